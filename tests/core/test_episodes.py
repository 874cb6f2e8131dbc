import numpy as np
import pytest

from recap.core.episodes import FrameIndexError, find_episodes, find_presorted
from recap.errors import RecapError


def test_unsorted_rows_non_contiguous_ids():
    # episode 7 (3 frames) and episode 2 (2 frames), rows shuffled
    ep = np.array([7, 2, 7, 2, 7])
    fr = np.array([2, 1, 0, 0, 1])
    e = find_episodes(ep, fr)
    np.testing.assert_array_equal(e.episode_ids, [2, 7])
    np.testing.assert_array_equal(e.lengths, [2, 3])
    np.testing.assert_array_equal(e.starts, [0, 2])
    np.testing.assert_array_equal(ep[e.order], [2, 2, 7, 7, 7])
    np.testing.assert_array_equal(fr[e.order], [0, 1, 0, 1, 2])
    np.testing.assert_array_equal(e.position, [0, 1, 0, 1, 2])
    np.testing.assert_array_equal(e.end_of, [2, 2, 5, 5, 5])
    np.testing.assert_array_equal(e.is_last, [False, True, False, False, True])
    np.testing.assert_array_equal(e.order, [3, 1, 2, 4, 0])
    np.testing.assert_array_equal(e.unsort(np.arange(5) * 10), [40, 10, 20, 0, 30])


def test_one_frame_episodes():
    e = find_episodes(np.array([5, 3, 4]), np.array([0, 0, 0]))
    np.testing.assert_array_equal(e.lengths, [1, 1, 1])
    np.testing.assert_array_equal(e.is_last, [True, True, True])


def test_empty():
    e = find_episodes(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert e.num_frames == 0 and e.episode_ids.size == 0


def test_duplicate_row_is_an_error_naming_the_row():
    with pytest.raises(
        FrameIndexError, match=r"duplicate row \(episode_index=1, frame_index=1\)"
    ) as e:
        find_episodes(np.array([1, 0, 1, 1]), np.array([1, 0, 0, 1]))
    assert e.value.row == 3  # the second (1, 1), in the caller's row order


def test_gap_is_an_error():
    with pytest.raises(RecapError, match="episode 4 has frame 2 where frame 1 was expected") as e:
        find_episodes(np.array([4, 4, 4]), np.array([3, 0, 2]))
    assert e.value.row == 2


def test_not_starting_at_zero_is_an_error():
    with pytest.raises(RecapError, match="episode 0 has frame 1 where frame 0 was expected"):
        find_episodes(np.array([0, 0]), np.array([1, 2]))


def test_presorted_chunks_agree_with_the_joined_columns():
    # episodes 3 (4 frames), 8 (3 frames), 9 (1 frame); chunk cuts inside and between episodes
    ep = np.array([3, 3, 3, 3, 8, 8, 8, 9])
    fr = np.array([0, 1, 2, 3, 0, 1, 2, 0])
    cuts = [0, 2, 4, 4, 7, 8]
    e = find_presorted(
        [ep[a:b] for a, b in zip(cuts[:-1], cuts[1:])],
        [fr[a:b] for a, b in zip(cuts[:-1], cuts[1:])],
    )
    np.testing.assert_array_equal(e.episode_ids, [3, 8, 9])
    np.testing.assert_array_equal(e.starts, [0, 4, 7])
    np.testing.assert_array_equal(e.lengths, [4, 3, 1])
    np.testing.assert_array_equal(e.position, fr)
    np.testing.assert_array_equal(e.order, np.arange(8))
    assert e.presorted and find_episodes(ep, fr).presorted


@pytest.mark.parametrize(
    "ep, fr",
    [
        ([3, 3, 2, 2], [0, 1, 0, 1]),  # ids decrease
        ([3, 3, 3, 3], [0, 1, 1, 2]),  # repeated frame across the cut
        ([3, 3, 3, 3], [0, 1, 3, 4]),  # gap across the cut
        ([3, 3, 4, 4], [0, 1, 1, 2]),  # episode 4 starts at frame 1
    ],
)
def test_presorted_chunks_reject_what_needs_the_sort(ep, fr):
    ep, fr = np.array(ep), np.array(fr)
    assert find_presorted([ep[:2], ep[2:]], [fr[:2], fr[2:]]) is None
