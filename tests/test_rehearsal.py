"""The real path, rehearsed: the shipped LIBERO pipeline end to end on real-format stand-ins.

``experiments/libero_pipeline.gin`` exactly as shipped, plus ``rehearsal/tiny.gin`` (sizes, step
counts, batch sizes and worker counts only), pointed at ``recap.standins`` (LeRobot v2.1 datasets
in RLinf's published layout, a SigLIP and a Gemma3 directory as Hugging Face saves them, a
PaliGemma SentencePiece file, a π0.5 checkpoint in openpi's layout), on 2 DeepSpeed CPU ranks:
returns, value, advantages, policy and baseline all run, and what they export reloads in a plain
process. Then value, advantages and policy run again as two simulated nodes (one rank each, the
second node's global rank 1 as local rank 0) and reproduce the single-node run. Last, the LoRA
experiments (``experiments/libero_value_lora.gin``, ``libero_pi05_lora.gin``) as shipped train
with the commands the pipeline ran for value and policy: only adapters and the modules the recipe
trains fully move, the merged export is base + (alpha / r) B A of the adapter export, and it loads
without peft.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import gin
import numpy as np
import pyarrow.parquet as pq
import pytest

from recap.cli import parse_gin
from tests.helpers import REPO, deepspeed_local, launch_env, launch_two_nodes, tree_hashes

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
# the ZeRO stage the rehearsal exercises (3: partitioned weights, per-rank shards, exports), which
# "auto", the real config's, would not pick for tiny models
STAGE = {"deepspeed_config.zero_stage"}
SIZE_KEYS = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "image_size", "patch_size",
             "vocab_size"}  # fmt: skip
STAGES = ["returns", "value", "advantages", "policy", "baseline"]


def tiny_bindings() -> dict[str, object]:
    """Every binding of tiny.gin, as ``configurable.param -> value`` (gin's public API only)."""
    import recap.steps.compute_advantages  # noqa: F401
    import recap.steps.train  # noqa: F401
    import recap.workflow.pipeline  # noqa: F401  (registers every step's configurables)
    from recap.config_check import config_entries

    gin.clear_config()
    try:
        parse_gin([TINY], [])
        keys = [key for key, _ in config_entries()]
        return {f"{key.rpartition('/')[2].split('.')[-2]}.{key.rpartition('.')[2]}":
                gin.query_parameter(key) for key in keys}  # fmt: skip
    finally:
        gin.clear_config()


def test_tiny_gin_binds_only_sizes_step_counts_and_batch_sizes():
    bindings = tiny_bindings()
    assert set(bindings) - (SIZES | STEP_COUNTS | BATCHES | WORKERS | STAGE) == set()
    assert bindings["deepspeed_config.zero_stage"] == 3
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
        # head counts no tensor shows stay π0.5's (1 KV head; SigLIP's 16 heads, recap.standins)
        same = ("num_key_value_heads", "num_attention_heads") if part == "vision" else (
            "num_key_value_heads",)  # fmt: skip
        assert all(ours[k] < theirs[k] for k in SIZE_KEYS & set(ours) if k not in same), part
        assert all(ours[k] == theirs[k] for k in SIZE_KEYS & set(ours) & {"num_attention_heads"}
                   if part == "vision"), part  # fmt: skip


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, fresh_standins):
    """The LIBERO pipeline on stand-ins, 2 ranks; (stand-ins, run root, stdout, wall seconds)."""
    import time

    tmp = tmp_path_factory.mktemp("rehearsal")
    standins = fresh_standins(tmp / "standins")
    before = {p: tree_hashes(p) for p in (standins.sft, standins.train, standins.eval)}
    runs = tmp / "runs"
    start = time.perf_counter()
    done = rehearse(PIPELINE, standins, runs, tmp)
    print(f"rehearsal wall time: {time.perf_counter() - start:.0f} s")
    return standins, runs, done.stdout, before


def rehearse(
    pipeline: str, standins, runs: Path, cwd: Path, ranks: int = 2
) -> subprocess.CompletedProcess:
    """``pipeline`` + ``rehearsal/tiny.gin`` on the stand-ins, outputs under ``runs``: on
    ``ranks`` DeepSpeed CPU ranks, or with ``ranks=1`` one plain process per step (the pipeline's
    ``python`` launcher); the run must succeed (its output tails are the failure message)."""
    launch = [f"pipeline.ranks = {ranks}"]
    launch += ['pipeline.launcher = "python"'] if ranks == 1 else []
    params = [f'all:include "{TINY}"', *launch, f'pipeline.run_root = "{runs}"',
              *standins.bindings()]  # fmt: skip
    argv = [sys.executable, "-m", "recap.commands.pipeline", "--gin_file", pipeline]
    argv += [a for p in params for a in ("--gin_param", p)]
    done = subprocess.run(argv, cwd=cwd, env=launch_env(cwd), capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


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


# ---- the same steps on two simulated nodes ----------------------------------------------------

TWO_NODE_STAGES = ("value", "advantages", "policy")
STEP_LINE = re.compile(r"^== \[\d+/\d+\] (\w+) \(\w+\): (.+)$")


def stage_args(out: str) -> dict[str, list[str]]:
    """Stage -> the ``--module MODULE --gin_file ... --gin_param ...`` part of the ``deepspeed``
    command the pipeline printed and ran."""
    found = {}
    for line in out.splitlines():
        match = STEP_LINE.match(line)
        if match and match.group(1) in TWO_NODE_STAGES:
            argv = shlex.split(match.group(2))
            found[match.group(1)] = argv[argv.index("--module") :]
    return found


@pytest.fixture(scope="module")
def two_nodes(rehearsal, tmp_path_factory):
    """Value (ZeRO-3), Step 3 and the policy of the rehearsal rerun as 2 nodes x 1 rank (two
    DeepSpeed per-node launchers, ``tests.helpers.launch_two_nodes``) with the commands the
    pipeline ran, on a copy of the datasets (their advantages sidecars and records deleted) and
    into a run root of their own; the stand-in models are shared."""
    standins, runs, out, _ = rehearsal
    tmp = tmp_path_factory.mktemp("rehearsal_two_nodes")
    data, mine = tmp / "data", tmp / "runs"
    shutil.copytree(standins.data, data)
    for sidecar in [*data.glob("*/meta/advantages_*.parquet"), *data.glob("*/meta/mixture_*")]:
        sidecar.unlink()
    swap = {str(runs): str(mine), str(standins.data): str(data)}

    def moved(arg: str) -> str:
        for theirs, ours in swap.items():
            arg = arg.replace(theirs, ours)
        return arg

    logs, walls = {}, {}
    for stage, args in stage_args(out).items():
        (mine / stage / run_dir(runs, stage).name).mkdir(parents=True)  # as the pipeline does
        start = time.perf_counter()
        logs[stage] = launch_two_nodes([moved(a) for a in args], tmp, tmp / stage, timeout=600)
        walls[stage] = time.perf_counter() - start
    print("two-node wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()))
    return {"tmp": tmp, "data": data, "runs": mine, "logs": logs, "walls": walls}


def records(directory: Path) -> list[tuple[int, str]]:
    lines = (directory / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], "eval" if any(k.startswith("eval/") for k in r) else "train")
            for r in map(json.loads, lines)]  # fmt: skip


def by_record(directory: Path) -> dict[tuple[int, str], dict]:
    lines = (directory / "metrics.jsonl").read_text().splitlines()
    return dict(zip(records(directory), map(json.loads, lines), strict=True))


def test_two_nodes_run_every_step_with_global_rank_1_as_local_rank_0(two_nodes):
    assert set(two_nodes["logs"]) == set(TWO_NODE_STAGES)
    for stage, (node0, node1) in two_nodes["logs"].items():
        assert "nnodes=2, num_local_procs=1, node_rank=0" in node0, stage
        assert "nnodes=2, num_local_procs=1, node_rank=1" in node1, stage
        assert "'node1': [1]" in node1, stage  # DeepSpeed's global_rank_mapping of node 1


RANK0_LINES = {
    "value": ("world=2 start_step=0", "value: step 3;"),
    "advantages": ("on 2 ranks", "positives: ", "pictures: "),
    "policy": ("world=2 start_step=0", "policy: step 3;"),
}


def test_two_nodes_do_every_rank0_action_once(rehearsal, two_nodes):
    standins, runs, _, _ = rehearsal
    mine = two_nodes["runs"]
    for stage, (node0, node1) in two_nodes["logs"].items():  # the summaries: rank 0 alone
        for text in RANK0_LINES[stage]:
            assert node0.count(text) == 1 and text not in node1, (stage, text)
    for stage in ("value", "policy"):
        ours, theirs = run_dir(mine, stage), run_dir(runs, stage)
        assert records(ours) == records(theirs)  # every metrics record once
        assert len(set(records(ours))) == len(records(ours))
        assert (ours / "checkpoints" / "latest").read_text().strip() == "step_3"
        assert (ours / "model.safetensors").stat().st_size > 0
        # each global rank wrote its own ZeRO-3 shard: the same files as on one node
        shards = sorted(p.name for p in (ours / "checkpoints" / "step_3").rglob("*"))
        assert shards == sorted(p.name for p in (theirs / "checkpoints" / "step_3").rglob("*"))
        assert any("rank_1" in name for name in shards), shards
    pictures = sorted(p.name for p in run_dir(mine, "advantages").glob("*.png"))
    assert pictures == sorted(p.name for p in run_dir(runs, "advantages").glob("*.png"))
    assert len(pictures) == 3
    query = "SELECT e.name, r.name FROM runs r JOIN experiments e USING (experiment_id)"
    with sqlite3.connect(two_nodes["tmp"] / "mlflow.db") as db:  # one MLflow run per step
        names = sorted(db.execute(query).fetchall())
    assert names == [("advantages", "libero/advantages"), ("pi05", "libero/policy"),
                     ("value", "libero/value")]  # fmt: skip


def test_two_nodes_write_the_single_node_sidecars_byte_for_byte(rehearsal, two_nodes):
    standins, runs, _, _ = rehearsal
    tag = f"adv_{run_dir(runs, 'advantages').name}"
    value = {str(run_dir(runs, "value")): str(run_dir(two_nodes["runs"], "value"))}
    for dataset in (standins.sft, standins.train):
        ours = two_nodes["data"] / dataset.name / "meta"
        sidecar = f"advantages_{tag}.parquet"
        assert (ours / sidecar).read_bytes() == (dataset / "meta" / sidecar).read_bytes()
        config = (dataset / "meta" / "mixture_config.yaml").read_text()
        for theirs, mine in value.items():  # the record names the value model it used
            config = config.replace(theirs, mine)
        assert (ours / "mixture_config.yaml").read_text() == config
    assert not list((two_nodes["data"] / standins.eval.name).glob("meta/advantages_*"))


def test_two_nodes_reproduce_the_single_node_losses_and_weights(rehearsal, two_nodes):
    from safetensors.torch import load_file

    _, runs, _, _ = rehearsal
    for stage in ("value", "policy"):
        ours, theirs = by_record(run_dir(two_nodes["runs"], stage)), by_record(run_dir(runs, stage))
        losses = 0
        for key, record in theirs.items():
            for name, number in record.items():
                if "loss" in name:
                    assert ours[key][name] == pytest.approx(number, rel=1e-6, abs=1e-9), (
                        stage, key, name)  # fmt: skip
                    losses += 1
        assert losses >= 4, stage  # three training steps and the eval
        mine = load_file(run_dir(two_nodes["runs"], stage) / "model.safetensors")
        reference = load_file(run_dir(runs, stage) / "model.safetensors")
        assert mine.keys() == reference.keys()
        worst = max((mine[k].float() - v.float()).abs().max().item() for k, v in reference.items())
        assert worst <= 1e-6, (stage, worst)


# ---- the LoRA experiments on the same stand-ins -----------------------------------------------

# stage -> (the experiment file the pipeline ran, its LoRA version as shipped)
LORA_FILES = {
    "value": ("experiments/libero_value.gin", "experiments/libero_value_lora.gin"),
    "policy": ("experiments/libero_pi05.gin", "experiments/libero_pi05_lora.gin"),
}
PALIGEMMA = "paligemma_with_expert.paligemma.model."
# towers the recipe adapts (all but their adapters frozen) and modules it trains fully (openpi's
# LoRA recipe: SigLIP, the projector, the action and time projections; the value model's critic)
LORA_TOWERS = {
    "policy": ((PALIGEMMA + "language_model.", "paligemma_with_expert.gemma_expert."),
               (PALIGEMMA + "vision_tower.", PALIGEMMA + "multi_modal_projector.",
                "action_in_proj.", "action_out_proj.", "time_mlp_in.", "time_mlp_out.")),
    "value": (("language_model.",), ("vision_tower.", "projector.", "expert.", "head.")),
}  # fmt: skip
LORA_A = re.compile(r"^base_model\.model\.(.*)\.lora_A\.weight$")


@pytest.fixture(scope="module")
def lora(rehearsal, tmp_path_factory):
    """``experiments/libero_value_lora.gin`` and ``libero_pi05_lora.gin`` as shipped, launched on 2
    ranks with the commands the pipeline ran for value and policy (the same stand-ins, tiny sizes
    and Step 3 labels), the experiment file swapped; both at once. Run directories by stage."""
    from recap.ports import free_port

    _, runs, out, _ = rehearsal
    tmp = tmp_path_factory.mktemp("rehearsal_lora")
    dirs, procs = {}, {}
    start = time.perf_counter()
    for stage, (full, lora_file) in LORA_FILES.items():
        dirs[stage] = tmp / stage
        args = stage_args(out)[stage]
        assert args.count(full) == 1
        args = [lora_file if a == full else a for a in args]
        args += ["--gin_param", f'train.run_dir = "{dirs[stage]}"']  # the last binding wins
        argv = [*deepspeed_local(2, free_port()), *args]
        log = (tmp / f"{stage}.log").open("w")
        procs[stage] = subprocess.Popen(argv, cwd=tmp, env=launch_env(tmp), stdout=log,
                                        stderr=subprocess.STDOUT, text=True)  # fmt: skip
    for stage, proc in procs.items():
        code = proc.wait(timeout=600)
        assert code == 0, (tmp / f"{stage}.log").read_text()[-5000:]
    print(f"LoRA rehearsal wall time: {time.perf_counter() - start:.0f} s")
    return dirs


def merged_export(directory: Path) -> dict:
    """``model.safetensors`` of a LoRA run with its tied aliases restored (as ``load_exported``)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = str(directory / "model.safetensors")
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    assert (metadata["recap_lora"], metadata["recap_weights"]) == ("merged", "raw")
    state = load_file(path)
    for alias, source in json.loads(metadata["recap_tied"]).items():
        state[alias] = state[source]
    return state


def against_base(stage: str, directory: Path, base: dict) -> dict:
    """The run's merged export and ``adapter/`` against ``base``: each adapted projection is
    ``W + (alpha / r) B A`` of the adapter file (r from A's shape and ``rank_pattern``, alpha
    from ``alpha_pattern``) with B trained, every other weight of an adapted tower byte-identical,
    nothing else moved but the fully trained modules, whose ``modules_to_save`` copies are the
    merged weights. Returns the adapter config and the adapters' ranks by tower."""
    import torch
    from safetensors.torch import load_file

    from recap.models import adapters

    merged = merged_export(directory)
    folder = directory / adapters.ADAPTER_DIR
    assert sorted(p.name for p in folder.iterdir()) == [adapters.ADAPTER_CONFIG,
                                                         adapters.ADAPTER_WEIGHTS]  # fmt: skip
    config = json.loads((folder / adapters.ADAPTER_CONFIG).read_text())
    tensors = load_file(str(folder / adapters.ADAPTER_WEIGHTS))
    adapted_towers, trained = LORA_TOWERS[stage]
    assert set(merged) == set(base)
    ranks: dict[str, set] = {}
    adapted = set()
    for key, a in tensors.items():
        match = LORA_A.match(key)
        if match is None:
            continue
        module = match.group(1)
        b = tensors[f"base_model.model.{module}.lora_B.weight"]
        (alpha,) = {v for k, v in config["alpha_pattern"].items() if re.fullmatch(k, module)}
        (rank,) = {v for k, v in config["rank_pattern"].items() if re.fullmatch(k, module)}
        assert a.shape[0] == b.shape[1] == rank, module
        (tower,) = [t for t in adapted_towers if module.startswith(t)]
        ranks.setdefault(tower, set()).add(rank)
        want = base[f"{module}.weight"] + (alpha / rank) * (b @ a)
        torch.testing.assert_close(merged[f"{module}.weight"], want, rtol=0, atol=1e-6)
        assert b.abs().max() > 1e-5, module  # B starts at zero: the adapter trained
        adapted.add(f"{module}.weight")
    moved = {k for k in base if not torch.equal(merged[k], base[k])}
    frozen = {k for k in base if k.startswith(adapted_towers)} - adapted
    assert frozen and not moved & frozen, sorted(moved & frozen)[:5]
    fully = moved - adapted
    assert fully and all(k.startswith(trained) for k in fully), sorted(fully)
    saved = {k.removeprefix(adapters.PEFT_PREFIX): v for k, v in tensors.items()
             if ".lora_" not in k}  # fmt: skip
    assert {m for m in config["modules_to_save"] for k in saved if k.startswith(m + ".")} == set(
        config["modules_to_save"])  # fmt: skip
    assert all(torch.equal(v, merged[k]) for k, v in saved.items())
    return {"config": config, "ranks": {t: sorted(r) for t, r in ranks.items()},
            "adapted": len(adapted), "merged": merged}  # fmt: skip


def test_lora_runs_log_finite_losses_and_train_only_the_adapters(rehearsal, lora):
    for stage, directory in lora.items():
        record = metrics(directory)
        losses = {k: v for k, v in record.items() if "loss" in k}
        assert {"train/loss", "eval/loss"} <= set(losses), (stage, sorted(record))
        assert all(np.isfinite(v) for v in losses.values()), (stage, losses)
        assert (directory / "checkpoints" / "latest").read_text().strip() == "step_3"


def test_the_value_lora_run_moves_only_its_adapters_and_the_critic(rehearsal, lora):
    import torch

    from recap.models.value import from_pretrained_parts
    from recap.standins import VALUE_SIZES

    standins = rehearsal[0]
    torch.manual_seed(0)  # the critic is initialized fresh: it trains fully
    base = from_pretrained_parts(standins.siglip, standins.gemma3, **VALUE_SIZES).state_dict()
    found = against_base("value", lora["value"], base)
    # the Gemma3 layers the critic reads (depth 2): layer 0 all seven projections, layer 1 k/v
    assert (found["ranks"], found["adapted"]) == ({"language_model.": [16]}, 7 + 2)
    config = found["config"]
    assert (config["r"], config["lora_alpha"], config["alpha_pattern"]) == (
        16, 16.0, {r"language_model\..*": 16.0})  # fmt: skip
    assert sorted(config["modules_to_save"]) == ["expert", "head.cls", "head.proj", "projector",
                                                 "vision_tower"]  # fmt: skip


def test_the_pi05_lora_run_moves_only_its_adapters_and_openpis_trained_modules(rehearsal, lora):
    from safetensors import safe_open

    from recap.models.checkpoints import load_pi05, state_to_file
    from recap.standins import PI05_SIZES

    standins = rehearsal[0]
    base = load_pi05(standins.pi05_base, **PI05_SIZES).state_dict()
    found = against_base("policy", lora["policy"], base)
    decoder, expert = LORA_TOWERS["policy"][0]
    assert found["ranks"] == {decoder: [16], expert: [32]}  # gemma_2b_lora, gemma_300m_lora
    # decoder: layer 0 all seven projections, the last layer k/v only; expert: 2 x 7
    assert found["adapted"] == 7 + 2 + 2 * 7
    assert sorted(found["config"]["alpha_pattern"].values()) == [16.0, 32.0]
    # openpi's file layout: the stand-in's keys and shapes, whose patterns are the published
    # file's minus the tied embedding (tests/test_standins.py)
    ours = {k: list(v.shape) for k, v in state_to_file(found["merged"], 32, "openpi").items()}
    with safe_open(str(standins.pi05_base / "model.safetensors"), framework="pt") as f:
        assert ours == {k: f.get_slice(k).get_shape() for k in f.keys()}
    real = json.loads((REPO / "tests/fixtures/formats/openpi_pi05_keys.json").read_text())
    (tie,) = real["ties"]
    patterns = {re.sub(r"\.\d+\.", ".{i}.", k) for k in real["state"] if k != tie[0]}
    assert {re.sub(r"\.\d+\.", ".{i}.", k) for k in ours} == patterns and len(ours) == 92


PLAIN = """
import json, sys

sys.modules["peft"] = None  # `import peft` fails in this process
from recap.engine.inference import load_exported
from recap.models.checkpoints import load_pi05
from recap.models.value import from_pretrained_parts
from recap.standins import PI05_SIZES, VALUE_SIZES, StandIns

s, runs = StandIns.at(sys.argv[1]), json.loads(sys.argv[2])
value = from_pretrained_parts(s.siglip, s.gemma3, **VALUE_SIZES)
load_exported(value, runs["value"])  # as Step 3 reads the value model
policy = load_pi05(s.pi05_base, **PI05_SIZES)
load_exported(policy, runs["policy"])
print(json.dumps({k: sum(float(p.double().sum()) for p in m.state_dict().values())
                  for k, m in (("value", value), ("policy", policy))}))
"""


def test_the_lora_merged_exports_load_in_a_process_without_peft(rehearsal, lora):
    standins = rehearsal[0]
    paths = {stage: str(d / "model.safetensors") for stage, d in lora.items()}
    argv = [sys.executable, "-c", PLAIN, str(standins.root), json.dumps(paths)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                          env=launch_env(lora["value"].parent), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    sums = json.loads(done.stdout.strip().splitlines()[-1])
    for stage, directory in lora.items():  # every loaded weight is the file's
        want = sum(float(v.double().sum()) for v in merged_export(directory).values())
        assert sums[stage] == pytest.approx(want, rel=1e-12, abs=1e-9), stage
