"""Models as ``nn.Module``s; the engine (``recap.engine``) trains any model of this protocol.

Protocol (value model, policy, and the toy all follow it)::

    loss, metrics = model(batch)

- ``batch``: a dict of tensors (the collated items of a map-style dataset, already on the device).
- ``loss``: ``float[B]``, the unreduced per-example loss. The engine backpropagates its mean over
  the micro-batch and logs the mean over the global batch, summed exactly across ranks.
- ``metrics``: ``dict[str, Tensor]``; a ``[B]`` tensor is a per-example value (averaged over
  examples across ranks; at eval gathered over the whole eval set), a 0-d tensor is a batch value
  (averaged over micro-batches and ranks).

Optional hooks (called on rank 0 with the whole eval set, in dataset order):

- ``summarize_eval(outputs: dict[str, Tensor]) -> dict[str, float]`` for set-level metrics such as
  Spearman over all predictions; ``outputs`` holds ``"loss"`` and every per-example metric.
- ``eval_figures(outputs) -> dict[str, matplotlib.figure.Figure]``: plots logged to MLflow.

Parameters whose names match ``deepspeed_config.head_patterns`` (default ``"head.*"``: name the
module ``head``) train at the head learning rate. Large backbones are built with transformers'
``from_config`` / ``from_pretrained`` so ZeRO-3 partitions them at construction. Models never move
themselves to a device, use ``torch.distributed`` or DeepSpeed: the engine places and shards them.

Datasets: map-style (``__len__``, ``__getitem__`` -> dict of tensors); an optional
``collate(items)`` method replaces ``torch.utils.data.default_collate``.
"""

from __future__ import annotations

import os

# transformers must never reach for TensorFlow / JAX (it once segfaulted under NumPy 2).
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TRANSFORMERS_NO_TF", "1")
os.environ.setdefault("USE_FLAX", "0")
os.environ.setdefault("USE_TORCH", "1")
