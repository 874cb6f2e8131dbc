"""LoRA through peft and frozen towers (``recap.models.adapters``): counts at the real size on
the meta device, the merged export's formula and key set, freezing, parse-time errors."""

from __future__ import annotations

import json

import gin
import pytest
import torch

from recap.errors import RecapError
from recap.models import adapters
from recap.models.adapters import LoraOptions, adapt, merged_state
from recap.models.pi05 import Pi05Config, build_pi05
from tests.helpers import REPO
from tests.models import tiny_batch as value_batch
from tests.models import tiny_config as value_config
from tests.models.test_pi05 import tiny_batch, tiny_model

Q0 = "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj"
EXPERT_UP1 = "paligemma_with_expert.gemma_expert.model.layers.1.mlp.up_proj"


def lora_sum(widths: dict[str, tuple[int, int]], last_kv_only: bool, layers: int) -> int:
    """sum over adapted projections of (in + out): every layer, the last one k/v only when
    the loss cannot reach the rest of it."""
    per_layer = sum(i + o for i, o in widths.values())
    last = sum(widths[k][0] + widths[k][1] for k in ("k_proj", "v_proj"))
    return (layers - 1) * per_layer + (last if last_kv_only else per_layer)


def gemma_widths(width: int, heads: int, kv: int, head_dim: int, mlp: int) -> dict:
    return {
        "q_proj": (width, heads * head_dim), "k_proj": (width, kv * head_dim),
        "v_proj": (width, kv * head_dim), "o_proj": (heads * head_dim, width),
        "gate_proj": (width, mlp), "up_proj": (width, mlp), "down_proj": (mlp, width),
    }  # fmt: skip


def test_real_size_pi05_default_lora_trainable_count_is_peft_and_the_formula():
    """openpi's recipe on the meta device: gemma_2b_lora (rank 16) on the decoder, whose last
    layer only projects keys/values for the suffix, gemma_300m_lora (rank 32) on the expert;
    SigLIP, projector, action and time projections fully trained."""
    import peft

    with torch.device("meta"):
        model = adapt(build_pi05(Pi05Config()), LoraOptions())
    ours = adapters.trainable_count(model)
    backbone = lora_sum(gemma_widths(2048, 8, 1, 256, 16384), last_kv_only=True, layers=18)
    expert = lora_sum(gemma_widths(1024, 8, 1, 256, 4096), last_kv_only=False, layers=18)
    lora = 16 * backbone + 32 * expert
    fully = (
        412_442_352
        + (1152 * 2048 + 2048)
        + (32 * 1024 + 1024)
        + (1024 * 32 + 32)
        + 2 * (1024 * 1024 + 1024)
    )
    assert (backbone, expert, lora) == (1_162_240, 433_152, 32_456_704)
    assert peft.get_model_status(model).trainable_params == ours == lora + fully == 449_426_192
    with torch.device("meta"):
        frozen = adapt(build_pi05(Pi05Config()), LoraOptions(), freeze=["vision"])
    assert adapters.trainable_count(frozen) == lora + fully - 412_442_352 == 36_983_840

    # the merged export of that model has exactly openpi's file layout
    from recap.models.checkpoints import state_to_file

    real = json.loads((REPO / "tests/fixtures/formats/openpi_pi05_keys.json").read_text())
    (tie,) = real["ties"]
    expected = {k: list(v[0]) for k, v in real["state"].items() if k != tie[0]}
    state = merged_state(model.state_dict(), model.recap_lora)
    saved = {k: list(v.shape) for k, v in state_to_file(state, 1024, "openpi").items()}
    assert len(saved) == 812 and saved == expected


def _perturbed(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def test_merged_weights_are_base_plus_scaled_BA_and_run_as_a_plain_model():
    model = _perturbed(adapt(tiny_model(), LoraOptions(rank=4, alpha=8.0, expert_rank=2,
                                                       expert_alpha=6.0)))  # fmt: skip
    state = model.state_dict()
    merged = merged_state(state, model.recap_lora)
    plain = tiny_model()
    assert set(merged) == set(plain.state_dict())
    for module, scale in ((Q0, 8.0 / 4), (EXPERT_UP1, 6.0 / 2)):
        a, b = state[f"{module}.lora_A.default.weight"], state[f"{module}.lora_B.default.weight"]
        assert a.shape[0] == b.shape[1] == (4 if module == Q0 else 2)
        want = state[f"{module}.base_layer.weight"] + scale * b @ a
        torch.testing.assert_close(merged[f"{module}.weight"], want, rtol=0, atol=1e-6)
        assert (b @ a).abs().max() > 1e-3
    plain.load_state_dict(merged)
    batch, noise, time = tiny_batch(), torch.randn(3, 4, 6), torch.tensor([0.1, 0.5, 0.9])
    with torch.no_grad():
        torch.testing.assert_close(
            plain(batch, noise, time)[0], model.eval()(batch, noise, time)[0], rtol=0, atol=1e-5
        )


def test_value_model_lora_trains_expert_and_head_fully_and_freezing_by_tower():
    from recap.models.value import build_value_model

    torch.manual_seed(0)
    model = adapt(build_value_model(value_config()), LoraOptions(rank=2, alpha=4.0),
                  freeze=["vision"])  # fmt: skip
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n.split(".")[0] for n in trainable} == {"language_model", "projector", "expert",
                                                    "head"}  # fmt: skip
    assert all(".lora_" in n for n in trainable if n.startswith("language_model."))
    # expert depth 2 reads layers 0 (all seven projections) and 1 (k, v): Gemma3 tiny widths
    backbone = lora_sum(gemma_widths(32, 2, 1, 16, 64), last_kv_only=True, layers=2)
    lora = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    assert lora == 2 * backbone == 2 * (512 + 96)
    assert model.recap_lora.modules_to_save == ["expert", "head.cls", "head.proj", "projector"]
    loss, _ = _perturbed(model)(value_batch())
    loss.mean().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if n in trainable)
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)

    vision = adapt(build_value_model(value_config()), LoraOptions(rank=2, alpha=4.0, vision=True))
    names = [n for n, p in vision.named_parameters() if p.requires_grad]
    assert any(n.startswith("vision_tower.") and ".lora_A." in n for n in names)
    assert not any(n.startswith("vision_tower.") and ".lora_" not in n for n in names)


def test_unknown_tower_or_target_module_is_one_line_at_parse_time():
    from recap.cli import parse_gin

    cases = {
        "pi05_policy.freeze = ['vison']": "gin config: pi05_policy.freeze has unknown tower "
        "'vison'; use names from ['vision', 'language_model', 'expert', 'projector']",
        "LoraOptions.target_modules = ['q_proj', 'qkv']": "gin config: "
        "LoraOptions.target_modules has unknown target module 'qkv'; use names from "
        "['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']",
        "LoraOptions.rank = 0": "gin config: LoraOptions.rank=0 must be a positive int",
    }
    try:
        for binding, line in cases.items():
            gin.clear_config()
            with pytest.raises(RecapError) as err:
                parse_gin([], ["pi05_policy.lora = @LoraOptions()", binding])
            assert str(err.value) == line
        gin.clear_config()
        with pytest.raises(RecapError) as err:
            parse_gin([], ["value_model.freeze = ['critic']"])
        assert str(err.value).startswith("gin config: value_model.freeze has unknown tower")
        gin.clear_config()
        parse_gin([], ["pi05_policy.lora = @LoraOptions()", "pi05_policy.freeze = ['vision']"])
    finally:
        gin.clear_config()


def test_the_pipeline_plan_stops_at_an_unknown_tower_in_one_line(tmp_path, capsys):
    """The pipeline parses every step's bindings before anything runs: the same line, naming the
    step, exit 2 (``--dry_run`` too)."""
    from recap.workflow.pipeline import main

    argv = ["--gin_file", "demo/scratch.gin", "--dry_run",
            "--gin_param", f'pipeline.run_root = "{tmp_path}"',
            "--gin_param", "policy:pi05_policy.lora = @LoraOptions()",
            "--gin_param", "policy:LoraOptions.target_modules = ['q_proj', 'qkv']"]  # fmt: skip
    try:
        assert main(argv) == 2
    finally:
        gin.clear_config()
    assert capsys.readouterr().err == (
        "error: pipeline step policy: gin config: LoraOptions.target_modules has unknown target "
        "module 'qkv'; use names from ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', "
        "'up_proj', 'down_proj']\n"
    )
