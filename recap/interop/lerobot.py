"""A π0.5 directory as LeRobot 0.6.1's ``PI05Policy.from_pretrained`` loads it.

``recap-import export-lerobot-policy DIR --out OUT --camera KEY ... --state-dim S --action-dim A``
writes ``OUT/model.safetensors`` (LeRobot's keys: ``model.`` + openpi's, the text embedding under
``paligemma.lm_head`` as openpi stores it, which LeRobot's loader copies to ``embed_tokens``, and
a zero expert head), ``OUT/config.json`` (a ``PI05Config``: ``type: pi05``, the variant names,
``chunk_size``, ``max_action_dim``, ``image_resolution``, ``num_inference_steps`` and the
``input_features`` / ``output_features`` LeRobot builds its image and action handling from: the
cameras in the order given, ``observation.state`` and ``action``) and ``OUT/recap_pi05.json``; the
source's ``assets/**/norm_stats.json`` is copied along, and its ``processor.json`` (how recap
trained it: prompt, advantage label, formula) with the cameras given. ``DIR`` is any π0.5
directory recap reads (``save_pi05`` in either layout, openpi's converter output, a recap training
run). The reverse
needs no command: ``load_pi05`` reads a LeRobot-saved directory (``config.json``, the sizes from
the weights' shapes at any size, ``recap.models.pi05_sizes``; both embedding tensors, of which the
``embed_tokens`` one is used).

LeRobot's normalization and tokenization live in its processor pipelines, not in the policy
directory: build them with ``make_pi05_pre_post_processors(config, dataset_stats)`` (quantile
statistics: recap's ``norm_stats.json`` ``q01`` / ``q99``). Nothing here imports ``lerobot``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from recap.errors import RecapError

LEROBOT_VARIANTS = ("gemma_2b", "gemma_300m")  # the only names LeRobot 0.6.1's PI05Config takes
STATE_KEY, ACTION_KEY = "observation.state", "action"


def lerobot_features(
    cameras: Sequence[str], image_size: int, state_dim: int, action_dim: int
) -> dict:
    """``input_features`` / ``output_features`` of a LeRobot ``PI05Config`` (JSON form)."""
    if not cameras:
        raise RecapError("export-lerobot-policy: no --camera given; name the image "
                         "features (observation.images.image, ...) in order")  # fmt: skip
    inputs = {cam: {"type": "VISUAL", "shape": [3, image_size, image_size]} for cam in cameras}
    inputs[STATE_KEY] = {"type": "STATE", "shape": [int(state_dim)]}
    outputs = {ACTION_KEY: {"type": "ACTION", "shape": [int(action_dim)]}}
    return {"input_features": inputs, "output_features": outputs}


def export_lerobot_policy(
    source: str | os.PathLike,
    out: str | os.PathLike,
    cameras: Sequence[str],
    state_dim: int,
    action_dim: int,
) -> Path:
    """Write ``out`` (module docstring) from the π0.5 directory ``source``; returns ``out``."""
    import torch
    from safetensors.torch import load_file

    from recap.models import checkpoints as ckpt
    from recap.models.pi05 import build_pi05

    source, out = Path(source), Path(out)
    weights = source / ckpt.WEIGHTS_FILE
    if not weights.is_file():
        raise RecapError(f"{weights}: file not found; pass a π0.5 directory holding "
                         "model.safetensors (recap, openpi or LeRobot)")  # fmt: skip
    config = ckpt.read_config(source)
    foreign = ckpt.foreign_config(config, ckpt.LEROBOT)
    variants = (foreign["paligemma_variant"], foreign["action_expert_variant"])
    if variants != LEROBOT_VARIANTS:
        raise RecapError(f"{source}: sizes are variants {variants}; LeRobot 0.6.1's "
                         f"PI05Config accepts only {LEROBOT_VARIANTS} (PaliGemma 2B + "
                         "Gemma 300M)")  # fmt: skip
    if action_dim > config.action_dim:
        raise RecapError(f"export-lerobot-policy: --action-dim {action_dim} exceeds the "
                         f"policy's action_dim {config.action_dim}; use at most that")  # fmt: skip
    state = load_file(str(weights))
    model_state = ckpt.to_model_keys(state, ckpt.detect_layout(state))
    with torch.device("meta"):
        expected = build_pi05(config).state_dict()
    missing = sorted(set(expected) - set(model_state))
    unexpected = sorted(set(model_state) - set(expected))
    if missing or unexpected:
        first = (missing or unexpected)[0]
        raise RecapError(f"{weights}: {len(missing)} missing and {len(unexpected)} "
                         f"unexpected keys for its config, first {first}; re-export it with "
                         "save_pi05")  # fmt: skip
    bad = [k for k in expected if tuple(model_state[k].shape) != tuple(expected[k].shape)]
    if bad:
        shape = tuple(model_state[bad[0]].shape)
        raise RecapError(f"{weights}: {bad[0]} has shape {shape}, the config says "
                         f"{tuple(expected[bad[0]].shape)}; fix recap_pi05.json")  # fmt: skip
    tensors = ckpt.state_to_file(model_state, config.expert["hidden_size"], ckpt.LEROBOT)
    size = int(config.vision.get("image_size", 224))
    extra = lerobot_features(cameras, size, state_dim, action_dim)
    extra |= {"max_state_dim": 32, "max_action_dim": config.action_dim}
    ckpt.write_pi05_files(out, tensors, config, ckpt.LEROBOT, {"source": "recap"}, extra)
    stats = ckpt.find_norm_stats(source)
    if stats is not None and stats.name == ckpt.NORM_STATS_FILE:
        dest = out / stats.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stats, dest)
    from recap.processing.pi05 import read_policy_processor

    processor = read_policy_processor(source)
    if processor is not None:  # how recap trained it (prompt, label, formula), LeRobot's slots
        processor.replace(cameras=tuple(cameras)).save(out)
    return out
