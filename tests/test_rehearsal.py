"""The real path, rehearsed: the shipped LIBERO pipeline end to end on real-format stand-ins.

``experiments/libero_pipeline.gin`` exactly as shipped, plus ``rehearsal/tiny.gin`` (sizes, step
counts, batch sizes and worker counts only), pointed at ``recap.standins`` (LeRobot v2.1 datasets
in RLinf's published layout, a SigLIP and a Gemma3 directory as Hugging Face saves them, a
PaliGemma SentencePiece file, a π0.5 checkpoint in openpi's layout), on 2 DeepSpeed CPU ranks:
returns, value, advantages, policy and baseline all run, and what they export reloads in a plain
process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gin
import numpy as np
import pyarrow.parquet as pq
import pytest

from recap.cli import parse_gin
from recap.standins import write_standins
from tests.helpers import REPO, launch_env, tree_hashes

PIPELINE = "experiments/libero_pipeline.gin"
TINY = "rehearsal/tiny.gin"
# What tiny.gin may bind: sizes, step counts, batch sizes, loader workers (nothing else).
SIZES = {
    "value_model.expert_width", "value_model.expert_depth", "value_model.expert_mlp",
    "value_model.expert_head_dim", "value_data.image_size", "policy_data.image_size",
    "pi05_policy.vision", "pi05_policy.text", "pi05_policy.expert",
}  # fmt: skip
STEP_COUNTS = {"train.max_steps", "train.log_every", "train.eval_every", "train.save_every",
               "deepspeed_config.warmup_steps"}  # fmt: skip
BATCHES = {"deepspeed_config.micro_batch_size", "deepspeed_config.global_batch_size",
           "train.eval_batch_size", "compute_advantages.batch_size"}  # fmt: skip
WORKERS = {"train.num_workers", "compute_advantages.num_workers"}
SIZE_KEYS = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "image_size", "patch_size",
             "vocab_size"}  # fmt: skip
STAGES = ["returns", "value", "advantages", "policy", "baseline"]


def tiny_bindings() -> dict[str, object]:
    """Every binding of tiny.gin, as ``configurable.param -> value``."""
    from gin import config as gin_config

    import recap.pipeline  # noqa: F401  (registers every step's configurables)
    import recap.steps.compute_advantages  # noqa: F401
    import recap.steps.train  # noqa: F401

    gin.clear_config()
    try:
        parse_gin([TINY], [])
        return {f"{sel.split('.')[-1]}.{param}": value
                for (scope, sel), params in gin_config._CONFIG.items()
                for param, value in params.items()}  # fmt: skip
    finally:
        gin.clear_config()


def test_tiny_gin_binds_only_sizes_step_counts_and_batch_sizes():
    bindings = tiny_bindings()
    assert set(bindings) - (SIZES | STEP_COUNTS | BATCHES | WORKERS) == set()
    # the π0.5 dicts keep every field of the real config; only the sizes differ
    import recap.models.pi05  # noqa: F401

    gin.clear_config()
    try:
        parse_gin(["models/pi05_real.gin"], [])
        real = {part: gin.query_parameter(f"pi05_policy.{part}") for part in ("vision", "text",
                                                                             "expert")}  # fmt: skip
    finally:
        gin.clear_config()
    for part, theirs in real.items():
        ours = bindings[f"pi05_policy.{part}"]
        assert set(ours) == set(theirs), part
        assert {k: v for k, v in ours.items() if k not in SIZE_KEYS} == {
            k: v for k, v in theirs.items() if k not in SIZE_KEYS
        }, part
        assert all(ours[k] < theirs[k] for k in SIZE_KEYS & set(ours)
                   if k not in ("num_key_value_heads",)), part  # fmt: skip


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The LIBERO pipeline on stand-ins, 2 ranks; (stand-ins, run root, stdout, wall seconds)."""
    import time

    tmp = tmp_path_factory.mktemp("rehearsal")
    standins = write_standins(tmp / "standins")
    before = {p: tree_hashes(p) for p in (standins.sft, standins.train, standins.eval)}
    runs = tmp / "runs"
    params = [f'all/include "{TINY}"', "pipeline.ranks = 2", f'pipeline.run_root = "{runs}"',
              *standins.bindings()]  # fmt: skip
    argv = [sys.executable, "-m", "recap.commands.pipeline", "--gin_file", PIPELINE]
    argv += [a for p in params for a in ("--gin_param", p)]
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=tmp, env=launch_env(tmp), capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    wall = time.perf_counter() - start
    print(f"rehearsal wall time: {wall:.0f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return standins, runs, done.stdout, before


def run_dir(runs: Path, stage: str) -> Path:
    (found,) = sorted((runs / stage).iterdir())
    return found


def rows(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def test_every_stage_runs_and_writes_its_outputs(rehearsal):
    standins, runs, out, before = rehearsal
    for stage in STAGES:
        assert f"] {stage} (" in out
    # Step 1 on all three datasets (51 + 66 + 45 frames with seed 0), with its statistics
    frames = {standins.sft: 51, standins.train: 66, standins.eval: 45}
    for dataset, count in frames.items():
        assert rows(dataset / "meta" / "returns.parquet") == count
        assert (dataset / "meta" / "returns.json").is_file()
    # Step 3 labels the training datasets (sft + rollouts), never the held-out one
    tag = f"adv_{run_dir(runs, 'advantages').name}"
    for dataset in (standins.sft, standins.train):
        table = pq.read_table(dataset / "meta" / f"advantages_{tag}.parquet")
        assert table.num_rows == frames[dataset]
        assert np.isfinite(table.column("advantage_continuous").to_numpy()).all()
    assert not list(standins.eval.glob("meta/advantages_*.parquet"))
    for stage in ("value", "policy", "baseline"):
        assert (run_dir(runs, stage) / "model.safetensors").is_file(), stage
    assert "compare runs: mlflow ui" in out
    # inputs untouched apart from the sidecars the steps add under meta/
    for dataset, hashes in before.items():
        after = tree_hashes(dataset)
        added = {k for k in after if k not in hashes}
        assert {k: after[k] for k in hashes} == hashes
        assert all(k.startswith(("meta/returns", "meta/advantages"))
                   or k == "meta/mixture_config.yaml" for k in added), added  # fmt: skip


def metrics(directory: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in (directory / "metrics.jsonl").read_text().splitlines():
        out.update(json.loads(line))
    return out


def test_the_baseline_has_no_advantage_text_and_the_policy_has(rehearsal):
    _, runs, _, _ = rehearsal
    policy, baseline = metrics(run_dir(runs, "policy")), metrics(run_dir(runs, "baseline"))
    assert "train/loss_conditional" in policy or "train/conditional" in policy
    assert not any("conditional" in k for k in baseline)
    assert np.isfinite(policy["train/loss"]) and np.isfinite(baseline["train/loss"])


RELOAD = """
import json, sys

import torch
from recap.engine.inference import load_exported
from recap.models.checkpoints import load_pi05
from recap.models.value import from_pretrained_parts
from recap.standins import PI05_SIZES, VALUE_SIZES, StandIns

s, runs = StandIns.at(sys.argv[1]), json.loads(sys.argv[2])
out = {}
def changed(model, before):
    after = model.state_dict()
    return sum(not torch.equal(after[k], v) for k, v in before.items()), len(before)
value = from_pretrained_parts(s.siglip, s.gemma3, **VALUE_SIZES)
before = {k: v.clone() for k, v in value.state_dict().items()}
load_exported(value, runs["value"])
out["value"] = changed(value, before)
base = load_pi05(s.pi05_base, **PI05_SIZES).state_dict()
for stage in ("policy", "baseline"):
    policy = load_pi05(s.pi05_base, **PI05_SIZES)
    load_exported(policy, runs[stage])
    out[stage] = changed(policy, base)
    out[stage + "_max_step"] = max((v - base[k]).abs().max().item()
                                   for k, v in policy.state_dict().items())
print(json.dumps(out))
"""


def test_exports_reload_in_a_plain_process(rehearsal):
    """The exported value model and both policies load into models built from the stand-ins
    without DeepSpeed, and training moved their weights."""
    standins, runs, _, _ = rehearsal
    exports = {stage: str(run_dir(runs, stage) / "model.safetensors")
               for stage in ("value", "policy", "baseline")}  # fmt: skip
    argv = [sys.executable, "-c", RELOAD, str(standins.root), json.dumps(exports)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                          env=launch_env(runs), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    for stage in ("value", "policy", "baseline"):
        moved, total = counts[stage]
        assert 0 < moved <= total, (stage, moved, total)
    # the policies started from PI05_BASE (loaded into ZeRO-3 partitions): three AdamW steps
    # at lr <= 5e-5 move no weight by more than ~1.5e-4, a fresh init would differ by ~0.1
    assert 0 < counts["policy_max_step"] < 1e-3
    assert 0 < counts["baseline_max_step"] < 1e-3
