"""RLinf's RECAP artifacts, as its public source writes them (examples/offline_rl).

Returns: ``recap.data.rlinf_returns`` (re-exported here) reads RLinf's Step 1 sidecar, which has
no ``meta/returns_{tag}.json``: ``returns_statistics`` checks it against the dataset and derives
the statistics recap's Step 1 records.

Value model: ``import_value_state`` / ``export_value_state`` map RLinf's full state dict (see
``recap.models.value``'s ``expert_style = "gemma1"``) to recap's keys and back; ``value_range``
reads the value support ``v_min`` / ``v_max`` from an RLinf run's config beside the checkpoint.

CFG policy: RLinf (as openpi) builds the action expert's unused ``lm_head`` as
``[RLINF_VOCAB, expert width]`` whatever the text vocabulary; the policy import tolerates it
absent or of another shape (zeros of the model's shape, one log line) and the export writes it
in RLinf's shape, so RLinf's strict loader takes recap's files at any size.
"""

from __future__ import annotations

import logging
from pathlib import Path

from recap.data.rlinf_returns import (  # noqa: F401  (re-exported)
    RECURRENCE_TOLERANCE,
    RLINF,
    SPLIT_FIX,
    infer_gamma,
    returns_statistics,
)

log = logging.getLogger(__name__)
RLINF_VOCAB = 257152  # rows of the expert's lm_head in RLinf / openpi, at every model size
DEFAULT_VALUE_RANGE = (-1.0, 0.0)  # recap's and RLinf's value support when none is recorded
CONFIG_NAMES = ("config.yaml", ".hydra/config.yaml", "config.json")  # an RLinf run's config


def value_range(source: str | Path, levels: int = 5) -> tuple[tuple[float, float], Path] | None:
    """``((v_min, v_max), config file)`` from an RLinf run's config (``config.yaml``, Hydra's
    ``.hydra/config.yaml`` or ``config.json``) in the checkpoint's folder or up to ``levels``
    folders above it: the first with both ``v_min`` and ``v_max`` keys at any depth; None when
    none records them."""
    folder = Path(source).absolute().parent
    for _ in range(levels + 1):
        for name in CONFIG_NAMES:
            path = folder / name
            if path.is_file():
                found = _find_range(_read_config(path))
                if found is not None:
                    return found, path
        if folder.parent == folder:
            break
        folder = folder.parent
    return None


def _read_config(path: Path) -> object:
    import json

    import yaml

    try:
        text = path.read_text()
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None


def _find_range(node: object) -> tuple[float, float] | None:
    if isinstance(node, dict):
        low, high = node.get("v_min"), node.get("v_max")
        if isinstance(low, int | float) and isinstance(high, int | float):
            return float(low), float(high)
        for value in node.values():
            found = _find_range(value)
            if found is not None:
                return found
    elif isinstance(node, list):
        for value in node:
            found = _find_range(value)
            if found is not None:
                return found
    return None


# ---- value model: RLinf's FSDP full state dict <-> recap's gemma1-style ValueModel ------------

VISION, GEMMA3, PROJ, EXPERT, HEAD = (
    "value_expert.vision_tower.", "value_expert.gemma3.", "value_expert.multi_modal_proj.",
    "value_expert.experts.value.", "value_head.",
)  # fmt: skip
# RLinf prefix -> recap prefix. RLinf's SigLIP (transformers 4.53) nests its weights under
# ``vision_model.``; recap's SiglipVisionModel (transformers 5) holds them at the top level.
PREFIXES = (
    (VISION + "vision_model.", "vision_tower."), (GEMMA3 + "model.", "language_model."),
    (PROJ, "projector."),
    (EXPERT + "model.", "expert."), (HEAD + "cls_embedding.", "head.cls."),
    (HEAD + "value_proj.", "head.proj."),
)  # fmt: skip
UNUSED = (VISION + "vision_model.head.", GEMMA3 + "lm_head.", EXPERT + "lm_head.",
          EXPERT + "model.embed_tokens.")  # fmt: skip
TIED_LM_HEAD = GEMMA3 + "lm_head.weight"
TIED_FROM = "language_model.embed_tokens.weight"


def _layer_of(key: str) -> int | None:
    parts = key.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None


def split_value_state(state: dict, depth: int | None = None) -> tuple[dict, dict]:
    """``(recap, unused)``: RLinf keys (a leading ``model.`` stripped) renamed to recap's, and
    the ones recap does not use (SigLIP's pooling head, the tied and the expert's ``lm_head``;
    with ``depth`` also Gemma3 layers >= depth, which the expert never reads). A key matching
    neither is a one-line RecapError naming the first few."""
    from recap.errors import RecapError

    recap, unused, unknown = {}, {}, []
    for key, value in state.items():
        key = key.removeprefix("model.")
        if key.startswith(UNUSED):
            unused[key] = value
            continue
        for src, dst in PREFIXES:
            if key.startswith(src):
                name = dst + key[len(src) :]
                layer = _layer_of(name) if dst == "language_model." else None
                if depth is not None and layer is not None and layer >= depth:
                    unused[key] = value
                else:
                    recap[name] = value
                break
        else:
            unknown.append(key)
    if unknown:
        raise RecapError(f"RLinf value state dict: {len(unknown)} keys match no RLinf prefix "
                         f"({', '.join(unknown[:3])}); is this RLinf's value-model "
                         "full_weights.pt?")  # fmt: skip
    return recap, unused


def join_value_state(recap: dict, unused: dict | None = None) -> dict:
    """RLinf's full state dict from recap's gemma1-style state (inverse of
    ``split_value_state``): Gemma3's tied ``lm_head.weight`` is the text embedding unless
    ``unused`` (what ``split_value_state`` set aside) holds it; ``unused`` keys are put back."""
    out = {}
    for key, value in recap.items():
        for src, dst in PREFIXES:
            if key.startswith(dst):
                out[src + key[len(dst) :]] = value
                break
        else:
            from recap.errors import RecapError

            raise RecapError(f"recap value state: key {key!r} has no RLinf name")
    out.update(unused or {})
    if TIED_LM_HEAD not in out and TIED_FROM in recap:
        out[TIED_LM_HEAD] = recap[TIED_FROM]
    return out


def infer_value_config(recap: dict, vision: dict, text: dict, truncate: bool):
    """``ValueModelConfig`` (gemma1 expert) whose expert sizes and bins come from the tensors'
    shapes; ``vision``/``text``: the SigLIP / Gemma3 config dicts."""
    from transformers import Gemma3TextConfig

    from recap.errors import RecapError
    from recap.models.value import ValueModelConfig

    try:
        width = recap["expert.norm.weight"].shape[0]
        head_dim = Gemma3TextConfig.from_dict(text).head_dim
        q = recap["expert.layers.0.self_attn.q_proj.weight"].shape[0]
        kv = recap["expert.layers.0.self_attn.k_proj.weight"].shape[0]
        mlp = recap["expert.layers.0.mlp.gate_proj.weight"].shape[0]
        bins = recap["head.proj.weight"].shape[0]
    except KeyError as exc:
        raise RecapError(f"RLinf value state dict: {exc.args[0]!r} (RLinf name) missing; is this "
                         "RLinf's value-model full_weights.pt?") from exc  # fmt: skip
    depth = len({_layer_of(k) for k in recap if k.startswith("expert.layers.")})
    return ValueModelConfig(
        vision=dict(vision), text=dict(text), expert_width=width, expert_depth=depth,
        expert_mlp=mlp, expert_heads=q // head_dim, expert_kv_heads=kv // head_dim,
        expert_head_dim=head_dim, num_bins=bins, truncate_backbone=truncate,
        expert_style="gemma1",
    )  # fmt: skip


def check_value_state(recap: dict, model_state: dict, rlinf_names: bool = True) -> None:
    """Every target key filled with its shape and no key left over; else one line naming the
    first unmatched keys (in RLinf's names)."""
    from recap.errors import RecapError

    name = (lambda k: next(iter(join_value_state({k: None})))) if rlinf_names else str
    missing = [k for k in model_state if k not in recap]
    extra = [k for k in recap if k not in model_state]
    shapes = [k for k in model_state if k in recap
              and tuple(recap[k].shape) != tuple(model_state[k].shape)]  # fmt: skip
    for what, keys in (("missing", missing), ("not in the model", extra)):
        if keys:
            raise RecapError(
                f"RLinf value state dict: {len(keys)} keys {what} "
                f"({', '.join(name(k) for k in keys[:3])}); check the "
                "vision/text configs and that this is RLinf's value model"
            )
    if shapes:
        k = shapes[0]
        raise RecapError(
            f"RLinf value state dict: {name(k)} has shape "
            f"{list(recap[k].shape)}, the model expects "
            f"{list(model_state[k].shape)}; check the vision/text configs"
        )


# ---- CFG policy: RLinf's FSDP full state dict <-> openpi's model.safetensors ------------------
# RLinf's full_weights.pt holds exactly openpi's ``PI0Pytorch.state_dict()``: every key of the
# openpi file (recap.models.checkpoints.file_state) plus the text embedding, which is tied to
# ``paligemma.lm_head`` and which ``save_model`` leaves out of the file.


def split_policy_state(state: dict, target: dict) -> tuple[dict, list[str]]:
    """``(file, dropped)``: RLinf's policy state dict (a ``model.`` prefix on every key
    stripped) as openpi's file keyed exactly as ``target`` (``file_state`` of the model, names
    and shapes), and the source keys dropped (the tied embedding, equal to ``lm_head``). An
    unmapped source key, an unfilled or misshapen target key, or an embedding that is not
    ``lm_head`` is one RecapError line naming the first key."""
    import torch

    from recap.errors import RecapError
    from recap.models.checkpoints import (
        EMBED_KEY,
        EXPERT_LM_HEAD_KEY,
        LEROBOT_PREFIX,
        LM_HEAD_KEY,
    )

    what = "RLinf policy state dict"
    if state and all(k.startswith(LEROBOT_PREFIX) for k in state):
        state = {k[len(LEROBOT_PREFIX) :]: v for k, v in state.items()}
    file, dropped = {}, []
    for key, value in state.items():
        if key in target:
            file[key] = value
        elif key == EMBED_KEY:
            dropped.append(key)
        else:
            unmapped = [k for k in state if k not in target and k != EMBED_KEY]
            raise RecapError(f"{what}: {len(unmapped)} keys unmapped, first {key!r} (not a key "
                             "of openpi's PI0Pytorch at this config); is this RLinf's CFG "
                             "π0.5 full_weights.pt, and are the sizes (--base) right?")  # fmt: skip
    if EMBED_KEY in state and LM_HEAD_KEY in state:
        embed, head = state[EMBED_KEY], state[LM_HEAD_KEY]
        if embed is not head and (embed.shape != head.shape or not torch.equal(embed, head)):
            raise RecapError(f"{what}: {EMBED_KEY} differs from {LM_HEAD_KEY}, which openpi "
                             "ties to it; the checkpoint is not a π0.5 policy's")  # fmt: skip
    if LM_HEAD_KEY not in file and EMBED_KEY in state:  # the tied tensor under its other name
        file[LM_HEAD_KEY] = state[EMBED_KEY]
        dropped.remove(EMBED_KEY)
    want = target.get(EXPERT_LM_HEAD_KEY)
    have = file.get(EXPERT_LM_HEAD_KEY)
    if want is not None and (have is None or tuple(have.shape) != tuple(want.shape)):
        shape = list(want.shape)  # never read: zeros of the model's shape, as save_pi05 writes
        found = "absent" if have is None else f"of shape {list(have.shape)}"
        log.info(f"{what}: the expert's lm_head (never read) is {found}; written as zeros "
                 f"{shape}")  # fmt: skip
        if have is not None:
            dropped.append(EXPERT_LM_HEAD_KEY)
        ref = file.get(LM_HEAD_KEY, want)  # the source's dtype and device
        file[EXPERT_LM_HEAD_KEY] = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
    missing = [k for k in target if k not in file]
    if missing:
        raise RecapError(f"{what}: {len(missing)} keys of openpi's layout unfilled, first "
                         f"{missing[0]!r}; is this RLinf's CFG π0.5 full_weights.pt, and are "
                         "the sizes (--base) right?")  # fmt: skip
    for key, want in target.items():
        if tuple(file[key].shape) != tuple(want.shape):
            raise RecapError(f"{what}: {key} has shape {list(file[key].shape)}, the config "
                             f"expects {list(want.shape)}; pass the π0.5 checkpoint RLinf "
                             "fine-tuned from as --base")  # fmt: skip
    return {k: file[k] for k in target}, dropped


def join_policy_state(file: dict) -> dict:
    """RLinf's full state dict (``PI0Pytorch.state_dict()``) from openpi's file (the embedding
    is ``lm_head``) or from recap's training export (``Pi05Policy`` keys: the embedding under
    its own name, no heads): both tied names hold the same tensor, and the expert's ``lm_head``
    (never read) is in RLinf's shape ``[RLINF_VOCAB, expert width]``: kept when it has it,
    else zeros of that shape (recap writes zeros ``[text vocab, width]``; a non-zero head of
    another shape is dropped with one log line)."""
    import torch

    from recap.errors import RecapError
    from recap.models.checkpoints import EMBED_KEY, EXPERT_LM_HEAD_KEY, LM_HEAD_KEY

    embed = file.get(EMBED_KEY, file.get(LM_HEAD_KEY))
    if embed is None or "action_in_proj.weight" not in file:
        raise RecapError(f"π0.5 weights: neither {LM_HEAD_KEY} nor {EMBED_KEY}, or no "
                         "action_in_proj.weight; expected openpi's model.safetensors or recap's "
                         "exported policy")  # fmt: skip
    head = file.get(LM_HEAD_KEY, embed)
    if head is not embed and (head.shape != embed.shape or not torch.equal(head, embed)):
        raise RecapError(f"π0.5 weights: {LM_HEAD_KEY} differs from {EMBED_KEY}; RLinf's "
                         "π0.5 ties them, export one of them")  # fmt: skip
    out = dict(file)
    out[LM_HEAD_KEY] = out[EMBED_KEY] = embed
    width = file["action_in_proj.weight"].shape[0]
    head = out.get(EXPERT_LM_HEAD_KEY)
    if head is None or tuple(head.shape) != (RLINF_VOCAB, width):
        if head is not None and bool(head.any()):
            log.info(f"π0.5 weights: the expert's lm_head (never read) has shape "
                     f"{list(head.shape)}; written as zeros [{RLINF_VOCAB}, {width}], RLinf's "
                     "shape")  # fmt: skip
        out[EXPERT_LM_HEAD_KEY] = embed.new_zeros(RLINF_VOCAB, width)
    return out
