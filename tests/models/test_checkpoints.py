"""π0.5 checkpoints: openpi key names, openpi/LeRobot round trips, strict errors, configs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from recap.errors import RecapError
from recap.models import checkpoints as ckpt
from recap.models.pi05 import Pi05Config, pi05_policy
from tests.models.test_pi05 import A, H, tiny_batch, tiny_config, tiny_model

PG = "paligemma_with_expert.paligemma."
EX = "paligemma_with_expert.gemma_expert.model."


def openpi_keys(vision_layers: int = 1, layers: int = 2) -> set[str]:
    """The keys of an openpi ``PI0Pytorch(pi05=True)`` file (``save_model``: ``lm_head`` kept
    for the tied embedding), spelled out from openpi's converter."""
    siglip = PG + "model.vision_tower.vision_model."
    keys = {PG + "lm_head.weight", "paligemma_with_expert.gemma_expert.lm_head.weight"}
    keys |= {
        siglip + f"embeddings.{n}"
        for n in ("patch_embedding.weight", "patch_embedding.bias", "position_embedding.weight")
    }
    keys |= {siglip + f"post_layernorm.{p}" for p in ("weight", "bias")}
    keys |= {PG + f"model.multi_modal_projector.linear.{p}" for p in ("weight", "bias")}
    for i in range(vision_layers):
        names = "layer_norm1 layer_norm2 mlp.fc1 mlp.fc2 self_attn.q_proj self_attn.k_proj"
        for name in (*names.split(), "self_attn.v_proj", "self_attn.out_proj"):
            keys |= {siglip + f"encoder.layers.{i}.{name}.{p}" for p in ("weight", "bias")}
    projections = [f"self_attn.{n}_proj" for n in "qkvo"] + [
        f"mlp.{n}_proj" for n in ("gate", "up", "down")
    ]
    for i in range(layers):
        lm = PG + f"model.language_model.layers.{i}."
        keys |= {lm + f"{n}.weight" for n in projections}
        keys |= {lm + "input_layernorm.weight", lm + "post_attention_layernorm.weight"}
        keys |= {EX + f"layers.{i}.{n}.weight" for n in projections}
        keys |= {
            EX + f"layers.{i}.{n}.dense.{p}"
            for n in ("input_layernorm", "post_attention_layernorm")
            for p in ("weight", "bias")
        }
    keys |= {
        PG + "model.language_model.norm.weight",
        EX + "norm.dense.weight",
        EX + "norm.dense.bias",
    }
    keys |= {
        f"{n}.{p}"
        for n in ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out")
        for p in ("weight", "bias")
    }
    return keys


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def sample(model, batch=None) -> torch.Tensor:
    batch = batch or tiny_batch()
    noise = torch.randn(3, H, A, generator=torch.Generator().manual_seed(0))
    return model.sample_actions(batch, noise, beta=1.5)


@pytest.mark.parametrize("layout", ["openpi", "lerobot"])
def test_round_trip(tmp_path, model, layout):
    model.save_pretrained(tmp_path, layout=layout)
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    prefix = "model." if layout == "lerobot" else ""
    assert keys == {prefix + k for k in openpi_keys()}  # exactly openpi's names
    assert {k.removeprefix(prefix) for k in keys} - {ckpt.LM_HEAD_KEY, ckpt.EXPERT_LM_HEAD_KEY} == (
        set(model.state_dict()) - {ckpt.EMBED_KEY}
    )
    loaded = pi05_policy(checkpoint=str(tmp_path)).eval()  # gin entry; layout from the keys
    assert torch.equal(sample(loaded), sample(model))
    assert ckpt.read_config(tmp_path) == model.config
    foreign = json.loads((tmp_path / "config.json").read_text())
    assert foreign.get("action_horizon", foreign.get("chunk_size")) == H


def test_embedding_key_and_exported_state_load(tmp_path, model):
    state = {k: v.clone() for k, v in model.state_dict().items()}  # the engine's export
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "recap_pi05.json").write_text(json.dumps(model.config.__dict__))
    assert torch.equal(sample(ckpt.load_pi05(tmp_path).eval()), sample(model))


def write_file(tmp_path, model, layout: str, edit) -> None:
    model.save_pretrained(tmp_path, layout=layout)
    state = load_file(str(tmp_path / "model.safetensors"))
    edit(state)
    save_file(state, str(tmp_path / "model.safetensors"))


@pytest.mark.parametrize(
    ("layout", "edit", "message"),
    [
        ("openpi", lambda s: s.pop("action_out_proj.bias"), "1 missing key (action_out_proj.bias)"),
        (
            "lerobot",
            lambda s: s.pop("model.time_mlp_in.weight"),
            "1 missing key (model.time_mlp_in.weight)",
        ),
        ("openpi", lambda s: s.update(extra=torch.zeros(1)), "1 unexpected key (extra)"),
        (
            "lerobot",
            lambda s: s.update({"model.state_proj.weight": torch.zeros(1)}),
            "1 unexpected key (model.state_proj.weight)",
        ),
        (
            "openpi",
            lambda s: s.update({"time_mlp_out.bias": torch.zeros(3)}),
            "first time_mlp_out.bias: (3,) in the file",
        ),
    ],
)
def test_strict_load_errors_name_the_keys(tmp_path, model, layout, edit, message):
    write_file(tmp_path, model, layout, edit)
    with pytest.raises(RecapError) as info:
        ckpt.load_pi05(tmp_path)
    text = str(info.value)
    assert message in text and str(tmp_path / "model.safetensors") in text and "\n" not in text


def test_many_missing_keys_are_counted(tmp_path, model):
    write_file(
        tmp_path, model, "openpi", lambda s: [s.pop(k) for k in list(s) if "gemma_expert" in k]
    )
    with pytest.raises(
        RecapError,
        match=r"missing keys \(paligemma_with_expert\.gemma_expert.* "
        r"and \d+ more\)",
    ):
        ckpt.load_pi05(tmp_path)


def test_openpi_and_lerobot_configs(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "type": "pi05",
                "paligemma_variant": "gemma_2b",
                "action_expert_variant": "gemma_300m",
                "chunk_size": 50,
                "max_action_dim": 32,
                "image_resolution": [224, 224],
            }
        )
    )
    config = ckpt.read_config(tmp_path, action_horizon=10)
    assert config == Pi05Config(action_horizon=10)
    (tmp_path / "config.json").write_text(
        json.dumps({"paligemma_variant": "gemma_2b_lora", "action_expert_variant": "gemma_300m"})
    )
    with pytest.raises(RecapError, match="gemma_2b_lora"):
        ckpt.read_config(tmp_path)
    with pytest.raises(RecapError, match="model.safetensors: file not found"):
        ckpt.load_pi05(tmp_path)


def test_real_size_parameter_count():
    assert ckpt.count_parameters() == 3_353_433_872  # SigLIP 412M + Gemma 2.51B + expert 0.43B
    assert ckpt.count_parameters(tiny_config()) == sum(p.numel() for p in tiny_model().parameters())


def test_the_saved_key_set_is_openpis_at_the_real_sizes():
    """``file_state`` of the real-size policy (meta device: nothing allocated) has exactly the
    published openpi file's names and shapes: its 813 state-dict entries minus the tied text
    embedding, which ``save_model`` stores once, as ``lm_head``."""
    import json

    from recap.models.checkpoints import file_state
    from recap.models.pi05 import Pi05Config, build_pi05
    from tests.helpers import REPO

    real = json.loads((REPO / "tests/fixtures/formats/openpi_pi05_keys.json").read_text())
    (tie,) = real["ties"]
    expected = {k: list(v[0]) for k, v in real["state"].items() if k != tie[0]}
    with torch.device("meta"):
        model = build_pi05(Pi05Config())
    saved = {k: list(v.shape) for k, v in file_state(model, "openpi").items()}
    assert len(expected) == 812
    assert saved == expected
