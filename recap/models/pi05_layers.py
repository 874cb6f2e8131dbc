"""π0.5 transformer pieces: adaptive RMSNorm, the action expert, and joint prefix/suffix attention.

Two Gemma stacks of equal depth share attention layer by layer (openpi
``PaliGemmaWithExpertModel``): at layer i the prefix stream (PaliGemma's Gemma-2B layer i) and the
suffix stream (the action expert's layer i) each project their own Q/K/V; the projections are
concatenated along the sequence, one attention runs over ``[prefix; suffix]``, and each stream
applies its own ``o_proj`` and MLP to its slice of the result. Every layer is built from stock
transformers Gemma blocks (``GemmaAttention`` projections, ``GemmaMLP``, ``GemmaRMSNorm``, the
Gemma rotary embedding); only their composition lives here.

Mask (True = may attend), ``valid`` bool[B, P] marking real prefix tokens:

- prefix query -> prefix key j: ``valid[j]``; prefix -> suffix: never (the prefix never sees
  actions, so its keys/values can be cached and reused by every denoising step);
- suffix query -> prefix key j: ``valid[j]``; suffix -> suffix: always (bidirectional, as π0.5).

Positions: prefix ``cumsum(valid) - 1``; suffix ``valid.sum() + arange(H)``.

Time enters the expert only through ``AdaRMSNorm``: (scale, shift, gate) = dense(cond),
``y = x / rms(x) * (1 + scale) + shift`` and the residual is gated, ``h + gate * f(y)``.

Shapes: B batch, P prefix length, H suffix (action) length, W widths, D head dim.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import GemmaConfig
from transformers.models.gemma.modeling_gemma import GemmaAttention, GemmaMLP

from recap.models.layers import KV, apply_rope

ATTENTION = ("sdpa", "eager")


class AdaRMSNorm(nn.Module):
    """Adaptive RMSNorm (openpi π0.5): ``(y, gate)`` for ``x`` float[B, L, W], ``cond`` float[B, C].

    (scale, shift, gate) = chunk3(dense(cond)); y = x / sqrt(mean(x^2) + eps) * (1 + scale) +
    shift, computed in float32 and returned in x's dtype. Parameters: ``dense.weight``
    [3W, C], ``dense.bias`` [3W] (no ``weight``: the scale comes from ``cond``).
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)
        nn.init.zeros_(self.dense.weight)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(cond.to(self.dense.weight.dtype))[:, None].chunk(3, dim=-1)
        out = normed * (1.0 + scale.float()) + shift.float()
        return out.to(x.dtype), gate.to(x.dtype)


class ExpertLayer(nn.Module):
    """One action-expert layer: stock Gemma attention projections and MLP, adaptive norms."""

    def __init__(self, config: GemmaConfig, index: int):
        super().__init__()
        self.self_attn = GemmaAttention(config, index)
        self.mlp = GemmaMLP(config)
        width = config.hidden_size
        self.input_layernorm = AdaRMSNorm(width, width, config.rms_norm_eps)
        self.post_attention_layernorm = AdaRMSNorm(width, width, config.rms_norm_eps)


class ActionExpert(nn.Module):
    """The Gemma action expert without token embeddings: ``layers`` and a final ``norm``.

    Linear weights start as Gemma's (normal, std ``initializer_range``; zero biases), except the
    adaptive norms' modulation, which starts at zero (openpi's ``kernel_init=zeros``): at
    initialization every norm is a plain RMSNorm and the time conditioning grows from there.
    """

    def __init__(self, config: GemmaConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(ExpertLayer(config, i) for i in range(config.num_hidden_layers))
        width = config.hidden_size
        self.norm = AdaRMSNorm(width, width, config.rms_norm_eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=config.initializer_range)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, AdaRMSNorm):  # after the loop above, which would overwrite it
                nn.init.zeros_(module.dense.weight)


@dataclasses.dataclass
class Prefix:
    """Prefix tokens float[B, P, W] and their validity bool[B, P]."""

    embeds: torch.Tensor
    valid: torch.Tensor

    def positions(self) -> torch.Tensor:
        """int64[B, P] ``cumsum(valid) - 1`` (clamped at 0)."""
        return (self.valid.long().cumsum(1) - 1).clamp(min=0)

    def suffix_positions(self, length: int) -> torch.Tensor:
        """int64[B, H] positions after the last valid prefix token."""
        start = self.valid.long().sum(1, keepdim=True)
        return start + torch.arange(length, device=start.device)[None]


def _norm(norm: nn.Module, x: torch.Tensor, cond: torch.Tensor | None):
    if isinstance(norm, AdaRMSNorm):
        return norm(x, cond)
    return norm(x), None


def _residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return x + y if gate is None else x + y * gate


def project(layer: nn.Module, hidden: torch.Tensor, cond, rope: KV, queries: bool = True):
    """``(q | None, k, v, gate)`` of a Gemma layer: q/k = RoPE(proj(norm(h))), v = proj(norm(h)),
    float[B, heads, L, D]; ``gate`` is the adaptive norm's gate (None for a plain norm)."""
    x, gate = _norm(layer.input_layernorm, hidden, cond)
    attn = layer.self_attn
    shape = (*x.shape[:-1], -1, attn.head_dim)
    key = apply_rope(attn.k_proj(x).view(shape).transpose(1, 2), *rope)
    value = attn.v_proj(x).view(shape).transpose(1, 2)
    query = apply_rope(attn.q_proj(x).view(shape).transpose(1, 2), *rope) if queries else None
    return query, key, value, gate


def finish(layer: nn.Module, hidden, attn_out: torch.Tensor, gate, cond) -> torch.Tensor:
    """Rest of the layer: h = h + gate * o_proj(attn); h = h + gate' * mlp(norm'(h))."""
    out = layer.self_attn.o_proj(attn_out.to(layer.self_attn.o_proj.weight.dtype))
    hidden = _residual(hidden, out.to(hidden.dtype), gate)
    x, gate = _norm(layer.post_attention_layernorm, hidden, cond)
    return _residual(hidden, layer.mlp(x), gate)


def attend(q, k, v, mask: torch.Tensor, scaling: float, impl: str = "sdpa") -> torch.Tensor:
    """float[B, Lq, Hq * D]: softmax(q k^T * scaling, masked) v for q float[B, Hq, Lq, D],
    k/v float[B, K, Lk, D] (grouped: each k/v head serves Hq / K query heads), mask
    bool[B, 1, Lq, Lk]. ``eager`` computes scores and softmax in float32."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.to(q.dtype), v.to(q.dtype)
    if groups > 1:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    if impl == "sdpa":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
    else:
        scores = (q.float() @ k.float().transpose(2, 3)) * scaling
        scores = scores.masked_fill(~mask, float("-inf"))
        out = scores.softmax(dim=-1).to(v.dtype) @ v
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def joint_mask(valid: torch.Tensor, suffix_len: int) -> torch.Tensor:
    """bool[B, 1, P + H, P + H] (module docstring): prefix rows see valid prefix keys, suffix rows
    see valid prefix keys and every suffix key."""
    batch, length = valid.shape
    keys = torch.cat([valid, valid.new_ones(batch, suffix_len)], dim=1)
    mask = keys[:, None, None, :].expand(batch, 1, length + suffix_len, -1).clone()
    mask[:, :, :length, length:] = False
    return mask


class PaliGemmaWithExpert(nn.Module):
    """PaliGemma (``paligemma.model.{vision_tower, multi_modal_projector, language_model}``) and
    the action expert (``gemma_expert.model``): module paths equal openpi's state-dict keys."""

    def __init__(self, vision_tower, projector, language_model, expert: ActionExpert, impl: str):
        super().__init__()
        parts = {"vision_tower": vision_tower, "multi_modal_projector": projector,
                 "language_model": language_model}  # fmt: skip
        self.paligemma = nn.ModuleDict({"model": nn.ModuleDict(parts)})
        self.gemma_expert = nn.ModuleDict({"model": expert})
        self.impl = impl
        self.gradient_checkpointing = False

    @property
    def language_model(self) -> nn.Module:
        return self.paligemma["model"]["language_model"]

    @property
    def expert(self) -> ActionExpert:
        return self.gemma_expert["model"]

    def _rope(self, like: torch.Tensor, positions: torch.Tensor) -> KV:
        return self.language_model.rotary_emb(like, positions)

    def joint(self, prefix: Prefix, suffix: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """float[B, H, We]: the expert's final (adaptively normed) states of ``suffix``
        float[B, H, We] after attending jointly with ``prefix`` at every layer (training path)."""
        length = prefix.valid.shape[1]
        positions = torch.cat([prefix.positions(), prefix.suffix_positions(suffix.shape[1])], 1)
        cos, sin = self._rope(prefix.embeds, positions)
        ropes = ((cos[:, :length], sin[:, :length]), (cos[:, length:], sin[:, length:]))
        mask = joint_mask(prefix.valid, suffix.shape[1])
        pairs = list(zip(self.language_model.layers, self.expert.layers))
        hp, hs = prefix.embeds, suffix
        for i, (lp, ls) in enumerate(pairs):
            args = (lp, ls, hp, hs, cond, ropes, mask, i < len(pairs) - 1)
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                hp, hs = checkpoint(self._joint_layer, *args, use_reentrant=False)
            else:
                hp, hs = self._joint_layer(*args)
        return self.expert.norm(hs, cond)[0]

    def _joint_layer(self, lp, ls, hp, hs, cond, ropes, mask, prefix_out: bool):
        """One shared-attention layer; the last layer (``prefix_out`` False) only needs the
        prefix keys/values, so prefix queries, o_proj and MLP are skipped there."""
        qp, kp, vp, gp = project(lp, hp, None, ropes[0], queries=prefix_out)
        qs, ks, vs, gs = project(ls, hs, cond, ropes[1])
        keys, values = torch.cat([kp, ks.to(kp.dtype)], 2), torch.cat([vp, vs.to(vp.dtype)], 2)
        length = hp.shape[1]
        query = torch.cat([qp, qs.to(qp.dtype)], 2) if prefix_out else qs
        out = attend(query, keys, values, mask if prefix_out else mask[:, :, length:],
                     lp.self_attn.scaling, self.impl)  # fmt: skip
        hs = finish(ls, hs, out[:, -hs.shape[1] :], gs, cond)
        hp = finish(lp, hp, out[:, :length], gp, None) if prefix_out else hp
        return hp, hs

    def prefix_cache(self, prefix: Prefix) -> list[KV]:
        """Per-layer prefix keys/values float[B, K, P, D] (the KV cache): the prefix stream alone
        (it never attends to actions, so this equals its part of ``joint``)."""
        rope = self._rope(prefix.embeds, prefix.positions())
        mask = prefix.valid[:, None, None, :]
        layers = self.language_model.layers
        hidden, cache = prefix.embeds, []
        for i, layer in enumerate(layers):
            last = i == len(layers) - 1
            query, key, value, gate = project(layer, hidden, None, rope, queries=not last)
            cache.append((key, value))
            if not last:
                out = attend(query, key, value, mask, layer.self_attn.scaling, self.impl)
                hidden = finish(layer, hidden, out, gate, None)
        return cache

    def suffix_with_cache(
        self, cache: list[KV], prefix: Prefix, suffix: torch.Tensor, cond: torch.Tensor
    ) -> torch.Tensor:
        """Same as ``joint(prefix, suffix, cond)`` from the cached prefix keys/values."""
        batch, horizon = suffix.shape[:2]
        rope = self._rope(suffix, prefix.suffix_positions(horizon))
        keys = torch.cat([prefix.valid, prefix.valid.new_ones(batch, horizon)], dim=1)
        mask = keys[:, None, None, :].expand(batch, 1, horizon, -1)
        hidden = suffix
        for layer, (k_prefix, v_prefix) in zip(self.expert.layers, cache):
            query, key, value, gate = project(layer, hidden, cond, rope)
            keys_all = torch.cat([k_prefix, key.to(k_prefix.dtype)], 2)
            values_all = torch.cat([v_prefix, value.to(v_prefix.dtype)], 2)
            out = attend(query, keys_all, values_all, mask, layer.self_attn.scaling, self.impl)
            hidden = finish(layer, hidden, out, gate, cond)
        return self.expert.norm(hidden, cond)[0]


class VisionTower(nn.Module):
    """Holds a stock ``SiglipVisionModel`` as ``vision_model`` (openpi's key path).

    transformers 5.24 (recap's pin) builds ``SiglipVisionModel`` flat (``embeddings``,
    ``encoder``, ...); 5.5.4 (LeRobot 0.6.1's) nests them under its own ``vision_model``, which
    gave ``vision_model.vision_model.*`` keys: the nested transformer is held instead, so the
    keys are openpi's under either (``make test-lerobot`` found it)."""

    def __init__(self, siglip: nn.Module):
        super().__init__()
        inner = getattr(siglip, "vision_model", None)
        self.vision_model = inner if isinstance(inner, nn.Module) else siglip

    @property
    def config(self):
        return self.vision_model.config

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """float[N, T, Wv] last hidden states of images float[N, 3, S, S] in [-1, 1]."""
        return self.vision_model(pixel_values=pixel_values).last_hidden_state


def time_embedding(
    time: torch.Tensor, dim: int, min_period: float, max_period: float
) -> torch.Tensor:
    """float32[B, dim] sinusoidal embedding of ``time`` float[B] (openpi): with
    period_k = min_period * (max_period / min_period)^(k / (dim/2 - 1)), k < dim/2,
    emb = [sin(2 pi t / period), cos(2 pi t / period)]. Computed in float64 on the CPU (the
    angles reach 2 pi / min_period; some accelerators lack float64), then moved to ``time``'s
    device."""
    if dim % 2:
        raise ValueError(f"time embedding dimension {dim} must be even")
    t = time.detach().to("cpu", torch.float64)
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64)
    period = min_period * (max_period / min_period) ** fraction
    angle = t[:, None] * (2 * torch.pi / period)[None]
    return torch.cat([angle.sin(), angle.cos()], dim=1).float().to(time.device)
