import numpy as np
import pytest
import torch

from recap.data.lerobot import LIBERO_KEYS, LocalDataset
from recap.data.loader import FrameDataset
from recap.engine.loader import ShardedSequentialBatches, make_loader
from recap.errors import DatasetError
from tests.helpers import FIXTURE_NAMES, fixture_dir


def _reference(name):
    with np.load(fixture_dir(name).parent / f"{name}.reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("workers", [0, 2])
def test_shuffled_loader_returns_lerobot_frames(name, workers):
    ref = _reference(name)
    ds = FrameDataset(fixture_dir(name))
    loader = make_loader(ds, batch_size=5, shuffle=True, seed=3, num_workers=workers)
    seen = []
    for batch in loader:
        rows = batch["row"].numpy()
        seen.append(rows)
        for cam in ds.key_map.cameras:
            got = batch["images"][cam]
            assert got.dtype == torch.uint8
            np.testing.assert_array_equal(got.numpy(), ref[cam][rows])
        np.testing.assert_array_equal(batch["state"].numpy(), ref[ds.key_map.state][rows])
        np.testing.assert_array_equal(batch["action"][:, 0].numpy(), ref[ds.key_map.action][rows])
        np.testing.assert_array_equal(batch["frame_index"].numpy(), ref["frame_index"][rows])
    order = np.concatenate(seen)
    assert sorted(order.tolist()) == list(range(len(ds)))
    assert order.tolist() != list(range(len(ds)))  # really shuffled


def test_same_seed_same_order():
    ds = FrameDataset(fixture_dir("libero_like_v30_images"))

    def order(seed):
        loader = make_loader(ds, 8, shuffle=True, seed=seed, num_workers=0)
        return np.concatenate([b["row"].numpy() for b in loader]).tolist()

    assert order(1) == order(1) and order(1) != order(2)


def test_sequential_pass_decodes_each_frame_once_in_order():
    name = "libero_like_v30_video"
    ref = _reference(name)
    ds = FrameDataset(fixture_dir(name))
    loader = make_loader(ds, batch_size=4, shuffle=False, num_workers=2)
    rows, frames = [], []
    for batch in loader:
        rows.append(batch["row"].numpy())
        frames.append(batch["images"]["observation.images.image"].numpy())
    rows, frames = np.concatenate(rows), np.concatenate(frames)
    assert sorted(rows.tolist()) == list(range(66))  # every frame exactly once
    np.testing.assert_array_equal(frames, ref["observation.images.image"][rows])


def test_sharded_sequential_batches_give_each_worker_a_contiguous_block():
    batches = list(ShardedSequentialBatches(num_items=10, batch_size=2, num_workers=2))
    # worker 0 gets batches 0, 2, 4 (rows 0-4), worker 1 batches 1, 3, 5 (rows 5-9)
    assert batches == [[0, 1], [5, 6], [2, 3], [7, 8], [4], [9]]
    assert len(ShardedSequentialBatches(10, 2, 2)) == 6
    assert list(ShardedSequentialBatches(3, 2, 2)) == [[0], [1, 2]]


def test_action_chunks_stop_at_episode_end():
    ds = FrameDataset(fixture_dir("libero_like_v30_images"), action_horizon=3)
    ref = _reference("libero_like_v30_images")
    item = ds[7]  # episode 0 has 9 frames: rows 7, 8, then past the end
    np.testing.assert_array_equal(item["action"].numpy(), ref["action"][[7, 8, 8]])
    assert item["action_mask"].tolist() == [True, True, False]
    assert ds[0]["action_mask"].tolist() == [True, True, True]


def test_extra_columns_and_rows():
    extra = {"target": np.arange(66, dtype=np.float32) / 10}
    ds = FrameDataset(fixture_dir("libero_like_v30_images"), extra=extra, rows=np.array([5, 60]))
    batch = ds.__getitems__([1, 0])
    assert batch["target"].tolist() == pytest.approx([6.0, 0.5])
    assert batch["row"].tolist() == [60, 5] and len(ds) == 2


def test_missing_camera_is_a_clear_error():
    message = r"camera 'image' not in the dataset.*fix \"cameras\" in the dataset's gin entry"
    with pytest.raises(DatasetError, match=message):
        FrameDataset(fixture_dir("libero_like_v30_images"), key_map=LIBERO_KEYS)


def test_dataset_pickles_without_open_decoders():
    import pickle

    ds = FrameDataset(fixture_dir("rlinf_like_v21_video"))
    ds.__getitems__([0, 1])
    clone = pickle.loads(pickle.dumps(ds))
    assert isinstance(clone.dataset, LocalDataset) and len(clone.dataset._videos) == 0
