"""Shared transformer pieces built from stock transformers Gemma3 blocks (no patched transformers).

- ``prefix_attention_mask``: a bidirectional mask over valid tokens, in the format the configured
  attention implementation expects (transformers' ``create_bidirectional_mask``).
- ``layer_kv``: the post-norm, post-RoPE keys/values that a stock ``Gemma3DecoderLayer`` computes
  from its input; an expert attending to the backbone reads them.
- ``run_prefix``: the backbone's first layers over a prefix, returning each layer's keys/values.
- ``CriticExpert``: a small Gemma stack whose single CLS token attends, layer by layer, to the
  backbone's keys/values of the same layer index plus its own key/value.

Shapes: B batch, P prefix length, H heads, K key/value heads, D head dim, W widths.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Gemma3TextConfig
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.gemma3.modeling_gemma3 import (
    Gemma3DecoderLayer,
    Gemma3RMSNorm,
    rotate_half,
)

KV = tuple[torch.Tensor, torch.Tensor]


def prefix_attention_mask(config: Gemma3TextConfig, embeds: torch.Tensor, valid: torch.Tensor):
    """Mask letting every query attend to every valid key (bool[B, P_kv] ``valid``).

    ``embeds`` float[B, P_q, W] gives batch size, dtype and device. Returns the 4D mask of
    ``config._attn_implementation`` (bool or additive float [B, 1, P_q, P_kv]); queries at padded
    positions also see the valid keys, so no row is empty (no NaN) and nothing valid reads them.
    """
    return create_bidirectional_mask(
        config=config,
        inputs_embeds=embeds,
        attention_mask=valid,
        allow_is_bidirectional_skip=False,
    )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """float[B, H, P, D] rotated by RoPE ``cos``/``sin`` float[B, P, D] (Gemma convention)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def layer_kv(layer: Gemma3DecoderLayer, hidden: torch.Tensor, rope: KV) -> KV:
    """Keys and values float[B, K, P, D] of a stock Gemma3 layer from its input float[B, P, W].

    Exactly the layer's own computation: k = RoPE(k_norm(k_proj(input_layernorm(h)))),
    v = v_proj(input_layernorm(h)).
    """
    return _project_kv(layer.self_attn, layer.input_layernorm(hidden), rope)


def _project_kv(attn: nn.Module, x: torch.Tensor, rope: KV) -> KV:
    shape = (*x.shape[:-1], -1, attn.head_dim)
    keys = attn.k_norm(attn.k_proj(x).view(shape).transpose(1, 2))
    values = attn.v_proj(x).view(shape).transpose(1, 2)
    return apply_rope(keys, *rope), values


def run_prefix(
    text_model: nn.Module,
    embeds: torch.Tensor,
    valid: torch.Tensor,
    positions: torch.Tensor,
    depth: int,
    compute_all: bool = False,
) -> list[KV]:
    """Keys/values of backbone layers ``0..depth-1`` over a bidirectional prefix.

    ``text_model``: a stock ``Gemma3TextModel``; ``embeds`` float[B, P, W]; ``valid`` bool[B, P];
    ``positions`` int64[B, P]. Layer i's keys/values depend only on layers < i, so layers
    ``0..depth-2`` run in full and layer ``depth-1`` only projects its keys/values; nothing later
    is computed unless ``compute_all`` (the wasteful reference: every layer and the final norm run
    and are discarded, as when a full backbone is run for its cache).
    """
    config = text_model.config
    mask = prefix_attention_mask(config, embeds, valid)
    ropes = {t: text_model.rotary_emb(embeds, positions, t) for t in set(config.layer_types)}
    hidden, kvs = embeds, []
    layers = text_model.layers[: config.num_hidden_layers]
    last = len(layers) if compute_all else depth - 1
    for i, layer in enumerate(layers[: max(last, depth)]):
        rope = ropes[config.layer_types[i]]
        if i < depth:
            kvs.append(layer_kv(layer, hidden, rope))
        if i < last:
            hidden = layer(
                hidden, position_embeddings=rope, attention_mask=mask, position_ids=positions
            )
    if compute_all:
        text_model.norm(hidden)
    return kvs


def expert_config(
    backbone: Gemma3TextConfig,
    width: int,
    depth: int,
    mlp: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> Gemma3TextConfig:
    """A Gemma3 text config for the expert: its own sizes, the backbone's norms and RoPE types."""
    return Gemma3TextConfig(
        vocab_size=1,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        hidden_size=width,
        intermediate_size=mlp,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        rms_norm_eps=backbone.rms_norm_eps,
        hidden_activation=backbone.hidden_activation,
        layer_types=list(backbone.layer_types[:depth]),
        rope_parameters=backbone.rope_parameters,
        attn_logit_softcapping=None,
    )


class CriticExpert(nn.Module):
    """Gemma decoder layers over one token that reads the backbone's keys/values layer by layer.

    Each layer is a stock ``Gemma3DecoderLayer`` (pre/post RMSNorms, q/k norms, gated MLP) whose
    attention is evaluated here for a single query against ``[backbone keys; own key]``: the
    expert's keys/values must have the backbone's key/value heads and head dim.
    """

    def __init__(self, config: Gemma3TextConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, token: torch.Tensor, prefix: list[KV], valid: torch.Tensor, ropes: list[KV]
    ) -> torch.Tensor:
        """float[B, W] final hidden state of ``token`` float[B, 1, W].

        ``prefix[i]``: backbone layer i's keys/values float[B, K, P, D]; ``valid`` bool[B, P];
        ``ropes[i]``: cos/sin float[B, 1, D] at the token's position for layer i's RoPE type.
        """
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
        bias = bias.masked_fill(~valid, float("-inf"))
        bias = torch.cat([bias, bias.new_zeros(valid.shape[0], 1)], dim=1)[:, None, None, :]
        hidden = token
        for layer, kv, rope in zip(self.layers, prefix, ropes):
            hidden = self._layer(layer, hidden, kv, bias, rope)
        return self.norm(hidden)[:, 0]

    @staticmethod
    def _layer(
        layer: Gemma3DecoderLayer, hidden: torch.Tensor, prefix: KV, bias: torch.Tensor, rope: KV
    ) -> torch.Tensor:
        """One Gemma3 decoder layer for query float[B, 1, W] over prefix + itself."""
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (*x.shape[:-1], -1, attn.head_dim)
        query = apply_rope(attn.q_norm(attn.q_proj(x).view(shape).transpose(1, 2)), *rope)
        own_k, own_v = _project_kv(attn, x, rope)
        keys = torch.cat([prefix[0].to(own_k.dtype), own_k], dim=2)
        values = torch.cat([prefix[1].to(own_v.dtype), own_v], dim=2)
        groups = attn.num_key_value_groups
        keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
        scores = (query.float() @ keys.float().transpose(2, 3)) * attn.scaling + bias
        out = (scores.softmax(dim=-1).to(values.dtype) @ values).transpose(1, 2)
        hidden = hidden + layer.post_attention_layernorm(
            attn.o_proj(out.reshape(*x.shape[:-1], -1))
        )
        mlp_out = layer.mlp(layer.pre_feedforward_layernorm(hidden))
        return hidden + layer.post_feedforward_layernorm(mlp_out)
