"""One return normalization, shared by Step 2 (value targets) and Step 3 (advantages).

A normalization is an affine map ``y = (G - offset) / scale``. A return-sized *difference*
(an n-step reward sum) maps with the scale alone: ``s / scale``. The two definitions RLinf uses
(``G / |min|`` in its Step 2 and ``(G - min) / (max - min) - 1`` in its Step 3) agree only when
``max == 0``; the single map here, ``(G - max) / (max - min)``, equals both in that case, takes
``[min, max]`` onto ``[-1, 0]`` in every case, and keeps the n-step advantage consistent:
with ``V_t = norm(G_t)`` and ``gamma = 1``, ``norm(G_t) = norm_sum(sum r) + norm(G_{t+N})``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recap.errors import RecapError

GLOBAL = "global"  # [min, max] over all training datasets -> [-1, 0]
TASK_LENGTH = "task_length"  # paper: G / (maximum episode length of the task)
MODES = (GLOBAL, TASK_LENGTH)


@dataclass(frozen=True)
class ReturnRange:
    """Return range over the training datasets (docs/spec.md §3: min of minima, max of maxima)."""

    return_min: float
    return_max: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.return_min) and np.isfinite(self.return_max)):
            raise RecapError(f"return range [{self.return_min}, {self.return_max}] is not finite")
        if self.return_max <= self.return_min:
            raise RecapError(
                f"return range: return_max {self.return_max} must exceed return_min "
                f"{self.return_min}; the training returns are constant, add datasets with "
                "different outcomes or episode lengths"
            )

    @classmethod
    def union(cls, ranges: list[ReturnRange] | tuple[ReturnRange, ...]) -> ReturnRange:
        """The global range of several datasets: min of mins, max of maxes."""
        if not ranges:
            raise RecapError("return range: no datasets given")
        return cls(min(r.return_min for r in ranges), max(r.return_max for r in ranges))

    @property
    def offset(self) -> float:
        return float(self.return_max)

    @property
    def scale(self) -> float:
        return float(self.return_max - self.return_min)


def normalize_returns(
    returns: np.ndarray, offset: np.ndarray | float, scale: np.ndarray | float
) -> np.ndarray:
    """float[n] returns -> float64[n] ``(G - offset) / scale``, offset and scale per frame."""
    return (np.asarray(returns, dtype=np.float64) - offset) / scale


def normalize_reward_sums(
    sums: np.ndarray, scale: np.ndarray | float, out: np.ndarray | None = None
) -> np.ndarray:
    """float[n] return-sized differences (n-step reward sums) -> float64[n] ``s / scale``
    (written into ``out`` when given)."""
    return np.divide(np.asarray(sums, dtype=np.float64), scale, out=out)


def task_length_scale(task_index: np.ndarray, episode_length: np.ndarray) -> np.ndarray:
    """Paper normalization: per frame, the maximum episode length of its task.

    Args:
        task_index: int[n] task of each frame.
        episode_length: int[n] length of each frame's episode.
    Returns:
        float64[n] scale; use with offset 0.
    """
    task_index = np.asarray(task_index, dtype=np.int64)
    tasks, inverse = np.unique(task_index, return_inverse=True)
    longest = np.zeros(tasks.shape[0], dtype=np.int64)
    np.maximum.at(longest, inverse, np.asarray(episode_length, dtype=np.int64))
    return longest[inverse].astype(np.float64)
