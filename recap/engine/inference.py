"""Batched no-grad inference over a dataset sharded across ranks, merged on rank 0 in order.

Rank ``r`` of ``W`` takes dataset positions ``r, r + W, r + 2W, ...``, padded to the same count
``ceil(n / W)`` on every rank (padding repeats a real item; ZeRO-3 needs every rank to run the
same number of forward passes). Stacking the ranks' rows ``[W, L]`` and reading them position-major
gives dataset order, and the padded rows land at positions ``>= n``, which are cut: each item is
computed once and appears once. Also here: loading an exported ``model.safetensors`` without
DeepSpeed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from safetensors.torch import load_file

from recap.engine import accelerator, distributed
from recap.errors import RecapError

TIED_KEY = "recap_tied"


def shard_positions(num_items: int, rank: int, world: int) -> list[int]:
    """Dataset indices rank ``rank`` computes: strided, padded to ``ceil(n / world)`` entries."""
    count = math.ceil(num_items / world)
    return [min(j * world + rank, num_items - 1) for j in range(count)]


def merge_shards(stacked: torch.Tensor, num_items: int) -> torch.Tensor:
    """``[world, L, ...]`` rank-major rows -> ``[num_items, ...]`` in dataset order."""
    world, count = stacked.shape[:2]
    ordered = stacked.transpose(0, 1).reshape(world * count, *stacked.shape[2:])
    return ordered[:num_items]


def loss_and_metrics(model: Callable, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Default inference function: the model protocol's per-example loss and metrics."""
    loss, metrics = model(batch)
    return {"loss": loss, **{k: v for k, v in metrics.items() if v.dim() > 0}}


def _collate(dataset: Any) -> Callable:
    return getattr(dataset, "collate", None) or torch.utils.data.default_collate


def _local_outputs(model, dataset, batch_size: int, fn: Callable) -> dict[str, torch.Tensor]:
    positions = shard_positions(len(dataset), distributed.rank(), distributed.world_size())
    collate, device = _collate(dataset), accelerator.device()
    chunks: dict[str, list[torch.Tensor]] = {}
    fetch = getattr(dataset, "__getitems__", None)  # a whole batch at once (torch's protocol)
    for start in range(0, len(positions), batch_size):
        chunk = positions[start : start + batch_size]
        items = fetch(chunk) if fetch is not None else [dataset[i] for i in chunk]
        outputs = fn(model, accelerator.to_device(collate(items), device))
        for key, value in outputs.items():
            chunks.setdefault(key, []).append(value.detach().cpu())
    return {key: torch.cat(values) for key, values in chunks.items()}


@torch.no_grad()
def predict(
    model: Callable,
    dataset: Any,
    batch_size: int,
    fn: Callable[[Callable, Mapping[str, Any]], dict[str, torch.Tensor]] = loss_and_metrics,
) -> dict[str, torch.Tensor] | None:
    """``fn(model, batch)`` over every item; on rank 0 a dict of ``[len(dataset), ...]`` CPU
    tensors in dataset order, ``None`` on other ranks. Call it on all ranks together."""
    if len(dataset) == 0:
        raise RecapError("inference: the dataset is empty; check the eval dataset configuration")
    module = getattr(model, "module", model)
    was_training = module.training
    module.eval()
    try:
        local = _local_outputs(model, dataset, batch_size, fn)
    finally:
        module.train(was_training)
    merged = {
        k: merge_shards(distributed.all_gather_stacked(v), len(dataset))
        for k, v in sorted(local.items())
    }
    return merged if distributed.is_main() else None


def load_exported(model: torch.nn.Module, path: str | os.PathLike, strict: bool = True) -> None:
    """Load a ``model.safetensors`` written by the trainer into a plain (non-DeepSpeed) model.

    Tied weights were stored once; the file's metadata names their aliases, restored here."""
    if not os.path.isfile(path):
        raise RecapError(
            f"{path}: exported weights not found; run training to the end or set the path"
        )
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    state = load_file(str(path))
    for alias, source in json.loads(metadata.get(TIED_KEY, "{}")).items():
        state[alias] = state[source]
    model.load_state_dict(state, strict=strict)
