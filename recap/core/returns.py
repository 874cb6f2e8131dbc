"""Step 1: per-frame rewards and discounted returns (docs/spec.md §2), vectorized over columns.

For an episode of length T: ``r_t = -1`` for ``t < T-1``; ``r_{T-1} = 0`` on success, else
``failure_reward``; ``G_{T-1} = r_{T-1}`` and ``G_t = r_t + gamma * G_{t+1}``.
Example (gamma 1, failure -300): success T=6 -> G = [-5,-4,-3,-2,-1,0];
failure T=5 -> G = [-304,-303,-302,-301,-300].
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from recap.core import columns as C
from recap.core.episodes import Episodes, find_episodes
from recap.errors import RecapError

DEFAULT_GAMMA = 1.0
DEFAULT_FAILURE_REWARD = -300.0
STEP_REWARD = -1.0


def compute_rewards(episodes: Episodes, success: np.ndarray, failure_reward: float) -> np.ndarray:
    """float64[n] rewards in sorted order.

    Args:
        episodes: layout from ``find_episodes``.
        success: bool[E] outcome of each episode.
        failure_reward: terminal reward of a failed episode (RLinf default -300).
    """
    rewards = np.full(episodes.num_frames, STEP_REWARD, dtype=np.float64)
    rewards[episodes.ends - 1] = np.where(np.asarray(success, dtype=bool), 0.0, failure_reward)
    return rewards


def discounted_returns(rewards: np.ndarray, episodes: Episodes, gamma: float) -> np.ndarray:
    """float64[n] ``G_t = sum_{k>=t, same episode} gamma^(k-t) r_k``, rows in sorted order.

    gamma == 1 is a segmented reverse cumulative sum; otherwise a log-step (doubling) scan:
    after step s each G_t covers ``2^s`` rewards clipped at its episode end, so the cost is
    O(n log T_max) whole-column operations and there is no ``gamma^-t`` overflow.
    """
    if not 0.0 < gamma <= 1.0:
        raise RecapError(f"gamma: {gamma} is outside (0, 1]; use a discount in (0, 1]")
    rewards = np.asarray(rewards, dtype=np.float64)
    if gamma == 1.0:
        # worked back to front (contiguous, not through a reversed view: twice as fast)
        backward = np.cumsum(rewards[::-1])  # backward[i] = sum_{k>=n-1-i} over the whole column
        after_episode = np.zeros(episodes.episode_ids.shape[0])  # sum beyond each episode's end
        after_episode[:-1] = backward[backward.shape[0] - 1 - episodes.ends[:-1]]
        backward -= np.repeat(after_episode[::-1], episodes.lengths[::-1])
        return np.ascontiguousarray(backward[::-1])
    g = rewards.copy()
    end_of = episodes.end_of
    idx = np.arange(g.shape[0], dtype=np.int64)
    shift, factor = 1, gamma
    max_len = int(episodes.lengths.max()) if episodes.lengths.size else 0
    while shift < max_len:
        src = idx + shift
        ok = src < end_of
        g[ok] += factor * g[src[ok]]
        shift, factor = shift * 2, factor * factor
    return g


def episode_success(outcome: np.ndarray, episodes: Episodes) -> np.ndarray:
    """bool[E] outcome of each episode, read at its last frame (docs/spec.md §2).

    Args:
        outcome: bool[n] per-frame outcome column in the table's row order (numbers must be
            exactly 0 or 1: ``columns.as_flags``).
    """
    outcome = np.asarray(outcome).reshape(episodes.num_frames, -1)[:, 0]
    if outcome.dtype != bool:  # by value, never truthiness: 'no', NaN and 2 are refused
        outcome = C.as_flags(pa.array(outcome), "outcome")
    return outcome[last_rows(episodes)]


def last_rows(episodes: Episodes) -> np.ndarray:
    """int64[E] the row (in the table's order) of each episode's last frame."""
    ends = episodes.ends - 1
    return ends if episodes.presorted else episodes.order[ends]


def add_returns(
    table: pa.Table,
    *,
    gamma: float = DEFAULT_GAMMA,
    failure_reward: float = DEFAULT_FAILURE_REWARD,
    success: np.ndarray | None = None,
    outcome_column: str = C.IS_SUCCESS,
    prompts: pa.Array | None = None,
    episodes: Episodes | None = None,
) -> pa.Table:
    """The returns sidecar table (``columns.RETURNS_SCHEMA``) for one dataset's frames.

    Args:
        table: frames with ``episode_index`` and ``frame_index`` (any order), and the outcome
            column unless ``success`` is given.
        success: bool[E] per-episode outcome in ascending episode order; ``None`` reads
            ``outcome_column`` (an sft dataset passes all True).
        episodes: the table's layout when the caller already has it (``find_episodes``).
        prompts: string[n] per row, in the table's row order (e.g. the task text, dictionary
            encoded); empty strings when ``None``.
    Returns:
        Table sorted by (episode_index, frame_index) with return/reward float32 (the
        ``RETURNS_SCHEMA``, except that ``prompt`` stays dictionary-encoded as given).
    """
    if episodes is None:
        episodes = find_episodes(
            table.column(C.EPISODE_INDEX).to_numpy(), table.column(C.FRAME_INDEX).to_numpy()
        )
    if success is None:
        column = table.column(outcome_column)
        if pa.types.is_boolean(column.type) and column.null_count == 0:  # nothing to refuse
            rows = pa.array(last_rows(episodes))
            success = column.take(rows).to_numpy(zero_copy_only=False)
        else:
            flags = C.as_flags(column, outcome_column)  # nulls, 2, 'no' refused
            success = episode_success(flags, episodes)
    rewards = compute_rewards(episodes, success, failure_reward)
    returns = discounted_returns(rewards, episodes, gamma)
    if prompts is None:
        prompt_col = pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(episodes.num_frames, dtype=np.int32)), pa.array([""])
        )
    elif episodes.presorted or _is_identity(episodes.order):
        prompt_col = prompts
    else:
        prompt_col = prompts.take(pa.array(episodes.order))
    schema = C.RETURNS_SCHEMA.set(
        C.RETURNS_SCHEMA.get_field_index(C.PROMPT), pa.field(C.PROMPT, prompt_col.type)
    )
    return pa.Table.from_arrays(
        [
            pa.array(np.repeat(episodes.episode_ids, episodes.lengths)),
            pa.array(episodes.position),
            pa.array(returns.astype(np.float32)),
            pa.array(rewards.astype(np.float32)),
            prompt_col,
        ],
        schema=schema,
    )


def _is_identity(order: np.ndarray) -> bool:
    return bool(np.array_equal(order, np.arange(order.shape[0])))


def return_stats(returns: np.ndarray) -> dict[str, float]:
    """min, max, mean, std (population) of float[n] returns."""
    r = np.asarray(returns, dtype=np.float64)
    if r.size == 0:
        raise RecapError("return: no frames")
    return {
        "return_min": float(r.min()),
        "return_max": float(r.max()),
        "return_mean": float(r.mean()),
        "return_std": float(r.std()),
    }
