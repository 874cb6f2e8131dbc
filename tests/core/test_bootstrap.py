"""The paired two-level bootstrap: literal cases and a hand-computed replicate."""

from __future__ import annotations

import numpy as np
import pytest

from recap.core.bootstrap import paired_bootstrap, rate_interval
from recap.errors import RecapError


def test_identical_and_opposite_arms():
    a = np.array([[1, 0, 1, 1], [0, 0, 1, 0]])
    same = paired_bootstrap(a, a, replicates=500)
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0) and not same.excludes_zero()
    ones, zeros = np.ones((3, 5)), np.zeros((3, 5))
    full = paired_bootstrap(ones, zeros, replicates=500)
    assert (full.mean, full.low, full.high) == (1.0, 1.0, 1.0) and full.excludes_zero()


def test_replicates_resample_seeds_then_paired_episodes():
    """The first replicate recomputed by hand from the same generator draws."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2, size=(3, 6))
    b = rng.integers(0, 2, size=(3, 6))
    draws = np.random.default_rng(11)
    rows = draws.integers(0, 3, size=(1, 3))
    cols = draws.integers(0, 6, size=(1, 3, 6))
    by_hand = np.mean([(a - b)[rows[0, k], cols[0, k]].mean() for k in range(3)])
    one = paired_bootstrap(a, b, replicates=1, seed=11)
    assert one.low == pytest.approx(by_hand) and one.high == pytest.approx(by_hand)
    assert one.mean == pytest.approx((a - b).mean())


def test_one_seed_that_disagrees_widens_the_interval():
    """Seeds agreeing on +0.2 give an interval excluding 0; a third seed at -0.4 does not."""
    episodes = 200
    bc = np.zeros((3, episodes))
    agree = np.zeros((3, episodes))
    agree[:, :40] = 1  # +0.2 on every seed
    split = agree.copy()
    split[2, :40] = 0
    bc_split = bc.copy()
    bc_split[2, :80] = 1  # seed 2: -0.4
    assert paired_bootstrap(agree, bc, replicates=2000).excludes_zero()
    wide = paired_bootstrap(split, bc_split, replicates=2000)
    assert wide.mean == pytest.approx(0.0) and not wide.excludes_zero()
    assert wide.low < -0.3 and wide.high > 0.15


def test_rate_interval_and_shape_errors():
    a = np.zeros((2, 100))
    a[:, :30] = 1
    rate = rate_interval(a, replicates=2000)
    assert rate.mean == pytest.approx(0.3) and 0.2 < rate.low < 0.3 < rate.high < 0.4
    with pytest.raises(
        RecapError, match=r"^paired outcomes differ in shape: \(2, 100\) vs \(2, 50\)"
    ):
        paired_bootstrap(a, a[:, :50])
    with pytest.raises(RecapError, match=r"^a: outcomes must be \[seeds, episodes\]"):
        paired_bootstrap(np.zeros(5), np.zeros(5))
