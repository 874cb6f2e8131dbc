"""Engine overhead: recap's DeepSpeed step at ZeRO stages 0-3 against plain PyTorch DDP, 2 ranks.

All five train the toy regressor (``gin/demo/toy.gin`` sizes) in the same two processes on the
same micro-batches: global batch 16, micro batch 4 (2 accumulation steps per rank), AdamW with
the same parameter groups, clipping 1.0, the same LR schedule, fp32. The engines run
``Trainer.train_step`` exactly as training does (metrics accumulated, EMA off); DDP skips the
all-reduce of the first micro-batch (``no_sync``) as a careful hand-written loop would. Timing is
interleaved: each round times every variant for ``--steps`` steps, in a rotating order; the step
time per variant is the median over ``--rounds`` rounds, and each ratio the median over rounds of
the variant's time over DDP's in the same round (the CPUs are shared: load that drifts between
rounds cancels).

What limits the ratios is DeepSpeed's, not recap's (profiled with cProfile on 2 CPU ranks): at
ZeRO-1/2 the partitioned optimizer adds a reduce-scatter / all-gather of the updated partitions
and an all-reduce of the gradient norm to DDP's single bucketed all-reduce (ZeRO-2 also reduces
at every micro-batch); at ZeRO-3 the per-module fetch/release hooks (Python, ~30 modules, on
every forward and backward) cost more than the toy's compute, whatever the persistence threshold.
Recap's own per-step work is the seeding, the batch transfer and metric sums kept on the device.

    DS_ACCELERATOR=cpu python bench/engine.py [--steps 10] [--rounds 11]

launches itself on 2 ranks (``deepspeed --num_gpus 2``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

from recap.engine import accelerator, distributed
from recap.engine.deepspeed_config import (
    EngineConfig,
    for_deepspeed,
    lr_scheduler_factory,
    param_groups,
)
from recap.engine.trainer import LoopOptions, Trainer, build_model
from recap.models.toy import toy_data, toy_model
from recap.ports import free_port
from recap.tracking import Tracker

RANKS, GLOBAL, MICRO, WARMUP = 2, 16, 4, 3
STAGES = (0, 1, 2, 3)
TARGET = {0: 1.2, 1: 1.2, 2: 1.2, 3: 2.0}


def config(stage: int, max_steps: int) -> dict:
    return EngineConfig(
        micro_batch_size=MICRO,
        global_batch_size=GLOBAL,
        zero_stage=stage,
        precision="fp32",
        lr=1e-3,
        head_lr=1e-3,
        param_persistence_threshold=0,
    ).build(world_size=RANKS, max_steps=max_steps)


def engine_step(stage: int, max_steps: int, data):
    """``step(i)`` running ``Trainer.train_step`` on a ZeRO-``stage`` engine; the keepalive."""
    import deepspeed

    cfg = config(stage, max_steps)
    ds = for_deepspeed(cfg)
    torch.manual_seed(0)
    model, keepalive = build_model(toy_model, ds)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model, cfg), config=ds,
        lr_scheduler=lr_scheduler_factory(cfg),
    )  # fmt: skip
    opts = LoopOptions(run_dir=Path(os.devnull), max_steps=max_steps)
    trainer = Trainer(engine, cfg, opts, Tracker(enabled=False), data)
    batches = trainer.batches(0)
    return (lambda i: trainer.train_step(i, batches)), keepalive


def ddp_step(max_steps: int, data):
    """``step(i)``: a plain PyTorch DDP step doing the same work."""
    from torch.nn.parallel import DistributedDataParallel

    cfg = config(0, max_steps)
    torch.manual_seed(0)
    model = DistributedDataParallel(toy_model())
    optimizer = torch.optim.AdamW(param_groups(model.module, cfg), betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=1e-10)  # fmt: skip
    scheduler = lr_scheduler_factory(cfg)(optimizer)
    sampler = distributed.StepBatchSampler(
        len(data), GLOBAL, MICRO, 0, 0, max_steps, distributed.rank(), RANKS
    )
    loader = iter(torch.utils.data.DataLoader(data, batch_sampler=sampler))
    accumulation = GLOBAL // (MICRO * RANKS)

    def step(_: int) -> None:
        for k in range(accumulation):
            batch = next(loader)
            if k < accumulation - 1:
                with model.no_sync():
                    loss, _ = model(batch)
                    (loss.mean() / accumulation).backward()
            else:
                loss, _ = model(batch)
                (loss.mean() / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def worker(steps: int, rounds: int) -> None:
    warnings.filterwarnings("ignore")
    distributed.init()
    data = toy_data(num_examples=512)
    max_steps = WARMUP + steps * rounds
    variants = {"ddp": ddp_step(max_steps, data)}
    keep = []
    for stage in STAGES:  # ZeRO-3 last: its HfDeepSpeedConfig partitions every later build
        variants[f"stage{stage}"], keepalive = engine_step(stage, max_steps, data)
        keep.append(keepalive)
    names = list(variants)
    counters = dict.fromkeys(names, 0)
    for name in names:
        for _ in range(WARMUP):
            counters[name] += 1
            variants[name](counters[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            distributed.barrier()
            begin = time.perf_counter()
            for _ in range(steps):
                counters[name] += 1
                variants[name](counters[name])
            accelerator.synchronize()
            times[name].append((time.perf_counter() - begin) / steps * 1e3)
    if not distributed.is_main():
        return
    median = {name: statistics.median(values) for name, values in times.items()}
    # each round's ratio against DDP in that same round, then the median: load that changes
    # between rounds (shared cores) cancels
    ratio = {
        s: statistics.median(t / d for t, d in zip(times[f"stage{s}"], times["ddp"], strict=True))
        for s in STAGES
    }
    print(f"{accelerator.describe()}; {RANKS} ranks; toy regressor; global {GLOBAL}, micro "
          f"{MICRO}; {rounds} rounds x {steps} steps, medians (ms/step):")  # fmt: skip
    for name in names:
        spread = ", ".join(f"{t:.1f}" for t in times[name])
        print(f"  {name:7s} {median[name]:7.2f}   rounds: {spread}")
    met = all(ratio[s] <= TARGET[s] for s in STAGES)
    print(
        f"RESULT: ddp_step_ms={median['ddp']:.2f} "
        + " ".join(f"stage{s}_step_ms={median[f'stage{s}']:.2f}" for s in STAGES)
        + " "
        + " ".join(f"stage{s}_ratio={ratio[s]:.2f}" for s in STAGES)
        + f' target="stage 0-2 <= 1.2x DDP, stage 3 <= 2x" met={"yes" if met else "no"}'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args.steps, args.rounds)
        return
    launcher = str(Path(sys.executable).with_name("deepspeed"))
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    cmd = [launcher, "--num_gpus", str(RANKS), "--master_port", str(free_port()),
           __file__, "--steps", str(args.steps), "--rounds", str(args.rounds)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if not line.startswith("[")]
    keep = [line for line in lines if line.startswith(("RESULT", "  ", accelerator.name()))]
    print("\n".join(keep or lines[-40:]))
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
        sys.exit(done.returncode)


if __name__ == "__main__":
    main()
