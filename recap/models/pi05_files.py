"""π0.5 checkpoint files: the openpi PyTorch and LeRobot layouts, strictly; no model code.

openpi (``PI0Pytorch(pi05=True)``, written with safetensors ``save_model``): one
``model.safetensors`` whose keys are exactly ``Pi05Policy``'s state-dict keys
(``paligemma_with_expert.paligemma.model.{vision_tower.vision_model, multi_modal_projector.linear,
language_model}.…``, ``paligemma_with_expert.gemma_expert.model.{layers.i, norm}.…`` with
``input_layernorm.dense`` / ``post_attention_layernorm.dense`` adaptive norms, ``action_in_proj``,
``action_out_proj``, ``time_mlp_in``, ``time_mlp_out``), plus two vocabulary heads that flow
matching never reads:

- ``paligemma_with_expert.paligemma.lm_head.weight`` is tied to
  ``…language_model.embed_tokens.weight``; ``save_model`` keeps one name per tied tensor (this
  one), so the embedding key is usually absent and is read from ``lm_head`` then.
- ``paligemma_with_expert.gemma_expert.lm_head.weight`` [vocab, expert width], the expert's unused
  LM head, is dropped.

LeRobot (``PI05Policy``) stores the same keys under ``model.``. Anything else missing or
unexpected is a one-line ``RecapError`` naming the first keys and the count. Saving mirrors the
files: the embedding under ``lm_head`` and a zero expert head, so openpi's strict
``safetensors.torch.load_model`` and LeRobot's strict load accept them; ``recap_pi05.json`` keeps
the exact ``Pi05Config`` and ``config.json`` the fields openpi/LeRobot read. openpi's training
checkpoints (``<step>/model.safetensors``, no config file) load with the caller's sizes.

This module knows the files (names, key layouts, the strict state-dict check, the writer) and
imports nothing of ``recap.models.pi05``: ``pi05`` builds on it (``Pi05Policy.save_pretrained``,
``read_config`` / ``load_pi05``, which build a ``Pi05Policy``), and ``recap.models.checkpoints``
gathers both (with the normalization statistics) as the one import for callers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from recap.errors import RecapError
from recap.weights import safetensors_bytes

# openpi's Gemma variants (``gemma_2b``: PaliGemma's language model, ``gemma_300m``: the action
# expert); ``Pi05Config``'s default sizes
PALIGEMMA_2B = {
    "vocab_size": 257152, "hidden_size": 2048, "intermediate_size": 16384,
    "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
}  # fmt: skip
GEMMA_300M = {
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 18,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
}  # fmt: skip
OPENPI, LEROBOT = "openpi", "lerobot"
LAYOUTS = (OPENPI, LEROBOT)
LEROBOT_PREFIX = "model."
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
RECAP_CONFIG_FILE = "recap_pi05.json"
EMBED_KEY = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
LM_HEAD_KEY = "paligemma_with_expert.paligemma.lm_head.weight"
EXPERT_LM_HEAD_KEY = "paligemma_with_expert.gemma_expert.lm_head.weight"
VARIANTS = {"gemma_2b": PALIGEMMA_2B, "gemma_300m": GEMMA_300M}
SHOWN = 3


def detect_layout(keys) -> str:
    """``lerobot`` when every key starts with ``model.``, else ``openpi``."""
    keys = list(keys)
    return LEROBOT if keys and all(k.startswith(LEROBOT_PREFIX) for k in keys) else OPENPI


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise RecapError(f"checkpoint layout {layout!r} is not one of {LAYOUTS}")
    return layout


def file_key(key: str, layout: str) -> str:
    """The name of model key ``key`` in a file of ``layout``."""
    return LEROBOT_PREFIX + key if layout == LEROBOT else key


def to_model_keys(state: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """File tensors renamed to ``Pi05Policy`` keys: LeRobot's ``model.`` prefix removed, the tied
    ``lm_head`` read as the embedding when the embedding is absent, unused heads dropped."""
    n = len(LEROBOT_PREFIX)
    if check_layout(layout) == LEROBOT:
        state = {k[n:] if k.startswith(LEROBOT_PREFIX) else k: v for k, v in state.items()}
    else:
        state = dict(state)
    head = state.pop(LM_HEAD_KEY, None)
    if head is not None and EMBED_KEY not in state:
        state[EMBED_KEY] = head
    state.pop(EXPERT_LM_HEAD_KEY, None)
    return state


def _listing(keys: list[str], what: str, layout: str) -> str:
    names = ", ".join(file_key(k, layout) for k in keys[:SHOWN])
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return f"{len(keys)} {what} key{'s' if len(keys) > 1 else ''} ({names}{more})"


def load_strict(
    model: torch.nn.Module, state: dict[str, torch.Tensor], source: object, layout: str
) -> None:
    """``model.load_state_dict(state)`` after checking names and shapes: any missing or
    unexpected key or shape mismatch is one ``RecapError`` line naming ``source`` and keys."""
    expected = model.state_dict(keep_vars=True)  # parameters keep their ZeRO-3 ds_shape
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        parts = [_listing(missing, "missing", layout)] if missing else []
        parts += [_listing(unexpected, "unexpected", layout)] if unexpected else []
        raise RecapError(
            f"{source}: {'; '.join(parts)} for the {layout} layout; use a π0.5 checkpoint whose "
            "sizes match the config (recap_pi05.json / config.json) or pass the right layout"
        )
    bad = [k for k in expected if tuple(state[k].shape) != _shape(expected[k])]
    if bad:
        k = bad[0]
        raise RecapError(
            f"{source}: {len(bad)} keys differ in shape, first {file_key(k, layout)}: "
            f"{tuple(state[k].shape)} in the file, {_shape(expected[k])} in the model; "
            "fix the config sizes to match the checkpoint"
        )
    if partitioned(model):
        model.pending_state = state  # the engine loads it into the partitions
    else:
        model.load_state_dict(state, strict=True)


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    """The full shape of a tensor, also of a ZeRO-3 partitioned parameter (``ds_shape``)."""
    return tuple(getattr(tensor, "ds_shape", tensor.shape))


def partitioned(model: torch.nn.Module) -> bool:
    """Whether the model was built partitioned (ZeRO-3 construction: parameters hold only
    this rank's slice). Its checked state is then left in ``model.pending_state`` for the
    engine, which loads it into the partitions (``engine.checkpointing.load_pending``)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


# openpi's published π0.5 configs, by name: the fields a config-less checkpoint of each needs
# beyond the real sizes (Pi05Config's defaults). pi05_libero: action_horizon 10.
NAMED_VARIANTS = {"pi05_base": {}, "pi05_droid": {"action_horizon": 15},
                  "pi05_libero": {"action_horizon": 10}}  # fmt: skip


def variant_fields(variant: str | None) -> dict:
    """``NAMED_VARIANTS[variant]`` (``{}`` for None); an unknown name is one line."""
    if variant is None:
        return {}
    if variant not in NAMED_VARIANTS:
        names = sorted(NAMED_VARIANTS)
        raise RecapError(f"pi05_policy.variant {variant!r} is not one of {names}; "
                         "or leave it None and bind the sizes")  # fmt: skip
    return dict(NAMED_VARIANTS[variant])


def steps_hint(path: Path) -> str:
    """`` (it holds training steps 1000, 2000: pass one of them)`` for an openpi training run
    directory (``<step>/model.safetensors``), else ``""``."""
    steps = [p.parent.name for p in path.glob(f"*/{WEIGHTS_FILE}")]
    steps.sort(key=lambda n: (int(n), n) if n.isdigit() else (-1, n))
    return f" (it holds training steps {', '.join(steps)}: pass one of them)" if steps else ""


def file_state(model: torch.nn.Module, layout: str) -> dict[str, torch.Tensor]:
    """The tensors ``save_pi05`` writes: openpi names (embedding under ``lm_head``, a zero
    expert head), prefixed with ``model.`` for LeRobot; on the model's device (``meta`` gives
    the names and shapes of a model never allocated)."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return state_to_file(state, model.action_in_proj.out_features, layout)


def state_to_file(
    state: dict[str, torch.Tensor], expert_width: int, layout: str
) -> dict[str, torch.Tensor]:
    """``file_state`` of a plain ``Pi05Policy`` state dict (e.g. merged LoRA weights,
    ``recap.models.adapters.merged_state``) whose action expert is ``expert_width`` wide."""
    state = dict(state)
    embed = state.pop(EMBED_KEY)
    state[LM_HEAD_KEY] = embed
    state[EXPERT_LM_HEAD_KEY] = embed.new_zeros(embed.shape[0], expert_width)
    return {file_key(k, layout): v for k, v in state.items()}


def foreign_config(config: Any, layout: str) -> dict:
    """The ``config.json`` fields openpi (converter output) or LeRobot (``PI05Config``) read."""
    variants = {
        "paligemma_variant": next((n for n, v in VARIANTS.items() if v == config.text), "custom"),
        "action_expert_variant": next((n for n, v in VARIANTS.items() if v == config.expert),
                                      "custom"),
    }  # fmt: skip
    if layout == OPENPI:
        return {"action_dim": config.action_dim, "action_horizon": config.action_horizon,
                **variants}  # fmt: skip
    size = int(config.vision.get("image_size", 224))
    return {"type": "pi05", **variants, "chunk_size": config.action_horizon,
            "n_action_steps": config.action_horizon, "max_action_dim": config.action_dim,
            "num_inference_steps": config.num_steps, "image_resolution": [size, size]}  # fmt: skip


def save_pi05(model: torch.nn.Module, directory: str | os.PathLike, layout: str = OPENPI) -> Path:
    """Write ``model.safetensors`` (``file_state``), ``config.json`` and ``recap_pi05.json``
    atomically (``write_pi05_files``); returns the weights path."""
    layout = check_layout(layout)
    return write_pi05_files(directory, file_state(model, layout), model.config, layout)


def write_pi05_files(
    directory: str | os.PathLike,
    state: dict[str, torch.Tensor],
    config: Any,
    layout: str = OPENPI,
    metadata: dict[str, str] | None = None,
    extra_config: dict | None = None,
) -> Path:
    """``state`` (keyed in ``layout``) as ``model.safetensors`` with ``config.json`` (the
    layout's own config, plus ``extra_config`` fields: LeRobot's features,
    ``recap.interop.lerobot``) and ``recap_pi05.json``, all or none replaced (``write_atomic``);
    returns the weights path."""
    from recap.io import write_atomic

    path = Path(directory)
    tensors = {k: v.contiguous().cpu() for k, v in state.items()}
    meta = {"format": "pt", **(metadata or {})}
    foreign = foreign_config(config, layout) | (extra_config or {})
    write_atomic({
        path / WEIGHTS_FILE: lambda p: p.write_bytes(safetensors_bytes(tensors, meta)),
        path / CONFIG_FILE: lambda p: p.write_text(json.dumps(foreign)),
        path / RECAP_CONFIG_FILE: lambda p: p.write_text(
            json.dumps(dataclasses.asdict(config), indent=2)),
    })  # fmt: skip
    return path / WEIGHTS_FILE
