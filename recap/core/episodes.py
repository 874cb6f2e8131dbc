"""Episode structure from the ``episode_index`` / ``frame_index`` columns, vectorized.

Rows may come in any order, episode ids need not be contiguous, and an episode may span files:
everything here works on the whole column at once (one ``np.lexsort``), never per episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
        first: bool[n] whether each sorted row starts an episode.
        position: int64[n] per sorted row, its frame t within the episode (0..T-1).
        presorted: whether the rows came already sorted (``order`` is the identity).
    """

    order: np.ndarray
    episode_ids: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    first: np.ndarray
    position: np.ndarray
    presorted: bool = False

    @cached_property
    def episode_of(self) -> np.ndarray:
        """int64[n] position in ``episode_ids`` of each sorted row."""
        return np.cumsum(self.first, dtype=np.int64) - 1

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
        return Episodes(empty, empty, empty, empty, np.zeros(0, dtype=bool), empty, True)
    step_ep, step_fr = np.diff(episode_index), np.diff(frame_index)
    if _sorted_and_consecutive(step_ep, step_fr) and frame_index[0] == 0:
        # the usual case, checked in one pass: no sort, and only episode starts left to check
        new_episode = np.empty(n, dtype=bool)
        new_episode[0] = True
        np.not_equal(step_ep, 0, out=new_episode[1:])
        starts = np.flatnonzero(new_episode)
        if not frame_index[starts].any():
            order = np.arange(n, dtype=np.int64)
            return Episodes(
                order,
                episode_index[starts],
                starts,
                np.diff(starts, append=n),
                new_episode,
                frame_index,
                presorted=True,
            )
    if not _is_sorted(step_ep, step_fr):
        order = np.lexsort((frame_index, episode_index))
        ep, fr = episode_index[order], frame_index[order]
        step_ep, step_fr = np.diff(ep), np.diff(fr)
    else:
        order = np.arange(n, dtype=np.int64)
        ep, fr = episode_index, frame_index
    new_episode = np.empty(n, dtype=bool)
    new_episode[0] = True
    np.not_equal(step_ep, 0, out=new_episode[1:])
    starts = np.flatnonzero(new_episode)
    # valid iff each episode starts at frame 0 and then steps by exactly 1 (fr is then position)
    bad_step = ~new_episode[1:] & (step_fr != 1)
    bad_start = fr[starts] != 0
    if bad_step.any() or bad_start.any():
        i = _first_bad_row(starts, bad_start, bad_step)
        raise FrameIndexError(_frame_error(ep, fr, new_episode, i), row=int(order[i]))
    lengths = np.diff(starts, append=n)  # rows needed the sort (sorted valid rows returned above)
    return Episodes(order, ep[starts], starts, lengths, new_episode, fr, presorted=False)


def _sorted_and_consecutive(step_ep: np.ndarray, step_fr: np.ndarray) -> bool:
    """Rows sorted by episode with frames stepping by exactly 1 inside each episode."""
    return bool(np.all((step_ep > 0) | ((step_ep == 0) & (step_fr == 1))))


def _is_sorted(step_ep: np.ndarray, step_fr: np.ndarray) -> bool:
    """Whether rows are in strictly increasing (episode, frame) order, from their steps."""
    return bool(np.all((step_ep > 0) | ((step_ep == 0) & (step_fr > 0))))


def _first_bad_row(starts: np.ndarray, bad_start: np.ndarray, bad_step: np.ndarray) -> int:
    """The first sorted row that breaks the 0, 1, 2, ... frame sequence."""
    candidates = [int(starts[np.argmax(bad_start)])] if bad_start.any() else []
    if bad_step.any():
        candidates.append(int(np.argmax(bad_step)) + 1)
    return min(candidates)


def _frame_error(ep: np.ndarray, fr: np.ndarray, new_episode: np.ndarray, i: int) -> str:
    """Explain the sorted row ``i`` whose frame_index breaks its episode's 0..T-1 sequence."""
    if not new_episode[i] and fr[i] == fr[i - 1]:
        return (
            f"episode_index/frame_index: duplicate row (episode_index={ep[i]}, "
            f"frame_index={fr[i]}); remove the extra rows or re-export the dataset"
        )
    expected = 0 if new_episode[i] else fr[i - 1] + 1
    return (
        f"frame_index: episode {ep[i]} has frame {fr[i]} where frame {expected} was expected "
        "(a gap); frames are missing, restore them or drop the episode"
    )
