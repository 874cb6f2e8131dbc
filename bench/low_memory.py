"""Low-memory recipes of π0.5: full fine-tuning, LoRA (openpi's: rank 16 decoder, rank 32
expert, SigLIP trained) and LoRA + frozen vision, on the DeepSpeed engine at reduced sizes.

Per recipe, measured here (one rank, ZeRO-2, fp32, the accelerator DeepSpeed picks): trainable
parameters, the parameters the DeepSpeed optimizer holds, the optimizer-state bytes as DeepSpeed
allocates them (float32 master partitions + Adam moments, ``memory.optimizer_footprint``), and
the step time relative to full fine-tuning in the same run. Then the memory planner's prediction
at the real sizes (``recap.engine.memory.plan_recipes``, parameters counted on the meta device
with peft's adapters) for 1 x 24 GB and 8 x 32 GB, from the activations measured for the LIBERO
plan (docs/hardware/memory.md: π0.5 0.938 GiB per sample with gradient checkpointing, of
which the SigLIP tower 0.690 GiB, not checkpointed).

    DS_ACCELERATOR=cpu python bench/low_memory.py [--steps 5]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from recap.engine import distributed, memory
from recap.engine.deepspeed_config import EngineConfig, for_deepspeed, param_groups
from recap.models.adapters import LoraOptions, adapt, recipe_steps
from recap.models.pi05 import Pi05Config, build_pi05

WARMUP = 2
MICRO = 2
SMALL = {
    "vision": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 2, "image_size": 56, "patch_size": 14},
    "text": {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 1024,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 64, "max_position_embeddings": 512},
    "expert": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64},
    "action_horizon": 10,
}  # fmt: skip
RECIPES = {"full": (None, ()), "LoRA": (LoraOptions(), ()),
           "LoRA + frozen vision": (LoraOptions(), ("vision",))}  # fmt: skip
ACTIVATION_GIB, VISION_GIB = 0.938, 0.690
HARDWARE = ((1, 24.0), (8, 32.0))


def batch(config: Pi05Config, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    size, h = config.vision["image_size"], config.action_horizon
    return {
        "images": torch.rand(MICRO, 3, 3, size, size, generator=g) * 2 - 1,
        "image_masks": torch.ones(MICRO, 3, dtype=torch.bool),
        "input_ids": torch.randint(3, 1024, (MICRO, 48), generator=g),
        "attention_mask": torch.ones(MICRO, 48, dtype=torch.bool),
        "actions": torch.randn(MICRO, h, config.action_dim, generator=g),
    }


def run_recipe(name: str, steps: int) -> dict:
    import deepspeed

    lora, freeze = RECIPES[name]
    torch.manual_seed(0)
    config = Pi05Config(**SMALL)
    model = adapt(build_pi05(config), lora, freeze)
    cfg = EngineConfig(
        micro_batch_size=MICRO,
        global_batch_size=MICRO,
        zero_stage=2,
        precision="fp32",
        head_lr=None,
        head_patterns=[],
    ).build(world_size=1, max_steps=steps + WARMUP)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model, cfg),
                                      config=for_deepspeed(cfg))  # fmt: skip
    times = []
    for step in range(WARMUP + steps):
        data = {k: v.to(engine.device) for k, v in batch(config, step).items()}
        begin = time.perf_counter()
        loss, _ = engine(data)
        engine.backward(loss.mean())
        engine.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - begin)
    numel, state_bytes = memory.optimizer_footprint(engine)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {"name": name, "trainable": trainable, "total": total, "optimizer_params": numel,
            "state_bytes": state_bytes, "step_s": sorted(times)[len(times) // 2]}  # fmt: skip


def planned() -> dict[tuple[int, float], list]:
    """Recipe plans of the real-size π0.5 (LIBERO: horizon 10, gradient checkpointing)."""
    build = lambda: build_pi05(Pi05Config(action_horizon=10, gradient_checkpointing=True))  # noqa: E731
    counts = memory.recipe_counts(build, recipe_steps(LoraOptions()))
    acts = memory.Activations(ACTIVATION_GIB, None, "README", VISION_GIB, VISION_GIB)
    return {(ranks, gb): memory.plan_recipes(counts, acts, ranks, gb, 32)
            for ranks, gb in HARDWARE}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    distributed.init()
    rows = [run_recipe(name, args.steps) for name in RECIPES]
    full = rows[0]
    print(f"π0.5 at reduced sizes ({full['total']:,} parameters), one rank, ZeRO-2, fp32, "
          f"micro {MICRO}, median of {args.steps} steps")  # fmt: skip
    print("| recipe | trainable | optimizer holds | optimizer state bytes | of full | step time "
          "vs full |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['trainable']:,} | {r['optimizer_params']:,} | "
              f"{r['state_bytes']:,} ({r['state_bytes'] / r['trainable']:.0f} B/param) | "
              f"{100 * r['state_bytes'] / full['state_bytes']:.1f}% | "
              f"{r['step_s'] / full['step_s']:.2f}x |")  # fmt: skip
    plans = planned()
    print("\nplanner at the real sizes (predictions; π0.5 LIBERO, checkpointing on):")
    print(
        "| recipe | trainable | optimizer state vs full | "
        + " | ".join(f"{n} x {gb:g} GB: largest micro, GiB/rank" for n, gb in HARDWARE)
        + " |"
    )
    print("|---|---|---|" + "---|" * len(HARDWARE))
    first = plans[HARDWARE[0]]
    for i, p in enumerate(first):
        ratio = p.counts.trainable / first[0].counts.trainable
        cells = [f"{plans[h][i].largest_micro}, {plans[h][i].total_gb:.1f}" for h in HARDWARE]
        print(
            f"| {p.recipe.name} | {p.counts.trainable:,} | {100 * ratio:.1f}% | "
            + " | ".join(cells)
            + " |"
        )
    lora = next(p for p in first if p.recipe.name == "LoRA")
    frozen = next(p for p in first if p.recipe.name == "LoRA + frozen vision")
    measured = {r["name"]: r["state_bytes"] / full["state_bytes"] for r in rows}
    real = {p.recipe.name: p.counts.trainable / first[0].counts.trainable for p in first}
    if lora.fits and real["LoRA"] <= 0.03:
        met = "yes"
    elif lora.fits and real["LoRA + frozen vision"] <= 0.03:
        met = "partly (LoRA fits; <= 3% only with the vision tower frozen)"
    else:
        met = "no"
    print(
        f"RESULT: pi05_lora_1x24_micro={lora.largest_micro} pi05_lora_1x24_gib={lora.total_gb:.1f} "
        f"pi05_lora_frozen_vision_1x24_micro={frozen.largest_micro} "
        f"optimizer_state_vs_full_real_lora={100 * real['LoRA']:.1f}% "
        f"optimizer_state_vs_full_real_lora_frozen_vision="
        f"{100 * real['LoRA + frozen vision']:.1f}% "
        f"optimizer_state_vs_full_measured_small_lora={100 * measured['LoRA']:.1f}% "
        f"optimizer_state_vs_full_measured_small_lora_frozen_vision="
        f"{100 * measured['LoRA + frozen vision']:.1f}% "
        f"lora_step_vs_full={rows[1]['step_s'] / full['step_s']:.2f} "
        f'target="pi05 LoRA fits 1x24GB at micro batch >= 1 (planned); optimizer state <= 3% '
        f'of full fine-tuning" met={met}'
    )


if __name__ == "__main__":
    main()
