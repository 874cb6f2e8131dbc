"""Run by ``test_memory_auto`` under ``deepspeed --num_gpus 2`` (CPU): rank 0 is told its device
has 64 GiB, rank 1 6 GiB; each rank resolves ``zero_stage = "auto"`` and writes what it chose to
``OUT/rank{r}.json`` (with the stage ``_largest_across_ranks`` agrees on from ranks 0 and 1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from recap.engine import accelerator, distributed
from recap.engine.deepspeed_config import EngineConfig, _largest_across_ranks, resolve_auto

distributed.init()
rank = distributed.rank()
accelerator.total_memory_gib = lambda local_ranks=1: 64.0 if rank == 0 else 6.0
config = EngineConfig(
    micro_batch_size=4,
    global_batch_size=8,
    precision="fp32",
    zero_stage="auto",
    activation_gb_per_sample=1.0,
).build(world_size=2, max_steps=1)
resolved, line = resolve_auto(config, lambda: torch.nn.Linear(8, 8), distributed.world_size())
out = {"stage": resolved["zero_optimization"]["stage"], "line": line,
       "largest": _largest_across_ranks(rank)}  # fmt: skip
Path(sys.argv[-1], f"rank{rank}.json").write_text(json.dumps(out))
distributed.shutdown()
