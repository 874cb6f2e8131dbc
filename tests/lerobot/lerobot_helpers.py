"""LeRobot 0.6.1 writing and reading datasets through its own public API, and recap reading the
same directories, both into one per-frame dict of arrays in global ``index`` order, so the tests
compare values (and name the field and the difference when they do not match)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

from recap.data.lerobot import LocalDataset

INDEX = ("episode_index", "frame_index", "index", "task_index")
VIDEO_BACKEND = "pyav"  # PyAV, the decoder recap uses (torchcodec needs a system FFmpeg)


def smooth_frames(rng: np.random.Generator, n: int, height: int, width: int) -> np.ndarray:
    """uint8[n, H, W, 3]: moving gradients plus mild noise (video codecs keep them close)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = np.empty((n, height, width, 3), np.uint8)
    for t in range(n):
        phase = rng.uniform(0, 2 * np.pi, 3)
        base = np.stack(
            [np.sin(x / 7 + phase[c] + t / 3) + np.cos(y / 5 - phase[c]) for c in range(3)], -1
        )
        noise = rng.normal(0, 6, (height, width, 3))
        out[t] = np.clip(127 + 55 * base + noise, 0, 255).astype(np.uint8)
    return out


def write_with_lerobot(
    root: Path,
    repo_id: str,
    features: dict,
    episodes: list[dict[str, np.ndarray | str]],
    fps: int = 10,
    data_mb: float | None = None,
    video_mb: float | None = None,
) -> Path:
    """A v3.0 dataset written by ``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` /
    ``finalize``. ``episodes``: feature -> per-frame array ([T, ...]) plus ``task`` (str)."""
    ds = LeRobotDataset.create(
        repo_id, fps, features, root=root, robot_type="test_arm", use_videos=True,
        data_files_size_in_mb=data_mb, video_files_size_in_mb=video_mb,
    )  # fmt: skip
    for ep in episodes:
        length = len(next(v for k, v in ep.items() if k != "task"))
        for t in range(length):
            frame = {k: v[t] for k, v in ep.items() if k != "task"}
            ds.add_frame(frame | {"task": ep["task"]})
        ds.save_episode(parallel_encoding=False)
    ds.finalize()
    return root


def read_with_lerobot(repo_id: str, root: Path) -> tuple[dict[str, np.ndarray], LeRobotDataset]:
    """Every frame of ``LeRobotDataset(repo_id, root=root)`` in index order: numbers as arrays,
    cameras as uint8 HWC (``round(float_CHW * 255)``), ``task`` as text."""
    ds = LeRobotDataset(repo_id, root=root, video_backend=VIDEO_BACKEND)
    cameras = set(ds.meta.camera_keys)
    rows: dict[str, list] = {}
    for i in range(len(ds)):
        item = ds[i]
        for key, value in item.items():
            if key in cameras:
                value = (value.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
            elif torch.is_tensor(value):
                value = value.numpy()
            rows.setdefault(key, []).append(value)
    return {k: np.stack(v) if k != "task" else np.array(v, object) for k, v in rows.items()}, ds


def read_with_recap(root: Path) -> dict[str, np.ndarray]:
    """The same frames through ``recap.data.lerobot.LocalDataset``."""
    with LocalDataset(root) as ds:
        names = [k for k, f in ds.features.items() if f["dtype"] not in ("image", "video")]
        table = ds.read_columns(names)
        out: dict[str, np.ndarray] = {}
        for name in names:
            column = table.column(name).combine_chunks()
            shape = ds.features[name]["shape"]
            if hasattr(column.type, "list_size") or str(column.type).startswith(("list", "fixed")):
                values = column.flatten().to_numpy(zero_copy_only=False)
                out[name] = values.reshape(len(column), *shape)
            else:
                out[name] = column.to_numpy(zero_copy_only=False)
        rows = np.arange(ds.num_frames)
        for key in ds.camera_keys:
            out[key] = ds.frames(key, rows)
        out["task"] = ds.task_texts(out["task_index"])
    return out


def mismatches(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], skip=()) -> list[str]:
    """One line per field that differs: missing on a side, shape, dtype kind, or the first
    frame whose value differs (with both values). Empty when every field is equal."""
    problems = []
    for key in sorted(set(ours) | set(theirs)):
        if key in skip:
            continue
        if key not in ours or key not in theirs:
            side = "recap" if key not in ours else "lerobot"
            problems.append(f"{key}: missing from {side}'s reading")
            continue
        a, b = np.asarray(ours[key]), np.asarray(theirs[key])
        b = b.reshape(a.shape) if a.size == b.size and a.shape != b.shape else b
        if a.shape != b.shape:
            problems.append(f"{key}: shape {a.shape} (recap) vs {b.shape} (lerobot)")
            continue
        if a.dtype.kind in "fc" or b.dtype.kind in "fc":
            equal = np.isclose(a.astype(np.float64), b.astype(np.float64), rtol=0, atol=1e-6)
        else:
            equal = a == b
        if not equal.all():
            bad = np.argwhere(~equal.reshape(len(a), -1).all(1))[:, 0]
            i = int(bad[0])
            if a.dtype.kind in "iufcb" and b.dtype.kind in "iufcb" and a[i].size > 8:
                diff = np.abs(a.astype(np.float64) - b.astype(np.float64)).max()
                what = f"max |difference| {diff:g}"
            else:
                what = f"recap {a[i].tolist()!r} vs lerobot {b[i].tolist()!r}"
            problems.append(f"{key}: {bad.size} of {len(a)} frames differ, first index {i}: {what}")
    return problems
