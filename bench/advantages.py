"""Step 3 math (advantages + thresholds + labels) against merely reading its columns, in one run.

Builds (once, cached under bench/_data/) one parquet file shaped like a Step 3 input: ~1M frames in
4,096 episodes (lengths 150-339, as the LIBERO rollout set), sorted like a returns sidecar, zstd,
with ``episode_index``, ``frame_index`` (int64), ``reward``, ``return`` (float32, as Step 1 writes
them), ``value`` (float64) and ``prompt`` (40 tasks). Then, best of 5, interleaved:
  floor       = pyarrow.parquet.read_table(path, columns=...)
  advantages  = the same read + add_advantages(...) (N = 10, gamma 1, global threshold, labels)
Target (issue): within 2x of reading the columns. The per-task scope is timed and printed too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recap.core import columns as C
from recap.core.advantages import VALUE, LabelOptions, add_advantages
from recap.core.normalize import ReturnRange

TARGET = "within 2x of reading the columns"
COLUMNS = [C.EPISODE_INDEX, C.FRAME_INDEX, C.REWARD, C.RETURN, VALUE, C.PROMPT]
RANGE = ReturnRange(-639.0, 0.0)


def build(root: Path, num_episodes: int, seed: int = 0) -> Path:
    """Write the input parquet once; returns its path."""
    path = root / f"advantages_input_{num_episodes}.parquet"
    if path.is_file():
        return path
    rng = np.random.default_rng(seed)
    lengths = rng.integers(150, 340, size=num_episodes)
    n, ends = int(lengths.sum()), np.cumsum(lengths)
    episode = np.repeat(np.arange(num_episodes, dtype=np.int64), lengths)
    frame = np.arange(n, dtype=np.int64) - np.repeat(ends - lengths, lengths)
    reward = np.full(n, -1.0, np.float32)
    reward[ends - 1] = np.where(rng.random(num_episodes) < 0.5, 0.0, -300.0)
    ret = np.repeat(reward[ends - 1], lengths) - (np.repeat(lengths, lengths) - 1 - frame)
    tasks = pa.array([f"libero task number {i}" for i in range(40)])
    prompt = pa.DictionaryArray.from_arrays(pa.array((episode % 40).astype(np.int32)), tasks)
    table = pa.table(
        {
            C.EPISODE_INDEX: episode,
            C.FRAME_INDEX: frame,
            C.REWARD: reward,
            C.RETURN: ret.astype(np.float32),
            VALUE: rng.uniform(-1.0, 0.0, n),
            C.PROMPT: prompt.cast(pa.string()),
        }
    )
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")
    return path


def read(path: Path) -> pa.Table:
    return pq.read_table(path, columns=COLUMNS)


def advantages(path: Path, scope: str = "global") -> pa.Table:
    return add_advantages(
        read(path),
        return_range=RANGE,
        lookahead=10,
        gamma=1.0,
        labels=LabelOptions(0.3, scope),
        dataset_name="bench",
    )


def best_of(fns: dict, path: Path, repeats: int) -> dict[str, float]:
    """Best wall time of each function, runs interleaved so drift hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(path)
            times[name].append(time.perf_counter() - t0)
    return {name: min(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "_data")
    args = parser.parse_args()
    t0 = time.perf_counter()
    path = build(args.data, args.episodes)
    print(f"input {path} ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    frames = pq.ParquetFile(path).metadata.num_rows
    advantages(path)  # warm-up: page cache, imports
    fns = {"floor": read, "advantages": advantages}
    fns["per_task"] = lambda p: advantages(p, "per_task")
    best = best_of(fns, path, args.repeats)
    per_m = 1e6 / frames
    for name, seconds in best.items():
        print(
            f"{name:>10}: {seconds * 1e3:7.1f} ms  ({seconds * per_m * 1e3:.1f} ms per 1M frames)"
        )
    ratio = best["advantages"] / best["floor"]
    print(f"per_task scope ratio {best['per_task'] / best['floor']:.2f}")
    print(
        f"RESULT: frames={frames} floor_s={best['floor']:.3f} "
        f"advantages_s={best['advantages']:.3f} ratio={ratio:.2f} "
        f'target="{TARGET}" met={"yes" if ratio <= 2.0 else "no"}'
    )


if __name__ == "__main__":
    main()
