"""Columns read by meaning, not truthiness (issue #28), and stale sidecars, through Step 1's real
entry point (``recap.cli.run_command(compute_returns, argv)`` in process)."""

import json
import shutil

import gin
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recap.cli import run_command
from recap.core import columns as C
from recap.data.sidecars import read_returns
from recap.errors import DatasetError
from recap.steps.compute_returns import compute_returns
from tests.helpers import copy_fixture, tree_hashes

DATA = "data/chunk-000/file-000.parquet"
RULE = "it must hold bool, or integers/floats that are exactly 0 or 1; rewrite it as bool"
# libero_like_v30_images: lengths 9,12,7,15,10,13; outcomes T,T,F,T,F,T
RETURNS = [
    *[-8.0 + t for t in range(9)],
    *[-11.0 + t for t in range(12)],
    *[-306.0 + t for t in range(7)],
    *[-14.0 + t for t in range(15)],
    *[-309.0 + t for t in range(10)],
    *[-12.0 + t for t in range(13)],
]


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def step1(capsys, *roots, tag="t"):
    """Run Step 1 as the console script does; (exit status, stderr)."""
    entries = ", ".join(f'{{"name": "d{i}", "root": "{r}"}}' for i, r in enumerate(roots))
    argv = ["--gin_param", f"compute_returns.datasets = [{entries}]"]
    argv += ["--gin_param", f'compute_returns.tag = "{tag}"']
    capsys.readouterr()
    code = run_command(compute_returns, argv)
    return code, capsys.readouterr().err


def with_outcome(root, make):
    """Rewrite the data file's ``is_success`` column as ``make(bool values)``."""
    path = root / DATA
    table = pq.read_table(path)
    i = table.column_names.index(C.IS_SUCCESS)
    values = table.column(i).to_numpy(zero_copy_only=False)
    pq.write_table(table.set_column(i, C.IS_SUCCESS, make(values)), path)
    return root


BAD_OUTCOMES = [
    ("yes_no", lambda v: pa.array(np.where(v, "yes", "no")),
     "episode 0 frame 0 has value 'yes' (type string)"),
    ("nan", lambda v: pa.array(np.where(v, 1.0, np.nan)), "episode 2 frame 0 has value nan"),
    ("zero_two", lambda v: pa.array(np.where(v, 2, 0)), "episode 0 frame 0 has value 2"),
    ("null", lambda v: pa.array([None if not x else True for x in v], pa.bool_()),
     "episode 2 frame 0 has value null"),
    ("float_half", lambda v: pa.array(np.where(v, 1.0, 0.5)), "episode 2 frame 0 has value 0.5"),
]  # fmt: skip


@pytest.mark.parametrize("case, make, where", BAD_OUTCOMES, ids=[c[0] for c in BAD_OUTCOMES])
def test_bad_outcome_is_refused(tmp_path, capsys, case, make, where):
    root = with_outcome(copy_fixture("libero_like_v30_images", tmp_path), make)
    before = tree_hashes(tmp_path)
    code, err = step1(capsys, root)
    assert code == 2
    assert err == f"error: {root / DATA}: column 'is_success': {where}; {RULE}\n"
    assert tree_hashes(tmp_path) == before  # nothing written, inputs byte-identical


GOOD_OUTCOMES = [
    ("bool", lambda v: pa.array(v)),
    ("int64_0_1", lambda v: pa.array(v.astype(np.int64))),
    ("int8_0_1", lambda v: pa.array(v.astype(np.int8))),
    ("float_0_1", lambda v: pa.array(v.astype(np.float64))),
    ("float32_0_1", lambda v: pa.array(v.astype(np.float32))),
]


@pytest.mark.parametrize("case, make", GOOD_OUTCOMES, ids=[c[0] for c in GOOD_OUTCOMES])
def test_numeric_0_1_outcome_reads_as_bool(tmp_path, capsys, case, make):
    root = with_outcome(copy_fixture("libero_like_v30_images", tmp_path), make)
    code, err = step1(capsys, root)
    assert (code, err) == (0, "")
    table, stats = read_returns(root, "t")
    assert table.column(C.RETURN).to_pylist() == RETURNS
    assert (stats["num_episodes"], stats["num_successes"], stats["return_min"]) == (6, 4, -309.0)


def test_integral_float_index_columns_are_cast_exactly(tmp_path, capsys):
    """Documented lenient reading: float index columns holding whole numbers (3.0) are cast
    exactly to int64, and give the clean data's sidecar; 2.5 is refused."""
    clean = copy_fixture("libero_like_v30_images", tmp_path / "clean")
    assert step1(capsys, clean) == (0, "")
    root = copy_fixture("libero_like_v30_images", tmp_path / "float")
    table = pq.read_table(root / DATA)
    for name in (C.EPISODE_INDEX, C.FRAME_INDEX, C.TASK_INDEX):
        i = table.column_names.index(name)
        table = table.set_column(i, name, table.column(i).cast(pa.float64()))
    pq.write_table(table, root / DATA)
    assert step1(capsys, root) == (0, "")
    assert read_returns(root, "t")[0].equals(read_returns(clean, "t")[0])

    frames = table.column(C.FRAME_INDEX).to_numpy().copy()
    frames[3] = 2.5
    i = table.column_names.index(C.FRAME_INDEX)
    pq.write_table(table.set_column(i, C.FRAME_INDEX, pa.array(frames)), root / DATA)
    before = tree_hashes(tmp_path)
    code, err = step1(capsys, root, tag="u")
    assert code == 2
    assert err == (
        f"error: {root / DATA}: column 'frame_index': row 3 has value 2.5; it must hold "
        "integers (integral floats are cast exactly); rewrite it as int64\n"
    )
    assert tree_hashes(tmp_path) == before


def test_stale_sidecar_after_the_dataset_is_rewritten(tmp_path, capsys):
    root = copy_fixture("libero_like_v30_images", tmp_path)
    assert step1(capsys, root) == (0, "")
    stats = json.loads((root / "meta" / "returns_t.json").read_text())
    assert stats["source"]["num_frames"] == 66 and stats["source"]["num_episodes"] == 6
    assert stats["source"]["data_digest"].startswith("sha256:")
    # a copy of the dataset (new mtimes) keeps its sidecar valid
    moved = tmp_path / "moved"
    shutil.copytree(root, moved, copy_function=shutil.copyfile)
    assert read_returns(moved, "t")[0].equals(read_returns(root, "t")[0])
    # the dataset rewritten after Step 1 (episode 2 now a success): the sidecar is stale
    with_outcome(root, lambda v: pa.array(np.ones_like(v)))
    sidecar = root / "meta" / "returns_t.parquet"
    with pytest.raises(DatasetError) as info:
        read_returns(root, "t")
    digest = stats["source"]["data_digest"]
    assert info.value.message.startswith(
        f"{sidecar}: stale: computed from other data than the dataset now holds (data_digest "
        f"was {digest}, is sha256:"
    )
    assert info.value.message.endswith(
        "); the dataset changed after it was written, rerun Step 1 (recap-returns) with this tag"
    )
    # a sidecar written before the record existed (no "source") is accepted as it is
    del stats["source"]
    (root / "meta" / "returns_t.json").write_text(json.dumps(stats))
    table, back = read_returns(root, "t")
    assert table.column(C.RETURN).to_pylist() == RETURNS and "source" not in back


def test_non_finite_returns_are_refused(tmp_path, capsys):
    root = copy_fixture("libero_like_v30_images", tmp_path)
    assert step1(capsys, root) == (0, "")
    path = root / "meta" / "returns_t.parquet"
    table = pq.read_table(path)
    values = table.column(C.RETURN).to_numpy().copy()
    values[10] = np.inf
    pq.write_table(table.set_column(2, C.RETURN, pa.array(values)), path)
    with pytest.raises(DatasetError) as info:
        read_returns(root, "t")
    assert info.value.message == (
        f"{path}: column 'return': episode 1 frame 1 has value inf (not finite); the sidecar is "
        "corrupt, recompute it"
    )
