"""Batched no-grad inference over a dataset sharded across ranks, merged on rank 0 in order.

Batches are fixed in dataset order whatever the world size: batch ``k`` holds positions
``kB .. kB + B - 1`` (past the end, the last item repeats). Rank ``r`` of ``W`` takes the
contiguous run of batches ``rP .. rP + P - 1`` with ``P = ceil(ceil(n / B) / W)``, so every rank
runs the same number of forward passes (ZeRO-3 needs that), reads its frames front to back (video
decoders run forward, no seeks), and every item sees the same batch on 1 or W ranks (identical
numerics). Stacking the ranks' rows ``[W, P B]`` rank-major gives dataset order; the padded rows
land at positions ``>= n`` and are cut: each item is computed once and appears once. Batches are
fetched by the one loader, ``recap.engine.loader.batch_loader``; with ``num_workers`` DataLoader
workers each worker decodes its own contiguous run of the rank's batches. Also here: loading an
exported ``model.safetensors`` without DeepSpeed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from safetensors.torch import load_file

from recap.engine import accelerator, distributed
from recap.engine.loader import batch_loader, worker_order
from recap.engine.protocol import ExportHooks
from recap.errors import RecapError

TIED_KEY = "recap_tied"


def shard_positions(num_items: int, rank: int, world: int, batch_size: int = 1) -> list[int]:
    """Dataset indices rank ``rank`` computes: a contiguous block of whole batches of the fixed
    batch grid, ``P * batch_size`` entries on every rank (positions past the end repeat the last
    item)."""
    per_rank = math.ceil(math.ceil(num_items / batch_size) / world) * batch_size
    start = rank * per_rank
    return [min(p, num_items - 1) for p in range(start, start + per_rank)]


def merge_shards(stacked: torch.Tensor, num_items: int) -> torch.Tensor:
    """``[world, L, ...]`` rank-major rows -> ``[num_items, ...]`` in dataset order."""
    world, count = stacked.shape[:2]
    return stacked.reshape(world * count, *stacked.shape[2:])[:num_items]


def loss_and_metrics(model: Callable, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Default inference function: the model protocol's per-example loss and metrics."""
    loss, metrics = model(batch)
    return {"loss": loss, **{k: v for k, v in metrics.items() if v.dim() > 0}}


def _batches(dataset: Any, batches: list[list[int]], num_workers: int) -> Iterator[tuple]:
    """``(batch id, collated batch)`` for every batch, in the main process or in workers, each
    worker walking a contiguous run of the batches (``worker_order``)."""
    order = worker_order(len(batches), num_workers)
    in_order = [[] if k is None else batches[k] for k in order]
    # without workers the base seed goes unused: draw it from a private generator, leaving the
    # global RNG (which an eval loss may sample from) as it was
    private = None if num_workers > 0 else torch.Generator()
    batches_in_order = batch_loader(dataset, in_order, num_workers, generator=private)
    for k, batch in zip(order, batches_in_order, strict=True):
        if k is not None:
            yield k, batch


def _local_outputs(
    model, dataset, batch_size: int, fn: Callable, num_workers: int = 0
) -> dict[str, torch.Tensor]:
    rank, world = distributed.rank(), distributed.world_size()
    positions = shard_positions(len(dataset), rank, world, batch_size)
    batches = [positions[s : s + batch_size] for s in range(0, len(positions), batch_size)]
    device = accelerator.device()
    results: list[dict[str, torch.Tensor]] = [{} for _ in batches]
    for k, batch in _batches(dataset, batches, num_workers):
        outputs = fn(model, accelerator.to_device(batch, device))
        results[k] = {key: value.detach().cpu() for key, value in outputs.items()}
    return {key: torch.cat([r[key] for r in results]) for key in results[0]}


@torch.no_grad()
def predict(
    model: Callable,
    dataset: Any,
    batch_size: int,
    fn: Callable[[Callable, Mapping[str, Any]], dict[str, torch.Tensor]] = loss_and_metrics,
    num_workers: int = 0,
) -> dict[str, torch.Tensor] | None:
    """``fn(model, batch)`` over every item; on rank 0 a dict of ``[len(dataset), ...]`` CPU
    tensors in dataset order, ``None`` on other ranks. Call it on all ranks together.
    ``num_workers`` > 0 fetches batches in DataLoader workers (forkserver), each decoding a
    contiguous run of this rank's batches."""
    if len(dataset) == 0:
        raise RecapError("inference: the dataset is empty; check the eval dataset configuration")
    module = getattr(model, "module", model)
    was_training = module.training
    module.eval()
    try:
        local = _local_outputs(model, dataset, batch_size, fn, num_workers)
    finally:
        module.train(was_training)
    merged = {
        k: merge_shards(distributed.all_gather_stacked(v), len(dataset))
        for k, v in sorted(local.items())
    }
    return merged if distributed.is_main() else None


def load_exported(model: torch.nn.Module, path: str | os.PathLike, strict: bool = True) -> None:
    """Load a ``model.safetensors`` written by the trainer into a plain (non-DeepSpeed) model.

    Tied weights were stored once; the file's metadata names their aliases, restored here. A
    model with ``ExportHooks`` is readied first (``prepare_to_load_exported``: one built with LoRA
    adapters gets its plain layers back, the file holding the merged weights)."""
    if not os.path.isfile(path):
        raise RecapError(
            f"{path}: exported weights not found; run training to the end or set the path"
        )
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    state = load_file(str(path))
    if isinstance(model, ExportHooks):
        model.prepare_to_load_exported()
    for alias, source in json.loads(metadata.get(TIED_KEY, "{}")).items():
        state[alias] = state[source]
    model.load_state_dict(state, strict=strict)
