"""Step 3's value inference, frames/s, with and without skipping the unread backbone layers.

The demo-size value model (``gin/demo/value.gin``: SigLIP 64 px / 2 layers, Gemma3 2 layers,
critic expert depth 2) over the demo's sft + rollout datasets (written once under bench/_data/),
one rank, no DataLoader workers, CPU: ``truncated`` (``value_model.truncate_backbone = True``,
the default: the last backbone layer only projects keys/values) against ``full`` (every layer
and the final norm run, as RLinf does). Both have the same weights and give the same values
(checked). Timed, best of N, interleaved:

- end to end: ``recap.steps.compute_advantages.infer_values`` (decode + batch + forward, what
  Step 3 runs);
- forward only: the same batches decoded once beforehand.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import gin
import numpy as np
import torch

from recap.cli import parse_gin
from recap.configurable import configured
from recap.core.normalize import ReturnRange
from recap.data.datasets import ValueDataset
from recap.data.sidecars import read_returns
from recap.data.specs import parse_dataset_specs
from recap.data.transforms import load_tokenizer
from recap.envs.reach import write_demo_datasets, write_demo_tokenizer
from recap.models.value import ValueModel, value_model
from recap.steps.compute_advantages import infer_values
from recap.steps.compute_returns import ReturnsConfig, compute_returns

TARGET = "report the ratio"
DATA = Path(__file__).resolve().parent / "_data" / "value_inference"
ENTRIES = [{"name": "sft", "root": "sft", "type": "sft"},
           {"name": "rollout", "root": "rollout", "type": "rollout"}]  # fmt: skip


def demo_data(root: Path) -> ValueDataset:
    """The demo's sft (30 episodes) + rollout (60) datasets with returns, as Step 3 reads them."""
    if not (root / "rollout" / "meta" / "returns.parquet").is_file():
        write_demo_datasets(root, sft_episodes=30, rollout_episodes=60, eval_episodes=1)
        write_demo_tokenizer(root)
        compute_returns(ReturnsConfig(datasets=ENTRIES, data_root=str(root)))
    specs = parse_dataset_specs(ENTRIES, root)
    stats = [read_returns(s.root, "")[1] for s in specs]
    rng = ReturnRange.union([ReturnRange(s["return_min"], s["return_max"]) for s in stats])
    return ValueDataset(specs, "", rng, load_tokenizer(root / "tokenizer"), 64, 16)


def models() -> tuple[ValueModel, ValueModel]:
    """(truncated, full) demo-size value models with the same random weights, eval mode."""
    parse_gin(["demo/value.gin"], [])
    torch.manual_seed(0)
    full = configured(value_model)(truncate_backbone=False).eval()
    truncated = configured(value_model)().eval()
    gin.clear_config()
    truncated.load_state_dict(full.state_dict(), strict=False)  # the unread layer is absent
    return truncated, full


def best_seconds(runs: list, repeats: int) -> tuple[list[float], list]:
    """Best wall time of each callable (runs interleaved after a warm-up) and its last result."""
    best, results = [float("inf")] * len(runs), [None] * len(runs)
    for r in range(repeats + 1):
        for i, run in enumerate(runs):
            begin = time.perf_counter()
            results[i] = run()
            if r:
                best[i] = min(best[i], time.perf_counter() - begin)
    return best, results


def forward_only(model: ValueModel, batches: list[dict]) -> np.ndarray:
    with torch.no_grad():
        return torch.cat([model.predict_value(b) for b in batches]).double().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    data = demo_data(DATA)
    truncated, full = models()
    n, b = len(data), args.batch_size
    end_to_end = [lambda m=m: infer_values(m, data, b) for m in (truncated, full)]
    (t_trunc, t_full), (v_trunc, v_full) = best_seconds(end_to_end, args.repeats)
    same = bool(np.allclose(v_trunc, v_full, rtol=0, atol=1e-5))
    batches = [data.__getitems__(list(range(s, min(s + b, n)))) for s in range(0, n, b)]
    forward = [lambda m=m: forward_only(m, batches) for m in (truncated, full)]
    (f_trunc, f_full), _ = best_seconds(forward, args.repeats)
    print(
        f"{n} frames, batch {b}, {torch.get_num_threads()} threads: end to end truncated "
        f"{n / t_trunc:.0f} vs full {n / t_full:.0f} frames/s ({t_full / t_trunc:.2f}x); forward "
        f"only {n / f_trunc:.0f} vs {n / f_full:.0f} frames/s ({f_full / f_trunc:.2f}x); "
        f"same values: {same}"
    )
    print(
        f"RESULT: frames_per_s_truncated={n / t_trunc:.1f} frames_per_s_full={n / t_full:.1f} "
        f'speedup={t_full / t_trunc:.2f} target="{TARGET}" met={"yes" if same else "no"}'
    )


if __name__ == "__main__":
    main()
