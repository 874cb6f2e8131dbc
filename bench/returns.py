"""Step 1 wall time against the time to merely read the columns it needs, in one run.

Builds (once, cached under bench/_data/) a rollout dataset the size of the real LIBERO rollout set:
4,096 episodes, ~1M frames, no cameras (Step 1 never reads them), in both on-disk layouts:
v2.1 (one parquet per episode) and v3.0 (a few large files). Then rounds (``--repeats``, 5, for
v2.1; ``--repeats-v30``, 21, for v3.0, whose 0.25 s rounds vary by +-20% with scheduling: a
median of 5 of them moved between 1.43 and 1.65 from run to run, of 21 it stays within +-0.04),
each timing both back to back:
  floor  = LocalDataset(root).read_columns([episode_index, frame_index, task_index, is_success])
  step1  = compute_returns(...) for that dataset: read + rewards + returns + stats + atomic write
The times printed are the best over the rounds; each ratio is the median over rounds of that
round's Step 1 time over its floor (the cores are shared: load that drifts between rounds
cancels, as in bench/engine.py).
Targets (issue #42): Step 1 within 1.15x of the read floor in v2.1 (the real rollout set's
layout, LIBERO as converted for RLinf/openpi) and within 1.5x in v3.0, where the floor is 4
compressed integer columns from a few files (~0.15 s) and writing the 1M-row sidecar alone
costs ~0.03 s (Step 1 writes it in the background while it checks the layout and sums up).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from recap.core import columns as C
from recap.data.lerobot import LocalDataset
from recap.data.lerobot_writer import Episode, WriterConfig, write_lerobot_dataset
from recap.steps.compute_returns import ReturnsConfig, compute_returns

TARGET = "Step 1 within 1.15x (v2.1) and 1.5x (v3.0) of reading its columns"
LIMITS = {"v2.1": 1.15, "v3.0": 1.5}
TASKS = [f"libero task number {i}" for i in range(40)]


def episodes(num_episodes: int, seed: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(150, 340, size=num_episodes)
    for i, n in enumerate(lengths):
        yield Episode(
            images={},
            state=np.zeros((n, 8), np.float32),
            action=np.zeros((n, 7), np.float32),
            task=TASKS[i % len(TASKS)],
            success=bool(rng.random() < 0.5),
        )


def build(root: Path, version: str, num_episodes: int) -> Path:
    path = root / f"rollout_{version}_{num_episodes}"
    if not (path / "meta" / "info.json").is_file():
        t0 = time.perf_counter()
        cfg = WriterConfig(version=version, naming="libero", max_frames_per_file=300_000)
        write_lerobot_dataset(path, episodes(num_episodes, 0), cfg, overwrite=True)
        print(f"built {path} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return path


def floor(path: Path) -> None:
    with LocalDataset(path) as ds:
        ds.read_columns([C.EPISODE_INDEX, C.FRAME_INDEX, C.TASK_INDEX, C.IS_SUCCESS])


def step1(path: Path) -> None:
    compute_returns(ReturnsConfig(datasets=[{"name": "bench", "root": str(path)}], tag="bench"))


def timed(fn, path: Path) -> float:
    t0 = time.perf_counter()
    fn(path)
    return time.perf_counter() - t0


def interleaved(path: Path, repeats: int) -> tuple[float, float, float]:
    """(best floor, best Step 1, median of the rounds' Step 1 / floor ratios)."""
    rounds = [(timed(floor, path), timed(step1, path)) for _ in range(repeats)]
    ratio = statistics.median(s / f for f, s in rounds)
    return min(f for f, _ in rounds), min(s for _, s in rounds), ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5, help="rounds for v2.1")
    parser.add_argument("--repeats-v30", type=int, default=21, help="rounds for v3.0")
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "_data")
    parser.add_argument("--clean", action="store_true", help="delete the built datasets after")
    args = parser.parse_args()
    results = {}
    for version in ("v2.1", "v3.0"):
        path = build(args.data, version, args.episodes)
        frames = LocalDataset(path).num_frames
        step1(path)  # warm-up: file cache, imports
        repeats = args.repeats if version == "v2.1" else args.repeats_v30
        t_floor, t_step, ratio = interleaved(path, repeats)
        results[version] = (frames, t_floor, t_step, ratio)
        print(
            f"{version}: {frames} frames  read floor {t_floor * 1e3:.0f} ms  "
            f"Step 1 {t_step * 1e3:.0f} ms  ratio {ratio:.2f}"
        )
        if args.clean:
            shutil.rmtree(path)
    frames, f21, s21, r21 = results["v2.1"]
    _, f30, s30, r30 = results["v3.0"]
    met = all(results[v][3] <= limit for v, limit in LIMITS.items())
    print(
        f"RESULT: frames={frames} v21_floor_s={f21:.3f} v21_step1_s={s21:.3f} "
        f"v21_ratio={r21:.2f} v30_floor_s={f30:.3f} v30_step1_s={s30:.3f} "
        f'v30_ratio={r30:.2f} target="{TARGET}" met={"yes" if met else "no"}'
    )


if __name__ == "__main__":
    main()
