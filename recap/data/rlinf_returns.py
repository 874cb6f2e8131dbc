"""RLinf's Step 1 returns sidecar, read as recap's (``recap.data.sidecars.read_returns``).

RLinf's Step 1 writes ``meta/returns_{tag}.parquet`` with recap's columns but no
``meta/returns_{tag}.json`` (its statistics go into ``meta/stats.json``), with rows possibly in
completion order, and it finds episode boundaries per data file, so an episode spanning two
LeRobot v3.0 data files comes out as two episodes. ``returns_statistics`` checks such a sidecar
against the dataset (every frame exactly once, no episode split) and derives what recap's Step 1
records: return min/max/mean/std, frame/episode/success counts, the longest episode per task,
the failure reward and gamma (inferred from ``G_t = r_t + gamma * G_{t+1}``; 1.0 when no frame
determines it, said in ``gamma_source``). Everything is whole-column numpy.

It lives in ``recap.data`` (not ``recap.interop``, which also maps model weights) so that reading
a sidecar never reaches ``recap.models`` (``.importlinter``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recap import __version__
from recap.core import columns as C
from recap.core.episodes import FrameIndexError, find_episodes
from recap.core.returns import STEP_REWARD, return_stats
from recap.errors import DatasetError, located

RLINF = "rlinf"
# |G_t - r_t - gamma G_{t+1}| allowed, relative to max(1, |G_t|): returns are stored float32
RECURRENCE_TOLERANCE = 1e-4
SPLIT_FIX = (
    "RLinf's Step 1 finds episode boundaries per data file, so an episode spanning two data "
    "files was split in two; recompute the returns with recap's Step 1 (scripts/compute_returns.py)"
)


def returns_statistics(
    root: str | os.PathLike, path: Path, table: pa.Table
) -> tuple[pa.Table, dict]:
    """``(table sorted by (episode_index, frame_index), stats)`` of a returns sidecar without
    its JSON (RLinf's Step 1), checked against the dataset at ``root``; one-line DatasetError
    naming ``path`` when a frame is missing or extra, or an episode was split."""
    from recap.data.lerobot import LocalDataset

    with LocalDataset(root) as ds:
        frames = ds.read_columns([C.EPISODE_INDEX, C.FRAME_INDEX], check_frames=False)
        data = ds.check_frames(frames)
    ep = table.column(C.EPISODE_INDEX).to_numpy()
    fr = table.column(C.FRAME_INDEX).to_numpy()
    try:
        side = find_episodes(ep, fr)
    except FrameIndexError as exc:
        raise DatasetError(located(path, f"{exc.message}; {SPLIT_FIX}")) from exc
    if not side.presorted:
        table = table.take(pa.array(side.order))
    _check_frames(path, side, data)
    reward = table.column(C.REWARD).to_numpy().astype(np.float64)
    ret = table.column(C.RETURN).to_numpy().astype(np.float64)
    last = side.is_last
    inner = ~last
    early_end = inner & (reward != STEP_REWARD)
    if early_end.any():
        i = int(np.argmax(early_end))
        _split(path, side, i, f"reward {reward[i]:g} (an episode end) before its last frame")
    end_bad = last & ~_close(ret, reward)
    if end_bad.any():
        i = int(np.argmax(end_bad))
        raise DatasetError(located(path, f"episode {int(side.episode_ids[side.episode_of[i]])} "
                                         f"frame {int(side.position[i])}: return {ret[i]:g} at "
                                         f"the last frame is not its reward {reward[i]:g}; the "
                                         "sidecar is corrupt, recompute it"))  # fmt: skip
    gamma, source = infer_gamma(ret, reward, inner)
    nxt = np.append(ret[1:], 0.0)
    bad = inner & ~_close(ret, reward + gamma * nxt)
    if bad.any():
        i = int(np.argmax(bad))
        _split(path, side, i, f"return {ret[i]:g} does not continue into frame "
                              f"{int(side.position[i]) + 1} (return {nxt[i]:g}) with gamma "
                              f"{gamma:g}")  # fmt: skip
    return table, _stats(Path(root), table, side, reward, ret, gamma, source)


def _close(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) <= RECURRENCE_TOLERANCE * np.maximum(1.0, np.abs(a))


def _split(path: Path, side, i: int, what: str) -> None:
    e = int(side.episode_ids[side.episode_of[i]])
    raise DatasetError(located(path, f"episode {e} frame {int(side.position[i])}: {what}; "
                                     f"{SPLIT_FIX}"))  # fmt: skip


def _check_frames(path: Path, side, data) -> None:
    """The sidecar's sorted keys are exactly the dataset's."""
    s_ep = np.repeat(side.episode_ids, side.lengths)
    d_ep = np.repeat(data.episode_ids, data.lengths)
    if s_ep.size == d_ep.size and np.array_equal(s_ep, d_ep):
        return  # same episodes, each 0..T-1 of the same length
    d_len = dict(zip(data.episode_ids.tolist(), data.lengths.tolist()))
    s_len = dict(zip(side.episode_ids.tolist(), side.lengths.tolist()))
    for e in sorted(set(d_len) | set(s_len)):
        has, want = s_len.get(e, 0), d_len.get(e, 0)
        if has != want:
            what = (f"no rows for frames {has}..{want - 1} of episode {e}" if has < want
                    else f"rows for frames {want}..{has - 1} of episode {e}, which the dataset "
                    "lacks")  # fmt: skip
            raise DatasetError(located(path, f"{what} ({side.num_frames} rows for "
                                             f"{data.num_frames} frames); the sidecar was "
                                             "computed from other data, recompute it"))  # fmt: skip


def infer_gamma(ret: np.ndarray, reward: np.ndarray, inner: np.ndarray) -> tuple[float, str]:
    """``(gamma, how)`` from float64[n] sorted returns/rewards: least squares over the frames
    before an episode's last with a nonzero next return, rounded to 6 decimals; 1.0 when there
    are none (``how`` says which)."""
    nxt = np.append(ret[1:], 0.0)
    use = inner & (nxt != 0.0)
    if not use.any():
        return 1.0, "default 1.0 (no frame determines it)"
    g = float(np.dot(ret[use] - reward[use], nxt[use]) / np.dot(nxt[use], nxt[use]))
    return round(g, 6), f"inferred from {int(use.sum())} frames"


def _stats(root: Path, table, side, reward, ret, gamma: float, gamma_source: str) -> dict:
    last_reward = reward[side.ends - 1]
    failures = np.unique(last_reward[last_reward != 0.0])
    prompts = pc.dictionary_encode(table.column(C.PROMPT)).combine_chunks()
    by_episode = prompts.indices.to_numpy()[side.ends - 1]
    longest = np.zeros(len(prompts.dictionary), dtype=np.int64)
    np.maximum.at(longest, by_episode, side.lengths)
    seen = np.zeros(len(prompts.dictionary), dtype=bool)
    seen[by_episode] = True
    names = prompts.dictionary.to_pylist()
    return {
        **return_stats(ret),
        "dataset_name": root.name,
        "dataset_type": None,
        "gamma": gamma,
        "gamma_source": gamma_source,
        "failure_reward": float(failures[0]) if failures.size == 1 else None,
        "outcome_column": None,
        "num_frames": int(side.num_frames),
        "num_episodes": int(side.episode_ids.size),
        "num_successes": int(np.sum(last_reward == 0.0)),
        "task_max_episode_length": {names[i]: int(longest[i]) for i in np.flatnonzero(seen)},
        "recap_version": __version__,
        "format": RLINF,
    }
