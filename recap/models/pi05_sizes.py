"""π0.5 sizes read from a checkpoint's own tensors: the safetensors header, not the weights.

LeRobot's ``config.json`` names its sizes only by variant (``paligemma_variant: gemma_2b``,
``action_expert_variant: gemma_300m``: the only names LeRobot 0.6.1's ``PI05Config`` takes), and
openpi's converter writes the same names. A π0.5 at other sizes (a tiny one, a LeRobot model built
with other widths) still names them, so ``read_config`` takes every size the shapes show from the
JSON header of ``model.safetensors`` (no tensor is read) whenever a weights file is there, and logs
one line when they are not the sizes the names imply. Read from the shapes (openpi's key names,
LeRobot's ``model.`` prefix removed):

- vision (SigLIP): width and patch size (``patch_embedding``), image size (patch size times the
  square root of ``position_embedding``'s rows), MLP width (``fc1``), depth (the
  ``encoder.layers.<i>`` present);
- text (PaliGemma's Gemma): vocabulary and width (``embed_tokens``, else the tied ``lm_head``),
  MLP width (``gate_proj``), depth, and ``head_dim`` = ``k_proj`` rows / KV heads,
  ``num_attention_heads`` = ``q_proj`` rows / ``head_dim``;
- expert: width (``action_in_proj`` rows), MLP width, depth and heads as the text's (attention is
  shared layer by layer: its ``q_proj`` / ``k_proj`` rows must equal the text's);
- ``action_dim``: ``action_in_proj`` columns.

Not visible in any shape, so taken from the config's variant (the real π0.5 convention; LeRobot's
and openpi's ``config.json`` carry no head counts): the number of KV heads (1: multi-query
attention, as ``gemma_2b`` and ``gemma_300m``), SigLIP's 16 attention heads (so400m's, which
LeRobot and openpi always build), activations, norm epsilons, ``max_position_embeddings`` and the
special token ids. A checkpoint that breaks that convention (e.g. 2 vision heads) needs its sizes
written (``recap_pi05.json`` or gin ``pi05_policy.*``). Sizes the caller passes are never replaced.
Shapes that disagree with each other (or with a number ``config.json`` states: ``image_resolution``,
``max_action_dim``) are one ``RecapError`` line naming the file and the tensor.

Standard library only (no torch): ``recap-serve``'s checks use it before any weight is read.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

from recap import logs
from recap.errors import RecapError

log = logs.get(__name__)

PREFIX = "model."  # LeRobot's
PALIGEMMA = "paligemma_with_expert.paligemma."
VISION = PALIGEMMA + "model.vision_tower.vision_model."
TEXT = PALIGEMMA + "model.language_model."
EXPERT = "paligemma_with_expert.gemma_expert.model."
PATCH = VISION + "embeddings.patch_embedding.weight"
POSITIONS = VISION + "embeddings.position_embedding.weight"
PROJECTOR = PALIGEMMA + "model.multi_modal_projector.linear.weight"
EMBED = TEXT + "embed_tokens.weight"
LM_HEAD = PALIGEMMA + "lm_head.weight"
ACTION_IN = "action_in_proj.weight"
ACTION_OUT = "action_out_proj.weight"
SIZE_FIELDS = ("vision", "text", "expert", "action_dim")
MAX_HEADER = 100 * 2**20


def header_shapes(weights: str | Path) -> dict[str, list[int]]:
    """``{tensor name: shape}`` from the JSON header of a safetensors file (LeRobot's ``model.``
    prefix removed when every name has it); a file that is not safetensors is one line."""
    try:
        with open(weights, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > MAX_HEADER:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(handle.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise RecapError(f"{weights}: not a safetensors file ({exc}); point it at a π0.5 "
                         "checkpoint's model.safetensors") from None  # fmt: skip
    shapes = {k: list(v["shape"]) for k, v in header.items()
              if k != "__metadata__" and isinstance(v, dict)}  # fmt: skip
    if shapes and all(k.startswith(PREFIX) for k in shapes):
        shapes = {k[len(PREFIX) :]: v for k, v in shapes.items()}
    return shapes


class _Reader:
    """Shapes of one file, with one-line errors naming it and the tensor."""

    def __init__(self, weights: Path, shapes: dict[str, list[int]]):
        self.weights, self.shapes = weights, shapes

    def shape(self, key: str, rank: int) -> list[int]:
        shape = self.shapes.get(key)
        if shape is None:
            raise RecapError(f"{self.weights}: no tensor {key}; not a π0.5 checkpoint (openpi or "
                             "LeRobot layout), so its sizes cannot be read")  # fmt: skip
        if len(shape) != rank:
            raise RecapError(f"{self.weights}: {key} has shape {tuple(shape)}, expected "
                             f"{rank} dimensions")  # fmt: skip
        return shape

    def depth(self, prefix: str) -> int:
        pattern = re.compile(re.escape(prefix) + r"layers\.(\d+)\.")
        found = {int(m.group(1)) for k in self.shapes if (m := pattern.match(k))}
        if not found:
            raise RecapError(f"{self.weights}: no tensor {prefix}layers.0.*; not a π0.5 "
                             "checkpoint, so its sizes cannot be read")  # fmt: skip
        missing = sorted(set(range(max(found) + 1)) - found)
        if missing:
            raise RecapError(f"{self.weights}: {prefix}layers.{missing[0]}.* missing although "
                             f"{prefix}layers.{max(found)}.* is there; the checkpoint is "
                             "incomplete")  # fmt: skip
        return max(found) + 1

    def agree(self, key: str, axis: int, value: int, what: str, source: str) -> None:
        """``key``'s ``axis`` must be ``value`` (the ``what`` read from ``source``)."""
        shape = self.shapes.get(key)
        if shape is not None and (len(shape) <= axis or shape[axis] != value):
            raise RecapError(f"{self.weights}: {key} has shape {tuple(shape)} but {source} "
                             f"makes the {what} {value}; its tensors disagree, so no π0.5 "
                             "config fits them (re-export the checkpoint)")  # fmt: skip


def sizes_from_shapes(weights: str | Path, shapes: dict[str, list[int]], implied: dict) -> dict:
    """``implied`` (``vision``, ``text``, ``expert`` dicts, ``action_dim``: what the config's
    names imply) with every size the shapes show replaced (module docstring); the fields it
    cannot see (heads convention, activations, eps, ids) kept from ``implied``."""
    r = _Reader(Path(weights), shapes)
    vision, text, expert = (dict(implied[k]) for k in ("vision", "text", "expert"))
    width, _, patch, _ = r.shape(PATCH, 4)
    positions = r.shape(POSITIONS, 2)
    r.agree(POSITIONS, 1, width, "vision width", PATCH)
    side = math.isqrt(positions[0])
    if side * side != positions[0]:
        raise RecapError(f"{r.weights}: {POSITIONS} has {positions[0]} rows, not a square "
                         "number of patches; not a SigLIP tower")  # fmt: skip
    heads = int(vision.get("num_attention_heads", 16))
    if width % heads:
        raise RecapError(f"{r.weights}: vision width {width} ({PATCH}) is not divisible by "
                         f"SigLIP's {heads} attention heads (the count is in no tensor); write "
                         "its sizes (recap_pi05.json or pi05_policy.vision)")  # fmt: skip
    vision_depth = r.depth(VISION + "encoder.")
    vision_mlp = r.shape(VISION + "encoder.layers.0.mlp.fc1.weight", 2)[0]
    vision |= {"hidden_size": width, "intermediate_size": vision_mlp, "patch_size": patch,
               "num_hidden_layers": vision_depth, "image_size": side * patch,
               "num_attention_heads": heads}  # fmt: skip

    embed = EMBED if EMBED in shapes else LM_HEAD
    vocab, text_width = r.shape(embed, 2)
    r.agree(PROJECTOR, 0, text_width, "text width", embed)
    r.agree(PROJECTOR, 1, width, "vision width", PATCH)
    text |= _gemma(r, TEXT, text_width, int(text.get("num_key_value_heads", 1)))
    text["vocab_size"] = vocab

    expert_width = r.shape(ACTION_IN, 2)[0]
    action_dim = r.shape(ACTION_IN, 2)[1]
    r.agree(ACTION_OUT, 0, action_dim, "action dim", ACTION_IN)
    expert |= _gemma(r, EXPERT, expert_width, text["num_key_value_heads"])
    for name in ("num_hidden_layers", "num_attention_heads", "head_dim"):
        if expert[name] != text[name]:  # attention is shared layer by layer
            key = EXPERT + "layers.0.self_attn.q_proj.weight"
            source = TEXT + "layers.0.self_attn.q_proj.weight"
            raise RecapError(f"{r.weights}: the expert's {name} {expert[name]} ({key}) is not "
                             f"the text's {text[name]} ({source}); π0.5 shares attention layer "
                             "by layer, so its tensors disagree")  # fmt: skip
    return {"vision": vision, "text": text, "expert": expert, "action_dim": action_dim}


def _gemma(r: _Reader, prefix: str, width: int, kv_heads: int) -> dict:
    """Width, MLP width, depth and heads of a Gemma stack from its layer-0 tensors."""
    attn = prefix + "layers.0.self_attn."
    q_rows = r.shape(attn + "q_proj.weight", 2)[0]
    k_rows = r.shape(attn + "k_proj.weight", 2)[0]
    r.agree(attn + "q_proj.weight", 1, width, "width", prefix + "'s input")
    if k_rows % kv_heads:
        raise RecapError(f"{r.weights}: {attn}k_proj.weight has {k_rows} rows, not a multiple "
                         f"of {kv_heads} KV heads; write its sizes (recap_pi05.json)")  # fmt: skip
    head_dim = k_rows // kv_heads
    if q_rows % head_dim:
        raise RecapError(f"{r.weights}: {attn}q_proj.weight has {q_rows} rows, not a multiple "
                         f"of the head dim {head_dim} ({attn}k_proj.weight); its tensors "
                         "disagree")  # fmt: skip
    r.agree(attn + "v_proj.weight", 0, k_rows, "KV width", attn + "k_proj.weight")
    mlp = r.shape(prefix + "layers.0.mlp.gate_proj.weight", 2)[0]
    r.agree(prefix + "layers.0.mlp.up_proj.weight", 0, mlp, "MLP width",
            prefix + "layers.0.mlp.gate_proj.weight")  # fmt: skip
    return {"hidden_size": width, "intermediate_size": mlp, "num_hidden_layers": r.depth(prefix),
            "num_attention_heads": q_rows // head_dim, "num_key_value_heads": kv_heads,
            "head_dim": head_dim}  # fmt: skip


def weights_sizes(
    weights: str | Path, implied: dict, stated: dict, config_file: str | Path
) -> dict:
    """The size fields of ``implied`` (a subset of ``vision``, ``text``, ``expert``,
    ``action_dim``: those the caller did not pass) as ``weights``' shapes show them; one log line
    when they are not ``implied``. ``stated``: numbers ``config_file`` states explicitly
    (``image_size``, ``action_dim``), which must be the shapes' (one line naming both files)."""
    weights = Path(weights)
    shapes = header_shapes(weights)
    # a part the caller passed is read only to check the file (its heads: any that divide)
    base = {"vision": {"num_attention_heads": 1}, "text": {"num_key_value_heads": 1},
            "expert": {}} | {k: v for k, v in implied.items() if k != "action_dim"}  # fmt: skip
    read = sizes_from_shapes(weights, shapes, base | {"action_dim": 0})
    checks = (("image_size", read["vision"]["image_size"], POSITIONS),
              ("action_dim", read["action_dim"], ACTION_IN))  # fmt: skip
    for name, value, key in checks:
        if stated.get(name) is not None and int(stated[name]) != value:
            raise RecapError(f"{config_file}: {name} {stated[name]}, but {weights} {key} "
                             f"makes it {value}; fix config.json or re-export the "
                             "checkpoint")  # fmt: skip
    read = {k: v for k, v in read.items() if k in implied}
    if read != implied:
        v, t, e = read.get("vision"), read.get("text"), read.get("expert")
        shown = []
        if v:
            shown.append(f"vision {v['hidden_size']}x{v['num_hidden_layers']} "
                         f"({v['image_size']} px, patch {v['patch_size']})")  # fmt: skip
        if t:
            shown.append(f"text {t['hidden_size']}x{t['num_hidden_layers']} "
                         f"(vocab {t['vocab_size']}, {t['num_attention_heads']} heads of "
                         f"{t['head_dim']})")  # fmt: skip
        if e:
            shown.append(f"expert {e['hidden_size']}x{e['num_hidden_layers']}")
        if "action_dim" in read:
            shown.append(f"action_dim {read['action_dim']}")
        log.info(f"{weights}: sizes from the weights, not {Path(config_file).name}'s variant "
                 f"names: {', '.join(shown)}; KV heads {t['num_key_value_heads'] if t else '-'} "
                 f"and vision heads {v['num_attention_heads'] if v else '-'} as π0.5's (no "
                 "tensor shows them)")  # fmt: skip
    return read
