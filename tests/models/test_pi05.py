"""π0.5 policy on tiny configs: shapes, attention masks, loss, KV cache, guidance, training."""

from __future__ import annotations

import pytest
import torch

from recap.errors import RecapError
from recap.models.losses import flow_matching_loss
from recap.models.pi05 import Pi05Config, Pi05Policy, build_pi05

VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}
TEXT = {
    "vocab_size": 32,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 128,
}
EXPERT = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}
H, A = 4, 6  # horizon, action dims


def tiny_config(**overrides) -> Pi05Config:
    """SigLIP 1 layer width 32 (4 tokens per 28 px image), Gemma 2 layers width 64, expert 32."""
    fields = {
        "vision": dict(VISION),
        "text": dict(TEXT),
        "expert": dict(EXPERT),
        "action_dim": A,
        "action_horizon": H,
        "num_steps": 3,
    }
    return Pi05Config(**fields | overrides)


def tiny_model(seed: int = 0, **overrides) -> Pi05Policy:
    """Random weights of std 0.2 everywhere, so every path visibly moves the output."""
    torch.manual_seed(seed)
    model = build_pi05(tiny_config(**overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def tiny_batch(batch_size: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """Example 1 misses camera 1, nobody has camera 2; prompt lengths 6, 3, 4 (uncond 3, 2, 3)."""
    g = torch.Generator().manual_seed(seed)
    lengths, uncond = torch.tensor([6, 3, 4])[:batch_size], torch.tensor([3, 2, 3])[:batch_size]
    ids = torch.randint(3, 32, (batch_size, 6), generator=g)
    ids[:, 0] = 2
    text = torch.arange(6)[None] < lengths[:, None]
    plain = torch.arange(4)[None] < uncond[:, None]
    return {
        "images": torch.rand(batch_size, 3, 3, 28, 28, generator=g) * 2 - 1,
        "image_masks": torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)[
            :batch_size
        ],
        "input_ids": ids.masked_fill(~text, 0),
        "attention_mask": text,
        "uncond_input_ids": ids[:, :4].masked_fill(~plain, 0),
        "uncond_attention_mask": plain,
        "actions": torch.randn(batch_size, H, A, generator=g),
        "conditional": torch.tensor([True, False, True])[:batch_size],
    }


@pytest.fixture(scope="module")
def model() -> Pi05Policy:
    return tiny_model()


def prefix_of(model: Pi05Policy, batch: dict):
    return model.embed_prefix(
        batch["images"], batch["image_masks"], batch["input_ids"], batch["attention_mask"]
    )


def fixed(seed: int = 1, batch_size: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, H, A, generator=g), torch.rand(batch_size, generator=g)


@torch.no_grad()
def test_shapes(model):
    batch = tiny_batch()
    loss, metrics = model(batch)
    assert loss.shape == (3,) and loss.dtype == torch.float32
    assert torch.equal(metrics["conditional"], torch.tensor([1.0, 0.0, 1.0]))
    prefix = prefix_of(model, batch)  # 2 cameras kept x 4 tokens + 6 text tokens
    assert prefix.embeds.shape == (3, 14, 64) and prefix.valid.shape == (3, 14)
    x, t = fixed()
    assert model.velocity(prefix, x, t).shape == (3, H, A)
    cache = model.paligemma_with_expert.prefix_cache(prefix)
    assert len(cache) == 2 and cache[1][0].shape == (3, 1, 14, 16)
    assert model.sample_actions(batch, x).shape == (3, H, A)


@torch.no_grad()
def test_prefix_never_sees_actions(model):
    batch, seen = tiny_batch(), []
    mlp = model.paligemma_with_expert.language_model.layers[0].mlp
    handle = mlp.register_forward_hook(lambda mod, args, out: seen.append(out.clone()))
    prefix = prefix_of(model, batch)
    (x1, t1), (x2, t2) = fixed(1), fixed(2)
    try:
        v1, v2 = model.velocity(prefix, x1, t1), model.velocity(prefix, x2, t2)
    finally:
        handle.remove()
    assert not torch.allclose(v1, v2)
    assert torch.equal(seen[0], seen[1])  # layer-0 prefix states do not depend on the actions


@torch.no_grad()
def test_masked_prompt_tokens_and_cameras_change_nothing(model):
    batch = tiny_batch()
    x, t = fixed()
    reference = model.velocity(prefix_of(model, batch), x, t)
    padded = {**batch, "input_ids": batch["input_ids"].clone()}
    padded["input_ids"][1, 3:] = 9  # example 1 has 3 valid tokens
    pixels = {**batch, "images": batch["images"].clone()}
    pixels["images"][1, 1] = 0.5  # camera 1 masked for example 1 only
    pixels["images"][:, 2] = -0.25  # camera 2 masked for everyone
    for changed in (padded, pixels):
        assert torch.allclose(model.velocity(prefix_of(model, changed), x, t), reference, atol=1e-6)


@torch.no_grad()
def test_actions_see_prefix_and_each_other(model):
    batch = tiny_batch()
    x, t = fixed()
    prefix = prefix_of(model, batch)
    reference = model.velocity(prefix, x, t)
    text = {**batch, "input_ids": batch["input_ids"].clone()}
    text["input_ids"][0, 5] = 7 if int(batch["input_ids"][0, 5]) != 7 else 8  # last valid token
    changed = model.velocity(prefix_of(model, text), x, t)
    assert (changed[0] - reference[0]).abs().max() > 1e-4
    assert torch.equal(changed[1:], reference[1:])
    later = x.clone()
    later[:, -1] += 1.0  # the last action step moves the first one: bidirectional action block
    assert (model.velocity(prefix, later, t)[:, 0] - reference[:, 0]).abs().min() > 1e-5


def test_flow_matching_loss_literal():
    velocity = torch.tensor([[[1.0, 2.0], [0.0, 0.0]]])
    noise, actions = torch.tensor([[[1.0, 1.0], [1.0, 1.0]]]), torch.zeros(1, 2, 2)
    assert torch.allclose(flow_matching_loss(velocity, noise, actions), torch.tensor([0.75]))
    mask = torch.tensor([[[True, True], [True, False]]])  # squared errors 0, 1, 1 (, 1 dropped)
    assert torch.allclose(flow_matching_loss(velocity, noise, actions, mask), torch.tensor([2 / 3]))
    steps = torch.tensor([[[True], [False]]])  # [B, H, 1] broadcast over dims
    assert torch.allclose(flow_matching_loss(velocity, noise, actions, steps), torch.tensor([0.5]))


@torch.no_grad()
def test_loss_is_the_flow_matching_equation(model):
    batch, seen = tiny_batch(), []
    noise, time = fixed(3)
    handle = model.action_in_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        loss, _ = model(batch, noise=noise, time=time)
    finally:
        handle.remove()
    t = time[:, None, None]
    x_t = t * noise + (1 - t) * batch["actions"]
    assert torch.allclose(seen[0], x_t, atol=1e-6)  # x_t = t eps + (1 - t) a
    v = model.velocity(prefix_of(model, batch), x_t, time)
    expected = (v - (noise - batch["actions"])).square().mean(dim=(1, 2))  # u = eps - a
    assert torch.allclose(loss, expected, atol=1e-6)


@torch.no_grad()
def test_loss_by_hand_with_a_constant_velocity():
    model = tiny_model()
    model.action_out_proj.weight.zero_()
    model.action_out_proj.bias.fill_(2.0)  # v = 2 everywhere
    batch = tiny_batch() | {"actions": torch.full((3, H, A), 0.5)}
    batch["actions"][..., 3:] = 10.0  # padded dims, masked out below
    batch["action_mask"] = (torch.arange(A) < 3).view(1, 1, A)
    loss, _ = model(batch, noise=torch.ones(3, H, A), time=torch.full((3,), 0.7))
    assert torch.allclose(loss, torch.full((3,), 2.25))  # (2 - (1 - 0.5))^2


def test_sample_time_is_shifted_beta(model):
    torch.manual_seed(0)
    t = model.sample_time(20000)
    assert float(t.min()) >= 0.001 and float(t.max()) <= 1.0
    assert abs(float(t.mean()) - (0.6 * 0.999 + 0.001)) < 0.01  # E[Beta(1.5, 1)] = 0.6
    assert abs(float((t < 0.5).float().mean()) - 0.5**1.5) < 0.01  # CDF x^1.5


@pytest.mark.parametrize("beta", [1.0, 2.0, 0.0])
def test_cached_sampling_equals_uncached(model, beta):
    batch, (noise, _) = tiny_batch(), fixed()
    cached = model.sample_actions(batch, noise, beta=beta)
    uncached = model.sample_actions(batch, noise, beta=beta, use_cache=False)
    assert torch.allclose(cached, uncached, atol=1e-5)


@torch.no_grad()
def euler(model: Pi05Policy, batch: dict, noise: torch.Tensor, beta: float) -> torch.Tensor:
    """Reference guided Euler sampler built from ``velocity`` per branch."""
    cond = prefix_of(model, batch)
    uncond = model.embed_prefix(
        batch["images"],
        batch["image_masks"],
        batch["uncond_input_ids"],
        batch["uncond_attention_mask"],
    )
    x, steps = noise, model.config.num_steps
    for k in range(steps):
        t = torch.full((noise.shape[0],), 1.0 - k / steps)
        v_c, v_u = model.velocity(cond, x, t), model.velocity(uncond, x, t)
        x = x - (v_u + beta * (v_c - v_u)) / steps
    return x


def test_guidance_and_branch_cost(model):
    batch, (noise, _) = tiny_batch(), fixed()
    sizes, images = [], []
    hooks = [
        model.action_in_proj.register_forward_pre_hook(
            lambda m, args: sizes.append(args[0].shape[0])
        ),
        model.paligemma_with_expert.paligemma["model"]["vision_tower"].register_forward_hook(
            lambda m, args, out: images.append(out.shape[0])
        ),
    ]
    try:
        conditional = model.sample_actions(batch, noise, beta=1.0)
        counts = (list(sizes), list(images))
        sizes.clear(), images.clear()
        guided = model.sample_actions(batch, noise, beta=2.0)
    finally:
        for hook in hooks:
            hook.remove()
    steps = model.config.num_steps
    assert counts == ([3] * steps, [6])  # beta = 1: one branch; 2 cameras x 3 images once
    assert (sizes, images) == ([6] * steps, [6])  # both branches stacked, images embedded once
    garbage = batch | {"uncond_input_ids": batch["uncond_input_ids"] * 0 + 5}
    assert torch.equal(model.sample_actions(garbage, noise, beta=1.0), conditional)
    assert torch.allclose(conditional, euler(model, batch, noise, 1.0), atol=1e-5)
    assert torch.allclose(guided, euler(model, batch, noise, 2.0), atol=1e-5)
    assert not torch.allclose(guided, conditional, atol=1e-3)


def test_guidance_needs_the_plain_prompt(model):
    batch = {k: v for k, v in tiny_batch().items() if not k.startswith("uncond")}
    with pytest.raises(RecapError, match="uncond_input_ids"):
        model.sample_actions(batch, beta=1.5)


def test_branch_metrics_and_eval_summary():
    model = tiny_model().train()
    batch = tiny_batch()
    noise, time = fixed()
    loss, metrics = model(batch, noise=noise, time=time)
    assert torch.allclose(metrics["loss_conditional"], loss.detach()[[0, 2]])
    assert torch.allclose(metrics["loss_unconditional"], loss.detach()[[1]])
    ratio = loss.detach()[[0, 2]].mean() / loss.detach()[1]
    assert torch.allclose(metrics["loss_ratio"], ratio)
    summary = model.summarize_eval({"loss": loss.detach(), "conditional": metrics["conditional"]})
    assert summary["loss_ratio"] == pytest.approx(float(ratio), rel=1e-5)


def test_training_steps_reduce_the_loss():
    model = tiny_model(seed=1).train()
    for p in model.parameters():  # a fresh-looking init for stable steps
        torch.nn.init.normal_(p, std=0.05)
    batch = tiny_batch()
    noise, time = fixed(5)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(8):
        loss, _ = model(batch, noise=noise, time=time)
        optimizer.zero_grad()
        loss.mean().backward()
        optimizer.step()
        losses.append(float(loss.detach().mean()))
    assert losses[-1] < 0.7 * losses[0]
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert "paligemma_with_expert.paligemma.model.language_model.norm.weight" in frozen
    assert all(".layers.1." in n or n.endswith("norm.weight") for n in frozen)


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for flag in (False, True):
        model = tiny_model(gradient_checkpointing=flag).train()
        noise, time = fixed()
        model(tiny_batch(), noise=noise, time=time)[0].sum().backward()
        layer = model.paligemma_with_expert.language_model.layers[0]
        grads.append(layer.self_attn.q_proj.weight.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_config_must_share_attention():
    with pytest.raises(RecapError, match="num_attention_heads"):
        build_pi05(tiny_config(expert={**EXPERT, "num_attention_heads": 4}))


def test_adaptive_norms_start_as_plain_rms_norms_with_closed_gates():
    """openpi's adaptive RMSNorm modulation starts at zero (kernel_init=zeros): at init every
    expert norm has scale = shift = gate = 0, so each residual branch adds nothing."""
    from recap.models.pi05_layers import AdaRMSNorm

    torch.manual_seed(0)
    norms = [m for m in build_pi05(tiny_config()).modules() if isinstance(m, AdaRMSNorm)]
    assert len(norms) == 2 * 2 + 1  # two per expert layer (tiny: 2 layers) and the final one
    assert all(not n.dense.weight.any() and not n.dense.bias.any() for n in norms)
    x, cond = torch.randn(2, 3, norms[0].dense.out_features // 3), torch.randn(2, 64)
    y, gate = norms[0](x, cond[:, : norms[0].dense.in_features])
    rms = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + norms[0].eps)
    torch.testing.assert_close(y, rms)
    assert not gate.any()
