"""One processor per policy: the same frame is the same tensors in training, evaluation,
collection and serving; the processor round-trips through its JSON file; a LeRobot checkpoint
is run with LeRobot's own normalization and sampling steps."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from recap.data.lerobot import detect_key_map
from recap.data.lerobot_writer import Episode, WriterConfig, write_lerobot_dataset
from recap.data.policy_data import PolicyDataset
from recap.data.specs import parse_dataset_specs
from recap.errors import RecapError
from recap.loading import ChunkAdapter, PolicyAdapter, load_policy
from recap.processing.cameras import slot_order
from recap.processing.normalize import QuantileStats, normalize_quantile
from recap.processing.pi05 import Pi05Processor, read_policy_processor
from recap.processing.transforms import load_tokenizer, write_word_tokenizer
from recap.serve.policy import ServedPolicy, ServeSpec
from tests.models.test_pi05 import tiny_model

TASK = "fold the towel"
# an ALOHA-style camera set, written in an order that is not the slot order
CAMERAS = ("cam_right_wrist", "cam_high", "cam_left_wrist")
SLOTS = tuple(f"observation.images.{c}" for c in ("cam_high", "cam_left_wrist", "cam_right_wrist"))


def aloha_dataset(root, frames: int = 5):
    rng = np.random.default_rng(0)
    episodes = []
    for k in range(2):
        images = {c: rng.integers(0, 256, (frames, 20, 24 + 4 * i, 3), dtype=np.uint8)
                  for i, c in enumerate(CAMERAS)}  # fmt: skip
        state = rng.uniform(-1, 2, (frames, 3)).astype(np.float32)
        action = rng.uniform(-1, 1, (frames, 5)).astype(np.float32)
        episodes.append(Episode(images, state, action, TASK, bool(k)))
    write_lerobot_dataset(root, episodes, WriterConfig(image_dtype="image"))
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("processor")
    root = aloha_dataset(tmp / "aloha")
    tokenizer = write_word_tokenizer(tmp / "tok", [f"Task: {TASK}, State: ;\nAction: "])
    specs = parse_dataset_specs([{"name": "aloha", "root": str(root)}], "")
    return PolicyDataset(specs, "", load_tokenizer(tokenizer), image_size=28, action_horizon=4,
                         action_dim=6, conditioning="none")  # fmt: skip


def test_one_camera_rule_for_key_maps_and_observations():
    assert slot_order(["cam_right_wrist", "cam_low", "cam_left_wrist", "cam_high"]) == [
        "cam_low", "cam_high", "cam_left_wrist", "cam_right_wrist"]  # fmt: skip
    features = {f"observation.images.{c}": {"dtype": "video"} for c in CAMERAS}
    features |= {"observation.state": {"dtype": "float32"}, "action": {"dtype": "float32"}}
    # detected key maps and observations without a named slot order follow the same rule
    images = [k for k in features if k.startswith("observation.images.")]
    assert detect_key_map(features).cameras == SLOTS == tuple(slot_order(images))


def test_one_frame_is_the_same_tensors_in_training_evaluation_collection_and_serving(data):
    model = tiny_model(0)
    processor = data.processor.for_model(model.config)
    assert processor.cameras == SLOTS
    item = data.__getitems__([3])
    source, row = data.sources[0], int(data.row_of[3])
    raw = source.frames.__getitems__(np.array([row]))
    images = {k: raw["images"][k].numpy() for k in reversed(SLOTS)}  # any order of keys
    state = raw["state"].numpy()
    obs = {"images": images, "state": state, "task": [TASK]}
    evaluation = PolicyAdapter(model, processor, beta=1.0).batch(obs)
    collection = ChunkAdapter(model, processor, beta=1.0).batch(obs)
    no_names = processor.replace(cameras=())  # slots by the one rule, not by name
    unnamed = PolicyAdapter(model, no_names.use_tokenizer(processor.load_tokenizer())).batch(obs)
    served = ServedPolicy(model, processor, beta=1.0, spec=ServeSpec(image_keys=SLOTS),
                          device="cpu")  # fmt: skip
    request = {k: images[k][0] for k in SLOTS} | {"observation/state": state[0], "prompt": TASK}
    serving = served.model_batch([served.prepare(request)])
    train_ids = item["input_ids"][0, item["attention_mask"][0]].tolist()
    assert len(train_ids) > 4
    for batch in (evaluation, collection, unnamed, serving):
        assert torch.equal(batch["frames"], item["frames"])
        assert torch.equal(batch["image_masks"], item["image_masks"])
        ids, mask = batch["uncond_input_ids"], batch["uncond_attention_mask"]  # one prompt: BC
        assert ids[0, mask[0]].tolist() == train_ids
    # the right wrist (32 px wide, resized to 28 with padding) is in slot 2, the base in slot 0
    from recap.processing.transforms import resize_frames

    right = resize_frames(torch.from_numpy(images[SLOTS[2]]), 28)
    assert torch.equal(item["frames"][0, 2], right[0])
    assert item["image_masks"].tolist() == [[True, True, True]]


def test_the_processor_round_trips_and_refuses_a_missing_or_unknown_field(data, tmp_path):
    processor = data.processor.replace(num_steps=7, vocab_size=40)
    tokenizer = tmp_path / "tok"
    shutil.copytree(processor.tokenizer, tokenizer)
    processor = processor.replace(tokenizer=str(tokenizer))
    path = processor.save(tmp_path)
    raw = json.loads(path.read_text())
    assert raw["tokenizer"] == "tok"  # inside the directory: stored relative to it
    assert (raw["kind"], raw["normalization"], raw["num_steps"], raw["cameras"]) == (
        "pi05", "openpi", 7, list(SLOTS))  # fmt: skip
    again = read_policy_processor(tmp_path)
    assert again == processor and again.tokenizer == str(tmp_path / "tok")
    np.testing.assert_array_equal(again.state_stats.q99, processor.state_stats.q99)
    del raw["action_horizon"]
    with pytest.raises(RecapError) as caught:
        Pi05Processor.from_json(raw, "run/processor.json")
    assert str(caught.value).startswith(
        "run/processor.json: missing field 'action_horizon' (required: tokenizer, "
        "action_horizon, state_stats, action_stats)"
    )
    raw |= {"action_horizon": 4, "prompt_stlye": "openpi"}
    with pytest.raises(RecapError) as caught:
        Pi05Processor.from_json(raw, "run/processor.json")
    assert str(caught.value).startswith(
        "run/processor.json: unknown field 'prompt_stlye'; known: tokenizer, action_horizon"
    )
    with pytest.raises(RecapError, match="^run/processor.json: kind 'value', expected 'pi05'$"):
        Pi05Processor.from_json({**raw, "kind": "value"}, "run/processor.json")


def test_a_tokenizer_path_relative_to_the_working_directory_is_stored_absolute(
    data, tmp_path, monkeypatch
):
    """``make demo`` names its tokenizer ``demo_data/tokenizer`` (relative to where it runs); the
    run directory's processor.json must not read it back relative to the run directory."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(data.processor.tokenizer, tmp_path / "demo_data" / "tokenizer")
    processor = data.processor.replace(tokenizer="demo_data/tokenizer")
    run = tmp_path / "runs" / "policy"
    raw = json.loads(processor.save(run).read_text())
    assert raw["tokenizer"] == str(tmp_path / "demo_data" / "tokenizer")
    assert read_policy_processor(run).tokenizer == str(tmp_path / "demo_data" / "tokenizer")
    monkeypatch.chdir(run)  # read from anywhere
    assert read_policy_processor(".").load_tokenizer() is not None


def test_a_lerobot_checkpoint_runs_with_lerobot_normalization_and_its_steps(data, tmp_path):
    directory = tmp_path / "lerobot"
    model = tiny_model(0)
    model.save_pretrained(directory, layout="lerobot")
    # LeRobot's config.json says 5 sampling steps; the sizes file (a tiny model is no
    # gemma_2b) says the tiny model's 3: LeRobot's own setting is the one it runs with
    config = json.loads((directory / "config.json").read_text())
    assert json.loads((directory / "recap_pi05.json").read_text())["num_steps"] == 3
    (directory / "config.json").write_text(json.dumps(config | {"num_inference_steps": 5}))
    q01, q99 = np.array([-1.0, 0.0, 2.0]), np.array([1.0, 4.0, 2.5])
    stats = {"observation.state.q01": q01, "observation.state.q99": q99,
             "action.q01": np.full(5, -1.0), "action.q99": np.full(5, 1.0)}  # fmt: skip
    save_file(
        {k: torch.tensor(v, dtype=torch.float64) for k, v in stats.items()},
        str(directory / "policy_preprocessor_step_3_normalizer_processor.safetensors"),
    )
    loaded, processor = load_policy(directory, tokenizer=data.processor.tokenizer)
    assert (processor.normalization, processor.prompt_style, processor.num_steps) == (
        "lerobot", "lerobot", 5)  # fmt: skip
    state = np.array([0.5, 1.0, 2.25])
    # LeRobot: 2 (x - q01) / (q99 - q01) - 1, no epsilon
    np.testing.assert_array_equal(processor.normalize_state(state), [0.5, -0.5, 0.0])
    openpi = normalize_quantile(state, QuantileStats(q01, q99))
    assert abs(openpi[2] - 0.0) > 1e-6  # openpi's +1e-6 moves it: another state bin can follow
    served = ServedPolicy(loaded, processor, beta=1.0, device="cpu")
    assert (served.num_steps, served.metadata()["normalization"]) == (5, "lerobot")
