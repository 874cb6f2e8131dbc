import numpy as np
import pytest

from recap.core.normalize import (
    ReturnRange,
    normalize_returns,
    normalize_reward_sums,
    task_length_scale,
)
from recap.errors import RecapError


def test_equals_rlinf_step2_when_max_is_zero():
    rng = ReturnRange(-304.0, 0.0)
    g = np.array([-304.0, -152.0, -5.0, 0.0])
    y = normalize_returns(g, rng.offset, rng.scale)
    np.testing.assert_allclose(y, g / 304.0)  # RLinf Step 2: G / |min|
    np.testing.assert_allclose(y, (g + 304.0) / 304.0 - 1.0)  # RLinf Step 3


def test_maps_range_onto_minus_one_zero_when_max_is_not_zero():
    rng = ReturnRange(-310.0, -10.0)
    y = normalize_returns(np.array([-310.0, -160.0, -10.0]), rng.offset, rng.scale)
    np.testing.assert_allclose(y, [-1.0, -0.5, 0.0])


def test_n_step_consistency_gamma_one():
    # norm(G_t) == norm_sum(G_t - G_{t+N}) + norm(G_{t+N}) for any range
    rng = ReturnRange(-310.0, -10.0)
    g_t, g_tn = -200.0, -190.0
    lhs = normalize_returns(g_t, rng.offset, rng.scale)
    rhs = normalize_reward_sums(g_t - g_tn, rng.scale) + normalize_returns(
        g_tn, rng.offset, rng.scale
    )
    assert lhs == pytest.approx(rhs)


def test_union():
    r = ReturnRange.union([ReturnRange(-5, 0), ReturnRange(-304, -300)])
    assert (r.return_min, r.return_max) == (-304, 0)


def test_degenerate_range_is_an_error():
    with pytest.raises(RecapError, match="return_max -5 must exceed return_min -5"):
        ReturnRange(-5, -5)


def test_task_length_scale():
    np.testing.assert_array_equal(
        task_length_scale(np.array([0, 0, 1, 1, 0]), np.array([3, 3, 2, 2, 7])),
        [7, 7, 2, 2, 7],
    )
