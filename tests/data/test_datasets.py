import gin
import numpy as np
import pytest
import torch

from recap.core.normalize import ReturnRange
from recap.data.datasets import ValueDataConfig, ValueDataset, _virtual_index, training_return_range
from recap.data.lerobot import LIBERO_KEYS
from recap.data.specs import parse_dataset_specs
from recap.data.transforms import load_tokenizer, tokenize_prompts, write_word_tokenizer
from recap.errors import DatasetError, RecapError
from recap.steps.compute_returns import ReturnsConfig, compute_returns
from tests.helpers import FIXTURES, copy_fixture

TASKS = ["Task: put the black bowl on the plate.", "Task: open the top drawer of the cabinet."]


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture
def data(tmp_path):
    """The LeRobot-written v3.0 image fixture (lengths 9,12,7,15,10,13; T,T,F,T,F,T) with
    Step 1 returns (range [-309, 0]) and a word tokenizer."""
    root = copy_fixture("libero_like_v30_images", tmp_path)
    compute_returns(ReturnsConfig(datasets=[{"name": "r", "root": str(root)}], tag="t"))
    tok = write_word_tokenizer(tmp_path / "tok", TASKS)
    return root, load_tokenizer(tok), tok


def _dataset(root, tok, **kw):
    specs = parse_dataset_specs([{"name": "r", "root": str(root)}])
    return ValueDataset(specs, "t", training_return_range(specs, "t"), tok, 32, 16, **kw)


def test_targets_frames_masks_and_tokens(data):
    root, tok, _ = data
    ds = _dataset(root, tok)
    assert len(ds) == 66 and ds.return_range == ReturnRange(-309.0, 0.0)
    batch = ds.__getitems__([0, 8, 21, 43])
    # ep0 frame 0: G=-8; ep0 last: 0; ep2 (failure) frame 0: -306; ep4 (failure) frame 0: -309
    assert batch["target"].tolist() == pytest.approx([-8 / 309, 0.0, -306 / 309, -1.0])
    assert batch["frames"].dtype == torch.uint8 and batch["frames"].shape == (4, 3, 32, 32, 3)
    assert batch["image_masks"].tolist() == [[True, True, False]] * 4
    rows = [0, 8, 21, 43]
    with np.load(FIXTURES / "libero_like_v30_images.reference.npz") as z:
        for slot, key in enumerate(["observation.images.image", "observation.images.wrist_image"]):
            np.testing.assert_array_equal(batch["frames"][:, slot].numpy(), z[key][rows])
    assert not batch["frames"][:, 2].any()
    # both prompts are bos + 10 words; padding to max_length 16 is cut to the batch's longest
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert mask.sum(1).tolist() == [11, 11, 11, 11] and ids.shape == (4, 11)
    assert ids[0, 0] == tok.bos_token_id
    assert tok.decode(ids[0, 1:]) == "task : put the black bowl on the plate ."
    assert tok.decode(ids[3, 1:]) == "task : open the top drawer of the cabinet ."
    short = ds.__getitems__([9])  # one prompt alone: no padding column at all
    assert short["attention_mask"].all()


def test_resize_keeps_uint8(data):
    root, tok, _ = data
    batch = _dataset(root, tok).__getitems__([3])
    assert batch["frames"].shape == (1, 3, 32, 32, 3)
    ds = ValueDataset(
        parse_dataset_specs([{"name": "r", "root": str(root)}]), "t", ReturnRange(-309, 0),
        tok, 64,
    )  # fmt: skip
    big = ds.__getitems__([3])["frames"]
    assert big.shape == (1, 3, 64, 64, 3) and big.dtype == torch.uint8
    assert int(big[0, 0].float().mean()) == pytest.approx(int(batch["frames"][0, 0].float().mean()),
                                                          abs=3)  # fmt: skip


def test_virtual_index_mixing():
    src, rows = _virtual_index([4, 10], [1.0, 1.0], "proportional", seed=0)
    assert np.bincount(src).tolist() == [4, 10]
    src, rows = _virtual_index([4, 10], [1.0, 1.0], "balanced", seed=0)
    assert np.bincount(src).tolist() == [10, 10]
    assert sorted(np.bincount(rows[src == 0]).tolist()) == [2, 2, 3, 3]  # 2 passes + 2 extra
    src, rows = _virtual_index([4, 10], [2.0, 0.5], "proportional", seed=0)
    assert np.bincount(src).tolist() == [8, 5]
    again = _virtual_index([4, 10], [2.0, 0.5], "proportional", seed=0)
    assert np.array_equal(rows, again[1])


def test_eval_split_uses_the_training_range(data, tmp_path):
    root, _, tok_dir = data
    other = copy_fixture("rlinf_like_v21_video", tmp_path)
    compute_returns(
        ReturnsConfig(
            datasets=[{"name": "e", "root": str(other), "failure_reward": -50.0}], tag="t"
        )
    )
    ds = ValueDataConfig(
        split="eval", datasets=[{"name": "r", "root": str(root)}],
        eval_datasets=[{"name": "e", "root": str(other)}], returns_tag="t",
        tokenizer_path=str(tok_dir), image_size=32,
    ).build()  # fmt: skip
    assert ds.return_range == ReturnRange(-309.0, 0.0)
    assert ds.sources[0].spec.name == "e" and len(ds) == 71


def test_missing_returns_tag_names_dataset_and_tags_found(data):
    root, tok, _ = data
    specs = parse_dataset_specs([{"name": "r", "root": str(root)}])
    with pytest.raises(DatasetError) as err:
        ValueDataset(specs, "nope", ReturnRange(-1, 0), tok, 32)
    message = err.value.message
    assert str(root / "meta" / "returns_nope.parquet") in message
    assert "tags found: 't'" in message and "run Step 1" in message


def test_missing_camera_is_an_error(data):
    root, tok, _ = data
    specs = parse_dataset_specs([{"name": "r", "root": str(root)}])
    with pytest.raises(DatasetError, match="camera 'image' not in the dataset"):
        ValueDataset(specs, "t", ReturnRange(-1, 0), tok, 32, key_maps={"r": LIBERO_KEYS})


def test_bad_mixing_and_split(data):
    root, tok, tok_dir = data
    specs = parse_dataset_specs([{"name": "r", "root": str(root)}])
    with pytest.raises(RecapError, match="mixing: 'even' is not one of"):
        ValueDataset(specs, "t", ReturnRange(-1, 0), tok, 32, mixing="even")
    with pytest.raises(RecapError, match="split: 'test'"):
        ValueDataConfig(split="test", datasets=[], tokenizer_path=str(tok_dir)).build()


def test_a_max_length_that_would_cut_a_prompt_is_refused_before_training(data):
    """Both tasks' prompts take 11 tokens (BOS and 10 words): max_length 10 would cut a word of
    each; the data refuses it in one line naming the binding, and 11 is enough."""
    root, tok, _ = data
    specs = parse_dataset_specs([{"name": "r", "root": str(root)}])
    rng = training_return_range(specs, "t")
    with pytest.raises(RecapError) as err:
        ValueDataset(specs, "t", rng, tok, 32, 10)
    assert str(err.value) == (
        "value_data.max_length = 10: the prompt 'Task: put the black bowl on the plate.' takes "
        "11 tokens (BOS included); bind value_data.max_length = 11 or more"
    )
    with pytest.raises(RecapError, match=r"^compute_advantages.max_length = 4: the prompt "):
        ValueDataset(specs, "t", rng, tok, 32, 4,
                     max_length_binding="compute_advantages.max_length")  # fmt: skip
    assert ValueDataset(specs, "t", rng, tok, 32, 11).prompt_ids.shape == (2, 11)
    # below the data, the tokenizer refuses to cut as well
    with pytest.raises(RecapError) as err:
        tokenize_prompts(tok, ["Task: open the top drawer of the cabinet."], 10)
    assert str(err.value) == ("prompt 'Task: open the top drawer of the cabinet.': 11 tokens (BOS "
                              "included), more than max_length 10")  # fmt: skip
