"""Engine overhead: a ZeRO-3 DeepSpeed step vs a plain PyTorch step doing the same work.

Both train the toy regressor (``gin/demo/toy.gin`` sizes) in one process on the same micro-batches:
2 accumulation micro-batches of 4, AdamW with the same parameter groups, clipping 1.0, the same
LR schedule. The engine side runs ``Trainer.train_step`` exactly as training does.

    DS_ACCELERATOR=cpu python bench/engine.py [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import torch

from recap.engine import accelerator, distributed
from recap.engine.deepspeed_config import (
    deepspeed_config,
    for_deepspeed,
    lr_scheduler_factory,
    param_groups,
)
from recap.engine.tracking import Tracker
from recap.engine.trainer import LoopOptions, Trainer, build_model
from recap.models.toy import toy_data, toy_model

WARMUP = 3


def config(max_steps: int) -> dict:
    return deepspeed_config(
        world_size=1,
        max_steps=max_steps,
        micro_batch_size=4,
        global_batch_size=8,
        precision="fp32",
        lr=1e-3,
        head_lr=1e-3,
        param_persistence_threshold=0,
    )


def time_engine(steps: int, data) -> float:
    import deepspeed

    cfg = config(steps + WARMUP)
    ds = for_deepspeed(cfg)
    torch.manual_seed(0)
    model, keepalive = build_model(toy_model, ds)
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, cfg),
        config=ds,
        lr_scheduler=lr_scheduler_factory(cfg),
    )
    opts = LoopOptions(run_dir=Path(os.devnull), max_steps=steps + WARMUP)
    trainer = Trainer(engine, cfg, opts, Tracker(enabled=False), data)
    batches = trainer.batches(0)
    for step in range(1, WARMUP + 1):
        trainer.train_step(step, batches)
    begin = time.perf_counter()
    for step in range(WARMUP + 1, WARMUP + steps + 1):
        trainer.train_step(step, batches)
    del keepalive
    return (time.perf_counter() - begin) / steps


def time_plain(steps: int, data) -> float:
    cfg = config(steps + WARMUP)
    torch.manual_seed(0)
    model = toy_model()
    optimizer = torch.optim.AdamW(
        param_groups(model, cfg), betas=(0.9, 0.95), eps=1e-8, weight_decay=1e-10
    )
    scheduler = lr_scheduler_factory(cfg)(optimizer)
    sampler = distributed.StepBatchSampler(len(data), 8, 4, 0, 0, steps + WARMUP, 0, 1)
    loader = iter(torch.utils.data.DataLoader(data, batch_sampler=sampler))

    def step() -> None:
        for _ in range(2):
            loss, _ = model(next(loader))
            (loss.mean() / 2).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(WARMUP):
        step()
    begin = time.perf_counter()
    for _ in range(steps):
        step()
    accelerator.synchronize()
    return (time.perf_counter() - begin) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    distributed.init()
    data = toy_data(num_examples=512)
    plain = time_plain(args.steps, data)
    engine = time_engine(args.steps, data)
    print(f"{accelerator.describe()}; toy regressor, {args.steps} timed steps of 2 x 4 examples")
    print(
        f"RESULT: engine_step_ms={engine * 1e3:.2f} plain_step_ms={plain * 1e3:.2f} "
        f'overhead_ratio={engine / plain:.2f} target="report the overhead" met=yes'
    )


if __name__ == "__main__":
    main()
