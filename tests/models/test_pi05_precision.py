"""π0.5 under bf16 with openpi's precision policy, and the guidance types (fixed noise)."""

from __future__ import annotations

import math

import pytest
import torch

from recap.errors import RecapError
from recap.models.pi05 import Pi05Policy, build_pi05, keeps_fp32, set_precision
from tests.models.test_pi05 import TEXT, fixed, tiny_batch, tiny_config, tiny_model

NORMS = ("input_layernorm", "post_attention_layernorm")


def dtypes(model: Pi05Policy) -> dict[str, torch.dtype]:
    return {name: p.dtype for name, p in model.named_parameters()}


def test_bf16_keeps_openpi_fp32_modules_and_runs():
    model = set_precision(tiny_model(), torch.bfloat16)
    kinds = dtypes(model)
    fp32 = {n for n, d in kinds.items() if d == torch.float32}
    vision = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings."
    expected = {vision + "patch_embedding.weight", vision + "patch_embedding.bias",
                vision + "position_embedding.weight",
                "paligemma_with_expert.paligemma.model.language_model.norm.weight",
                "paligemma_with_expert.gemma_expert.model.norm.dense.weight",
                "paligemma_with_expert.gemma_expert.model.norm.dense.bias"}  # fmt: skip
    for stack, depth in (("paligemma.model.language_model", 2), ("gemma_expert.model", 2)):
        for i in range(depth):
            for norm in NORMS:
                prefix = f"paligemma_with_expert.{stack}.layers.{i}.{norm}."
                expected |= {n for n in kinds if n.startswith(prefix)}
    assert len(expected) == 6 + 2 * 2 + 2 * 2 * 2  # decoder norms 1 weight, expert 2 (dense)
    assert fp32 == expected
    assert {d for n, d in kinds.items() if n not in fp32} == {torch.bfloat16}
    assert kinds["action_in_proj.weight"] == torch.bfloat16
    assert kinds[vision.replace("embeddings.", "post_layernorm.weight")] == torch.bfloat16
    batch, (noise, time) = tiny_batch(), fixed()
    with torch.no_grad():
        loss, _ = model(batch, noise=noise, time=time)
        actions = model.sample_actions(batch, noise, beta=2.0)
    assert loss.dtype == actions.dtype == torch.float32
    assert torch.isfinite(loss).all() and torch.isfinite(actions).all()
    # bf16 outputs track the float32 model's
    reference = tiny_model()
    with torch.no_grad():
        loss32, _ = reference(batch, noise=noise, time=time)
    torch.testing.assert_close(loss, loss32, rtol=0.1, atol=0.05)


def test_policy_off_casts_everything_and_build_applies_it():
    off = set_precision(tiny_model(openpi_precision=False), torch.bfloat16)
    assert set(dtypes(off).values()) == {torch.bfloat16}
    built = build_pi05(tiny_config(), torch.bfloat16)
    assert dtypes(built)["paligemma_with_expert.gemma_expert.model.norm.dense.bias"] == (
        torch.float32
    )
    assert keeps_fp32("x.layers.3.post_attention_layernorm")
    assert not keeps_fp32("x.vision_model.post_layernorm")


def test_text_scale_is_float32_sqrt_width():
    text = TEXT | {"hidden_size": 72}  # sqrt(72) = 8.485...: bf16 rounds it to 8.5
    on = set_precision(tiny_model(text=text), torch.bfloat16)
    off = set_precision(tiny_model(text=text, openpi_precision=False), torch.bfloat16)
    ids = torch.arange(3, 30)[None]
    mask = torch.ones_like(ids, dtype=torch.bool)
    empty, none = torch.zeros(1, 0, 72), torch.zeros(1, 0, dtype=torch.bool)
    with torch.no_grad():
        raw = on.paligemma_with_expert.language_model.embed_tokens.weight[ids]
        got = on.prefix_from(empty, none, ids, mask).embeds
        old = off.prefix_from(empty, none, ids, mask).embeds
    assert on.text_scale == math.sqrt(72) and off.text_scale is None
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, (raw.float() * math.sqrt(72)).to(torch.bfloat16))
    assert torch.equal(old, raw * torch.tensor(math.sqrt(72)).to(torch.bfloat16))
    assert not torch.equal(got, old)


def test_fp32_policy_changes_nothing():
    on, off = tiny_model(), tiny_model(openpi_precision=False)
    batch, (noise, time) = tiny_batch(), fixed()
    with torch.no_grad():
        assert torch.equal(on(batch, noise=noise, time=time)[0],
                           off(batch, noise=noise, time=time)[0])  # fmt: skip


# ---- guidance types --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Pi05Policy:
    return tiny_model()


def guided_batch() -> dict[str, torch.Tensor]:
    batch = tiny_batch()
    g = torch.Generator().manual_seed(7)
    neg = torch.randint(3, 32, (3, 5), generator=g)
    neg[:, 0] = 2
    mask = torch.arange(5)[None] < torch.tensor([5, 4, 2])[:, None]
    return batch | {"neg_input_ids": neg.masked_fill(~mask, 0), "neg_attention_mask": mask}


@torch.no_grad()
def rlinf_sample(model: Pi05Policy, batch: dict, noise: torch.Tensor, w: float, guide: str):
    """RLinf's loop: v = (1 - w) v_u + w v_g, x += dt v with dt = -1/steps, t from 1."""
    ids, mask = {"positive": ("input_ids", "attention_mask"),
                 "negative": ("neg_input_ids", "neg_attention_mask")}[guide]  # fmt: skip

    def prefix(i: str, m: str):
        return model.embed_prefix(batch["images"], batch["image_masks"], batch[i], batch[m])

    cond, uncond = prefix(ids, mask), prefix("uncond_input_ids", "uncond_attention_mask")
    steps = model.config.num_steps
    x, dt = noise.clone(), -1.0 / steps
    for k in range(steps):
        t = torch.full((noise.shape[0],), 1.0 - k / steps)
        v = (1 - w) * model.velocity(uncond, x, t) + w * model.velocity(cond, x, t)
        x = x + dt * v
    return x


def test_no_guide_is_sampling_with_the_plain_prompt(model):
    batch, (noise, _) = guided_batch(), fixed()
    plain = batch | {"input_ids": batch["uncond_input_ids"],
                     "attention_mask": batch["uncond_attention_mask"]}  # fmt: skip
    expected = model.sample_actions(plain, noise, beta=1.0)
    for beta in (1.0, 2.5):
        got = model.sample_actions(batch, noise, beta=beta, guidance="no_guide")
        assert torch.equal(got, expected)
    assert not torch.allclose(expected, model.sample_actions(batch, noise, beta=1.0), atol=1e-3)


def test_positive_beta_one_is_the_conditional_branch_alone(model):
    batch, (noise, _) = guided_batch(), fixed()
    got = model.sample_actions(batch, noise, beta=1.0, guidance="positive")
    broken = batch | {"uncond_input_ids": batch["uncond_input_ids"] * 0 + 9}
    assert torch.equal(got, model.sample_actions(broken, noise, beta=1.0))
    torch.testing.assert_close(got, rlinf_sample(model, batch, noise, 1.0, "positive"),
                               rtol=0, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_negative_is_what_rlinf_computes(model, beta):
    batch, (noise, _) = guided_batch(), fixed()
    got = model.sample_actions(batch, noise, beta=beta, guidance="negative")
    torch.testing.assert_close(got, rlinf_sample(model, batch, noise, beta, "negative"),
                               rtol=0, atol=1e-5)  # fmt: skip
    positive = model.sample_actions(batch, noise, beta=beta, guidance="positive")
    assert not torch.allclose(got, positive, atol=1e-3)


def test_guidance_refusals(model):
    batch, (noise, _) = guided_batch(), fixed()
    with pytest.raises(RecapError, match="positive_only_conditional"):
        model.sample_actions(batch, noise, beta=2.0, guidance="negative", positive_only=True)
    with pytest.raises(RecapError, match="guidance: 'sideways' is not one of"):
        model.sample_actions(batch, noise, guidance="sideways")
    no_neg = {k: v for k, v in batch.items() if not k.startswith("neg_")}
    with pytest.raises(RecapError, match="neg_input_ids"):
        model.sample_actions(no_neg, noise, beta=2.0, guidance="negative")
