"""What truncating the value model's text backbone saves, measured against the full backbone.

The critic expert reads the keys/values of backbone layers 0..depth-1 only (depth 4 of Gemma3's
18). ``full`` runs every backbone layer, as RLinf does (its expert then reads 4 of 18 caches);
``truncated`` (the default, ``truncate_backbone=True``) builds ``depth`` layers and computes
layers 0..depth-2 plus the key/value projections of layer depth-1. Both give the same value
(checked here on the same weights).

Printed, in one run:
- FLOPs of one example at the real size (SigLIP so400m/14 at 224, 3 cameras, Gemma3-270M,
  200 prompt tokens), counted on the meta device (no weights, no compute);
- FLOPs and best-of-N forward wall time (no grad, CPU) on a small-but-not-tiny config with the
  real depths, token counts and layouts at a quarter of the widths: SigLIP width 288 x 27 layers
  at 224 px / 14 (256 tokens per camera, 3 cameras), Gemma3 width 160 x 18 layers, 200 tokens.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from recap.models import layers
from recap.models.value import ValueModel, ValueModelConfig, build_value_model

TARGET = "report the saving"
SMALL_VISION = {"hidden_size": 288, "intermediate_size": 1076, "num_hidden_layers": 27,
                "num_attention_heads": 4, "image_size": 224, "patch_size": 14}  # fmt: skip
SMALL_TEXT = {"vocab_size": 4096, "hidden_size": 160, "intermediate_size": 512,
              "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
              "head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 512,
              "max_position_embeddings": 1024}  # fmt: skip
SMALL_EXPERT = {"expert_head_dim": 64}


def batch_for(config: ValueModelConfig, batch_size: int, tokens: int) -> dict[str, torch.Tensor]:
    size = config.vision["image_size"]
    g = torch.Generator().manual_seed(0)
    return {
        "images": torch.rand(batch_size, 3, 3, size, size, generator=g) * 2 - 1,
        "image_masks": torch.ones(batch_size, 3, dtype=torch.bool),
        "input_ids": torch.randint(0, 1000, (batch_size, tokens), generator=g),
        "attention_mask": torch.ones(batch_size, tokens, dtype=torch.bool),
    }


def real_size_gflops(truncate: bool) -> float:
    """GFLOPs of one example's value at the real size, counted on the meta device: the vision
    tower over 3 cameras, the projector, the backbone prefix pass and the expert."""
    config = ValueModelConfig(truncate_backbone=truncate)
    with torch.device("meta"), torch.no_grad(), FlopCounterMode(display=False) as counter:
        model = build_value_model(config).eval()
        feats = model.vision_tower(pixel_values=torch.zeros(3, 3, 224, 224)).last_hidden_state
        text = model.language_model.embed_tokens(torch.zeros(1, 200, dtype=torch.long))
        embeds = torch.cat([model.projector(feats).reshape(1, -1, text.shape[-1]), text], dim=1)
        valid = torch.ones(embeds.shape[:2], dtype=torch.bool)
        positions = torch.arange(embeds.shape[1])[None]
        kvs = layers.run_prefix(model.language_model, embeds, valid, positions,
                                config.expert_depth, compute_all=not truncate)  # fmt: skip
        token = model.head["cls"](torch.zeros(1, 1, dtype=torch.long))
        types = model.language_model.config.layer_types[: config.expert_depth]
        ropes = [model.language_model.rotary_emb(token, positions[:, :1], t) for t in types]
        model.head["proj"](model.expert(token, kvs, valid, ropes))
    return counter.get_total_flops() / 1e9


def gflops(model: ValueModel, batch: dict) -> float:
    """GFLOPs of one forward (matmuls and attention, as counted by torch's FlopCounterMode)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.logits(batch)
    return counter.get_total_flops() / 1e9


def best_ms(models: list[ValueModel], batch: dict, repeats: int) -> list[float]:
    """Best forward wall time (ms, no grad) of each model, runs interleaved after a warm-up."""
    best = [float("inf")] * len(models)
    with torch.no_grad():
        for r in range(repeats + 1):
            for i, model in enumerate(models):
                begin = time.perf_counter()
                model.logits(batch)
                if r:
                    best[i] = min(best[i], (time.perf_counter() - begin) * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    real_full, real_trunc = real_size_gflops(False), real_size_gflops(True)
    print(
        f"real size, 1 example: full {real_full:.1f} GFLOP, truncated {real_trunc:.1f} GFLOP "
        f"({1 - real_trunc / real_full:.1%} saved, ratio {real_full / real_trunc:.2f}x)"
    )

    torch.manual_seed(0)
    sizes = {"vision": SMALL_VISION, "text": SMALL_TEXT, **SMALL_EXPERT}
    full = build_value_model(ValueModelConfig(truncate_backbone=False, **sizes)).eval()
    truncated = build_value_model(ValueModelConfig(**sizes)).eval()
    truncated.load_state_dict(full.state_dict(), strict=False)
    batch = batch_for(full.config, args.batch_size, args.tokens)
    with torch.no_grad():
        same = torch.allclose(full.logits(batch), truncated.logits(batch), atol=1e-5, rtol=0)
    full_gflops, trunc_gflops = gflops(full, batch), gflops(truncated, batch)
    full_ms, trunc_ms = best_ms([full, truncated], batch, args.repeats)
    params = [sum(p.numel() for p in m.parameters()) / 1e6 for m in (full, truncated)]
    print(
        f"small config, batch {args.batch_size}, prefix {3 * 256 + args.tokens} tokens: "
        f"params {params[0]:.1f}M -> {params[1]:.1f}M, GFLOP {full_gflops:.2f} -> "
        f"{trunc_gflops:.2f} ({full_gflops / trunc_gflops:.2f}x), forward {full_ms:.1f} -> "
        f"{trunc_ms:.1f} ms ({full_ms / trunc_ms:.2f}x), same values: {same}"
    )
    print(
        f"RESULT: full_ms={full_ms:.1f} truncated_ms={trunc_ms:.1f} "
        f"speedup={full_ms / trunc_ms:.2f} full_gflop={real_full:.1f} "
        f'truncated_gflop={real_trunc:.1f} target="{TARGET}" met={"yes" if same else "no"}'
    )


if __name__ == "__main__":
    main()
