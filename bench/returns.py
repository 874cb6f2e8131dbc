"""Step 1 wall time against the time to merely read the columns it needs, in one run.

Builds (once, cached under bench/_data/) a rollout dataset the size of the real LIBERO rollout set:
4,096 episodes, ~1M frames, no cameras (Step 1 never reads them), in both on-disk layouts:
v2.1 (one parquet per episode) and v3.0 (a few large files). Then, best of 3, interleaved:
  floor  = LocalDataset(root).read_columns([episode_index, frame_index, task_index, is_success])
  step1  = compute_returns(...) for that dataset: read + rewards + returns + stats + atomic write
Target (issue): Step 1 within 1.5x of the read floor, on a dataset like the real one. The real
rollout set (LIBERO as converted for RLinf/openpi) is v2.1, so ``met`` is judged on v2.1; the
v3.0 ratio is printed too: there the floor is 4 compressed integer columns from a few files
(~0.13 s) and writing the 1M-row sidecar alone costs ~0.05 s of it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from recap.core import columns as C
from recap.data.lerobot import LocalDataset
from recap.data.lerobot_writer import Episode, WriterConfig, write_lerobot_dataset
from recap.steps.compute_returns import compute_returns

TARGET = "Step 1 within 1.5x of reading its columns"
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
    compute_returns(datasets=[{"name": "bench", "root": str(path)}], tag="bench")


def best_of(fn, path: Path, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(path)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "_data")
    parser.add_argument("--clean", action="store_true", help="delete the built datasets after")
    args = parser.parse_args()
    results = {}
    for version in ("v2.1", "v3.0"):
        path = build(args.data, version, args.episodes)
        frames = LocalDataset(path).num_frames
        step1(path)  # warm-up: file cache, imports
        t_floor = best_of(floor, path, args.repeats)
        t_step = best_of(step1, path, args.repeats)
        results[version] = (frames, t_floor, t_step)
        print(
            f"{version}: {frames} frames  read floor {t_floor * 1e3:.0f} ms  "
            f"Step 1 {t_step * 1e3:.0f} ms  ratio {t_step / t_floor:.2f}"
        )
        if args.clean:
            shutil.rmtree(path)
    frames, f21, s21 = results["v2.1"]
    _, f30, s30 = results["v3.0"]
    print(
        f"RESULT: frames={frames} v21_floor_s={f21:.3f} v21_step1_s={s21:.3f} "
        f"v21_ratio={s21 / f21:.2f} v30_floor_s={f30:.3f} v30_step1_s={s30:.3f} "
        f'v30_ratio={s30 / f30:.2f} target="{TARGET}" met={"yes" if s21 / f21 <= 1.5 else "no"}'
    )


if __name__ == "__main__":
    main()
