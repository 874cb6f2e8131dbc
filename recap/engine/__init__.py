"""The only package that knows ranks, devices, ZeRO-3 and DeepSpeed.

- ``accelerator``: device selection (Ascend NPU / CUDA / CPU through DeepSpeed's accelerator),
  seeding, memory, bf16 support.
- ``distributed``: process group, barrier, reductions, rank-sharded batches.
- ``deepspeed_config``: ``EngineConfig`` (gin ``deepspeed_config.*``), the DeepSpeed config dict
  it builds in code.
- ``trainer``: the loop (step, log, evaluate, save, resume, export); ``checkpointing`` its files.
- ``inference``: sharded batched inference merged on rank 0; loading exported weights.
- ``loader``: the one DataLoader construction (training, inference and the frame-loader
  benchmark), whole batches per worker call; in-order passes give each worker a contiguous block.
- ``protocol``: what the engine needs from a model (it imports nothing of ``recap.models``).
- ``memory``: the per-rank memory plan of a ZeRO-3 run (``recap-plan-memory``).

Importing this package selects the accelerator but never imports TensorFlow or JAX.
"""

from __future__ import annotations

import os

# Before torch / transformers / deepspeed load: keep transformers away from TensorFlow and JAX.
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TRANSFORMERS_NO_TF", "1")
os.environ.setdefault("USE_FLAX", "0")
os.environ.setdefault("USE_TORCH", "1")

from recap.engine import accelerator  # noqa: E402

accelerator.select_accelerator()
