"""A tiny π0.5 trained with LoRA through ``recap.steps.train`` (one process, or under
``deepspeed --num_gpus 2``), on fixed random examples (``tiny_policy_data``). Rank 0 writes
``run_dir/optimizer.json`` before the first step: the parameters the DeepSpeed optimizer holds,
the trainable ones and their names (``tests/engine/test_lora_engine.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gin
import torch

from recap.cli import run_step
from recap.engine import distributed, memory
from recap.engine.trainer import Trainer
from recap.models.adapters import trainable_count
from recap.steps.train import train

H, A, SIZE = 4, 6, 28


class TinyPolicyData(torch.utils.data.Dataset):
    """``num_examples`` fixed random π0.5 examples (3 cameras of 28 px, 6 prompt tokens)."""

    def __init__(self, num_examples: int = 16, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        n = num_examples
        self.items = {
            "images": torch.rand(n, 3, 3, SIZE, SIZE, generator=g) * 2 - 1,
            "image_masks": torch.tensor([True, True, False]).repeat(n, 1),
            "input_ids": torch.randint(3, 32, (n, 6), generator=g),
            "attention_mask": torch.ones(n, 6, dtype=torch.bool),
            "actions": torch.randn(n, H, A, generator=g),
            "noise": torch.randn(n, H, A, generator=g),  # fixed: runs of any world size agree
            "time": torch.rand(n, generator=g) * 0.999 + 0.001,
        }

    def __len__(self) -> int:
        return len(self.items["actions"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[index] for k, v in self.items.items()}


@gin.configurable
def tiny_policy_data(num_examples: int = 16, seed: int = 0) -> TinyPolicyData:
    return TinyPolicyData(num_examples, seed)


_run = Trainer.run


def _run_and_report(self: Trainer, start: int):
    if distributed.is_main():
        numel, _ = memory.optimizer_footprint(self.engine)
        module = self.engine.module
        report = {
            "optimizer_params": numel,
            "trainable": trainable_count(module),
            "trainable_names": sorted(n for n, p in module.named_parameters() if p.requires_grad),
        }
        (Path(self.opts.run_dir) / "optimizer.json").write_text(json.dumps(report))
    return _run(self, start)


Trainer.run = _run_and_report

if __name__ == "__main__":
    run_step(train, sys.argv[1:])
