"""What the engine needs from a model, as ``typing.Protocol`` classes (it imports no model).

``recap.models`` (value model, π0.5, toy) implements these; the engine only calls them. Any
``nn.Module`` of this shape trains, evaluates, exports and plans:

- ``TrainableModel`` (required): ``loss, metrics = model(batch)``. ``batch``: a dict of tensors
  (the collated items of a map-style dataset, already on the device). ``loss``: ``float[B]``, the
  unreduced per-example loss; the engine backpropagates its mean over the micro-batch and logs
  the mean over the global batch, summed exactly across ranks. ``metrics``: ``dict[str,
  Tensor]``; a ``[B]`` tensor is a per-example value (averaged over examples across ranks; at
  eval gathered over the whole eval set), a 0-d tensor a batch value (averaged over micro-batches
  and ranks).
- ``EvalSummaries`` (optional, rank 0, the whole eval set in dataset order):
  ``summarize_eval(outputs) -> dict[str, float]`` for set-level metrics (Spearman over all
  predictions); ``outputs`` holds ``"loss"`` and every per-example metric.
- ``EvalFigures`` (optional, the model's and the eval dataset's): ``eval_figures(outputs) ->
  dict[str, Figure]``, plots logged to MLflow (a failure is a warning, never a stopped run).
- ``ExportHooks`` (optional): ``export_state(state, run_dir) -> (state, metadata)`` turns the
  consolidated state dict into what ``model.safetensors`` holds and may write files of its own
  under ``run_dir`` (rank 0; a LoRA model writes peft's adapter and returns the merged weights);
  ``prepare_to_load_exported()`` readies a freshly built model for that file (a LoRA model gets its
  plain layers back).
- ``MemoryProbe`` (the planner, ``recap.engine.memory``; implemented by a model's config
  dataclass): the real depth of each stack whose activations grow with its layer count, the
  same config at other depths and a small vocabulary, a model built from it, an example training
  batch and a switch for gradient checkpointing.

Parameters whose names match ``deepspeed_config.head_patterns`` (default ``"head.*"``) train at the
head learning rate. Large backbones are built with transformers' ``from_config`` /
``from_pretrained`` so ZeRO-3 partitions them at construction. Models never move themselves to a
device, use ``torch.distributed`` or DeepSpeed: the engine places and shards them. Datasets:
map-style (``__len__``, ``__getitem__`` -> dict of tensors); an optional ``collate(items)`` method
replaces ``torch.utils.data.default_collate``, an optional ``check_model(model)`` vets the model
it will feed (``recap.steps.train``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class TrainableModel(Protocol):
    def __call__(
        self, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


@runtime_checkable
class EvalSummaries(Protocol):
    def summarize_eval(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]: ...


@runtime_checkable
class EvalFigures(Protocol):
    def eval_figures(self, outputs: dict[str, torch.Tensor]) -> dict[str, Any]: ...


@runtime_checkable
class ExportHooks(Protocol):
    def export_state(
        self, state: dict[str, torch.Tensor], run_dir: Path
    ) -> tuple[dict[str, torch.Tensor], dict[str, str]]: ...

    def prepare_to_load_exported(self) -> None: ...


@runtime_checkable
class MemoryProbe(Protocol):
    """A model config the memory planner can measure (``recap.engine.memory``)."""

    def memory_depths(self) -> dict[str, int]:
        """Real depth of each stack whose activations grow with its layer count; a ``"vision"``
        entry is the stack a frozen vision tower removes."""
        ...

    def memory_scaled(self, depths: dict[str, int], vocab_size: int) -> MemoryProbe:
        """This config with the stacks at ``depths`` and a ``vocab_size`` vocabulary."""
        ...

    def memory_build(self, dtype: torch.dtype) -> nn.Module:
        """A randomly initialized model of this config."""
        ...

    def example_batch(
        self, cameras: int, prompt_tokens: int, batch_size: int, vocab_size: int
    ) -> dict[str, torch.Tensor]:
        """A training batch: ``cameras`` valid images, a full prompt of ids below
        ``vocab_size``, random targets."""
        ...

    def set_checkpointing(self, model: nn.Module, enabled: bool) -> bool:
        """Switch ``model``'s gradient checkpointing; False when it has none."""
        ...
