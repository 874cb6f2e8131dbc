import numpy as np
import pyarrow as pa
import pytest

from recap.core import columns as C
from recap.core.episodes import find_episodes
from recap.core.returns import add_returns, compute_rewards, discounted_returns, return_stats
from recap.errors import RecapError


def _table(episode, frame, success):
    return pa.table(
        {C.EPISODE_INDEX: episode, C.FRAME_INDEX: frame, C.IS_SUCCESS: success},
    )


def test_spec_example():
    # SPEC: success T=6 -> [-5..0]; failure T=5 -> [-304..-300] (gamma 1, failure -300)
    ep = [0] * 6 + [1] * 5
    fr = list(range(6)) + list(range(5))
    ok = [True] * 6 + [False] * 5
    out = add_returns(_table(ep, fr, ok), prompts=pa.array(["a"] * 6 + ["b"] * 5))
    assert out.schema == C.RETURNS_SCHEMA
    assert out.column(C.RETURN).to_pylist() == [-5, -4, -3, -2, -1, 0, -304, -303, -302, -301, -300]
    assert out.column(C.REWARD).to_pylist() == [-1] * 5 + [0] + [-1] * 4 + [-300]
    assert out.column(C.PROMPT).to_pylist() == ["a"] * 6 + ["b"] * 5


def test_unsorted_rows_are_sorted_in_the_sidecar():
    ep = [9, 3, 9, 3, 3]
    fr = [1, 2, 0, 0, 1]
    ok = [False, True, False, True, True]
    out = add_returns(_table(ep, fr, ok), failure_reward=-10.0, prompts=pa.array(list("abcde")))
    assert out.column(C.EPISODE_INDEX).to_pylist() == [3, 3, 3, 9, 9]
    assert out.column(C.FRAME_INDEX).to_pylist() == [0, 1, 2, 0, 1]
    assert out.column(C.RETURN).to_pylist() == [-2, -1, 0, -11, -10]
    assert out.column(C.PROMPT).to_pylist() == ["d", "e", "b", "c", "a"]


def test_one_frame_episodes():
    out = add_returns(_table([0, 1], [0, 0], [True, False]))
    assert out.column(C.RETURN).to_pylist() == [0.0, -300.0]
    assert out.column(C.PROMPT).to_pylist() == ["", ""]


def test_outcome_read_at_last_frame():
    # outcome broadcast per frame; only the last frame counts
    out = add_returns(_table([0, 0, 0], [0, 1, 2], [False, False, True]))
    assert out.column(C.RETURN).to_pylist() == [-2, -1, 0]


@pytest.mark.parametrize(
    "gamma, expected",
    [
        (0.5, [-1 - 0.5 - 0.25 * 10, -1 - 0.5 * 10, -10]),  # failure T=3, failure_reward -10
        (0.9, [-1 - 0.9 - 0.81 * 10, -1 - 0.9 * 10, -10]),
    ],
)
def test_discounted(gamma, expected):
    e = find_episodes(np.zeros(3, dtype=np.int64), np.arange(3))
    r = compute_rewards(e, np.array([False]), -10.0)
    np.testing.assert_allclose(discounted_returns(r, e, gamma), expected, rtol=1e-12)


def test_doubling_scan_matches_reference_on_long_mixed_episodes():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=40)
    ep = np.repeat(np.arange(40), lengths)
    fr = np.concatenate([np.arange(n) for n in lengths])
    e = find_episodes(ep, fr)
    r = rng.normal(size=ep.size)
    gamma = 0.97
    expected = np.empty_like(r)
    for s, n in zip(e.starts, e.lengths):
        acc = 0.0
        for t in range(s + n - 1, s - 1, -1):
            acc = r[t] + gamma * acc
            expected[t] = acc
    np.testing.assert_allclose(discounted_returns(r, e, gamma), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        discounted_returns(r, e, 1.0),
        discounted_returns(r, e, 1.0 - 1e-15),
        atol=1e-8,
    )


def test_bad_gamma():
    e = find_episodes(np.zeros(2, dtype=np.int64), np.arange(2))
    with pytest.raises(RecapError, match=r"gamma: 1.5 is outside \(0, 1\]"):
        discounted_returns(np.zeros(2), e, 1.5)


def test_null_outcome_is_an_error():
    with pytest.raises(RecapError, match="^column 'is_success': row 1 has value null; "):
        add_returns(_table([0, 0], [0, 1], [True, None]))


def test_return_stats():
    s = return_stats(np.array([-5.0, -4.0, -3.0, -2.0, -1.0, 0.0, -304.0]))
    assert s["return_min"] == -304.0 and s["return_max"] == 0.0
    assert s["return_mean"] == pytest.approx(-319 / 7)
