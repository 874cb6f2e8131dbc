"""recap.data.merge: three LeRobot v3.0 datasets (one of two episodes split over data files, two
one-episode recordings) merged into one that recap's reader reads back as their concatenation:
state, action, flags and tasks exactly, video frames identical (files copied, not re-encoded);
sources untouched; one-line errors and nothing written for sources that do not agree."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from recap.data.lerobot import LocalDataset
from recap.data.lerobot_writer import V21, Episode, WriterConfig, write_lerobot_dataset
from recap.data.merge import MERGE_FILE, merge_datasets
from recap.errors import RecapError

CAMERAS = ("image", "wrist_image")
STATE, ACTION = "observation.state", "action"


def episode(seed: int, length: int, task: str, corrected: tuple[int, ...] = ()) -> Episode:
    rng = np.random.default_rng(seed)
    return Episode(
        images={c: rng.integers(0, 256, (length, 16, 16, 3), dtype=np.uint8) for c in CAMERAS},
        state=rng.normal(size=(length, 3)).astype(np.float32),
        action=rng.normal(size=(length, 2)).astype(np.float32),
        task=task,
        success=seed % 2 == 0,
        flags={"is_correction": np.isin(np.arange(length), corrected)},
    )


def write(root: Path, episodes: list[Episode], **config) -> Path:
    write_lerobot_dataset(root, episodes, WriterConfig(**{"fps": 10, **config}))
    return root


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(path)).encode() + f.read_bytes())
    return h.hexdigest()


def read(path: Path) -> dict:
    with LocalDataset(path) as ds:
        flags = ["is_correction", "is_success"]
        t = ds.read_columns([STATE, ACTION, "episode_index", "frame_index", "index",
                             "task_index", *flags], flags=flags)  # fmt: skip
        rows = np.arange(ds.num_frames)
        return {
            "state": np.stack(t.column(STATE).to_numpy(zero_copy_only=False)),
            "action": np.stack(t.column(ACTION).to_numpy(zero_copy_only=False)),
            **{
                c: t.column(c).to_numpy(zero_copy_only=False)
                for c in ("episode_index", "frame_index", "index", *flags)
            },  # fmt: skip
            "task": [ds.tasks[i] for i in t.column("task_index").to_pylist()],
            "frames": {c: ds.frames(f"observation.images.{c}", rows) for c in CAMERAS},
            "episodes": ds.num_episodes,
        }


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    two = write(root / "two", [episode(0, 5, "reach red"), episode(1, 4, "reach blue", (1, 2))],
                max_frames_per_file=3)  # fmt: skip
    one = write(root / "one", [episode(2, 3, "reach blue", (0,))])
    (one / "meta" / "recap_record.json").write_text('{"episode": "episode_000007"}\n')
    three = write(root / "three", [episode(3, 6, "reach green")])
    sources = [two, one, three]
    before = {p.name: digest(p) for p in sources}
    summary = merge_datasets(sources, root / "merged")
    return {"root": root, "sources": sources, "before": before, "summary": summary}


def test_the_merged_dataset_is_the_sources_concatenated(merged):
    sources, out = merged["sources"], merged["root"] / "merged"
    assert merged["summary"] == {"path": str(out), "episodes": 4, "frames": 18,
                                 "tasks": ["reach red", "reach blue", "reach green"],
                                 "sources": 3}  # fmt: skip
    got, parts = read(out), [read(s) for s in sources]
    assert got["episodes"] == 4
    for key in ("state", "action", "is_correction", "is_success", "frame_index"):
        np.testing.assert_array_equal(got[key], np.concatenate([p[key] for p in parts]))
    assert got["episode_index"].tolist() == [0] * 5 + [1] * 4 + [2] * 3 + [3] * 6
    assert got["index"].tolist() == list(range(18))
    assert got["task"] == [t for p in parts for t in p["task"]]
    assert got["is_correction"].nonzero()[0].tolist() == [6, 7, 9]
    for camera in CAMERAS:  # copied, not re-encoded: the decoded frames are the sources'
        np.testing.assert_array_equal(
            got["frames"][camera], np.concatenate([p["frames"][camera] for p in parts])
        )


def test_the_metadata_is_rewritten_and_the_sources_untouched(merged):
    root, out = merged["root"], merged["root"] / "merged"
    assert {p.name: digest(p) for p in merged["sources"]} == merged["before"]
    info = json.loads((out / "meta" / "info.json").read_text())
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (4, 18, 3)
    assert info["splits"] == {"train": "0:4"}
    stats = json.loads((out / "meta" / "stats.json").read_text())
    assert stats[STATE]["count"] == [18]
    state = read(out)["state"]
    np.testing.assert_allclose(stats[STATE]["mean"], state.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats[STATE]["min"], state.min(0))
    record = json.loads((out / "meta" / MERGE_FILE).read_text())
    assert record == {"sources": [
        {"path": str(root / "two"), "episodes": 2, "first_episode": 0},
        {"path": str(root / "one"), "episodes": 1, "first_episode": 2,
         "record": {"episode": "episode_000007"}},
        {"path": str(root / "three"), "episodes": 1, "first_episode": 3}]}  # fmt: skip
    videos = sorted(p.relative_to(out).as_posix() for p in out.glob("videos/*/*/*.mp4"))
    assert videos == [f"videos/observation.images.{c}/chunk-000/file-00{i}.mp4"
                      for c in CAMERAS for i in range(3)]  # fmt: skip
    assert [p.name for p in (out / "data" / "chunk-000").iterdir()] == ["file-000.parquet"]
    assert not list(out.glob("meta/returns_*")) and not list(root.glob(".merged.*"))


def test_sources_that_disagree_are_one_line_and_nothing_is_written(merged, tmp_path):
    root = merged["root"]
    wide = episode(4, 3, "reach red")
    wide.state = np.zeros((3, 5), np.float32)
    other = write(tmp_path / "wide", [wide])
    with pytest.raises(RecapError) as exc:
        merge_datasets([root / "one", other], tmp_path / "out")
    assert str(exc.value) == (
        f"{other}/meta/info.json: features differ from {root / 'one'}'s (observation.state); "
        "merge datasets with the same columns, dtypes and shapes"
    )
    old = write(tmp_path / "old", [episode(5, 3, "reach red")], version=V21)
    with pytest.raises(RecapError) as exc:
        merge_datasets([root / "one", old], tmp_path / "out")
    assert str(exc.value) == (
        f"{old}/meta/info.json: codebase_version 'v2.1'; merge takes LeRobot v3.0 datasets "
        "only (convert it first)"
    )
    slow = write(tmp_path / "slow", [episode(6, 3, "reach red", (0,))], fps=5)
    with pytest.raises(RecapError) as exc:
        merge_datasets([root / "one", slow], tmp_path / "out")
    assert str(exc.value) == (
        f"{slow}/meta/info.json: fps 5 differs from {root / 'one'}'s 10; merge datasets "
        "recorded at one rate"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "slow", "wide"]
