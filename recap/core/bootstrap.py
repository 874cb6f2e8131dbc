"""Confidence intervals for closed-loop success rates: a paired, two-level bootstrap.

An arm's outcomes are a bool/0-1 array ``[seeds, episodes]``: one row per training seed, one column
per evaluation episode. Two arms compared here are *paired*: the same seeds index the same data
and the same columns are the same seeded episode layouts. A bootstrap replicate resamples the
seeds with replacement, then, within each drawn seed, the episodes with replacement (the same
episode columns for both arms), and takes the mean difference; the interval is the percentile
interval of the replicates. With few seeds the seed level dominates the width, which is the
point: a difference one seed shows and the others do not gets a wide interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recap.errors import RecapError


@dataclass(frozen=True)
class Interval:
    """Mean difference (a - b) and its percentile interval at ``level``."""

    mean: float
    low: float
    high: float
    level: float

    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


def _check(a: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.size == 0:
        raise RecapError(f"{name}: outcomes must be [seeds, episodes], got shape {a.shape}")
    return a


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, replicates: int = 10_000, seed: int = 0, level: float = 0.95
) -> Interval:
    """``Interval`` of mean(a) - mean(b) for paired outcomes ``[seeds, episodes]``."""
    a, b = _check(a, "a"), _check(b, "b")
    if a.shape != b.shape:
        raise RecapError(f"paired outcomes differ in shape: {a.shape} vs {b.shape}")
    diff = a - b
    seeds, episodes = diff.shape
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, seeds, size=(replicates, seeds))
    cols = rng.integers(0, episodes, size=(replicates, seeds, episodes))
    means = diff[rows[..., None], cols].mean(axis=(1, 2))
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(float(diff.mean()), float(low), float(high), level)


def rate_interval(
    a: np.ndarray, replicates: int = 10_000, seed: int = 0, level: float = 0.95
) -> Interval:
    """``Interval`` of one arm's mean success (the same two-level resampling)."""
    a = _check(a, "a")
    return paired_bootstrap(a, np.zeros_like(a), replicates, seed, level)
