"""Training-frame loader: random and sequential items/s against the sequential PyAV decode floor.

Writes (once, cached under bench/_data/) a LIBERO-size v3.0 dataset like the one LeRobot was
measured on: 2 cameras at 256x256, AV1 (libsvtav1, crf 30, keyframe every 2 frames, yuv420p),
20 episodes x 100 frames, one mp4 per camera. Then, in one run:
  floor       sequential PyAV decode of both files to rgb24 (items/s = frames per camera / s)
  sequential  recap's loader, in-order passes (2 workers), best epoch after the first
  random      recap's loader, shuffled, 2 workers, batch 32: best epoch after the first (steady
              state, persistent workers) and the first epoch with worker start-up included
  random_w0   the same in the main process (no workers)
  lerobot     LeRobotDataset random access, when `lerobot` is importable (optional extra)
  memory      RSS of the main process + workers after each of 10 shuffled epochs (10x the data)
Reference (issue 9, same kind of machine): LeRobot 79 items/s with PyAV, 198 with torchcodec.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

import av
import numpy as np

from recap.data.lerobot_writer import Episode, WriterConfig, write_lerobot_dataset
from recap.data.loader import FrameDataset
from recap.engine.loader import make_loader

TARGET = "random access >= 400 items/s with PyAV on 2 cores"
CAMERAS = ("image", "wrist_image")


def _camera(rng: np.random.Generator, n: int, size: int = 256) -> np.ndarray:
    """uint8[n, size, size, 3]: a gradient scene with a moving disc and sensor noise."""
    yy, xx = np.mgrid[0:size, 0:size]
    base = np.stack([xx, yy, (xx + yy) // 2], -1).astype(np.float32)
    out = np.empty((n, size, size, 3), np.uint8)
    cx, cy = rng.uniform(40, size - 40, 2)
    for t in range(n):  # data generation, once
        cx, cy = cx + rng.normal(0, 3), cy + rng.normal(0, 3)
        img = base.copy()
        img[(xx - cx) ** 2 + (yy - cy) ** 2 < 400] = (255, 40, 40)
        out[t] = np.clip(img + rng.normal(0, 6, img.shape), 0, 255)
    return out


def build(root: Path) -> Path:
    path = root / "frames_av1_256_20x100"
    if (path / "meta" / "info.json").is_file():
        return path
    rng = np.random.default_rng(0)
    episodes = (
        Episode(
            images={cam: _camera(rng, 100) for cam in CAMERAS},
            state=rng.normal(size=(100, 8)).astype(np.float32),
            action=rng.normal(size=(100, 7)).astype(np.float32),
            task="pick up the bowl",
            success=True,
        )
        for _ in range(20)
    )
    cfg = WriterConfig(version="v3.0", codec="libsvtav1", gop=2, crf=30)
    t0 = time.perf_counter()
    write_lerobot_dataset(path, episodes, cfg, overwrite=True)
    print(f"built {path} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return path


def floor_items_per_s(ds: FrameDataset) -> float:
    t0 = time.perf_counter()
    for key in ds.key_map.cameras:
        with av.open(str(ds.dataset._video_path(key, 0))) as container:
            for frame in container.decode(video=0):
                frame.to_ndarray(format="rgb24")
    return len(ds) / (time.perf_counter() - t0)


def loader_items_per_s(ds: FrameDataset, epochs: int, **kwargs) -> tuple[float, float]:
    """(items/s of the first epoch, worker start-up included; best later epoch: steady state)."""
    loader = make_loader(ds, batch_size=32, **kwargs)
    rates = []
    for _ in range(epochs):
        t0, items = time.perf_counter(), 0
        for batch in loader:
            items += batch["row"].shape[0]
        rates.append(items / (time.perf_counter() - t0))
    return rates[0], max(rates[1:] or rates)


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def memory_over_epochs(ds: FrameDataset, epochs: int) -> list[float]:
    """RSS (main + workers) after each shuffled epoch with persistent workers."""
    loader = make_loader(ds, batch_size=32, shuffle=True, seed=1, num_workers=2)
    out = []
    for _ in range(epochs):
        for _batch in loader:
            pass
        pids = [os.getpid()] + [p.pid for p in multiprocessing.active_children()]
        out.append(rss_mb(pids))
    return out


def lerobot_items_per_s(path: Path, n: int) -> float | None:
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError:
        return None
    ds = LeRobotDataset(repo_id="local/bench", root=path, video_backend="pyav")
    order = np.random.default_rng(0).permutation(len(ds))[:n]
    t0 = time.perf_counter()
    for i in order.tolist():
        ds[i]
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "_data")
    parser.add_argument("--memory_epochs", type=int, default=10)
    args = parser.parse_args()
    path = build(args.data)
    ds = FrameDataset(path)
    floor = floor_items_per_s(ds)
    _, sequential = loader_items_per_s(ds, 3, shuffle=False, num_workers=2)
    random_start, random = loader_items_per_s(ds, 3, shuffle=True, num_workers=2)
    _, random_w0 = loader_items_per_s(ds, 2, shuffle=True, num_workers=0)
    lerobot = lerobot_items_per_s(path, 400)
    memory = memory_over_epochs(ds, args.memory_epochs)
    print(f"floor (sequential PyAV decode): {floor:.0f} items/s")
    print(f"recap sequential (2 workers):  {sequential:.0f} items/s")
    print(
        f"recap random (2 workers):      {random:.0f} items/s "
        f"(first epoch, worker start-up included: {random_start:.0f})"
    )
    print(f"recap random (main process):   {random_w0:.0f} items/s")
    if lerobot is None:
        print("lerobot: not importable here (optional extra `lerobot`); not timed")
    else:
        print(f"lerobot LeRobotDataset random (pyav): {lerobot:.0f} items/s")
    print("RSS after each shuffled epoch (MB): " + " ".join(f"{m:.0f}" for m in memory))
    print(
        f"RESULT: random_items_s={random:.0f} random_first_epoch_items_s={random_start:.0f} "
        f"random_main_process_items_s={random_w0:.0f} "
        f"sequential_items_s={sequential:.0f} floor_items_s={floor:.0f} "
        f"random_to_floor={random / floor:.2f} "
        f"lerobot_items_s={'n/a' if lerobot is None else f'{lerobot:.0f}'} "
        f"rss_first_epoch_mb={memory[0]:.0f} rss_peak_mb={max(memory):.0f} "
        f"rss_last_epoch_mb={memory[-1]:.0f} "
        f'target="{TARGET}" met={"yes" if random >= 400 else "no"}'
    )


if __name__ == "__main__":
    main()
