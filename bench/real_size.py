"""Real-size training steps: the value model and π0.5 at each ZeRO stage that the planner allows.

On an NPU / GPU: the real sizes (``value.gin`` + ``models/value_real.gin``;
``experiments/libero_pi05.gin``, gradient checkpointing on as LIBERO sets it), bf16, one process;
for each ZeRO stage (0-3) whose predicted model states leave room for one sample on this
device (``recap.engine.memory.stage_model_states``, one rank; ``--stages`` to name them), the
micro batch is the largest the memory planner allows at that stage (capped at the gin micro
batch), or ``--micro_batch``. On CPU: the demo
sizes (``demo/value.gin``, ``demo/policy.gin``), fp32, micro batch 4. Reports step time
(forward + backward + optimizer step), samples/s, peak device memory against the planner's
prediction (where the device counts memory) and MFU: 3 x the forward's FLOPs (torch's
FlopCounterMode; the recomputation of checkpointing not counted) over the device's bf16 dense
peak.

    python bench/real_size.py [--steps 3] [--micro_batch N] [--peak_tflops T] [--stages 0,2,3]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch.utils.flop_counter import FlopCounterMode

from recap.engine import accelerator, distributed, memory

# bf16 dense peak TFLOPS (no sparsity). NVIDIA datasheets: H100 / H200 SXM 989, A100 312.
# Ascend 910B: ~313, approximate (the figure commonly quoted for the 910B; Huawei publishes
# 320 FP16 for the original Ascend 910). Override with --peak_tflops.
PEAK_TFLOPS = {"910B": 313.0, "H200": 989.0, "H100": 989.0, "A100": 312.0}
REAL = {
    "value": ["value.gin", "models/value_real.gin"],
    "pi05": ["experiments/libero_pi05.gin"],
}
DEMO = {"value": ["demo/value.gin"], "pi05": ["demo/policy.gin"]}
# the LIBERO plan's measured activations (README "Real sizes and memory"), GiB per sample
ACTIVATION_GIB = {"value": 0.885, "pi05": 0.938}
SHAPES_ONLY = ["pi05_policy.checkpoint = None", "train.max_steps = 1"]
WARMUP = 2


def device_name() -> str:
    try:
        return torch.get_device_module(accelerator.name()).get_device_name()
    except Exception:
        return accelerator.name()


def peak_tflops(name: str, override: float | None) -> float | None:
    if override:
        return override
    return next((v for k, v in PEAK_TFLOPS.items() if k.lower() in name.lower()), None)


def model_config(files: list[str]):
    """(config, gin micro batch) of the model ``files`` bind (shapes only, nothing loaded)."""
    import gin

    import recap.models.pi05  # noqa: F401  (registers pi05_policy)
    import recap.steps.train  # noqa: F401  (registers train, value_model, ...)
    from recap.cli import parse_gin

    gin.clear_config()
    parse_gin(files, SHAPES_ONLY)
    model_fn = gin.query_parameter("train.model_fn").scoped_configurable_fn
    config = memory.build_on_meta(model_fn).config
    try:
        micro = int(gin.query_parameter("deepspeed_config.micro_batch_size"))
    except ValueError:
        micro = 32
    gin.clear_config()
    return config, micro


def make_batch(config, micro: int, dtype: torch.dtype, prompt_tokens: int) -> dict:
    torch.manual_seed(0)
    batch = memory.sample_batch(config, 3, prompt_tokens, micro)
    batch["input_ids"] %= int(config.text.get("vocab_size", memory.MEASURE_VOCAB))
    batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
    return accelerator.to_device(batch, accelerator.device())


def predicted_gib(
    config, micro: int, activation_gib: float, stage: int = 3
) -> tuple[float, float, int]:
    """(predicted peak GiB of model states + activations on one rank at ZeRO ``stage``, device
    GiB, largest micro batch the planner allows with its 4 GiB reserve)."""
    counts = memory.count_parameters(memory.build_on_meta(lambda: memory.build_scaled(config)))
    states = memory.stage_model_states(counts, 1, stage).planned
    total = accelerator.get().total_memory() / memory.GIB
    fits = memory.max_micro_batch(total, states + 4.0, activation_gib)
    return states + micro * activation_gib, total, fits


def feasible_stages(kind: str, files: list[str], args) -> list[int]:
    """``--stages``, else (device) every stage with room for one sample, (CPU) 0 and 3."""
    if args.stages:
        return [int(s) for s in args.stages.split(",")]
    if accelerator.is_cpu():
        return [0, 3]
    config, _ = model_config(files)
    activation = args.activation_gib or ACTIVATION_GIB[kind]
    return [s for s in (0, 1, 2, 3) if predicted_gib(config, 1, activation, s)[2] >= 1]


def run(kind: str, files: list[str], args, peak: float | None, stage: int = 3) -> dict:
    import deepspeed

    from recap.engine.deepspeed_config import EngineConfig, for_deepspeed, param_groups
    from recap.engine.trainer import build_model

    cpu = accelerator.is_cpu()
    config, gin_micro = model_config(files)
    activation = args.activation_gib or ACTIVATION_GIB[kind]
    micro = args.micro_batch or (4 if cpu else None)
    if micro is None:  # the planner's largest micro batch on this device, capped at the gin one
        micro = max(1, min(gin_micro, predicted_gib(config, 1, activation, stage)[2]))
    dtype = torch.float32 if cpu else torch.bfloat16
    cfg = EngineConfig(
        micro_batch_size=micro,
        global_batch_size=micro,
        precision="fp32" if cpu else "bf16",
        lr=1e-5,
        head_lr=1e-5,
        zero_stage=stage,
    ).build(world_size=1, max_steps=args.steps + WARMUP)
    ds = for_deepspeed(cfg)
    torch.manual_seed(0)
    begin = time.perf_counter()
    model, keepalive = build_model(lambda: memory.build_scaled(config, dtype=dtype), ds)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model, cfg),
                                      config=ds)  # fmt: skip
    build_s = time.perf_counter() - begin
    batch = make_batch(config, micro, dtype, 200 if not cpu else 16)
    engine.train()
    flops = 0.0

    def step(count: bool = False) -> float:
        nonlocal flops
        if count:
            with FlopCounterMode(display=False) as counter:
                loss, _ = engine(batch)
            flops = 3.0 * counter.get_total_flops()
        else:
            loss, _ = engine(batch)
        engine.backward(loss.mean())
        engine.step()
        return float(loss.mean())

    losses = [step(count=i == 0) for i in range(WARMUP)]
    accelerator.synchronize()
    try:
        accelerator.get().reset_peak_memory_stats()
    except Exception:
        pass
    begin = time.perf_counter()
    for _ in range(args.steps):
        losses.append(step())
    accelerator.synchronize()
    step_s = (time.perf_counter() - begin) / args.steps
    measured = accelerator.memory_stats().get("memory/max_allocated_gib") if not cpu else None
    out = {"kind": kind, "stage": stage, "micro": micro, "step_s": step_s,
           "samples_s": micro / step_s,
           "tflops": flops / step_s / 1e12, "build_s": build_s, "loss": losses[-1],
           "mfu": flops / step_s / 1e12 / peak if peak else None,
           "params": sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()),
           "peak_gib": measured, "predicted_gib": None}  # fmt: skip
    if measured is not None:
        out["predicted_gib"], out["device_gib"], _ = predicted_gib(config, micro, activation,
                                                                   stage)  # fmt: skip
    del keepalive  # the engine and model go with this frame
    try:
        accelerator.get().empty_cache()
    except Exception:
        pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps after 2 warm-up steps")
    parser.add_argument("--micro_batch", type=int, default=None, help="default: the planner's")
    parser.add_argument(
        "--activation_gib",
        type=float,
        default=None,
        help="GiB per sample for the planner (default: the LIBERO plan's)",
    )
    parser.add_argument("--peak_tflops", type=float, default=None, help="device bf16 peak")
    parser.add_argument("--only", choices=["value", "pi05"], default=None)
    parser.add_argument("--stages", default=None, help="comma-separated ZeRO stages to run")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    distributed.init()
    name = device_name()
    peak = None if accelerator.is_cpu() else peak_tflops(name, args.peak_tflops)
    sizes = DEMO if accelerator.is_cpu() else REAL
    results = {}
    for kind, files in sizes.items():
        if args.only in (None, kind):
            for stage in feasible_stages(kind, files, args):
                results[f"{kind}_zero{stage}"] = run(kind, files, args, peak, stage)
    print(f"{accelerator.describe()}; {name}; peak {peak or 'n/a'} TFLOPS bf16; "
          f"{'demo' if accelerator.is_cpu() else 'real'} sizes, 1 process")  # fmt: skip
    print(
        "model   ZeRO  params         micro  step s   samples/s  TFLOPS  MFU     peak GiB  "
        "planned GiB  build s  loss"
    )
    for r in results.values():
        mfu = f"{r['mfu']:.3f}" if r["mfu"] is not None else "n/a"
        peak_gib = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "n/a"
        planned = f"{r['predicted_gib']:.1f}" if r["predicted_gib"] is not None else "n/a"
        print(f"{r['kind']:7s} {r['stage']:4d}  {r['params']:>13,}  {r['micro']:5d}  "
              f"{r['step_s']:7.3f}  "
              f"{r['samples_s']:9.2f}  {r['tflops']:6.2f}  {mfu:6s}  {peak_gib:>8s}  "
              f"{planned:>11s}  {r['build_s']:7.1f}  {r['loss']:.4g}")  # fmt: skip

    def fmt(value, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    fields = " ".join(
        f"{name}_step_s={fmt(r['step_s'], '.3f')} {name}_samples_s={fmt(r['samples_s'], '.2f')} "
        f"{name}_mfu={fmt(r['mfu'], '.3f')} {name}_peak_gib={fmt(r['peak_gib'], '.1f')}"
        for name, r in results.items()
    )
    print(f'RESULT: device={accelerator.name()} {fields} target="report" met=yes')


if __name__ == "__main__":
    main()
