"""LoRA adapters (through ``peft``) and frozen towers for the value model and π0.5.

``adapt(model, lora, freeze)`` is what the gin factories (``pi05_policy.lora`` /
``pi05_policy.freeze``, ``value_model.lora`` / ``value_model.freeze``) call on a built model:

- ``lora`` (``LoraOptions``, None: full fine-tuning) injects ``peft`` LoRA layers
  (``inject_adapter_in_model``: the model keeps its class and its forward) on the projections
  named by ``target_modules`` of the language model (rank/alpha ``rank``/``alpha``) and, for
  π0.5, of the action expert (``expert_rank``/``expert_alpha``): openpi's ``gemma_2b_lora`` (16/16)
  and ``gemma_300m_lora`` (32/32). Everything else in an adapted tower is frozen; the vision tower
  keeps training fully (as openpi's LoRA recipe) unless it is adapted (``vision = True``: LoRA on
  SigLIP's ``vision_target_modules``) or frozen. Modules that never reach the loss (the last
  decoder layer's queries, output projection and MLP) get no adapter.
- ``freeze``: towers (``TOWERS``) whose parameters get no gradient.

Only parameters with ``requires_grad`` reach the optimizer (``deepspeed_config.param_groups``).
Exports (``recap.engine.checkpointing.export``, through ``AdapterHooks``): ``merged_state`` folds
every adapter into its base weight, ``W + (alpha / r) B A``, under the plain key names (the layout
of a full fine-tune); ``adapter_files`` is the adapter alone as ``peft`` writes it
(``adapter_config.json`` + ``adapter_model.safetensors``, the fully trained modules as
``modules_to_save``), so
``PeftModel.from_pretrained(base, directory)`` rebuilds the trained model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from recap.configurable import configurable, configured
from recap.errors import RecapError

TOWERS = ("vision", "language_model", "expert", "projector")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VISION_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")  # SigLIP's linears
ADAPTER = "default"  # peft's adapter name
ADAPTER_DIR = "adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # the key prefix of PeftModel.save_pretrained
FACTORIES = ("pi05_policy", "value_model")
LORA_KEY = re.compile(r"^(.*)\.lora_([AB])\." + ADAPTER + r"\.weight$")


def _check_names(field: str, names: object, allowed: Sequence[str], what: str) -> tuple:
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise RecapError(f"gin config: {field}={names!r} must be a list of {what} from "
                         f"{list(allowed)}")  # fmt: skip
    for name in names:
        if name not in allowed:
            raise RecapError(f"gin config: {field} has unknown {what} {name!r}; use names from "
                             f"{list(allowed)}")  # fmt: skip
    return tuple(names)


def _check_positive(field: str, value: object, kind: type) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise RecapError(f"gin config: {field}={value!r} must be a positive {kind.__name__}")
    if kind is int and not isinstance(value, int):
        raise RecapError(f"gin config: {field}={value!r} must be a positive int")


@configurable()
@dataclasses.dataclass(frozen=True)
class LoraOptions:
    """LoRA of the language model (``rank``/``alpha``), of π0.5's action expert
    (``expert_rank``/``expert_alpha``) and, with ``vision``, of the SigLIP tower (the language
    model's rank/alpha) on the projections ``target_modules`` / ``vision_target_modules``.
    ``seed``: the adapters' init (``init_adapters``)."""

    rank: int = 16
    alpha: float = 16.0
    expert_rank: int = 32
    expert_alpha: float = 32.0
    target_modules: Sequence[str] = TARGETS
    vision: bool = False
    vision_target_modules: Sequence[str] = VISION_TARGETS
    dropout: float = 0.0
    seed: int = 0

    def __post_init__(self):
        for name, kind in (("rank", int), ("alpha", float), ("expert_rank", int),
                           ("expert_alpha", float)):  # fmt: skip
            _check_positive(f"LoraOptions.{name}", getattr(self, name), kind)
        targets = _check_names("LoraOptions.target_modules", self.target_modules, TARGETS,
                               "target module")  # fmt: skip
        vision = _check_names("LoraOptions.vision_target_modules", self.vision_target_modules,
                              VISION_TARGETS, "target module")  # fmt: skip
        if not targets:
            raise RecapError("gin config: LoraOptions.target_modules is empty; name at least one "
                             f"of {list(TARGETS)}")  # fmt: skip
        if not isinstance(self.vision, bool):
            raise RecapError(
                f"gin config: LoraOptions.vision={self.vision!r} must be True or False"
            )
        if not 0.0 <= float(self.dropout) < 1.0:
            raise RecapError(f"gin config: LoraOptions.dropout={self.dropout!r} must be in [0, 1)")
        object.__setattr__(self, "target_modules", targets)
        object.__setattr__(self, "vision_target_modules", vision)


def check_freeze(freeze: object, owner: str = "freeze") -> tuple[str, ...]:
    """``freeze`` as a tuple of tower names; an unknown name is one line naming it."""
    return _check_names(owner, list(freeze) if isinstance(freeze, tuple) else freeze, TOWERS,
                        "tower")  # fmt: skip


# ---- towers of each model ----------------------------------------------------------------


def tower_prefixes(model: nn.Module) -> dict[str, str]:
    """Module-name prefix of each tower of a π0.5 policy or value model."""
    if hasattr(model, "paligemma_with_expert"):
        base = "paligemma_with_expert.paligemma.model."
        return {"vision": base + "vision_tower", "projector": base + "multi_modal_projector",
                "language_model": base + "language_model",
                "expert": "paligemma_with_expert.gemma_expert"}  # fmt: skip
    return {"vision": "vision_tower", "projector": "projector",
            "language_model": "language_model", "expert": "expert"}  # fmt: skip


def _lora_towers(model: nn.Module, lora: LoraOptions) -> dict[str, tuple[tuple, int, float]]:
    """Adapted towers: (target modules, rank, alpha) each."""
    towers = {"language_model": (lora.target_modules, lora.rank, lora.alpha)}
    if hasattr(model, "paligemma_with_expert"):
        towers["expert"] = (lora.target_modules, lora.expert_rank, lora.expert_alpha)
    if lora.vision:
        towers["vision"] = (lora.vision_target_modules, lora.rank, lora.alpha)
    return towers


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def lora_config(model: nn.Module, lora: LoraOptions):
    """The ``peft.LoraConfig`` of ``model`` (before injection): one regex per adapted tower,
    its rank/alpha through ``rank_pattern``/``alpha_pattern``, unreachable projections
    (frozen in full fine-tuning) excluded."""
    from peft import LoraConfig

    prefixes = tower_prefixes(model)
    towers = _lora_towers(model, lora)
    patterns, ranks, alphas, exclude = [], {}, {}, []
    for tower, (targets, rank, alpha) in towers.items():
        prefix = re.escape(prefixes[tower])
        regex = rf"{prefix}\..*\.(?:{'|'.join(targets)})"
        patterns.append(regex)
        ranks[rf"{prefix}\..*"] = rank
        alphas[rf"{prefix}\..*"] = alpha
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and re.fullmatch(regex, name):
                if not module.weight.requires_grad:
                    exclude.append(name)
    return LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=float(lora.dropout), bias="none",
        target_modules="|".join(f"(?:{p})" for p in patterns), rank_pattern=ranks,
        alpha_pattern=alphas, exclude_modules=exclude or None,
    )  # fmt: skip


def _fully_trained_modules(model: nn.Module) -> list[str]:
    """The outermost modules whose parameters all train and none is an adapter's."""
    total: dict[str, int] = {}
    trained: dict[str, int] = {}
    for name, param in model.named_parameters():
        parts = name.split(".")[:-1]
        ok = param.requires_grad and "lora_" not in name
        for i in range(len(parts) + 1):
            prefix = ".".join(parts[:i])
            total[prefix] = total.get(prefix, 0) + 1
            trained[prefix] = trained.get(prefix, 0) + ok
    containers = (nn.ModuleDict, nn.ModuleList)  # peft's ModulesToSaveWrapper refuses them
    full = {p for p in total if p and total[p] == trained[p]
            and not isinstance(model.get_submodule(p), containers)}  # fmt: skip

    def outermost(name: str) -> bool:
        parts = name.split(".")
        return not any(".".join(parts[:i]) in full for i in range(1, len(parts)))

    return sorted(p for p in full if outermost(p))


class AdapterHooks:
    """``recap.engine.protocol.ExportHooks`` of a model ``adapt`` may give LoRA (the value model,
    π0.5): the engine's export writes the adapter alone as peft does under
    ``run_dir/adapter/`` and the merged weights, under the names of a full fine-tune, to
    ``model.safetensors`` (metadata ``recap_lora`` = ``"merged"``); loading that file into a
    freshly built adapted model first gives it back its plain layers. A model without adapters
    exports its state unchanged."""

    def export_state(
        self, state: dict[str, torch.Tensor], run_dir: Path
    ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        lora = getattr(self, "recap_lora", None)
        if lora is None:
            return state, {}
        save_adapter(state, lora, Path(run_dir) / ADAPTER_DIR)
        return merged_state(state, lora), {"recap_lora": "merged"}

    def prepare_to_load_exported(self) -> None:
        if is_adapted(self):
            unload(self)


def adapt(model: nn.Module, lora: LoraOptions | None = None, freeze: Sequence[str] = ()):
    """``model`` with LoRA injected and ``freeze`` towers frozen (module docstring); returns
    it (the same object)."""
    freeze = check_freeze(freeze)
    if lora is not None and not isinstance(lora, LoraOptions):
        raise RecapError(f"gin config: lora={lora!r}; bind @LoraOptions() or None")
    if lora is not None and not isinstance(model, AdapterHooks):  # its export would not merge
        raise RecapError(f"LoRA: {type(model).__name__} has no AdapterHooks; only the value "
                         "model and π0.5 take adapters")  # fmt: skip
    prefixes = tower_prefixes(model)
    if lora is not None:
        from peft import inject_adapter_in_model

        config = lora_config(model, lora)
        trainable = {n: p.requires_grad for n, p in model.named_parameters()}
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
        adapted = [prefixes[t] for t in _lora_towers(model, lora)]
        for name, param in model.named_parameters():
            if "lora_" in name:
                continue
            base = name.replace(".base_layer.", ".")
            frozen_tower = any(_under(base, p) for p in adapted)
            param.requires_grad_(trainable.get(base, False) and not frozen_tower)
        model.recap_lora = config
        init_adapters(model, lora.seed)
    for tower in freeze:
        for name, param in model.named_parameters():
            if _under(name, prefixes[tower]):
                param.requires_grad_(False)
    if lora is not None:
        saved = dataclasses.replace(model.recap_lora)
        saved.modules_to_save = _fully_trained_modules(model) or None
        model.recap_lora = saved
    return model


def recipe_steps(lora: LoraOptions | None = None) -> list[tuple[str, Callable]]:
    """The memory planner's recipe transforms (``recap.engine.memory.recipe_counts``), applied in
    turn to one model: ``"lora"`` (``lora``, default the configured ``LoraOptions()``), then
    ``"lora_frozen_vision"`` (the vision tower frozen on top)."""
    options = lora or configured(LoraOptions)()
    return [("lora", lambda model: adapt(model, options)),
            ("lora_frozen_vision", lambda model: adapt(model, None, ["vision"]))]  # fmt: skip


@torch.no_grad()
def init_adapters(model: nn.Module, seed: int) -> None:
    """peft's LoRA init (A: kaiming-uniform, a = sqrt(5), i.e. U(+-1/sqrt(in)); B: 0) drawn
    from ``seed`` and the module's name only, so every rank, every ZeRO stage and a rebuild
    start from the same adapters whatever the global random state."""
    for name, param in model.named_parameters():
        match = LORA_KEY.match(name)
        if match is None or param.is_meta:
            continue
        if match.group(2) == "B":
            param.zero_()
            continue
        g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(match.group(1).encode()))
        bound = 1.0 / math.sqrt(param.shape[1])
        value = torch.rand(param.shape, generator=g, dtype=torch.float32) * 2 - 1
        param.copy_((value * bound).to(param.dtype))


def is_adapted(model: nn.Module) -> bool:
    return getattr(model, "recap_lora", None) is not None


def unload(model: nn.Module) -> nn.Module:
    """Replace every LoRA layer by its base layer (the adapters are dropped, not merged): the
    plain architecture, ready for merged weights (``merged_state``). Returns ``model``."""
    from peft.tuners.lora import LoraLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())
    for attr in ("recap_lora", "peft_config"):
        model.__dict__.pop(attr, None)
    return model


# ---- exports ------------------------------------------------------------------------------


def scaling(config, module: str) -> float:
    """alpha / r of the adapter of ``module`` (peft's ``rank_pattern``/``alpha_pattern``)."""
    from peft.utils.other import get_pattern_key

    rank = config.rank_pattern.get(get_pattern_key(config.rank_pattern, module), config.r)
    alpha = config.alpha_pattern.get(get_pattern_key(config.alpha_pattern, module),
                                     config.lora_alpha)  # fmt: skip
    return alpha / rank


def merged_state(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """The plain state dict of an adapted model's state: ``W + (alpha / r) B A`` (float32
    arithmetic, the base weight's dtype) under ``module.weight``, ``base_layer`` dropped from
    every other name, adapter tensors dropped."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        match = LORA_KEY.match(key)
        if match is None:
            out[key.replace(".base_layer.", ".")] = value
            continue
        module, which = match.groups()
        if which == "B":
            continue
        base = state[f"{module}.base_layer.weight"]
        b = state[f"{module}.lora_B.{ADAPTER}.weight"]
        delta = (b.float() @ value.float()) * scaling(config, module)
        out[f"{module}.weight"] = (base.float() + delta.to(base.device)).to(base.dtype)
    return out


def adapter_state(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """``adapter_model.safetensors``'s tensors as ``PeftModel.save_pretrained`` names them: the
    adapters (``…lora_A.weight``) and the fully trained modules (``modules_to_save``)."""
    saved = tuple(config.modules_to_save or ())
    out = {}
    for key, value in state.items():
        if LORA_KEY.match(key):
            out[PEFT_PREFIX + key.replace(f".{ADAPTER}.weight", ".weight")] = value
        elif any(_under(key.rpartition(".")[0], m) for m in saved):
            out[PEFT_PREFIX + key] = value
    return out


def save_adapter(state: dict[str, torch.Tensor], config, directory: str | os.PathLike) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` (peft's files)."""
    from recap.io import write_atomic
    from recap.weights import safetensors_bytes

    path = Path(directory)
    tensors = {k: v.detach().cpu().contiguous() for k, v in adapter_state(state, config).items()}
    payload = config.to_dict()
    payload = {k: sorted(v) if isinstance(v, set) else v for k, v in payload.items()}
    text = json.dumps(payload, indent=2, sort_keys=True)
    write_atomic({
        path / ADAPTER_WEIGHTS: lambda tmp: tmp.write_bytes(
            safetensors_bytes(tensors, {"format": "pt"})),
        path / ADAPTER_CONFIG: lambda tmp: tmp.write_text(text),
    })  # fmt: skip
    return path


def trainable_count(model: nn.Module) -> int:
    """Trainable parameters (``ds_numel`` under ZeRO-3)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
