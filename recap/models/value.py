"""Step 2 value model: SigLIP vision + projector + Gemma3 text backbone + critic expert + head.

Prefix = per camera ``(image_size / patch_size)**2`` image tokens (SigLIP ``last_hidden_state``
through a fresh ``Linear(vision -> text)``), then the prompt's text tokens (Gemma3's scaled
embedding). Attention over the prefix is bidirectional among valid tokens (a materialized
padding mask for every layer, sliding-window layers included, as in RLinf); positions are
``cumsum(valid) - 1`` so masked tokens shift nothing. A critic expert (``CriticExpert``) runs one
learned CLS token at position ``valid.sum()`` through ``expert_depth`` Gemma layers; layer i
attends to backbone layer i's keys/values plus its own. ``head.proj`` maps the CLS state to
``num_bins`` logits over atoms ``linspace(v_min, v_max)``; V = E[atom].

``expert_style``: ``"gemma3"`` (default) builds the expert from stock Gemma3 decoder layers;
``"gemma1"`` is RLinf's critic expert (``Gemma1Expert``: input and post-attention RMSNorm
``x * rsqrt(mean(x^2) + eps) * (1 + w)`` only, no q/k norms, gated gelu-tanh MLP, RoPE base
10000, scores scaled by ``head_dim ** -0.5``), whose weights map one to one onto RLinf's
``value_expert.experts.value.model.*`` keys (``recap.interop.rlinf``).

Only backbone layers ``0..expert_depth-1`` are read, so with ``truncate_backbone`` (default) the
text model is built with ``expert_depth`` layers (later pretrained layers are never loaded) and the
last of them only projects keys/values (``layers.run_prefix``); parameters that cannot reach the
value are frozen. Camera slots masked for the whole batch skip SigLIP and leave the prefix.

Batch keys: ``images`` float[B, C, 3, S, S] in [-1, 1] (cameras base, left wrist, right wrist);
``image_masks`` bool[B, C]; ``input_ids`` int64[B, L]; ``attention_mask`` bool[B, L] (text);
``target`` float[B] normalized return y in [-1, 0] (training / eval only).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModel, Gemma3TextConfig, SiglipVisionConfig
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

from recap.configurable import config_fields, configurable
from recap.errors import RecapError
from recap.models import layers
from recap.models.adapters import AdapterHooks, LoraOptions, adapt, check_freeze
from recap.models.losses import categorical_value_loss, expected_value
from recap.processing.transforms import frames_to_images
from recap.weights import save_safetensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHT_FILES = (WEIGHTS_FILE, "model.safetensors.index.json", "pytorch_model.bin")
ATTENTION = ("sdpa", "eager")
EXPERT_STYLES = ("gemma3", "gemma1")
GEMMA1_ROPE_THETA = 10_000.0
GEMMA1_RMS_EPS = 1e-6

SIGLIP_SO400M_224 = {
    "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
    "num_attention_heads": 16, "image_size": 224, "patch_size": 14,
    "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6,
}  # fmt: skip
GEMMA3_270M = {
    "vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "max_position_embeddings": 32768, "query_pre_attn_scalar": 256, "sliding_window": 512,
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ValueModelConfig:
    """Sizes of every part. ``vision``/``text``: SigLIP vision / Gemma3 text config dicts."""

    vision: dict = dataclasses.field(default_factory=lambda: dict(SIGLIP_SO400M_224))
    text: dict = dataclasses.field(default_factory=lambda: dict(GEMMA3_270M))
    expert_width: int = 128
    expert_depth: int = 4
    expert_mlp: int = 448
    expert_heads: int = 1
    expert_kv_heads: int = 1
    expert_head_dim: int = 256
    num_bins: int = 201
    v_min: float = -1.0
    v_max: float = 0.0
    truncate_backbone: bool = True
    attn_implementation: str = "sdpa"
    expert_style: str = "gemma3"

    def vision_config(self) -> SiglipVisionConfig:
        config = SiglipVisionConfig.from_dict({**self.vision, "vision_use_head": False})
        config._attn_implementation = self.attn_implementation
        return config

    def text_config(self) -> Gemma3TextConfig:
        """The backbone config: ``expert_depth`` layers when truncated, else the full stack."""
        text = dict(self.text)
        if self.truncate_backbone:
            full = Gemma3TextConfig.from_dict(text)
            text["num_hidden_layers"] = self.expert_depth
            text["layer_types"] = list(full.layer_types[: self.expert_depth])
        config = Gemma3TextConfig.from_dict(text)
        config._attn_implementation = self.attn_implementation
        return config

    def validate(self) -> None:
        """Raise ``RecapError`` when the parts cannot fit together."""
        text = Gemma3TextConfig.from_dict(self.text)
        problems = []
        if self.attn_implementation not in ATTENTION:
            problems.append(f"attn_implementation {self.attn_implementation!r} not in {ATTENTION}")
        if self.expert_style not in EXPERT_STYLES:
            problems.append(f"expert_style {self.expert_style!r} not in {EXPERT_STYLES}")
        if not 1 <= self.expert_depth <= text.num_hidden_layers:
            problems.append(f"expert_depth {self.expert_depth} not in 1..{text.num_hidden_layers}")
        if self.expert_kv_heads != text.num_key_value_heads:
            problems.append(
                f"expert_kv_heads {self.expert_kv_heads} != backbone "
                f"num_key_value_heads {text.num_key_value_heads}"
            )
        if self.expert_head_dim != text.head_dim:
            problems.append(
                f"expert_head_dim {self.expert_head_dim} != backbone head_dim {text.head_dim}"
            )
        if problems:
            raise RecapError(f"value model config: {'; '.join(problems)}; fix the expert sizes")

    # ---- recap.engine.protocol.MemoryProbe: what recap-plan-memory measures ----------------

    def memory_depths(self) -> dict[str, int]:
        """The SigLIP tower's and the expert's depths (and the backbone's when kept whole)."""
        knobs = {"vision": self.vision["num_hidden_layers"], "expert": self.expert_depth}
        if self.truncate_backbone:  # the backbone is built expert_depth deep
            return knobs
        return knobs | {"text": Gemma3TextConfig.from_dict(dict(self.text)).num_hidden_layers}

    def memory_scaled(self, depths: dict[str, int], vocab_size: int) -> ValueModelConfig:
        text = {**self.text, "vocab_size": vocab_size}
        if "text" in depths:
            text = with_layers(text, depths["text"])
        return dataclasses.replace(self, vision=with_layers(self.vision, depths["vision"]),
                                   text=text, expert_depth=depths["expert"])  # fmt: skip

    def memory_build(self, dtype: torch.dtype) -> ValueModel:
        return build_value_model(self, dtype=dtype)

    def example_batch(
        self, cameras: int, prompt_tokens: int, batch_size: int, vocab_size: int
    ) -> dict[str, torch.Tensor]:
        batch = example_inputs(self.vision, cameras, prompt_tokens, batch_size, vocab_size)
        return batch | {"target": torch.full((batch_size,), -0.5)}

    def set_checkpointing(self, model: nn.Module, enabled: bool) -> bool:
        return False  # the value model has no gradient checkpointing


def with_layers(sizes: dict, layers: int) -> dict:
    """A transformers config dict with ``layers`` hidden layers (``layer_types`` cut to match)."""
    out = {**sizes, "num_hidden_layers": layers}
    if "layer_types" in out:
        out["layer_types"] = list(out["layer_types"][:layers])
    return out


def example_inputs(
    vision: dict, cameras: int, prompt_tokens: int, batch_size: int, vocab_size: int
) -> dict[str, torch.Tensor]:
    """Random images in [-1, 1] of ``vision``'s size (all ``cameras`` valid) and a full prompt."""
    size = vision["image_size"]
    return {
        "images": torch.rand(batch_size, cameras, 3, size, size) * 2 - 1,
        "image_masks": torch.ones(batch_size, cameras, dtype=torch.bool),
        "input_ids": torch.randint(0, vocab_size, (batch_size, prompt_tokens)),
        "attention_mask": torch.ones(batch_size, prompt_tokens, dtype=torch.bool),
    }


class ValueModel(AdapterHooks, nn.Module):
    """V(images, prompt) in [v_min, v_max]; ``loss, metrics = model(batch)`` (engine protocol)."""

    def __init__(
        self, config: ValueModelConfig, vision_tower: nn.Module, language_model: nn.Module
    ):
        super().__init__()
        config.validate()
        self.config = config
        text = language_model.config
        self.vision_tower = vision_tower
        self.projector = nn.Linear(vision_tower.config.hidden_size, text.hidden_size)
        self.language_model = language_model
        c = config
        if c.expert_style == "gemma1":
            self.expert = Gemma1Expert(
                c.expert_width,
                c.expert_depth,
                c.expert_mlp,
                c.expert_heads,
                c.expert_kv_heads,
                c.expert_head_dim,
            )
        else:
            self.expert = layers.CriticExpert(layers.expert_config(
                text, c.expert_width, c.expert_depth, c.expert_mlp, c.expert_heads,
                c.expert_kv_heads, c.expert_head_dim))  # fmt: skip
        self.head = nn.ModuleDict(
            {"cls": nn.Embedding(1, c.expert_width), "proj": nn.Linear(c.expert_width, c.num_bins)}
        )
        freeze_unread(language_model, c.expert_depth)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """``(loss float32[B], metrics)``: two-hot cross-entropy against ``batch["target"]``."""
        logits = self.logits(batch)
        target = batch["target"].float()
        c = self.config
        loss = categorical_value_loss(logits, target, c.v_min, c.v_max)
        return loss, value_metrics(expected_value(logits.detach(), c.v_min, c.v_max), target)

    def predict_value(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """float32[B] expected value E[V] (no ``target`` needed)."""
        return expected_value(self.logits(batch), self.config.v_min, self.config.v_max)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """float[B, num_bins] value logits of a batch (keys in the module docstring)."""
        images = batch["images"] if "images" in batch else self.images_from(batch["frames"])
        embeds, valid = self.embed_prefix(
            images, batch["image_masks"], batch["input_ids"], batch["attention_mask"]
        )
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        depth = self.config.expert_depth
        kvs = layers.run_prefix(
            self.language_model,
            embeds,
            valid,
            positions,
            depth,
            compute_all=not self.config.truncate_backbone,
        )
        batch_size = embeds.shape[0]
        token = self.head["cls"](torch.zeros(batch_size, 1, dtype=torch.long, device=valid.device))
        token_pos = valid.long().sum(dim=1, keepdim=True)
        if isinstance(self.expert, Gemma1Expert):
            return self.head["proj"](self.expert(token, kvs, valid, token_pos))
        types = self.language_model.config.layer_types[:depth]
        ropes = {t: self.language_model.rotary_emb(token, token_pos, t) for t in set(types)}
        hidden = self.expert(token, kvs, valid, [ropes[t] for t in types])
        return self.head["proj"](hidden)

    def images_from(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8[B, C, S, S, 3] camera slots -> the vision tower's float images in [-1, 1],
        augmented in training (``transforms.frames_to_images``)."""
        dtype = next(self.vision_tower.parameters()).dtype
        return frames_to_images(frames, self.training).to(dtype)

    def embed_prefix(
        self,
        images: torch.Tensor,
        image_masks: torch.Tensor,
        input_ids: torch.Tensor,
        text_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embeds float[B, P, W], valid bool[B, P])``: image tokens then text tokens.

        Camera slots masked in every example are skipped (the first slot always runs, so every
        rank calls the vision tower); this changes no value, as their tokens would be masked.
        """
        image_masks = image_masks.bool()
        keep = image_masks.any(dim=0)
        keep[0] = True
        slots = keep.nonzero().flatten().tolist()
        images, image_masks = images[:, slots], image_masks[:, slots]
        batch, cams = images.shape[:2]
        feats = self.vision_tower(pixel_values=images.flatten(0, 1)).last_hidden_state
        tokens = self.projector(feats)
        text = self.language_model.embed_tokens(input_ids)
        tokens = tokens.reshape(batch, cams * tokens.shape[1], -1).to(text.dtype)
        per_image = feats.shape[1]
        valid = torch.cat([image_masks.repeat_interleave(per_image, dim=1), text_mask.bool()], 1)
        return torch.cat([tokens, text], dim=1), valid

    def summarize_eval(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        """Set-level metrics over the whole eval set (Spearman with average ranks for ties)."""
        pred, target = outputs["predicted_value"], outputs["target_value"]
        stats = value_metrics(pred, target)
        keys = ("value_spearman", "predicted_value_mean", "predicted_value_std",
                "target_value_mean", "target_value_std")  # fmt: skip
        return {k: float(stats[k]) for k in keys} | {"value_mae": float(stats["value_mae"].mean())}

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json`` and ``model.safetensors`` (a plain, non-DeepSpeed model)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(self.config), indent=2))
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_safetensors(state, path / WEIGHTS_FILE, {"format": "pt"})


class Gemma1Layer(nn.Module):
    """A Gemma1 decoder layer's weights (``GemmaDecoderLayer`` names, no biases)."""

    def __init__(self, width: int, mlp: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.self_attn = nn.ModuleDict({
            "q_proj": nn.Linear(width, heads * head_dim, bias=False),
            "k_proj": nn.Linear(width, kv_heads * head_dim, bias=False),
            "v_proj": nn.Linear(width, kv_heads * head_dim, bias=False),
            "o_proj": nn.Linear(heads * head_dim, width, bias=False),
        })  # fmt: skip
        self.mlp = nn.ModuleDict({
            "gate_proj": nn.Linear(width, mlp, bias=False),
            "up_proj": nn.Linear(width, mlp, bias=False),
            "down_proj": nn.Linear(mlp, width, bias=False),
        })  # fmt: skip
        self.input_layernorm = GemmaRMSNorm(width, GEMMA1_RMS_EPS)
        self.post_attention_layernorm = GemmaRMSNorm(width, GEMMA1_RMS_EPS)


class Gemma1Expert(nn.Module):
    """RLinf's critic expert: Gemma1 layers over one token; layer i attends to the backbone
    layer i's keys/values float[B, K, P, D] (valid ones) plus its own key/value. Blocks
    ``x + attn(rms(x))``, ``x + mlp(rms(x))``, then the final norm; RoPE base 10000 at the
    token's position."""

    def __init__(self, width: int, depth: int, mlp: int, heads: int, kv_heads: int,
                 head_dim: int):  # fmt: skip
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.layers = nn.ModuleList(
            Gemma1Layer(width, mlp, heads, kv_heads, head_dim) for _ in range(depth)
        )
        self.norm = GemmaRMSNorm(width, GEMMA1_RMS_EPS)

    def rope(self, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin float32[B, 1, D] at int64[B, 1] ``position`` (base 10000, Gemma halves)."""
        half = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=position.device)
        inv = 1.0 / (GEMMA1_ROPE_THETA ** (half / self.head_dim))
        angles = position.float()[..., None] * inv
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, token: torch.Tensor, prefix: list, valid: torch.Tensor,
                position: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """float[B, W] final hidden state of ``token`` float[B, 1, W] at ``position``."""
        cos, sin = self.rope(position)
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
        bias = bias.masked_fill(~valid, float("-inf"))
        bias = torch.cat([bias, bias.new_zeros(valid.shape[0], 1)], dim=1)[:, None, None, :]
        hidden = token
        for layer, kv in zip(self.layers, prefix):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            b = x.shape[0]
            q = attn["q_proj"](x).view(b, 1, self.heads, self.head_dim).transpose(1, 2)
            k = attn["k_proj"](x).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn["v_proj"](x).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q = layers.apply_rope(q, cos.to(q.dtype), sin.to(q.dtype))
            k = layers.apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))
            keys = torch.cat([kv[0].to(k.dtype), k], dim=2)
            values = torch.cat([kv[1].to(v.dtype), v], dim=2)
            groups = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
            scores = (q.float() @ keys.float().transpose(2, 3)) * self.head_dim**-0.5 + bias
            out = (scores.softmax(dim=-1).to(values.dtype) @ values).transpose(1, 2)
            hidden = hidden + attn["o_proj"](out.reshape(b, 1, -1))
            x = layer.post_attention_layernorm(hidden)
            m = layer.mlp
            gate = nn.functional.gelu(m["gate_proj"](x), approximate="tanh")
            hidden = hidden + m["down_proj"](gate * m["up_proj"](x))
        return self.norm(hidden)[:, 0]


def freeze_unread(language_model: nn.Module, depth: int) -> None:
    """Freeze text-model parameters that cannot reach the value: the final norm, everything of
    layer ``depth-1`` except what projects its keys/values, and all later layers."""
    language_model.norm.requires_grad_(False)
    for layer in language_model.layers[depth - 1 :]:
        layer.requires_grad_(False)
    last = language_model.layers[depth - 1]
    for module in (last.input_layernorm, last.self_attn.k_proj, last.self_attn.v_proj,
                   last.self_attn.k_norm):  # fmt: skip
        module.requires_grad_(True)


def value_metrics(pred: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example ``[B]`` (``value_mae``, ``predicted_value``, ``target_value``) and batch 0-d
    (means, population stds, ``value_spearman``) metrics of float[B] predictions and targets."""
    pred, target = pred.detach().float(), target.detach().float()
    return {
        "value_mae": (pred - target).abs(),
        "predicted_value": pred,
        "target_value": target,
        "predicted_value_mean": pred.mean(),
        "predicted_value_std": pred.std(correction=0),
        "target_value_mean": target.mean(),
        "target_value_std": target.std(correction=0),
        "value_spearman": spearman(pred, target),
    }


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """float64[N] 1-based ranks of ``x`` float[N], ties sharing their average rank."""
    _, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    return (ends - (counts.double() - 1) / 2)[inverse]


def spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """float32[] rank correlation of float[N] ``x`` and ``y`` (0 when either is constant)."""
    rx, ry = average_ranks(x.flatten()), average_ranks(y.flatten())
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = (rx.square().sum() * ry.square().sum()).sqrt()
    return torch.where(denom > 0, (rx * ry).sum() / denom.clamp_min(1e-300), 0.0).float()


def build_value_model(config: ValueModelConfig, dtype: torch.dtype = torch.float32) -> ValueModel:
    """Randomly initialized model of ``dtype`` (not the configs' stored dtype) from configs, via
    transformers ``from_config`` for the large parts (ZeRO-3 partitions them at construction
    while an ``HfDeepSpeedConfig`` is alive)."""
    config.validate()
    vision = AutoModel.from_config(config.vision_config(), dtype=dtype)
    text = AutoModel.from_config(config.text_config(), dtype=dtype)
    return ValueModel(config, vision, text).to(dtype)


def check_model_dir(path: str | os.PathLike, what: str, fix: str) -> Path:
    """``path`` as a ``Path`` when it holds ``config.json`` and weights, else a one-line
    ``RecapError`` naming the directory, what is missing and ``fix``."""
    path = Path(path)
    if not path.is_dir():
        raise RecapError(f"{path}: {what} directory not found; {fix}")
    if not (path / CONFIG_FILE).is_file():
        raise RecapError(f"{path}: no {CONFIG_FILE} ({what} directory incomplete); {fix}")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise RecapError(
            f"{path}: no weights ({' / '.join(WEIGHT_FILES)}) in the {what} directory; {fix}"
        )
    return path


def _checked_dir(path: str | os.PathLike, what: str, types: tuple[str, ...], use: str) -> Path:
    """A complete local model directory whose config.json has a ``model_type`` in ``types``."""
    path = check_model_dir(path, what, f"download {use} once and pass its local directory")
    model_type = json.loads((path / CONFIG_FILE).read_text()).get("model_type")
    if model_type not in types:
        raise RecapError(f"{path / CONFIG_FILE}: model_type {model_type!r} is not supported "
                         f"(expected {' or '.join(types)}); use {use}")  # fmt: skip
    return path


def from_pretrained_parts(
    siglip_path: str | os.PathLike,
    gemma_path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    **sizes,
) -> ValueModel:
    """Pretrained SigLIP vision tower and Gemma3 text model from local directories (offline);
    projector, expert and head are new. ``sizes``: other ``ValueModelConfig`` fields. Weights
    load as ``dtype`` (float32 master weights by default, whatever the checkpoint stores).

    SigLIP2 works in its fixed-resolution form (``model_type: siglip``, e.g.
    siglip2-so400m-patch14-224); the SigLIP pooling head is never built or loaded. With
    ``truncate_backbone`` the Gemma3 layers past ``expert_depth`` are skipped when loading.
    """
    from transformers import Gemma3TextModel, SiglipVisionModel

    siglip = _checked_dir(
        siglip_path,
        "SigLIP",
        ("siglip", "siglip_vision_model"),
        "a fixed-resolution SigLIP/SigLIP2, e.g. siglip2-so400m-patch14-224",
    )
    gemma = _checked_dir(gemma_path, "Gemma3", ("gemma3_text",),
                         "a Gemma3 text model, e.g. gemma-3-270m")  # fmt: skip
    vision_cfg = SiglipVisionConfig.from_pretrained(siglip, local_files_only=True)
    text_cfg = Gemma3TextConfig.from_pretrained(gemma, local_files_only=True)
    config = ValueModelConfig(vision=vision_cfg.to_dict(), text=text_cfg.to_dict(), **sizes)
    config.validate()
    impl = config.attn_implementation
    vision = SiglipVisionModel.from_pretrained(
        siglip, config=config.vision_config(), attn_implementation=impl, dtype=dtype,
        local_files_only=True,
    )  # fmt: skip
    text = Gemma3TextModel.from_pretrained(
        gemma, config=config.text_config(), attn_implementation=impl, dtype=dtype,
        local_files_only=True,
    )  # fmt: skip
    return ValueModel(config, vision, text)


def load_value_model(directory: str | os.PathLike) -> ValueModel:
    """A model saved by ``ValueModel.save_pretrained`` (``config.json``, ``model.safetensors``)."""
    path = check_model_dir(
        directory,
        "value model",
        "point it at a directory written by "
        "ValueModel.save_pretrained (or train the value model first)",
    )
    fields = json.loads((path / CONFIG_FILE).read_text())
    known = {f.name for f in dataclasses.fields(ValueModelConfig)}
    if "vision" not in fields or "text" not in fields:
        raise RecapError(
            f"{path / CONFIG_FILE}: not a value model config (no 'vision'/'text'); "
            "point it at a directory written by ValueModel.save_pretrained"
        )
    model = build_value_model(ValueModelConfig(**{k: v for k, v in fields.items() if k in known}))
    model.load_state_dict(load_file(str(path / WEIGHTS_FILE)))
    return model


@configurable()
@config_fields(ValueModelConfig, vision=SiglipVisionConfig, text=Gemma3TextConfig)
def value_model(
    siglip_path: str | None = None,
    gemma_path: str | None = None,
    vision: dict | None = None,
    text: dict | None = None,
    lora: LoraOptions | None = None,
    freeze: Sequence[str] = (),
    **sizes,
) -> ValueModel:
    """Gin entry point: pretrained parts when both paths are set, else random init from
    ``vision``/``text`` config dicts (default: the real sizes, SigLIP so400m + Gemma3-270M).
    ``lora`` (``@LoraOptions()``: adapters on the Gemma3 layers the expert reads; critic
    expert and head fully trained) and ``freeze`` (towers ``vision``, ``language_model``,
    ``expert``, ``projector``): ``recap.models.adapters``. ``sizes``: other ``ValueModelConfig``
    fields, each a parameter gin checks at parse time (``config_fields``), as are the keys of
    ``vision`` / ``text`` (``SiglipVisionConfig`` / ``Gemma3TextConfig`` arguments)."""
    freeze = check_freeze(freeze, "value_model.freeze")
    if (siglip_path is None) != (gemma_path is None):
        raise RecapError(
            "value_model: set both siglip_path and gemma_path (pretrained) or neither "
            "(random init from the vision/text configs)"
        )
    if siglip_path is not None:
        return adapt(from_pretrained_parts(siglip_path, gemma_path, **sizes), lora, freeze)
    config = ValueModelConfig(
        vision=vision or dict(SIGLIP_SO400M_224), text=text or dict(GEMMA3_270M), **sizes
    )
    return adapt(build_value_model(config), lora, freeze)
