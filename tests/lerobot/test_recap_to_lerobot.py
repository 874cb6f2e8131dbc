"""recap -> LeRobot: every dataset recap writes opens with LeRobot 0.6.1's
``LeRobotDataset(repo_id, root=...)`` offline (its metadata loading and checks: ``info.json`` as a
``DatasetInfo``, the codebase-version check, tasks, episodes, stats, every episode's video file
present, decoded frames within ``tolerance_s`` of their timestamps), and every frame holds what
recap wrote: numbers and PNG images exactly, video frames within the codec's loss (stated below),
and LeRobot's decoded video frames equal recap's reader's exactly (both decode with PyAV).

v2.1: LeRobot 0.6.1 opens only v3.0; a v2.1 dataset recap writes (the demo's ``sft``, the
stand-ins) goes through LeRobot's own converter (``convert_dataset_v21_to_v30.convert_dataset``,
local root, no push) and then opens the same way.
"""

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset

from recap.data.lerobot_writer import V21, V30, Episode, WriterConfig, column_names
from recap.data.lerobot_writer import write_lerobot_dataset as write_with_recap
from recap.envs.reach import (
    ACTION_NAMES,
    STATE_NAMES,
    ReachConfig,
    demo_datasets,
    generate_episodes,
    write_demo_datasets,
)
from tests.lerobot.lerobot_helpers import (
    mismatches,
    read_with_lerobot,
    read_with_recap,
    smooth_frames,
)

# The codec's loss: the largest per-frame mean |decoded - written| over the channel values of every
# video frame here (yuv420p: chroma at half resolution). Measured: libx264 crf 18 (recap's
# default) at most 2.4 on the demo's 64x64 renders and 6.6 on the noisy test frames; libsvtav1
# crf 30 (LeRobot's default codec and quality) 17.7 on the noisy frames (mean 7.0). Single
# values differ by much more at sharp colour edges, so the bound is on the per-frame mean.
CODEC_MEAN_LOSS = {"libx264": 8.0, "libsvtav1": 20.0}
DEMO = {"sft_episodes": 3, "rollout_episodes": 6, "eval_episodes": 3, "max_steps": 12,
        "max_frames_per_file": 10}  # fmt: skip


def written_frames(episodes: list[Episode], cfg: WriterConfig) -> dict[str, np.ndarray]:
    """Per frame, in index order, what ``write_lerobot_dataset`` was given (and computes)."""
    keys = column_names(cfg.naming, episodes[0].images)
    tasks: dict[str, int] = {}
    out: dict[str, list] = {}
    for e, ep in enumerate(episodes):
        n = len(ep)
        task = tasks.setdefault(ep.task, len(tasks))
        cols = {keys["state"]: ep.state.astype(np.float32),
                keys["action"]: ep.action.astype(np.float32),
                "is_success": np.full(n, bool(ep.success)), "done": np.arange(n) == n - 1,
                "timestamp": (np.arange(n) / cfg.fps).astype(np.float32),
                "frame_index": np.arange(n), "episode_index": np.full(n, e),
                "task_index": np.full(n, task),
                "task": np.array([ep.task] * n, object)}  # fmt: skip
        cols |= {keys[cam]: frames for cam, frames in ep.images.items()}
        for k, v in cols.items():
            out.setdefault(k, []).append(v)
    frames = {k: np.concatenate(v) for k, v in out.items()}
    frames["index"] = np.arange(len(frames["frame_index"]))
    return frames


def open_with_lerobot(root: Path, repo_id: str, tmp_path: Path, version: str):
    """``read_with_lerobot`` of ``root``; a v2.1 copy is converted by LeRobot first."""
    if version == V21:
        copy = tmp_path / "converted" / repo_id
        shutil.copytree(root, copy)
        convert_dataset(repo_id, root=copy, push_to_hub=False)
        root = copy
    return read_with_lerobot(repo_id, root)


def check_equal_to_written(theirs, ours, written, cfg: WriterConfig, aligned=False) -> list[str]:
    """Mismatch lines: LeRobot's reading vs what recap wrote (video within ``CODEC_MEAN_LOSS``
    and, with ``aligned``, each decoded frame nearer its own written frame than any other) and
    vs recap's own reading (exact everywhere)."""
    video = [k for k in written if k.endswith("image")] if cfg.image_dtype == "video" else []
    problems = mismatches(written, theirs, skip=video)
    problems += [f"recap reader vs lerobot reader: {p}" for p in mismatches(ours, theirs)]
    bound = CODEC_MEAN_LOSS[cfg.codec]
    for key in video:
        a, b = (x.reshape(len(x), -1).astype(np.float32) for x in (written[key], theirs[key]))
        loss = np.abs(a - b).mean(1)
        if loss.max() > bound:
            i = int(loss.argmax())
            problems.append(f"{key}: decoded frame {i} differs from the written one by a mean "
                            f"{loss.max():.2f} > {bound} per value ({cfg.codec})")  # fmt: skip
        if aligned:
            nearest = np.abs(a[None, :, :] - b[:, None, :]).mean(2).argmin(1)
            wrong = np.flatnonzero(nearest != np.arange(len(a)))
            if wrong.size:
                i = int(wrong[0])
                problems.append(f"{key}: decoded frame {i} is nearest written frame "
                                f"{int(nearest[i])}, not its own")  # fmt: skip
    return problems


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    write_demo_datasets(root, seed=0, **DEMO)
    return root


@pytest.mark.parametrize("name", ["sft", "rollout", "eval"])
def test_demo_datasets_open_in_lerobot_with_what_recap_wrote(demo, name, tmp_path):
    spec = next(s for s in demo_datasets(10, DEMO["max_frames_per_file"]) if s.name == name)
    cfg = replace(spec.writer, state_names=STATE_NAMES, action_names=ACTION_NAMES)
    sizes = {"sft": DEMO["sft_episodes"], "rollout": DEMO["rollout_episodes"],
             "eval": DEMO["eval_episodes"]}  # fmt: skip
    episodes = list(generate_episodes(sizes[name], seed=[0, spec.stream], mix=spec.mix,
                                      config=ReachConfig(max_steps=DEMO["max_steps"]),
                                      successes_only=spec.type == "sft"))  # fmt: skip
    written = written_frames(episodes, cfg)
    theirs, ds = open_with_lerobot(demo / name, f"recap/{name}", tmp_path, cfg.version)
    assert len(ds) == len(written["index"]) and ds.meta.total_episodes == sizes[name]
    assert ds.meta.features[column_names(cfg.naming, ["image"])["state"]]["names"] == list(
        STATE_NAMES
    )
    assert check_equal_to_written(theirs, read_with_recap(demo / name), written, cfg) == []
    if name == "rollout":  # recap splits episodes across its 10-frame data files
        files = sorted((demo / name / "data").glob("*/*.parquet"))
        assert len(files) == -(-len(written["index"]) // 10)


def _episodes(lengths, cameras, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for e, n in enumerate(lengths):
        images = {cam: smooth_frames(rng, n, h, w) for cam, (h, w) in cameras.items()}
        out.append(Episode(images, rng.normal(size=(n, 6)).astype(np.float32),
                           rng.normal(size=(n, 3)).astype(np.float32), f"task {e % 2}",
                           e % 3 != 1))  # fmt: skip
    return out


WRITERS = {
    "v3.0 lerobot video h264 split": WriterConfig(V30, "lerobot", "video", max_frames_per_file=4),
    "v3.0 libero video av1": WriterConfig(V30, "libero", "video", codec="libsvtav1"),
    "v3.0 lerobot image": WriterConfig(V30, "lerobot", "image", max_frames_per_file=5,
                                       split_episodes=False),
    "v2.1 libero video av1": WriterConfig(V21, "libero", "video", codec="libsvtav1"),
    "v2.1 lerobot image": WriterConfig(V21, "lerobot", "image"),
}  # fmt: skip


@pytest.mark.parametrize("which", list(WRITERS))
def test_every_writer_layout_opens_in_lerobot(which, tmp_path):
    cfg = WRITERS[which]
    cameras = {"image": (48, 64), "wrist_image": (24, 40)}  # non-square, different sizes
    episodes = _episodes([5, 1, 7, 1, 3], cameras)
    root = tmp_path / "ds"
    write_with_recap(root, episodes, cfg)
    written = written_frames(episodes, cfg)
    theirs, ds = open_with_lerobot(root, "recap/writer", tmp_path, cfg.version)
    assert len(ds) == 17 and ds.meta.total_episodes == 5 and ds.meta.total_tasks == 2
    assert check_equal_to_written(theirs, read_with_recap(root), written, cfg, True) == []
