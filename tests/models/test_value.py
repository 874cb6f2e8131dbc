"""Value model on tiny configs: shapes, masks, bidirectionality, truncation, training, I/O."""

from __future__ import annotations

import json
import math

import pytest
import torch

from recap.errors import RecapError
from recap.models import layers
from recap.models.value import (
    ValueModel,
    build_value_model,
    from_pretrained_parts,
    load_value_model,
    spearman,
)
from tests.models import EXPERT, TEXT, VISION, tiny_batch, tiny_config


@pytest.fixture(scope="module")
def model() -> ValueModel:
    torch.manual_seed(0)
    return build_value_model(tiny_config()).eval()


def prefix_kvs(model: ValueModel, batch: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    embeds, valid = model.embed_prefix(
        batch["images"], batch["image_masks"], batch["input_ids"], batch["attention_mask"]
    )
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    return layers.run_prefix(model.language_model, embeds, valid, positions, 2), valid


@torch.no_grad()
def test_shapes_and_value_range(model):
    batch = tiny_batch()
    loss, metrics = model(batch)
    assert loss.shape == (3,) and loss.dtype == torch.float32
    assert model.logits(batch).shape == (3, 201)
    value = model.predict_value(batch)
    assert value.shape == (3,) and bool(((value >= -1) & (value <= 0)).all())
    assert torch.equal(metrics["predicted_value"], value)
    assert {k for k, v in metrics.items() if v.dim() == 0} == {
        "predicted_value_mean", "predicted_value_std", "target_value_mean", "target_value_std",
        "value_spearman",
    }  # fmt: skip
    # 2 cameras kept (slot 2 masked everywhere) x 4 tokens + 6 text tokens
    kvs, valid = prefix_kvs(model, batch)
    assert valid.shape == (3, 14) and kvs[1][0].shape == (3, 1, 14, 16)


@torch.no_grad()
def test_prefix_is_bidirectional(model):
    batch = tiny_batch()
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    changed["input_ids"][0, 5] = 7 if int(batch["input_ids"][0, 5]) != 7 else 8  # last text token
    (before, _), (after, _) = prefix_kvs(model, batch)[0][1], prefix_kvs(model, changed)[0][1]
    # layer-1 key of the first image token (position 0) sees the last text token (position 13)
    assert not torch.allclose(before[0, :, 0], after[0, :, 0])
    assert torch.equal(before[1:], after[1:])  # other examples untouched


@torch.no_grad()
def test_masked_tokens_and_cameras_change_nothing(model):
    batch = tiny_batch()
    reference = model.logits(batch)
    padded = {**batch, "input_ids": batch["input_ids"].clone()}
    padded["input_ids"][1, 3:] = 9  # example 1 has 3 valid text tokens
    pixels = {**batch, "images": batch["images"].clone()}
    pixels["images"][1, 1] = 0.5  # camera 1 masked for example 1 (valid for the others)
    pixels["images"][:, 2] = -0.25  # camera 2 masked for everyone
    for changed in (padded, pixels):
        assert torch.allclose(model.logits(changed), reference, atol=1e-6, rtol=0)
    # dropping the all-masked slot is the same as keeping it masked
    two = {**batch, "images": batch["images"][:, :2], "image_masks": batch["image_masks"][:, :2]}
    assert torch.allclose(model.logits(two), reference, atol=1e-6, rtol=0)
    unmasked = {**batch, "image_masks": batch["image_masks"] | True}
    assert not torch.allclose(model.logits(unmasked), reference, atol=1e-4)


@torch.no_grad()
def test_keys_values_match_the_stock_gemma3_cache():
    torch.manual_seed(1)
    full = build_value_model(tiny_config(truncate_backbone=False)).eval()
    batch = tiny_batch()
    kvs, valid = prefix_kvs(full, batch)
    embeds, _ = full.embed_prefix(
        batch["images"], batch["image_masks"], batch["input_ids"], batch["attention_mask"]
    )
    mask = layers.prefix_attention_mask(full.language_model.config, embeds, valid)
    out = full.language_model(
        inputs_embeds=embeds,
        attention_mask={"full_attention": mask, "sliding_attention": mask},
        position_ids=(valid.long().cumsum(1) - 1).clamp(min=0),
        use_cache=True,
    )
    cache = out.past_key_values
    for i, (keys, values) in enumerate(kvs):
        assert torch.allclose(keys, cache.layers[i].keys, atol=1e-6)
        assert torch.allclose(values, cache.layers[i].values, atol=1e-6)


@torch.no_grad()
def test_truncated_backbone_gives_the_same_value():
    torch.manual_seed(2)
    full = build_value_model(tiny_config(truncate_backbone=False)).eval()
    truncated = build_value_model(tiny_config()).eval()
    missing, unexpected = truncated.load_state_dict(full.state_dict(), strict=False)
    assert not missing
    assert sorted({k.split(".")[2] for k in unexpected}) == ["2", "3"]  # language_model.layers.N
    assert len(truncated.language_model.layers) == 2 and len(full.language_model.layers) == 4
    batch = tiny_batch()
    assert torch.allclose(truncated.logits(batch), full.logits(batch), atol=1e-6, rtol=0)


def test_every_trainable_parameter_gets_a_gradient_and_frozen_ones_are_unread():
    torch.manual_seed(3)
    model = build_value_model(tiny_config()).train()
    model(tiny_batch())[0].mean().backward()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {
        "language_model.norm.weight",
        *(f"language_model.layers.1.{n}.weight" for n in (
            "self_attn.q_proj", "self_attn.o_proj", "self_attn.q_norm", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm",
            "pre_feedforward_layernorm", "post_feedforward_layernorm")),
    }  # fmt: skip
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert no_grad == []


def test_a_few_steps_overfit_a_fixed_batch():
    torch.manual_seed(4)
    model = build_value_model(tiny_config()).train()
    batch = tiny_batch(batch_size=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95))
    losses = []
    for _ in range(25):
        loss = model(batch)[0].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert 4.8 < losses[0] < 6.0  # ~ ln 201 = 5.30 at init
    assert losses[-1] < 0.5 * losses[0]


@torch.no_grad()
def test_save_load_round_trip(model, tmp_path):
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_value_model(tmp_path).eval()
    batch = tiny_batch()
    assert torch.equal(loaded.logits(batch), model.logits(batch))


@torch.no_grad()
def test_from_pretrained_parts_loads_local_siglip_and_gemma3(tmp_path):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, SiglipConfig, SiglipModel

    torch.manual_seed(5)
    text_cfg = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                "num_attention_heads": 2, "vocab_size": 32}  # fmt: skip
    siglip = SiglipModel(SiglipConfig(vision_config={**VISION, "vision_use_head": True},
                                      text_config=text_cfg))  # fmt: skip
    siglip.save_pretrained(tmp_path / "siglip")
    gemma = Gemma3ForCausalLM(Gemma3TextConfig(**TEXT))
    gemma.to(torch.bfloat16).save_pretrained(tmp_path / "gemma")  # loads as float32 all the same
    gemma.float()
    model = from_pretrained_parts(tmp_path / "siglip", tmp_path / "gemma", **EXPERT)
    vision_state = model.vision_tower.state_dict()
    assert not any(k.startswith("head.") for k in vision_state)  # pooling head not built
    source = siglip.vision_model.state_dict()
    assert all(torch.equal(v, source[k]) for k, v in vision_state.items())
    assert len(model.language_model.layers) == 2
    for k, v in model.language_model.state_dict().items():
        assert torch.equal(v, gemma.model.state_dict()[k]), k
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    batch = tiny_batch()
    model.eval().save_pretrained(tmp_path / "value")
    assert torch.equal(
        load_value_model(tmp_path / "value").eval().logits(batch), model.logits(batch)
    )


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (None, "SigLIP directory not found"),
        ({}, "no config.json (SigLIP directory incomplete)"),
        ({"config.json": {"model_type": "siglip"}}, "no weights (model.safetensors"),
        ({"config.json": {"model_type": "siglip2"}, "model.safetensors": ""}, "'siglip2' is not"),
    ],
)
def test_bad_model_directory_is_one_line(tmp_path, files, message):
    siglip = tmp_path / "siglip"
    if files is not None:
        siglip.mkdir()
        for name, content in files.items():
            (siglip / name).write_text(json.dumps(content) if isinstance(content, dict) else "")
    with pytest.raises(RecapError) as err:
        from_pretrained_parts(siglip, tmp_path / "gemma")
    text = str(err.value)
    assert message in text and str(siglip) in text and "\n" not in text


def test_incompatible_expert_is_a_config_error():
    with pytest.raises(RecapError, match="expert_head_dim 8 != backbone head_dim 16"):
        build_value_model(tiny_config(expert_head_dim=8))


def test_summaries_and_spearman_with_ties(model):
    x, y = torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor([1.0, 3.0, 2.0, 4.0])
    assert math.isclose(float(spearman(x, y)), 4.5 / math.sqrt(22.5), rel_tol=1e-6)
    assert float(spearman(x, torch.ones(4))) == 0.0
    summary = model.summarize_eval({"predicted_value": y / -4, "target_value": x / -4})
    assert math.isclose(summary["value_spearman"], 4.5 / math.sqrt(22.5), rel_tol=1e-6)
    assert math.isclose(summary["value_mae"], 0.125)


def test_real_size_parameter_count_on_meta_device():
    from recap.models.value import ValueModelConfig

    with torch.device("meta"):
        model = build_value_model(ValueModelConfig())
    counts = {name: sum(p.numel() for p in part.parameters()) for name, part in
              model.named_children()}  # fmt: skip
    assert counts["projector"] == 1152 * 640 + 640
    assert counts["head"] == 128 + 128 * 201 + 201
    assert len(model.language_model.layers) == 4
    assert 400e6 < counts["vision_tower"] < 420e6


def test_eager_and_sdpa_agree_and_bf16_trains(model):
    eager = build_value_model(tiny_config(attn_implementation="eager")).eval()
    eager.load_state_dict(model.state_dict())
    batch = tiny_batch()
    with torch.no_grad():
        assert torch.allclose(eager.logits(batch), model.logits(batch), atol=1e-5, rtol=0)
    torch.manual_seed(6)
    half = build_value_model(tiny_config()).to(torch.bfloat16).train()
    loss, metrics = half(batch)
    loss.mean().backward()
    assert loss.dtype == torch.float32 and bool(torch.isfinite(loss).all())
    assert all(torch.isfinite(p.grad).all() for p in half.parameters() if p.grad is not None)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(7)
    plain = build_value_model(tiny_config()).train()
    checkpointed = build_value_model(tiny_config()).train()
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.language_model.gradient_checkpointing_enable()
    checkpointed.vision_tower.gradient_checkpointing_enable()
    for m in (plain, checkpointed):
        m(tiny_batch())[0].mean().backward()
    grads = {n: p.grad for n, p in plain.named_parameters()}
    for name, param in checkpointed.named_parameters():
        assert (param.grad is None) == (grads[name] is None), name
        assert param.grad is None or torch.allclose(param.grad, grads[name], atol=1e-6), name
