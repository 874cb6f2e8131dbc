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
        sort_order: int64[n] row permutation that sorts the table by (episode_index,
            frame_index), or None when the rows came sorted (``order`` is then built on demand).
        episode_ids: int64[E] distinct episode ids, ascending.
        starts: int64[E] first sorted position of each episode.
        lengths: int64[E] number of frames of each episode.
        first: bool[n] whether each sorted row starts an episode.
        frame_position: int64[n] per sorted row, its frame t within the episode (0..T-1), or
            None to derive it on demand (``position``).
    """

    sort_order: np.ndarray | None
    episode_ids: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    first: np.ndarray
    frame_position: np.ndarray | None

    @property
    def presorted(self) -> bool:
        """Whether the rows came already sorted (``order`` is the identity)."""
        return self.sort_order is None

    @cached_property
    def order(self) -> np.ndarray:
        """int64[n] row permutation into sorted (episode_index, frame_index) order."""
        if self.sort_order is None:
            return np.arange(self.num_frames, dtype=np.int64)
        return self.sort_order

    @cached_property
    def position(self) -> np.ndarray:
        """int64[n] per sorted row, its frame t within the episode (0..T-1)."""
        if self.frame_position is not None:
            return self.frame_position
        return np.arange(self.num_frames, dtype=np.int64) - np.repeat(self.starts, self.lengths)

    @cached_property
    def episode_of(self) -> np.ndarray:
        """int64[n] position in ``episode_ids`` of each sorted row."""
        return np.cumsum(self.first, dtype=np.int64) - 1

    @property
    def num_frames(self) -> int:
        return int(self.first.shape[0])

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
        if self.sort_order is None:
            return sorted_values
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
        return Episodes(None, empty, empty, empty, np.zeros(0, dtype=bool), empty)
    presorted = find_presorted([episode_index], [frame_index])
    if presorted is not None:
        return presorted
    step_ep, step_fr = np.diff(episode_index), np.diff(frame_index)
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
    return Episodes(order, ep[starts], starts, lengths, new_episode, fr)


def find_presorted(
    episode_chunks: list[np.ndarray], frame_chunks: list[np.ndarray]
) -> Episodes | None:
    """The layout of int64 rows given in consecutive chunks (e.g. an Arrow column's), when they
    are already sorted with frames 0..T-1 (the usual case); else None.

    Two boolean passes over the columns, chunk by chunk: no joined copy, no int64 temporaries.
    Episodes start where ``episode_index`` changes; the rows are valid and sorted iff the ids
    increase at every start, each episode's first frame is 0 and its last T - 1, and frames
    strictly increase inside it (T increasing integers from 0 to T - 1 are exactly 0..T-1).
    """
    sizes = np.array([c.shape[0] for c in episode_chunks], dtype=np.int64)
    n = int(sizes.sum())
    new_episode = np.empty(n, dtype=bool)
    start, last_episode, last_frame = 0, None, None
    for episode, frame in zip(episode_chunks, frame_chunks, strict=True):  # chunks, not rows
        m = episode.shape[0]
        if m == 0:
            continue
        first = new_episode[start : start + m]
        first[0] = last_episode is None or episode[0] != last_episode
        if not first[0] and frame[0] <= last_frame:
            return None
        np.not_equal(episode[1:], episode[:-1], out=first[1:])
        increasing = np.greater(frame[1:], frame[:-1])
        increasing |= first[1:]
        if not increasing.all():
            return None
        start, last_episode, last_frame = start + m, episode[-1], frame[-1]
    starts = np.flatnonzero(new_episode)
    lengths = np.diff(starts, append=n)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    ids = _gather(episode_chunks, offsets, starts)
    if not (
        np.all(ids[1:] > _gather(episode_chunks, offsets, starts[1:] - 1))
        and not _gather(frame_chunks, offsets, starts).any()
        and np.array_equal(_gather(frame_chunks, offsets, starts + lengths - 1), lengths - 1)
    ):
        return None
    position = frame_chunks[0] if len(frame_chunks) == 1 else None
    return Episodes(None, ids, starts, lengths, new_episode, position)


def _gather(chunks: list[np.ndarray], offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """int64[k] values at global ``rows`` (ascending) of consecutive ``chunks``."""
    if len(chunks) == 1:
        return chunks[0][rows]
    out = np.empty(rows.shape[0], dtype=np.int64)
    bounds = np.searchsorted(rows, offsets)
    for i, chunk in enumerate(chunks):
        a, b = bounds[i], bounds[i + 1]
        out[a:b] = chunk[rows[a:b] - offsets[i]]
    return out


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
