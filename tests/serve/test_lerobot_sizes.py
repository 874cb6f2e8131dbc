"""A π0.5 in LeRobot's layout at sizes of its own, with LeRobot's files only (``config.json``
naming ``gemma_2b`` / ``gemma_300m`` as LeRobot always does, ``model.safetensors``, the pre/post
processor JSON and statistics files; no ``recap_pi05.json``, no ``processor.json``): its sizes
come from the weights' header, ``load_policy`` equals the same weights at explicit sizes, and
``recap-serve`` serves it through openpi's client as written."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from recap.errors import RecapError
from recap.models import checkpoints as ckpt
from recap.models.pi05 import Pi05Config, build_pi05
from tests.serve.conftest import ACTION_Q01, ACTION_Q99, STATE_Q01, STATE_Q99, observation

# neither the real sizes nor the demo's nor the other tests': SigLIP's 16 heads (of 3), text and
# expert 4 heads of 12 over 1 KV head (π0.5's multi-query convention), 3 layers, 21 px images
VISION = {"hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2,
          "num_attention_heads": 16, "image_size": 21, "patch_size": 7}  # fmt: skip
TEXT = {"vocab_size": 40, "hidden_size": 40, "intermediate_size": 72, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 12}  # fmt: skip
EXPERT = {"hidden_size": 24, "intermediate_size": 56, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 12}  # fmt: skip
H, MAX_ACTION_DIM, STEPS = 3, 8, 2
CAMERAS = ("observation.images.base", "observation.images.wrist")
LEROBOT_FILES = [
    "config.json",
    "model.safetensors",
    "policy_postprocessor.json",
    "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
    "policy_preprocessor.json",
    "policy_preprocessor_step_3_normalizer_processor.safetensors",
]


def explicit_config() -> Pi05Config:
    return Pi05Config(vision=dict(VISION), text=dict(TEXT), expert=dict(EXPERT),
                      action_dim=MAX_ACTION_DIM, action_horizon=H, num_steps=STEPS)  # fmt: skip


def stats_tensors(prefix: str, q01: list[float], q99: list[float]) -> dict[str, torch.Tensor]:
    low, high = torch.tensor(q01), torch.tensor(q99)
    moments = {"q01": low, "q99": high, "min": low - 1, "max": high + 1, "mean": (low + high) / 2,
               "std": (high - low) / 4}  # fmt: skip
    return {f"{prefix}.{k}": v.float() for k, v in moments.items()}


def write_lerobot(directory: Path, seed: int = 0) -> Path:
    """The files LeRobot 0.6.1's ``PI05Policy.save_pretrained`` and its processors'
    ``save_pretrained`` write, and only those."""
    torch.manual_seed(seed)
    model = build_pi05(explicit_config())
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    directory.mkdir(parents=True)
    state = ckpt.file_state(model, ckpt.LEROBOT)  # LeRobot keeps both embedding tensors
    state["model." + ckpt.EMBED_KEY] = state["model." + ckpt.LM_HEAD_KEY].clone()
    save_file(state, str(directory / "model.safetensors"))
    size = VISION["image_size"]
    inputs = {c: {"type": "VISUAL", "shape": [3, size, size]} for c in CAMERAS}
    inputs["observation.state"] = {"type": "STATE", "shape": [len(STATE_Q01)]}
    config = {
        "type": "pi05", "n_obs_steps": 1, "input_features": inputs,
        "output_features": {"action": {"type": "ACTION", "shape": [len(ACTION_Q01)]}},
        "device": "cpu", "use_amp": False, "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m", "dtype": "float32", "chunk_size": H,
        "n_action_steps": H, "max_state_dim": 32, "max_action_dim": MAX_ACTION_DIM,
        "num_inference_steps": STEPS, "image_resolution": [size, size], "empty_cameras": 0,
        "tokenizer_max_length": 48,
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config, indent=4))
    state = stats_tensors("observation.state", STATE_Q01, STATE_Q99)
    action = stats_tensors("action", ACTION_Q01, ACTION_Q99)
    normalizer = "policy_preprocessor_step_3_normalizer_processor.safetensors"
    unnormalizer = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    save_file(state | action, str(directory / normalizer))
    save_file(action, str(directory / unnormalizer))
    pre = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "relative_actions_processor", "config": {"enabled": False}},
        {"registry_name": "normalizer_processor", "config": {}, "state_file": normalizer},
        {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}},
        {"registry_name": "tokenizer_processor",
         "config": {"tokenizer_name": "google/paligemma-3b-pt-224", "max_length": 48}},
        {"registry_name": "device_processor", "config": {"device": "cpu"}}]}  # fmt: skip
    post = {"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor", "config": {}, "state_file": unnormalizer},
        {"registry_name": "absolute_actions_processor", "config": {"enabled": False}},
        {"registry_name": "device_processor", "config": {"device": "cpu"}}]}  # fmt: skip
    (directory / "policy_preprocessor.json").write_text(json.dumps(pre, indent=4))
    (directory / "policy_postprocessor.json").write_text(json.dumps(post, indent=4))
    return directory


@pytest.fixture(scope="module")
def lerobot_dir(tmp_path_factory) -> Path:
    directory = write_lerobot(tmp_path_factory.mktemp("lerobot") / "pi05")
    assert sorted(p.name for p in directory.iterdir()) == LEROBOT_FILES
    return directory


def test_load_policy_reads_the_sizes_from_the_weights(lerobot_dir, policy_dir, capsys):
    from recap.loading import load_policy

    model, processor = load_policy(lerobot_dir, tokenizer=policy_dir)
    line = capsys.readouterr().out.splitlines()[0]
    assert line == (
        f"{lerobot_dir / 'model.safetensors'}: sizes from the weights, not config.json's variant "
        "names: vision 48x2 (21 px, patch 7), text 40x3 (vocab 40, 4 heads of 12), expert 24x3, "
        "action_dim 8; KV heads 1 and vision heads 16 as π0.5's (no tensor shows them)"
    )
    config = model.config
    assert {k: config.vision[k] for k in VISION} == VISION
    assert {k: config.text[k] for k in TEXT} == TEXT
    assert config.expert == EXPERT
    assert (config.action_dim, config.action_horizon, config.num_steps) == (MAX_ACTION_DIM, H, 2)
    explicit, _ = load_policy(lerobot_dir, tokenizer=policy_dir,
                              sizes=dataclasses.asdict(explicit_config()))  # fmt: skip
    assert "sizes from the weights" not in capsys.readouterr().out  # sizes passed: as given
    assert (processor.image_size, processor.action_horizon, processor.num_steps) == (21, H, STEPS)
    assert processor.cameras == CAMERAS  # LeRobot's slots: its image features, in order
    g = torch.Generator().manual_seed(1)
    batch = {
        "images": torch.rand(2, 3, 3, 21, 21, generator=g) * 2 - 1,
        "image_masks": torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool),
        "input_ids": torch.tensor([[2, 5, 9, 11], [2, 7, 3, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool),
    }
    noise = torch.randn(2, H, MAX_ACTION_DIM, generator=g)
    with torch.no_grad():
        ours = model.sample_actions(batch, noise=noise)
        theirs = explicit.sample_actions(batch, noise=noise)
    assert ours.shape == (2, H, MAX_ACTION_DIM)
    assert ours.abs().max() > 0.1  # the weights move the actions
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_recap_serve_serves_it_as_written(lerobot_dir, policy_dir):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from recap.serve.load import load_served
    from recap.serve.server import BackgroundServer, ServerConfig

    served = load_served(lerobot_dir, tokenizer=str(policy_dir), device="cpu")
    meta = served.metadata()
    assert (meta["image_size"], meta["action_horizon"], meta["action_dim"]) == (21, H, 5)
    assert (meta["normalization"], meta["num_steps"]) == ("lerobot", STEPS)
    obs = observation(4, noise_seed=4)
    direct = served.infer(dict(obs))["actions"]
    with BackgroundServer(served, ServerConfig(port=0, batch_wait_ms=2.0)) as running:
        client = WebsocketClientPolicy(host="127.0.0.1", port=running.port)
        try:
            actions = client.infer(obs)["actions"]
        finally:
            client._ws.close()  # openpi-client has no close of its own
    assert actions.shape == (H, 5) and np.isfinite(actions).all()
    np.testing.assert_array_equal(actions, direct)
    assert np.abs(actions).max() > 0.1


def test_inconsistent_shapes_are_one_line(tmp_path, lerobot_dir):
    from safetensors.torch import load_file

    bad = tmp_path / "bad"
    bad.mkdir()
    for name in LEROBOT_FILES:
        (bad / name).write_bytes((lerobot_dir / name).read_bytes())
    state = load_file(str(bad / "model.safetensors"))
    key = "model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight"
    state[key] = torch.zeros(36, 48)
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(RecapError) as exc:
        ckpt.read_config(bad)
    assert str(exc.value) == (
        f"{bad / 'model.safetensors'}: paligemma_with_expert.paligemma.model.multi_modal_"
        "projector.linear.weight has shape (36, 48) but paligemma_with_expert.paligemma.model."
        "language_model.embed_tokens.weight makes the text width 40; its tensors disagree, so "
        "no π0.5 config fits them (re-export the checkpoint)"
    )
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(config | {"image_resolution": [28, 28]}))
    save_file(load_file(str(lerobot_dir / "model.safetensors")), str(bad / "model.safetensors"))
    with pytest.raises(RecapError) as exc:
        ckpt.read_config(bad)
    assert str(exc.value) == (
        f"{bad / 'config.json'}: image_size 28, but {bad / 'model.safetensors'} "
        "paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.position_"
        "embedding.weight makes it 21; fix config.json or re-export the checkpoint"
    )


def test_bound_sizes_that_are_not_the_weights_are_one_line(lerobot_dir):
    """gin-bound ``pi05_policy.*`` sizes replace the weights' (``load_served`` passes them to
    ``read_config``); widths that are not the file's are one line before any weight is read."""
    from recap.serve.load import check_sizes

    with pytest.raises(RecapError) as exc:
        check_sizes(lerobot_dir, ckpt.read_config(lerobot_dir, vision=dict(VISION, hidden_size=64)))
    assert str(exc.value) == (
        f"--policy: {lerobot_dir / 'model.safetensors'} has vision hidden_size 48 but its config "
        "says 64; the pi05_policy.* sizes bound by --gin_file do not match them (leave them "
        "unbound to read the sizes from the weights)"
    )
