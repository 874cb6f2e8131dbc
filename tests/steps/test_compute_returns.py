import json
import os
import subprocess
import sys

import gin
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recap.core import columns as C
from recap.data.sidecars import read_returns
from recap.errors import DatasetError, one_line
from recap.steps.compute_returns import ReturnsConfig, compute_returns
from tests.helpers import REPO, copy_fixture, tree_hashes

# libero_like fixtures: lengths 9,12,7,15,10,13; outcomes T,T,F,T,F,T
LENGTHS = [9, 12, 7, 15, 10, 13]
OUTCOMES = [True, True, False, True, False, True]


def _expected_returns(lengths, outcomes, failure=-300.0):
    out = []
    for n, ok in zip(lengths, outcomes):
        last = 0.0 if ok else failure
        out += [last - (n - 1 - t) for t in range(n)]
    return out


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _sidecar_files(root):
    return sorted(p.name for p in (root / "meta").iterdir() if p.name.startswith("returns"))


@pytest.mark.parametrize("name", ["libero_like_v30_images", "libero_like_v30_video"])
def test_rollout_fixture_values(tmp_path, name, capsys):
    root = copy_fixture(name, tmp_path)
    before = tree_hashes(root)
    (result,) = compute_returns(ReturnsConfig(datasets=[{"name": "r", "root": str(root)}], tag="t"))
    table, stats = read_returns(root, "t")
    assert table.column(C.RETURN).to_pylist() == _expected_returns(LENGTHS, OUTCOMES)
    assert table.column(C.EPISODE_INDEX).to_pylist() == sum(
        ([i] * n for i, n in enumerate(LENGTHS)), []
    )
    assert table.column(C.PROMPT).to_pylist()[:2] == ["put the black bowl on the plate"] * 2
    assert table.column(C.PROMPT).to_pylist()[9] == "open the top drawer of the cabinet"
    assert stats["return_min"] == -309.0 and stats["return_max"] == 0.0
    assert (stats["num_episodes"], stats["num_successes"], stats["num_frames"]) == (6, 4, 66)
    assert stats["task_max_episode_length"] == {
        "put the black bowl on the plate": 13,
        "open the top drawer of the cabinet": 15,
    }
    assert "r: 6 episodes, 4 successes, 66 frames, return min -309 max 0" in capsys.readouterr().out
    # the dataset's own files are byte-identical; only the two sidecars were added
    after = tree_hashes(root, exclude_prefix=("meta/returns_t",))
    assert after == before
    assert _sidecar_files(root) == ["returns_t.json", "returns_t.parquet"]


def test_sft_and_v21_and_tag_isolation(tmp_path):
    root = copy_fixture("rlinf_like_v21_video", tmp_path)
    compute_returns(
        ReturnsConfig(datasets=[{"name": "s", "root": str(root), "type": "sft"}], tag="")
    )
    compute_returns(
        ReturnsConfig(datasets=[{"name": "s", "root": str(root), "failure_reward": -50.0}], tag="b")
    )
    sft, sft_stats = read_returns(root, "")
    roll, roll_stats = read_returns(root, "b")
    assert sft_stats["num_successes"] == 7 and sft_stats["return_min"] > -50
    assert roll_stats["failure_reward"] == -50.0
    assert roll_stats["num_successes"] < 7 and roll_stats["return_min"] < -50
    # a second tag does not change the first
    assert read_returns(root, "")[0].equals(sft)
    assert _sidecar_files(root) == [
        "returns.json",
        "returns.parquet",
        "returns_b.json",
        "returns_b.parquet",
    ]


def test_next_success_outcome_column(tmp_path):
    root = copy_fixture("libero_like_v30_images", tmp_path)
    path = root / "data" / "chunk-000" / "file-000.parquet"
    t = pq.read_table(path)
    t = t.rename_columns([C.NEXT_SUCCESS if c == C.IS_SUCCESS else c for c in t.column_names])
    pq.write_table(t, path)
    compute_returns(
        ReturnsConfig(
            datasets=[{"name": "r", "root": str(root), "outcome_column": "next.success"}], tag="n"
        )
    )
    assert read_returns(root, "n")[0].column(C.RETURN).to_pylist() == _expected_returns(
        LENGTHS, OUTCOMES
    )


def _drop_outcome(root):
    path = root / "data" / "chunk-000" / "file-000.parquet"
    pq.write_table(pq.read_table(path).drop_columns([C.IS_SUCCESS]), path)
    info = json.loads((root / "meta" / "info.json").read_text())
    del info["features"][C.IS_SUCCESS]
    (root / "meta" / "info.json").write_text(json.dumps(info))


def _duplicate_row(root):
    path = root / "data" / "chunk-000" / "file-000.parquet"
    t = pq.read_table(path)
    pq.write_table(pa.concat_tables([t, t.slice(3, 1)]), path)


def _frame_gap(root):
    path = root / "data" / "chunk-000" / "file-000.parquet"
    t = pq.read_table(path)
    fr = t.column(C.FRAME_INDEX).to_pylist()
    fr[4] = 40
    t = t.set_column(t.column_names.index(C.FRAME_INDEX), C.FRAME_INDEX, pa.array(fr, pa.int64()))
    pq.write_table(t, path)


def _total_frames(root):  # found after the bad dataset's sidecar began to be written
    info = json.loads((root / "meta" / "info.json").read_text())
    info["total_frames"] += 1
    (root / "meta" / "info.json").write_text(json.dumps(info))


def _bad_version(root):
    info = json.loads((root / "meta" / "info.json").read_text())
    info["codebase_version"] = "v9.9"
    (root / "meta" / "info.json").write_text(json.dumps(info))


BAD_INPUTS = {
    "no_outcome": (_drop_outcome, ["info.json", "is_success", "outcome_column"]),
    "zero_byte": (
        lambda r: (r / "data" / "chunk-000" / "file-000.parquet").write_bytes(b""),
        ["file-000.parquet"],
    ),
    "corrupt": (
        lambda r: (r / "data" / "chunk-000" / "file-000.parquet").write_bytes(b"PAR1garbage"),
        ["file-000.parquet"],
    ),
    "duplicate": (_duplicate_row, ["duplicate", "episode_index=0, frame_index=3"]),
    "gap": (_frame_gap, ["frame_index", "gap"]),
    "version": (_bad_version, ["info.json", "codebase_version", "v9.9"]),
    "no_info": (lambda r: (r / "meta" / "info.json").unlink(), ["info.json"]),
    "total_frames": (_total_frames, ["info.json", "total_frames is"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_writes_nothing_anywhere(tmp_path, case):
    good = copy_fixture("rlinf_like_v21_video", tmp_path)
    bad = copy_fixture("libero_like_v30_images", tmp_path)
    corrupt, fragments = BAD_INPUTS[case]
    corrupt(bad)
    before = {p: tree_hashes(p) for p in (good, bad)}
    with pytest.raises(DatasetError) as err:
        compute_returns(
            ReturnsConfig(
                datasets=[
                    {"name": "good", "root": str(good), "type": "sft"},
                    {"name": "bad", "root": str(bad), "type": "rollout"},
                ],
                tag="x",
            )
        )
    msg = one_line(err.value)
    assert "\n" not in msg and msg == str(err.value).splitlines()[0]
    for fragment in fragments:
        assert fragment in msg, msg
    assert str(bad) in msg or "bad" in msg
    assert {p: tree_hashes(p) for p in (good, bad)} == before  # nothing written, even for 'good'


def _run_script(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "compute_returns.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_script_success_and_failure_exit_codes(tmp_path):
    root = copy_fixture("libero_like_v30_images", tmp_path)
    gin_file = tmp_path / "r.gin"
    gin_file.write_text(
        'include "returns.gin"\n'
        f'compute_returns.data_root = "{tmp_path}"\n'
        'compute_returns.datasets = [{"name": "r", "root": "libero_like_v30_images"}]\n'
    )
    ok = _run_script(
        "--gin_file", str(gin_file), "--gin_param", 'compute_returns.tag = "s"', cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    assert "r: 6 episodes, 4 successes, 66 frames" in ok.stdout
    assert (root / "meta" / "returns_s.parquet").is_file()

    _drop_outcome(root)
    bad = _run_script(
        "--gin_file", str(gin_file), "--gin_param", 'compute_returns.tag = "u"', cwd=tmp_path
    )
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "is_success" in lines[0]
    assert not (root / "meta" / "returns_u.parquet").exists()

    unknown = _run_script(
        "--gin_file", str(gin_file), "--gin_param", "compute_returns.gama = 0.9", cwd=tmp_path
    )
    assert unknown.returncode == 2 and "gama" in unknown.stderr


def test_episode_spanning_v30_files(tmp_path):
    import numpy as np

    from recap.data.lerobot_writer import Episode, WriterConfig, write_lerobot_dataset

    def episode(n, ok):
        return Episode({}, np.zeros((n, 8), np.float32), np.zeros((n, 7), np.float32), "t", ok)

    root = tmp_path / "split"
    cfg = WriterConfig(max_frames_per_file=4)
    write_lerobot_dataset(root, [episode(3, True), episode(6, False), episode(2, True)], cfg)
    assert len(list((root / "data" / "chunk-000").glob("*.parquet"))) == 3
    compute_returns(ReturnsConfig(datasets=[{"name": "s", "root": str(root)}], tag=""))
    table, stats = read_returns(root, "")
    assert table.column(C.RETURN).to_pylist() == [
        -2,
        -1,
        0,
        -305,
        -304,
        -303,
        -302,
        -301,
        -300,
        -1,
        0,
    ]
    assert stats["num_frames"] == 11 and stats["num_successes"] == 2
