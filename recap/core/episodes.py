"""Episode structure from the ``episode_index`` / ``frame_index`` columns, vectorized.

Rows may come in any order, episode ids need not be contiguous, and an episode may span files:
everything here works on the whole column at once (one ``np.lexsort``), never per episode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recap.errors import RecapError


class FrameIndexError(RecapError):
    """Duplicate or missing frames; ``row`` is the offending row in the caller's order."""

    def __init__(self, message: str, row: int):
        super().__init__(message)
        self.row = row


@dataclass(frozen=True)
class Episodes:
    """Episode layout of a frame table, in sorted (episode_index, frame_index) order.

    Attributes:
        order: int64[n] row permutation that sorts the table by (episode_index, frame_index).
        episode_ids: int64[E] distinct episode ids, ascending.
        starts: int64[E] first sorted position of each episode.
        lengths: int64[E] number of frames of each episode.
        episode_of: int64[n] position in ``episode_ids`` of each sorted row.
        position: int64[n] per sorted row, its frame t within the episode (0..T-1).
    """

    order: np.ndarray
    episode_ids: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    episode_of: np.ndarray
    position: np.ndarray

    @property
    def num_frames(self) -> int:
        return int(self.order.shape[0])

    @property
    def ends(self) -> np.ndarray:
        """int64[E] one past the last sorted position of each episode."""
        return self.starts + self.lengths

    @property
    def end_of(self) -> np.ndarray:
        """int64[n] per sorted row, one past the last sorted position of its episode."""
        return self.ends[self.episode_of]

    @property
    def is_last(self) -> np.ndarray:
        """bool[n] per sorted row, whether it is its episode's last frame."""
        last = np.zeros(self.num_frames, dtype=bool)
        last[self.ends - 1] = True
        return last

    def unsort(self, sorted_values: np.ndarray) -> np.ndarray:
        """Map values given in sorted order back to the original row order."""
        out = np.empty_like(sorted_values)
        out[self.order] = sorted_values
        return out


def find_episodes(episode_index: np.ndarray, frame_index: np.ndarray) -> Episodes:
    """Sort frames by (episode, frame) and find episode boundaries.

    Args:
        episode_index: int[n] episode id of each row, any order.
        frame_index: int[n] frame number of each row within its episode.

    Raises:
        FrameIndexError: on duplicate (episode_index, frame_index) rows, or when an episode's
            frame_index values are not exactly 0..T-1 (a gap, or a first frame other than 0).
    """
    episode_index = np.asarray(episode_index, dtype=np.int64)
    frame_index = np.asarray(frame_index, dtype=np.int64)
    if episode_index.shape != frame_index.shape or episode_index.ndim != 1:
        raise RecapError("episode_index and frame_index must be 1-D columns of the same length")
    n = episode_index.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Episodes(empty, empty, empty, empty, empty, empty)
    if _is_sorted(episode_index, frame_index):  # the usual case: skip the O(n log n) sort
        order = np.arange(n, dtype=np.int64)
        ep, fr = episode_index, frame_index
    else:
        order = np.lexsort((frame_index, episode_index))
        ep, fr = episode_index[order], frame_index[order]
    new_episode = np.empty(n, dtype=bool)
    new_episode[0] = True
    np.not_equal(ep[1:], ep[:-1], out=new_episode[1:])
    starts = np.flatnonzero(new_episode).astype(np.int64)
    lengths = np.diff(np.append(starts, n)).astype(np.int64)
    episode_of = np.cumsum(new_episode, dtype=np.int64) - 1
    expected = np.arange(n, dtype=np.int64) - starts[episode_of]
    bad = np.flatnonzero(fr != expected)
    if bad.size:
        i = int(bad[0])
        raise FrameIndexError(_frame_error(ep, fr, expected, i), row=int(order[i]))
    return Episodes(order.astype(np.int64), ep[starts], starts, lengths, episode_of, expected)


def _is_sorted(ep: np.ndarray, fr: np.ndarray) -> bool:
    """Whether rows are already in strictly increasing (episode, frame) order."""
    step_ep, step_fr = ep[1:] - ep[:-1], fr[1:] - fr[:-1]
    return bool(np.all((step_ep > 0) | ((step_ep == 0) & (step_fr > 0))))


def _frame_error(ep: np.ndarray, fr: np.ndarray, expected: np.ndarray, i: int) -> str:
    """Explain the first sorted row whose frame_index is not its position in the episode."""
    if i > 0 and ep[i] == ep[i - 1] and fr[i] == fr[i - 1]:
        return (
            f"episode_index/frame_index: duplicate row (episode_index={ep[i]}, "
            f"frame_index={fr[i]}); remove the extra rows or re-export the dataset"
        )
    return (
        f"frame_index: episode {ep[i]} has frame {fr[i]} where frame {expected[i]} was expected "
        "(a gap); frames are missing, restore them or drop the episode"
    )
