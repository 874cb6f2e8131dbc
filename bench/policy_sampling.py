"""π0.5 sampling throughput: guidance (beta = 1 vs 2) and the prefix KV cache, in one run.

``cached`` computes the prefix (images + prompt) once and reuses its per-layer keys/values in
every Euler step; ``uncached`` recomputes the prefix at every step (what a naive joint forward per
step does). beta = 1 runs only the conditional branch; beta = 2 runs conditional and
unconditional prompts stacked in one batch. Throughput is actions/s: batch x horizon action
steps per sampling call, best of ``--repeats`` interleaved calls (CPU, no grad). Cached and
uncached samples must agree (checked).

Config: a demo-size π0.5 with the real token layout (2 cameras x 256 SigLIP tokens at 224 px /
14, a 48-token prompt, horizon 10 as LIBERO, 10 Euler steps) at reduced widths and depths.
"""

from __future__ import annotations

import argparse
import time

import torch

from recap.models.pi05 import Pi05Config, Pi05Policy, build_pi05

TARGET = "report the ratios"
VISION = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4,
          "num_attention_heads": 4, "image_size": 224, "patch_size": 14}  # fmt: skip
TEXT = {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 6,
        "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 32,
        "max_position_embeddings": 1024}  # fmt: skip
EXPERT = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 6,
          "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 32}  # fmt: skip


def demo_batch(batch_size: int, tokens: int, size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (batch_size, tokens), generator=g)
    plain = torch.arange(tokens)[None] < tokens // 2
    return {
        "images": torch.rand(batch_size, 3, 3, size, size, generator=g) * 2 - 1,
        "image_masks": torch.tensor([True, True, False]).expand(batch_size, 3),
        "input_ids": ids,
        "attention_mask": torch.ones(batch_size, tokens, dtype=torch.bool),
        "uncond_input_ids": ids.masked_fill(~plain, 0),
        "uncond_attention_mask": plain.expand(batch_size, tokens),
    }


def measure(model: Pi05Policy, batch: dict, noise: torch.Tensor, repeats: int) -> dict:
    """Best seconds per sampling call for each (beta, cache) variant, and their samples."""
    variants = {f"beta{b}_{c}": (float(b), c == "cached")
                for b in (1, 2) for c in ("cached", "uncached")}  # fmt: skip
    best, samples = dict.fromkeys(variants, float("inf")), {}
    for r in range(repeats + 1):  # the first round warms up
        for name, (beta, cache) in variants.items():
            begin = time.perf_counter()
            samples[name] = model.sample_actions(batch, noise, beta=beta, use_cache=cache)
            if r:
                best[name] = min(best[name], time.perf_counter() - begin)
    return {"seconds": best, "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = Pi05Config(vision=VISION, text=TEXT, expert=EXPERT, action_horizon=10)
    model = build_pi05(config).eval()
    batch = demo_batch(args.batch_size, args.tokens, VISION["image_size"])
    shape = (args.batch_size, config.action_horizon, config.action_dim)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    result = measure(model, batch, noise, args.repeats)
    seconds, samples = result["seconds"], result["samples"]
    rate = {k: args.batch_size * config.action_horizon / s for k, s in seconds.items()}
    same = all(torch.allclose(samples[f"beta{b}_cached"], samples[f"beta{b}_uncached"],
                              atol=1e-4) for b in (1, 2))  # fmt: skip
    params = sum(p.numel() for p in model.parameters()) / 1e6
    prefix = 2 * (VISION["image_size"] // VISION["patch_size"]) ** 2 + args.tokens
    print(f"demo config: {params:.1f}M params, batch {args.batch_size}, prefix {prefix} tokens, "
          f"horizon {config.action_horizon}, {config.num_steps} Euler steps")  # fmt: skip
    for name, s in seconds.items():
        print(f"{name:>16}: {s * 1e3:8.1f} ms per call, {rate[name]:8.1f} actions/s")
    cache_speedup = rate["beta1_cached"] / rate["beta1_uncached"]
    beta2_cost = seconds["beta2_cached"] / seconds["beta1_cached"]
    print(
        f"RESULT: beta1_cached={rate['beta1_cached']:.1f} "
        f"beta1_uncached={rate['beta1_uncached']:.1f} beta2_cached={rate['beta2_cached']:.1f} "
        f"beta2_uncached={rate['beta2_uncached']:.1f} cache_speedup={cache_speedup:.2f} "
        f'beta2_cost={beta2_cost:.2f} target="{TARGET}" met={"yes" if same else "no"}'
    )


if __name__ == "__main__":
    main()
