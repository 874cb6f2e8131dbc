"""``recap-import export-lerobot-policy`` (``recap.interop.lerobot``) without the library: the files
LeRobot's ``PI05Policy.from_pretrained`` reads (``make test-lerobot`` loads them in LeRobot)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModel

from recap.commands.import_rlinf import main as recap_import
from recap.data.conditioning import QuantileStats
from recap.models import checkpoints as ckpt
from recap.models import pi05_files
from recap.models.pi05_layers import VisionTower
from tests.models.test_pi05 import A, tiny_batch, tiny_config, tiny_model

CAMERAS = ["observation.images.image", "observation.images.wrist_image"]


@pytest.fixture
def named_tiny(monkeypatch):
    """The tiny sizes named as LeRobot's variants (LeRobot accepts no other names)."""
    config = tiny_config()
    monkeypatch.setattr(
        pi05_files, "VARIANTS", {"gemma_2b": config.text, "gemma_300m": config.expert}
    )


def _export(source, out, *extra):
    argv = ["export-lerobot-policy", str(source), "--out", str(out), "--camera", CAMERAS[0],
            "--camera", CAMERAS[1], "--state-dim", "8", "--action-dim", "5", *extra]  # fmt: skip
    return recap_import(argv)


def test_export_writes_lerobot_keys_config_and_stats(named_tiny, tmp_path, capsys):
    model = tiny_model()
    ckpt.save_pi05(model, tmp_path / "src")
    stats = {k: QuantileStats(np.zeros(n), np.ones(n)) for k, n in (("state", 8), ("action", 5))}
    ckpt.write_norm_stats(tmp_path / "src", "libero", stats)
    assert _export(tmp_path / "src", tmp_path / "out") == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'out'}\n"
    size = model.config.vision["image_size"]
    assert json.loads((tmp_path / "out/config.json").read_text()) == {
        "type": "pi05", "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m",
        "chunk_size": model.config.action_horizon, "n_action_steps": model.config.action_horizon,
        "max_action_dim": A, "num_inference_steps": 3, "image_resolution": [size, size],
        "input_features": {
            CAMERAS[0]: {"type": "VISUAL", "shape": [3, size, size]},
            CAMERAS[1]: {"type": "VISUAL", "shape": [3, size, size]},
            "observation.state": {"type": "STATE", "shape": [8]},
        },
        "output_features": {"action": {"type": "ACTION", "shape": [5]}},
        "max_state_dim": 32,
    }  # fmt: skip
    source = load_file(str(tmp_path / "src/model.safetensors"))
    written = load_file(str(tmp_path / "out/model.safetensors"))
    assert sorted(written) == sorted("model." + k for k in source)
    assert all(torch.equal(written["model." + k], v) for k, v in source.items())
    assert (tmp_path / "out/assets/libero/norm_stats.json").read_text() == (
        tmp_path / "src/assets/libero/norm_stats.json"
    ).read_text()
    back = ckpt.load_pi05(tmp_path / "out").eval()  # recap reads its export back exactly
    batch, noise = tiny_batch(), torch.randn(3, model.config.action_horizon, A)
    assert torch.equal(back.sample_actions(batch, noise), model.sample_actions(batch, noise))


def test_a_recap_policy_exported_to_lerobot_keeps_its_processor(named_tiny, tmp_path):
    """A RECAP run's processor travels with the export (LeRobot's own default, the plain prompt,
    would drop its advantage label), with the exported cameras as its slots."""
    from recap.loading import load_policy
    from recap.processing.pi05 import Pi05Processor

    model = tiny_model()
    ckpt.save_pi05(model, tmp_path / "src")
    stats = {k: QuantileStats(np.zeros(n), np.ones(n)) for k, n in (("state", 8), ("action", 5))}
    processor = Pi05Processor(tokenizer="/nowhere/tokenizer.model", action_horizon=4,
                              state_stats=stats["state"], action_stats=stats["action"],
                              action_dim=A, conditioning="paper", label_position="action",
                              cameras=("image", "wrist_image"))  # fmt: skip
    processor.for_model(model.config).save(tmp_path / "src")
    assert _export(tmp_path / "src", tmp_path / "out") == 0
    _, loaded = load_policy(tmp_path / "out")
    assert (loaded.conditioning, loaded.label_position, loaded.normalization) == (
        "paper",
        "action",
        "openpi",
    )
    assert loaded.cameras == tuple(CAMERAS)
    assert loaded.tokenizer == "/nowhere/tokenizer.model"


def test_export_refuses_sizes_lerobot_cannot_name(tmp_path, capsys):
    ckpt.save_pi05(tiny_model(), tmp_path / "src")
    assert _export(tmp_path / "src", tmp_path / "out") == 2
    assert capsys.readouterr().err == (
        f"recap-import: {tmp_path / 'src'}: sizes are variants ('custom', 'custom'); LeRobot "
        "0.6.1's PI05Config accepts only ('gemma_2b', 'gemma_300m') (PaliGemma 2B + Gemma 300M)\n"
    )
    assert not (tmp_path / "out").exists()


def test_export_needs_weights(tmp_path, capsys):
    assert _export(tmp_path / "nothing", tmp_path / "out") == 2
    assert capsys.readouterr().err == (
        f"recap-import: {tmp_path / 'nothing/model.safetensors'}: file not found; pass a π0.5 "
        "directory holding model.safetensors (recap, openpi or LeRobot)\n"
    )


def test_vision_tower_keys_are_openpis_when_siglip_nests_its_layers():
    """transformers 5.5.4 (LeRobot's) nests SiglipVisionModel's layers under ``vision_model``."""
    siglip = AutoModel.from_config(tiny_config().vision_config())

    class Nested(nn.Module):  # the older layout, around this release's flat model
        def __init__(self):
            super().__init__()
            self.vision_model = siglip

    flat, nested = VisionTower(siglip), VisionTower(Nested())
    assert list(nested.state_dict()) == list(flat.state_dict())
    assert next(iter(flat.state_dict())) == "vision_model.embeddings.patch_embedding.weight"
