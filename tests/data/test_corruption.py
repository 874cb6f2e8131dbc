"""Corruption sweep (issue #28): bad data never becomes wrong results.

Each case copies a prepared dataset (a LeRobot-written fixture, or a multi-file v3.0 set from
``recap.data.lerobot_writer``; each with a Step 1 sidecar tagged "t" and an advantages sidecar
tagged "a"), corrupts it one way and runs one real entry point:

- ``step1``: ``recap.cli.run_command(compute_returns, argv)`` (the console script, in process);
- ``relabel``: ``run_command(relabel, argv)`` (per-task scope, so it reads the frames and tasks);
- ``frames``: ``FrameDataset`` + ``make_loader(num_workers=0)`` over every frame (training reads);
- ``read_returns``: the returns-sidecar reader of Steps 2-3 (value data, Step 3's plan);
- ``labels``: ``dataset_labels`` over every frame (what the policy dataset reads, Step 4).

Expected: exit 2 (a ``RecapError`` for the library entry points) with exactly one line
``error: <file>: <message>``, nothing written anywhere and the inputs byte-identical; or, for a
documented lenient reading (``CLEAN``), the same output as the clean data. ``pytest -s`` prints
the table (case, entry point, outcome).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import gin
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recap.cli import run_command
from recap.core import columns as C
from recap.core.advantages import VALUE, LabelOptions, add_advantages, labeling_of
from recap.core.normalize import ReturnRange
from recap.data.conditioning import dataset_labels
from recap.data.lerobot import LocalDataset
from recap.data.lerobot_writer import WriterConfig, write_lerobot_dataset
from recap.data.loader import FrameDataset
from recap.data.sidecars import (
    SOURCE_KEY,
    dataset_source,
    read_advantages,
    read_returns,
    write_advantages,
)
from recap.engine.loader import make_loader
from recap.envs.reach import (
    ACTION_NAMES,
    ROLLOUT_MIX,
    STATE_NAMES,
    ReachConfig,
    generate_episodes,
)
from recap.errors import RecapError, one_line
from recap.steps.compute_returns import ReturnsConfig, compute_returns
from recap.steps.relabel import relabel
from tests.helpers import copy_fixture, tree_hashes

CLEAN = "clean"  # lenient reading: the output equals the clean data's
V30, V30VID, V21, MULTI = (
    "libero_like_v30_images",
    "libero_like_v30_video",
    "rlinf_like_v21_video",
    "multi",
)
DATA30 = "data/chunk-000/file-000.parquet"
EPS30 = "meta/episodes/chunk-000/file-000.parquet"
FLAG = "it must hold bool, or integers/floats that are exactly 0 or 1; rewrite it as bool"
INDEX = "it must hold integers (integral floats are cast exactly); rewrite it as int64"
TABLE: list[tuple[str, str, str]] = []


# ---- prepared datasets ------------------------------------------------------------------------


def _prepare(root: Path) -> None:
    """Step 1 sidecar "t" and an advantages sidecar "a" (made-up values) on ``root``."""
    compute_returns(ReturnsConfig(datasets=[{"name": "d", "root": str(root)}], tag="t"))
    returns, stats = read_returns(root, "t")
    ep, fr = (returns.column(k).to_numpy() for k in (C.EPISODE_INDEX, C.FRAME_INDEX))
    table = returns.append_column(VALUE, pa.array(-0.5 + 0.4 * np.sin(1.7 * ep + 0.3 * fr)))
    table = table.append_column(C.DATASET_NAME, pa.array(["d"] * len(table)))
    rng = ReturnRange(stats["return_min"], stats["return_max"])
    out = add_advantages(table, return_range=rng, lookahead=3, labels=LabelOptions(0.3, "global"))
    out = out.cast(C.ADVANTAGES_SCHEMA.with_metadata(out.schema.metadata))
    write_advantages(root, "a", out, {**labeling_of(out), "datasets": [{"name": "d"}]},
                     dataset_source(root))  # fmt: skip


def labelled_after(corrupt):
    """``corrupt``, then the advantages sidecar labelled as if Step 3 had run on the result
    (its recorded source restamped): the data was bad when Step 3 read it, not changed since."""

    def run(root: Path):
        corrupt(root)
        path = root / ADV_A
        table = pq.read_table(path)
        source = json.dumps(dataset_source(root), sort_keys=True).encode()
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata,
                                                      SOURCE_KEY: source}), path)  # fmt: skip

    return run


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("prepared")
    gin.clear_config()
    roots = {name: copy_fixture(name, base) for name in (V30, V30VID, V21)}
    episodes = list(generate_episodes(4, 0, ROLLOUT_MIX, ReachConfig(max_steps=12)))
    lengths = [len(e) for e in episodes]
    config = WriterConfig(
        "v3.0", "lerobot", "image", state_names=STATE_NAMES, action_names=ACTION_NAMES,
        max_frames_per_file=lengths[0] + lengths[1] // 2,  # episode 1 spans two data files
    )  # fmt: skip
    write_lerobot_dataset(base / MULTI, episodes, config)
    roots[MULTI] = base / MULTI
    assert len(list((roots[MULTI] / "data").glob("*/*.parquet"))) >= 2
    for root in roots.values():
        _prepare(root)
    return roots


@pytest.fixture(scope="module", autouse=True)
def _print_table():
    yield
    width = max((len(c) for c, _, _ in TABLE), default=4)
    print(f"\n{'case':<{width}}  {'entry point':<12}  outcome")
    for case, entry, outcome in TABLE:
        print(f"{case:<{width}}  {entry:<12}  {outcome}")


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


# ---- entry points: each returns (exit status, stderr text, output to compare when clean) ------


def _cli(step, params: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = run_command(step, [a for p in params for a in ("--gin_param", p)])
    return code, capsys.readouterr().err


def step1(root: Path, capsys):
    code, err = _cli(
        compute_returns,
        [f'compute_returns.datasets = [{{"name": "d", "root": "{root}"}}]',
         'compute_returns.tag = "new"'],
        capsys,
    )  # fmt: skip
    out = None
    if code == 0:
        table, stats = read_returns(root, "new")
        out = (table, {k: v for k, v in stats.items() if k != "source"})
    return code, err, out


def relabel_entry(root: Path, capsys):
    code, err = _cli(
        relabel,
        [f'relabel.datasets = [{{"name": "d", "root": "{root}"}}]', 'relabel.source_tag = "a"',
         'relabel.new_tag = "b"', 'relabel.scope = "per_task"'],
        capsys,
    )  # fmt: skip
    return code, err, read_advantages(root, "b")[0] if code == 0 else None


def _library(fn: Callable[[], object]):
    try:
        return 0, "", fn()
    except RecapError as exc:
        return 2, f"error: {one_line(exc)}\n", None


def frames(root: Path, capsys):
    def read_all():
        data = FrameDataset(root)
        batches = list(make_loader(data, 32, shuffle=False, num_workers=0))
        data.close()
        return [b["images"] for b in batches]

    return _library(read_all)


def returns_reader(root: Path, capsys):
    return _library(lambda: read_returns(root, "t")[0])


def labels(root: Path, capsys):
    def read():
        with LocalDataset(root) as ds:
            t = ds.read_columns([C.EPISODE_INDEX, C.FRAME_INDEX])
        ep, fr = (t.column(k).to_numpy() for k in (C.EPISODE_INDEX, C.FRAME_INDEX))
        return dataset_labels(root, "a", ep, fr)

    return _library(read)


ENTRIES = {
    "step1": step1,
    "relabel": relabel_entry,
    "frames": frames,
    "read_returns": returns_reader,
    "labels": labels,
}


# ---- corruptions ------------------------------------------------------------------------------


def edit_json(rel: str, change: Callable[[dict], None]):
    def corrupt(root: Path):
        path = root / rel
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    return corrupt


def write_bytes(rel: str, data: bytes):
    return lambda root: (root / rel).write_bytes(data)


def truncate(rel: str, fraction: float):
    def corrupt(root: Path):
        path = root / rel
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * fraction)])

    return corrupt


def remove(rel: str):
    def corrupt(root: Path):
        path = root / rel
        shutil.rmtree(path) if path.is_dir() else path.unlink()

    return corrupt


def edit_parquet(rel: str, change: Callable[[pa.Table], pa.Table]):
    def corrupt(root: Path):
        paths = sorted(root.glob(rel))
        assert paths, rel
        for path in paths:
            pq.write_table(change(pq.read_table(path)), path)

    return corrupt


def column(name: str, make: Callable[[np.ndarray], pa.Array]):
    """A parquet edit replacing column ``name`` by ``make(its numpy values)``."""

    def change(table: pa.Table) -> pa.Table:
        i = table.column_names.index(name)
        return table.set_column(i, name, make(table.column(i).to_numpy(zero_copy_only=False)))

    return change


def add_column(name: str, make: Callable[[int], pa.Array]):
    return lambda t: t.append_column(name, make(t.num_rows))


def set_at(values: np.ndarray, row: int, value, dtype=None) -> pa.Array:
    out = values.astype(dtype or values.dtype, copy=True)
    out[row] = value
    return pa.array(out)


def edit_lines(rel: str, change: Callable[[list[str]], list[str]]):
    def corrupt(root: Path):
        path = root / rel
        path.write_text("".join(change(path.read_text().splitlines(keepends=True))))

    return corrupt


def rewrite_data_after_step1(root: Path):
    """The dataset changed after Step 1: episode 2 (a failure) rewritten as a success."""
    edit_parquet(DATA30, column(C.IS_SUCCESS, lambda v: pa.array(np.ones_like(v))))(root)


def png_cell(row: int, data: bytes):
    key = "observation.images.image"

    def change(table: pa.Table) -> pa.Table:
        cells = table.column(key).to_pylist()
        cells[row] = {**cells[row], "bytes": data}
        i = table.column_names.index(key)
        return table.set_column(i, key, pa.array(cells, table.schema.field(key).type))

    return change


def v21_video(cam: str, ep: int) -> str:
    return f"videos/chunk-000/{cam}/episode_{ep:06d}.mp4"


def v21_data(ep: int) -> str:
    return f"data/chunk-000/episode_{ep:06d}.parquet"


def in_one_multi_file(change):
    """Apply ``change`` to the multi-file set's second data file only."""
    return edit_parquet("data/chunk-000/file-001.parquet", change)


S, R, F, RR, L = "step1", "relabel", "frames", "read_returns", "labels"
RET_T, ADV_A = "meta/returns_t.parquet", "meta/advantages_a.parquet"

# (case id, dataset, corruption, entry point, file the line names, message after "file: "); the
# message CLEAN marks a documented lenient reading: the output equals the clean data's.
CASES = [
    # -- meta/info.json
    ("info_missing", V30, remove("meta/info.json"), S, "meta/info.json",
     "file not found; point the dataset root at a LeRobot dataset folder (the one holding meta/ "
     "and data/)"),
    ("info_not_json", V21, write_bytes("meta/info.json", b"{"), S, "meta/info.json",
     "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char "
     "1)); fix or restore it"),
    ("info_bad_version", V30,
     edit_json("meta/info.json", lambda d: d.update(codebase_version="v9.9")), S,
     "meta/info.json", "codebase_version 'v9.9' is not supported; use a LeRobot dataset of "
     "version v2.0, v2.1 or v3.0"),
    ("info_no_fps", V21, edit_json("meta/info.json", lambda d: d.pop("fps")), R, "meta/info.json",
     "field 'fps' is missing or invalid; restore info.json"),
    ("info_features_list", V30, edit_json("meta/info.json", lambda d: d.update(features=[])), S,
     "meta/info.json", "field 'features' is missing or invalid; restore info.json"),
    ("info_total_frames", V30, edit_json("meta/info.json", lambda d: d.update(total_frames=60)), S,
     "meta/info.json", "total_frames is 60 but the dataset holds 66; fix total_frames or "
     "restore the missing files"),
    ("info_data_path", V21, edit_json("meta/info.json", lambda d: d.update(
        data_path="data/chunk-{episode_chunk:03d}/ep_{episode_index:06d}.parquet")), S,
     "data/chunk-000/ep_000000.parquet",
     "data file not found (listed by meta/episodes); restore it"),
    ("info_video_path", V30VID, edit_json("meta/info.json", lambda d: d.update(
        video_path="videos/{video_key}/c-{chunk_index:03d}/f-{file_index:03d}.mp4")), F,
     "videos/observation.images.image/c-000/f-000.mp4",
     "camera 'observation.images.image', episode 0 frame 0: video file not found; restore it "
     "from the source dataset"),
    # -- data parquet
    ("data_truncated", V30, truncate(DATA30, 0.5), S, DATA30,
     "not a readable parquet file (Parquet magic bytes not found in footer. Either the file is "
     "corrupted or this is not a parquet file.); restore it from the source dataset"),
    ("data_empty_file", V21, write_bytes(v21_data(3), b""), S, v21_data(3),
     "parquet file is empty (0 bytes); restore it from the source dataset"),
    ("data_file_missing", V21, remove(v21_data(4)), R, v21_data(4),
     "data file not found (listed by meta/episodes); restore it"),
    ("data_stray_garbage_file", MULTI, write_bytes("data/chunk-000/file-099.parquet", b"junk" * 9),
     S, "data/chunk-000/file-099.parquet",
     "not a readable parquet file (Parquet magic bytes not found in footer. Either the file is "
     "corrupted or this is not a parquet file.); restore it from the source dataset"),
    ("outcome_yes_no", V30, edit_parquet(DATA30, column(
        C.IS_SUCCESS, lambda v: pa.array(np.where(v, "yes", "no")))), S, DATA30,
     f"column 'is_success': episode 0 frame 0 has value 'yes' (type string); {FLAG}"),
    ("outcome_nan", MULTI, in_one_multi_file(column(
        C.IS_SUCCESS, lambda v: pa.array(np.where(v, 1.0, np.nan)))), S,
     "data/chunk-000/file-001.parquet", "column 'is_success': episode 2 frame 0 has value nan; "
     + FLAG),
    ("outcome_0_2", V21, edit_parquet("data/chunk-000/*.parquet", column(
        C.IS_SUCCESS, lambda v: pa.array(np.where(v, 2, 0)))), S, v21_data(0),
     f"column 'is_success': episode 0 frame 0 has value 2; {FLAG}"),
    ("outcome_null", V30, edit_parquet(DATA30, column(
        C.IS_SUCCESS, lambda v: pa.array([None if i == 40 else x for i, x in enumerate(v)],
                                         pa.bool_()))), S, DATA30,
     f"column 'is_success': episode 3 frame 12 has value null; {FLAG}"),
    ("outcome_column_missing", V30, edit_parquet(DATA30, lambda t: t.drop_columns([C.IS_SUCCESS])),
     S, "meta/info.json", "rollout dataset 'd' has no outcome column 'is_success'; set its "
     "'outcome_column' (e.g. 'next.success') or list it with type 'sft'"),
    ("outcome_missing_in_one_file", MULTI, in_one_multi_file(
        lambda t: t.drop_columns([C.IS_SUCCESS])), S, "data/chunk-000/file-001.parquet",
     "column 'is_success' not found; available columns: observation.images.image, "
     "observation.images.wrist_image, observation.state, action, done, timestamp, frame_index, "
     "episode_index, index, task_index; fix the column name or the dataset's gin entry"),
    ("frame_gap", V30, edit_parquet(DATA30, lambda t: t.filter(pa.array(np.arange(66) != 15))), S,
     DATA30, "frame_index: episode 1 has frame 7 where frame 6 was expected (a gap); frames are "
     "missing, restore them or drop the episode"),
    ("episode_tail_dropped", V30, edit_parquet(DATA30, lambda t: pa.concat_tables(
     [t.slice(0, 20), t.slice(21)])), S, "meta/episodes",
     "length: episode 1 has length 12 but the data files hold 11 frames of it; restore the "
     "metadata or the data (re-export the dataset)"),
    ("frame_duplicate", V21,
     edit_parquet(v21_data(2), lambda t: pa.concat_tables([t, t.slice(3, 1)])), S,
     v21_data(2), "episode_index/frame_index: duplicate row (episode_index=2, frame_index=3); "
     "remove the extra rows or re-export the dataset"),
    ("episode_index_string", V30, edit_parquet(DATA30, column(
        C.EPISODE_INDEX, lambda v: pa.array(v.astype(str)))), S, DATA30,
     f"column 'episode_index': row 0 has value '0' (type string); {INDEX}"),
    ("frame_index_fraction", MULTI, in_one_multi_file(column(
        C.FRAME_INDEX, lambda v: set_at(v, 2, 2.5, np.float64))), S,
     "data/chunk-000/file-001.parquet", f"column 'frame_index': row 2 has value 2.5; {INDEX}"),
    ("task_index_unknown", V30, edit_parquet(DATA30, column(
        C.TASK_INDEX, lambda v: set_at(v, 5, 7))), S, "meta/tasks.parquet",
     "task_index 7 has no task text; add it to the tasks file"),
    ("task_index_null", V21, labelled_after(edit_parquet(v21_data(1), column(
        C.TASK_INDEX, lambda v: pa.array([None] + v[1:].tolist(), pa.int64())))), R,
     v21_data(1),
     f"column 'task_index': episode 1 frame 0 has value null; {INDEX}"),
    ("image_cell_garbage", V30, edit_parquet(DATA30, png_cell(5, b"not an image")), F,
     f"{DATA30} column 'observation.images.image'",
     "image bytes are neither PNG nor JPEG; re-export the dataset"),
    ("outcome_int_0_1", MULTI, edit_parquet("data/chunk-000/*.parquet", column(
        C.IS_SUCCESS, lambda v: pa.array(v.astype(np.int64)))), S, "", CLEAN),
    ("outcome_float_0_1", V21, edit_parquet("data/chunk-000/*.parquet", column(
        C.IS_SUCCESS, lambda v: pa.array(v.astype(np.float32)))), S, "", CLEAN),
    ("outcome_int_in_one_file", MULTI, in_one_multi_file(column(
        C.IS_SUCCESS, lambda v: pa.array(v.astype(np.int8)))), S, "", CLEAN),
    ("index_integral_floats", V30, edit_parquet(DATA30, column(
        C.FRAME_INDEX, lambda v: pa.array(v.astype(np.float64)))), S, "", CLEAN),
    # -- episode metadata and tasks
    ("episodes_v30_missing", V30, remove("meta/episodes"), S, "meta/episodes",
     "no chunk-XXX/file-XXX.parquet files; restore meta/episodes"),
    ("episodes_v30_length", V30, edit_parquet(EPS30, column(
        "length", lambda v: set_at(v, 2, 8))), S, "meta/episodes",
     "length: episode 2 has length 8 but the data files hold 7 frames of it; restore the "
     "metadata or the data (re-export the dataset)"),
    ("episodes_v30_length_fraction", V30, edit_parquet(EPS30, column(
        "length", lambda v: set_at(v, 1, 11.5, np.float64))), S, "meta/episodes",
     f"column 'length': row 1 has value 11.5; {INDEX}"),
    ("episodes_v21_unlisted", V21, edit_lines("meta/episodes.jsonl", lambda ls: ls[:-1]), S,
     "meta/info.json", "total_episodes is 7 but the dataset holds 6; fix total_episodes or "
     "restore the missing files"),
    ("episodes_v21_garbage", V21, write_bytes("meta/episodes.jsonl", b"{\"episode_index\": 0,\n"),
     S, "meta/episodes.jsonl", None),
    ("tasks_v21_missing", V21, remove("meta/tasks.jsonl"), S, "meta/tasks.jsonl",
     "file not found; restore it from the source dataset"),
    ("tasks_v30_garbage", V30, write_bytes("meta/tasks.parquet", b"PAR1junk"), R,
     "meta/tasks.parquet", None),
    # -- videos (read at training time)
    ("video_camera_missing", V21, remove(v21_video("image", 2)), F, v21_video("image", 2),
     "camera 'image', episode 2 frame 0: video file not found; restore it from the source "
     "dataset"),
    ("video_garbage", V21, write_bytes(v21_video("wrist_image", 1), b"junk" * 100), F,
     v21_video("wrist_image", 1), None),
    ("video_truncated", V30VID, truncate(
        "videos/observation.images.wrist_image/chunk-000/file-000.mp4", 0.6), F,
     "videos/observation.images.wrist_image/chunk-000/file-000.mp4", None),
    ("video_shorter_than_episode", V21, lambda r: shutil.copyfile(
        r / v21_video("image", 3), r / v21_video("image", 2)), F, v21_video("image", 2), None),
    # -- sidecars
    ("returns_stale", V30, rewrite_data_after_step1, RR, RET_T, None),
    ("advantages_stale", V30, rewrite_data_after_step1, L, ADV_A, None),
    ("advantages_stale_relabel", V30, rewrite_data_after_step1, R, ADV_A, None),
    ("timestamps_off_fps", V21, edit_parquet(v21_data(1), column(
        "timestamp", lambda v: pa.array((v * 3).astype(v.dtype)))), F, v21_video("image", 1),
     None),
    ("returns_nan", V21, edit_parquet(RET_T, column(C.RETURN, lambda v: set_at(v, 4, np.nan))), RR,
     RET_T, "column 'return': episode 0 frame 4 has value nan (not finite); the sidecar is "
     "corrupt, recompute it"),
    ("returns_json_garbage", V30, write_bytes("meta/returns_t.json", b"[1, "), RR,
     "meta/returns_t.json", None),
    ("returns_column_missing", MULTI, edit_parquet(RET_T, lambda t: t.drop_columns([C.REWARD])), RR,
     RET_T, "column 'reward' missing; rewrite the sidecar"),
    ("returns_extra_row", V30, edit_parquet(RET_T, lambda t: pa.concat_tables([t, t.slice(0, 1)])),
     RR, RET_T, "67 rows for 66 frames; rerun Step 1"),
    ("advantage_label_0_2", V30, edit_parquet(ADV_A, column(
        C.ADVANTAGE, lambda v: pa.array(np.where(v, 2, 0)))), L, ADV_A, None),
    ("advantage_label_yes_no", V21, edit_parquet(ADV_A, column(
        C.ADVANTAGE, lambda v: pa.array(np.where(v, "yes", "no")))), R, ADV_A,
     f"column 'advantage': episode 0 frame 0 has value 'yes' (type string); {FLAG}"),
    ("advantage_label_int_0_1", V30, edit_parquet(ADV_A, column(
        C.ADVANTAGE, lambda v: pa.array(v.astype(np.int64)))), L, "", CLEAN),
    ("advantage_continuous_nan", V30, edit_parquet(ADV_A, column(
        C.ADVANTAGE_CONTINUOUS, lambda v: set_at(v, 5, np.nan))), R, ADV_A,
     "advantage_continuous: 1 NaN/null/infinite values (first at episode_index=0, "
     "frame_index=5); recompute the advantages (Step 3)"),
    ("advantage_row_missing", MULTI, edit_parquet(ADV_A, lambda t: t.slice(1)), L, ADV_A, None),
    ("advantage_extra_rows", V30, edit_parquet(ADV_A, lambda t: pa.concat_tables(
        [t, t.slice(0, 2).set_column(0, C.EPISODE_INDEX, pa.array([9, 9]))])), L, ADV_A,
     "2 rows match no frame of the dataset (computed from other data); recompute the "
     "advantages (Step 3) for this dataset"),
    ("correction_0_2", V30, labelled_after(edit_parquet(DATA30, add_column(
        "is_correction", lambda n: pa.array(np.arange(n) % 3)))), R, DATA30,
     f"column 'is_correction': episode 0 frame 2 has value 2; {FLAG}"),
    ("correction_float_0_1_all_false", V21, labelled_after(edit_parquet(
        "data/chunk-000/*.parquet", add_column("is_correction", lambda n: pa.array(np.zeros(n))))),
     R, "", CLEAN),
]  # fmt: skip


@pytest.mark.parametrize(
    "case, dataset, corrupt, entry, rel, message", CASES, ids=[c[0] for c in CASES]
)
def test_corruption(tmp_path, prepared, capsys, case, dataset, corrupt, entry, rel, message):
    clean_root = tmp_path / "clean" / dataset
    shutil.copytree(prepared[dataset], clean_root)
    root = tmp_path / "bad" / dataset
    shutil.copytree(prepared[dataset], root)
    corrupt(root)
    before = tree_hashes(tmp_path)
    code, err, out = ENTRIES[entry](root, capsys)
    if message == CLEAN:
        TABLE.append((case, entry, "lenient: equal to the clean run"))
        assert (code, err) == (0, "")
        _, _, expected = ENTRIES[entry](clean_root, capsys)
        _assert_equal(out, expected)
        return
    TABLE.append((case, entry, f"exit {code}: {err.strip()}"))
    assert code == 2
    assert err.endswith("\n") and err.count("\n") == 1  # exactly one line
    prefix = f"error: {root / rel}: "
    assert err.startswith(prefix), err
    if message is not None:
        assert err == prefix + message + "\n"
    else:
        assert err.strip().endswith(SPECIAL[case]), err
    assert tree_hashes(tmp_path) == before  # nothing written anywhere, inputs byte-identical


# Messages holding a digest, a library's parse error or a decoder's message: their fixed tails.
SPECIAL = {
    "episodes_v21_garbage": "restore it from the source dataset",
    "tasks_v30_garbage": "restore it from the source dataset",
    "video_garbage": "restore it from the source dataset",
    "video_truncated": "restore it from the source dataset",
    "video_shorter_than_episode": "does not match the parquet timestamps, re-encode it or "
    "restore the dataset",
    "returns_stale": "the dataset changed after it was written, rerun Step 1 (recap-returns) "
    "with this tag",
    "advantages_stale": "the dataset changed after it was written, rerun Step 3 "
    "(recap-advantages) with this tag",
    "advantages_stale_relabel": "the dataset changed after it was written, rerun Step 3 "
    "(recap-advantages) with this tag",
    "timestamps_off_fps": "does not match the parquet timestamps, re-encode it or restore the "
    "dataset",
    "returns_json_garbage": "rerun Step 1",
    "advantage_label_0_2": FLAG,
    "advantage_row_missing": "recompute the advantages for this dataset or pick its tag",
}


def _assert_equal(out, expected) -> None:
    if isinstance(out, tuple):
        assert out[0].equals(expected[0]) and out[1] == expected[1]
    elif isinstance(out, pa.Table):
        assert out.equals(expected)
    else:
        np.testing.assert_array_equal(out, expected)


def test_sweep_size():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)
    assert sum(c[5] == CLEAN for c in CASES) == 6


def test_frame_error_is_one_line_from_a_worker(tmp_path):
    """A missing camera file read by a DataLoader worker: the same one line in the main process."""
    root = copy_fixture(V21, tmp_path)
    (root / v21_video("image", 2)).unlink()
    data = FrameDataset(root)
    with pytest.raises(RecapError) as info:
        for _ in make_loader(data, 16, shuffle=False, num_workers=2):
            pass
    assert one_line(info.value) == (
        f"{root / v21_video('image', 2)}: camera 'image', episode 2 frame 0: video file not "
        "found; restore it from the source dataset"
    )
