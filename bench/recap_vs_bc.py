"""Is RECAP better than behaviour cloning on the demo task? Several seeds, intervals, controls.

One value model and one Step 3 labelling (the demo's, `gin/demo/*.gin`), then for each training
seed the same policy, data and budget trained four ways and evaluated on the same held-out
episodes (layouts from `evaluate_policy.seed`, paired episode by episode):

- ``bc``: behaviour cloning on every frame (``demo/policy_bc.gin``), beta 1;
- ``recap``: advantage-conditioned (paper mode, label dropout 0.3), beta 1 and 2;
- ``oracle``: the same with labels = the episode's outcome (``recap.core.oracle``): no value
  model involved, so if it does not beat BC the conditioning path or the setting is at fault;
- ``filtered``: behaviour cloning on the positive frames only (``conditioning = "filtered"``);
- ``ft``: the seed's ``bc`` policy fine-tuned with RECAP (``demo/finetune.gin``: the ``recap``
  arm's prompts and labels, every weight trained, ``--finetune-steps`` steps, the BC run's
  normalization), beta 1 and 2;
- ``lora``: the same fine-tune with LoRA adapters (``demo/lora.gin``, through peft), beta 1 and 2.
  With both, the table adds lora - ft per beta (paired bootstrap, as against BC).

The real recipe's shape (a policy first trained on the demonstrations, then fine-tuned on
demonstrations + rollouts), each fine-tune ``--finetune-steps`` steps from the seed's ``bcsft`` run
with ``demo/finetune.gin`` (the base's normalization, lr 3e-4 cosine):

- ``bcsft``: behaviour cloning on the expert demonstrations only (the base; compared with ``bc``);
- ``sft_bc``: the base fine-tuned with plain BC on every frame (compared with ``bcsft``);
- ``sft_recap``: the base fine-tuned with RECAP's labels (compared with ``sft_bc``), beta 1 and 2;
- ``sft_recap_forced``: the same with the demonstrations' frames forced positive (RLinf's default,
  ``force_sft_positive``; tag ``demo_forced``, relabelled from ``demo`` without the model: the
  rollouts keep the threshold of the ``demo`` tag);
- ``sft_rlinf``: RLinf's recipe in full, ``sft_recap_forced``'s labels with RLinf's label dropout
  0.1 (compared with ``sft_bc``);
- ``sft_oracle``: the same with the oracle labels (compared with ``sft_bc``);
- ``sft_oracle_d01``: the same with label dropout 0.1 (RLinf's) instead of 0.3 (the paper's):
  whether more conditioned training separates the two prompts further (compared with ``sft_bc``);
- ``sft_filtered``: the base fine-tuned with BC on the oracle-positive frames only (the frames of
  successful episodes; compared with ``sft_bc``): whether the positive mode itself is good data;
- ``sft_more``: the base fine-tuned with BC on the demonstrations only (compared with ``bcsft``):
  what the fine-tuning steps alone add, the control of ``bench/recap_iterations.py --base-work``.

The seed is ``train.seed`` (model init, data order, and through ``policy_data.seed``'s default the
label dropout and mixture). Per arm and seed the success rate; per comparison with BC the mean
difference and its 95% interval from a paired two-level bootstrap (seeds, then episodes:
``recap.core.bootstrap``); the conditioning-sensitivity probe of each conditioned policy (mean
action distance positive vs plain / negative prompt, against two noises of one prompt). A PNG of
the per-seed results and the table go to MLflow (experiment ``bench``). Finished runs are reused
(each run directory keeps its ``closed_loop.json``), so an interrupted benchmark continues; ``ft``
and ``lora`` reuse the ``bc`` runs of the same ``--work``/``--steps`` (``runs/bc_s{seed}_{steps}``)
and write ``runs/{arm}_s{seed}_bc{steps}_ft{finetune_steps}`` (the ``sft_`` arms: ``bcsft``'s
runs, ``runs/{arm}_s{seed}_bcsft{steps}_ft{finetune_steps}``); an arm's base and baseline arms
are run too. Each record also carries its run's trainable parameter count and training wall time
(``bench_train.json`` in the run directory; for a run this script did not time, MLflow's
start-to-end time of the training run).

    python bench/recap_vs_bc.py                         # 3 seeds x 200 episodes, 4,000 steps
    python bench/recap_vs_bc.py --seeds 0 1 2 3 4 --episodes 300
    python bench/recap_vs_bc.py --quick                 # the machinery on a tiny budget
    python bench/recap_vs_bc.py --arms bc recap ft lora --finetune-steps 1000   # LoRA vs full FT
    python bench/recap_vs_bc.py --arms sft_recap sft_oracle     # from the expert-only BC policy
    python bench/recap_vs_bc.py --label-position action --work runs/bench_label_last ...

Cost on 2 CPU cores: ~8 min per policy training at 4,000 steps (2 ranks), so the default
(4 arms x 3 seeds) is ~1.6 h plus the evaluations; ``--arms bc recap`` halves it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from recap.core.bootstrap import paired_bootstrap, rate_interval
from recap.ports import free_port
from recap.records import EVALUATION_FILE, Evaluation

SFT_ONLY = '{"name": "sft", "root": "sft", "type": "sft"}'
ARMS = {
    "bc": (["demo/policy_bc.gin"], []),
    "recap": (["demo/policy.gin"], []),
    "oracle": (["demo/policy.gin"], ['policy_data.advantages_tag = "oracle"']),
    "filtered": (["demo/policy.gin"], ['policy_data.conditioning = "filtered"']),
    "ft": (["demo/finetune.gin"], []),  # from the seed's bc run (BASE_POLICY, bound per seed)
    "lora": (["demo/lora.gin"], []),
    # The real recipe's shape: a policy trained on the expert demonstrations only, then fine-tuned
    # on demonstrations + rollouts with plain BC, with RECAP's labels, with oracle labels.
    "bcsft": (["demo/policy_bc.gin"], [f"policy_data.datasets = [{SFT_ONLY}]"]),
    "sft_bc": (["demo/finetune.gin"], ['policy_data.conditioning = "none"']),
    "sft_recap": (["demo/finetune.gin"], []),
    "sft_recap_forced": (["demo/finetune.gin"], ['policy_data.advantages_tag = "demo_forced"']),
    "sft_rlinf": (
        ["demo/finetune.gin"],
        ['policy_data.advantages_tag = "demo_forced"', "policy_data.dropout = 0.1"],
    ),
    "sft_oracle": (["demo/finetune.gin"], ['policy_data.advantages_tag = "oracle"']),
    "sft_oracle_d01": (
        ["demo/finetune.gin"],
        ['policy_data.advantages_tag = "oracle"', "policy_data.dropout = 0.1"],
    ),
    "sft_filtered": (
        ["demo/finetune.gin"],
        ['policy_data.advantages_tag = "oracle"', 'policy_data.conditioning = "filtered"'],
    ),
    # More SFT: the base fine-tuned with plain BC on the demonstrations only, the training a
    # fine-tune adds without any rollout (the control of bench/recap_iterations.py --base-work).
    "sft_more": (
        ["demo/finetune.gin"],
        ['policy_data.conditioning = "none"', f"policy_data.datasets = [{SFT_ONLY}]"],
    ),
}
CONDITIONED = ("recap", "oracle", "ft", "lora", "sft_recap", "sft_recap_forced", "sft_rlinf",
               "sft_oracle", "sft_oracle_d01")  # fmt: skip
SFT_ARMS = [arm for arm in ARMS if arm.startswith("sft_")]  # every fine-tune of bcsft
# Fine-tuned arms and the arm whose run of the same seed they start from (trained first).
FINETUNED = {"ft": "bc", "lora": "bc", **{arm: "bcsft" for arm in SFT_ARMS}}
# What each arm is compared with (paired, same seeds and episodes); every other arm: bc.
OF_BCSFT = ("sft_bc", "sft_more")  # compared with the base itself
BASELINE = {**{arm: "sft_bc" for arm in SFT_ARMS}, **{arm: "bcsft" for arm in OF_BCSFT}}
TARGET = "RECAP(beta=1) - BC >= 15 points, 95% CI excluding 0, >= 3 seeds x >= 200 episodes"
DATASETS = ("sft", "rollout")


def run(cmd: list[str], log: Path) -> None:
    """Run a step, its output to ``log``; a failure prints the log's tail and stops the bench."""
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    with log.open("a") as out:
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if code != 0:
        tail = log.read_text().splitlines()[-30:]
        sys.exit(f"error: {' '.join(cmd[:6])} ... failed ({code}); last lines of {log}:\n"
                 + "\n".join(tail))  # fmt: skip


def gin_args(files: list[str], params: list[str]) -> list[str]:
    return [a for f in files for a in ("--gin_file", f)] + [
        a for p in params for a in ("--gin_param", p)
    ]


def distributed(module: str, ranks: int) -> list[str]:
    if ranks == 1:
        return [sys.executable, "-m", module]
    # the launcher beside this interpreter (a venv run without its bin/ on PATH), else PATH's
    launcher = Path(sys.executable).with_name("deepspeed")
    launcher = str(launcher) if launcher.is_file() else "deepspeed"
    return [launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()),
            "--module", module]  # fmt: skip


def prepare(work: Path, args, log: Path) -> None:
    """Demo data, Step 1, the value model, Step 3 (tag ``demo``), the oracle labels and the
    ``demo_forced`` relabelling (the demonstrations forced positive)."""
    if not (work / "demo_data" / "sft").is_dir():
        sizes = ["--sft-episodes", str(args.sft_episodes), "--rollout-episodes",
                 str(args.rollout_episodes)]  # fmt: skip
        state = ["--state-targets"] if args.state_targets else []
        run([sys.executable, "-m", "recap.commands.make_demo_data", "--out", "demo_data",
             *sizes, *state], log)  # fmt: skip
    run([sys.executable, "-m", "recap.commands.compute_returns",
         *gin_args(["demo/returns.gin"], [])], log)  # fmt: skip
    value = [f"train.max_steps = {args.value_steps}"]
    if not (work / "runs" / "demo_value" / "model.safetensors").is_file():
        run(distributed("recap.commands.train", args.ranks)
            + gin_args(["demo/value.gin"], value), log)  # fmt: skip
    if not (work / "demo_data" / "rollout" / "meta" / "advantages_demo.parquet").is_file():
        run([sys.executable, "-m", "recap.commands.compute_advantages",
             *gin_args(["demo/advantages.gin"], [])], log)  # fmt: skip
    write_oracle(work / "demo_data")
    if not (work / "demo_data" / "rollout" / "meta" / "advantages_demo_forced.parquet").is_file():
        from recap.data import sidecars

        # the demo tag's own quantile, so the rollout frames keep its threshold
        _, record = sidecars.read_advantages(work / "demo_data" / "rollout", "demo")
        forced = ['relabel.new_tag = "demo_forced"',
                  f"relabel.positive_quantile = {record['positive_quantile']}",
                  "relabel.force_sft_positive = True"]  # fmt: skip
        run([sys.executable, "-m", "recap.commands.relabel",
             *gin_args(["demo/relabel.gin"], forced)], log)  # fmt: skip


def write_oracle(data: Path, tag: str = "demo") -> None:
    """``advantages_oracle`` in ``data``'s sft and rollout datasets: the Step 3 tag ``tag``'s
    table with labels = each episode's outcome (``bench/recap_metaworld.py`` passes its own)."""
    from recap.core.oracle import outcome_labels
    from recap.data import sidecars

    for name in DATASETS:
        table, record = sidecars.read_advantages(data / name, tag)
        returns, _ = sidecars.read_returns(data / name, "")
        labels = outcome_labels(table, returns)
        positive = float(np.mean(labels.column("advantage").to_numpy(zero_copy_only=False)))
        record = {**record, "labels": "episode outcome", "positive_fraction": positive}
        source = sidecars.dataset_source(data / name)
        sidecars.write_advantages(data / name, "oracle", labels, record, source)


def arm_run_dir(arm: str, seed: int, args) -> str:
    """The run directory (relative to ``--work``) of ``arm`` trained with ``seed``."""
    if arm in FINETUNED:
        return f"runs/{arm}_s{seed}_{FINETUNED[arm]}{args.steps}_ft{args.finetune_steps}"
    return f"runs/{arm}_s{seed}_{args.steps}"


# Counts the trainable parameters of the model the gin files build (as the trainer's optimizer sees
# them: requires_grad), in a child process so the bench keeps no model, torch or gin state.
COUNT = """
import json, sys
from recap.cli import parse_gin
import recap.steps.train  # noqa: F401  (registers train, policy_data, pi05_policy)
from recap.models.adapters import trainable_count
from recap.models.pi05 import pi05_policy
from recap.configurable import configured
parse_gin(json.loads(sys.argv[1]), json.loads(sys.argv[2]))
model = configured(pi05_policy)()
total = sum(p.numel() for p in model.parameters())
print(json.dumps({"trainable_parameters": trainable_count(model), "parameters": total}))
"""


def mlflow_seconds(run_dir: Path) -> float | None:
    """Start-to-end seconds of the run's MLflow run (sqlite store), None when unknown."""
    import sqlite3

    try:
        info = json.loads((run_dir / "mlflow_run.json").read_text())
        uri = info["tracking_uri"]
        if not uri.startswith("sqlite:///"):
            return None
        db = sqlite3.connect(f"file:{uri.removeprefix('sqlite:///')}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT start_time, end_time FROM runs WHERE run_uuid = ?",
                             (info["run_id"],)).fetchone()  # fmt: skip
        finally:
            db.close()
    except (OSError, ValueError, KeyError, sqlite3.Error):
        return None
    return None if row is None or row[1] is None else (row[1] - row[0]) / 1000.0


def training_info(work: Path, run_dir: str, files: list[str], params: list[str]) -> dict:
    """``{run_dir}/bench_train.json``: training wall seconds (timed by this script, else MLflow's)
    and trainable / total parameters, filled in and written once."""
    path = work / run_dir / "bench_train.json"
    info = json.loads(path.read_text()) if path.is_file() else {}
    if info.get("train_s") is None:
        info["train_s"], info["train_s_source"] = mlflow_seconds(work / run_dir), "mlflow"
    if "trainable_parameters" not in info:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        done = subprocess.run([sys.executable, "-c", COUNT, json.dumps(files), json.dumps(params)],
                              capture_output=True, text=True, env=env)  # fmt: skip
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            print(f"  warning: could not count the parameters of {run_dir}: "
                  f"{(done.stderr.strip().splitlines() or ['?'])[-1]}", flush=True)  # fmt: skip
            return info
        info.update(json.loads(lines[-1]))
    path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def train_and_evaluate(work: Path, arm: str, seed: int, args, log: Path) -> dict:
    """The arm's policy for ``seed`` (reused when its evaluation exists) and its record (the
    evaluation's ``closed_loop.json`` plus ``training``: ``training_info``)."""
    files, extra = ARMS[arm]
    files = [*files, "demo/state.gin"] if args.state_targets else files
    run_dir = arm_run_dir(arm, seed, args)
    steps = args.finetune_steps if arm in FINETUNED else args.steps
    params = [*extra, f"train.seed = {seed}", f'train.run_dir = "{run_dir}"',
              f"train.max_steps = {steps}", "deepspeed_config.zero_stage = 1",
              f"train.save_every = {steps}"]  # fmt: skip
    if arm in FINETUNED:
        base = arm_run_dir(FINETUNED[arm], seed, args)
        if not (work / base / "model.safetensors").is_file():
            sys.exit(f"error: {arm} seed {seed} starts from {work / base}, which holds no "
                     f"model.safetensors; train the {FINETUNED[arm]} arm first "
                     f"(--arms {FINETUNED[arm]} ...)")  # fmt: skip
        params.append(f'BASE_POLICY = "{base}"')
    if arm in CONDITIONED and args.label_position != "task":
        params.append(f'policy_data.label_position = "{args.label_position}"')
    if arm == "lora":
        params.append(f"LoraOptions.seed = {seed}")  # the adapters' init varies with the seed too
    if (work / run_dir / EVALUATION_FILE).is_file():
        record = Evaluation.read(work / run_dir).as_record()
        if record["num_episodes"] == args.episodes and record["outcomes"]:
            return {**record, "training": training_info(work, run_dir, files, params)}
    if not (work / run_dir / "model.safetensors").is_file():
        start = time.perf_counter()
        run(distributed("recap.commands.train", args.ranks) + gin_args(files, params), log)
        seconds = time.perf_counter() - start
        (work / run_dir / "bench_train.json").write_text(
            json.dumps({"train_s": seconds, "train_s_source": "bench"}, indent=2) + "\n"
        )
        print(f"  {arm} seed {seed}: trained in {seconds:.0f} s", flush=True)
    betas = "[1.0]" if arm not in CONDITIONED else "[" + ", ".join(map(str, args.betas)) + "]"
    evaluation = [*params, f"evaluate_policy.num_episodes = {args.episodes}",
                  f"evaluate_policy.betas = {betas}"]  # fmt: skip
    start = time.perf_counter()
    run([sys.executable, "-m", "recap.commands.evaluate_policy", *gin_args(files, evaluation)], log)
    print(f"  {arm} seed {seed}: evaluated in {time.perf_counter() - start:.0f} s", flush=True)
    return {**Evaluation.read(work / run_dir).as_record(),
            "training": training_info(work, run_dir, files, params)}  # fmt: skip


def outcomes(records: dict, arm: str, beta: float, seeds: list[int]) -> np.ndarray:
    key = f"beta_{float(beta):g}"
    return np.array([records[(arm, s)]["outcomes"][key] for s in seeds], dtype=np.float64)


def summarize(records: dict, args) -> tuple[list[str], dict]:
    """The table's lines and the figures (rates, differences with intervals, probes; with both
    ``ft`` and ``lora``, lora - ft per beta; each arm's training cost)."""
    seeds = list(args.seeds)
    arms = [(a, b) for a in args.arms for b in (args.betas if a in CONDITIONED else [1.0])]
    width = max(16, *(len(f"{a} b={b:g}") for a, b in arms))  # the arm column fits every name
    lines = [f"{'arm':<{width}} | " + " | ".join(f"seed {s}" for s in seeds)
             + " | mean  | 95% interval   | vs baseline (95% interval)"]  # fmt: skip
    figures: dict = {"arms": {}}
    for arm, beta in arms:
        won = outcomes(records, arm, beta, seeds)
        rate = rate_interval(won)
        name = f"{arm} b={beta:g}"
        row = f"{name:<{width}} | " + " | ".join(f"{r:6.3f}" for r in won.mean(1))
        row += f" | {rate.mean:.3f} | [{rate.low:.3f}, {rate.high:.3f}]"
        entry = {"per_seed": won.mean(1).tolist(), "mean": rate.mean,
                 "interval": [rate.low, rate.high]}  # fmt: skip
        if arm != "bc":
            baseline = BASELINE.get(arm, "bc")
            diff = paired_bootstrap(won, outcomes(records, baseline, 1.0, seeds))
            row += f" | {diff.mean:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}] vs {baseline}"
            entry["vs"] = {"baseline": baseline, "mean": diff.mean,
                           "interval": [diff.low, diff.high]}  # fmt: skip
        lines.append(row)
        figures["arms"][name] = entry
    if "ft" in args.arms and "lora" in args.arms:
        figures["lora_vs_ft"] = {}
        for beta in args.betas:
            lora, ft = outcomes(records, "lora", beta, seeds), outcomes(records, "ft", beta, seeds)
            diff = paired_bootstrap(lora, ft)
            name = f"lora-ft b={beta:g}"
            per_seed = lora.mean(1) - ft.mean(1)
            lines.append(f"{name:<{width}} | " + " | ".join(f"{d:+6.3f}" for d in per_seed)
                         + f" | {diff.mean:+.3f} | [{diff.low:+.3f}, {diff.high:+.3f}] | "
                         "(paired: lora - ft)")  # fmt: skip
            figures["lora_vs_ft"][f"b={beta:g}"] = {
                "per_seed": per_seed.tolist(), "mean": diff.mean,
                "interval": [diff.low, diff.high]}  # fmt: skip
    for arm in (a for a in args.arms if a in CONDITIONED):
        probes = [records[(arm, s)].get("sensitivity", {}) for s in seeds]
        keys = sorted({k for p in probes for k in p})
        text = ", ".join(f"{k} {np.mean([p[k] for p in probes]):.4f}" for k in keys)
        lines.append(f"sensitivity {arm} (mean over seeds): {text}")
        figures[f"sensitivity_{arm}"] = {k: float(np.mean([p[k] for p in probes])) for k in keys}
    figures["training"] = {}
    for arm in args.arms:
        infos = [records[(arm, s)].get("training") or {} for s in seeds]
        counts = {i.get("trainable_parameters") for i in infos} - {None}
        times = [i["train_s"] for i in infos if i.get("train_s") is not None]
        count = f"{max(counts):,}" if len(counts) == 1 else "/".join(f"{c:,}" for c in counts)
        timed = f"{np.mean(times):.0f} s mean over {len(times)} seeds" if times else "not timed"
        lines.append(f"training {arm}: {count or '?'} trainable parameters, {timed}")
        figures["training"][arm] = {
            "trainable_parameters": [i.get("trainable_parameters") for i in infos],
            "parameters": [i.get("parameters") for i in infos],
            "train_s": [i.get("train_s") for i in infos]}  # fmt: skip
    return lines, figures


def recipe_fields(figures: dict, args, prefix: str) -> tuple[list[str], bool | None]:
    """The target's figures for one recipe (``prefix`` "": from scratch, RECAP vs BC; "sft_":
    fine-tuned from the expert-only BC policy, RECAP vs continued BC): its fields for the RESULT
    line and whether it meets the target (None when its arms were not run)."""
    arms, bc_name = figures["arms"], f"{prefix}bc b=1"
    if bc_name not in arms:
        return [], None
    bc = arms[bc_name]
    fields, met = [f"{prefix}bc={bc['mean']:.3f}"], None
    if f"{prefix}recap b=1" in arms:
        recap = arms[f"{prefix}recap b=1"]
        diff = recap["vs"]
        low, high = diff["interval"]
        met = meets_target(diff, args)
        fields += [f"{prefix}recap_b1={recap['mean']:.3f}",
                   f"{prefix}recap_over_bc={recap['mean'] / max(bc['mean'], 1e-9):.2f}",
                   f"{prefix}recap_b1_minus_bc={diff['mean']:+.3f}",
                   f"{prefix}ci=[{low:+.3f},{high:+.3f}]"]  # fmt: skip
    if f"{prefix}oracle b=1" in arms:
        oracle = arms[f"{prefix}oracle b=1"]["vs"]
        low, high = oracle["interval"]
        fields += [
            f"{prefix}oracle_b1_minus_bc={oracle['mean']:+.3f}",
            f"{prefix}oracle_ci=[{low:+.3f},{high:+.3f}]",
        ]
    return fields, met


def meets_target(diff: dict, args) -> bool:
    """The target's test of one paired difference (``mean``, ``interval``) over the run's size."""
    return (diff["mean"] >= 0.15 and diff["interval"][0] > 0 and len(args.seeds) >= 3
            and args.episodes >= 200)  # fmt: skip


def result_line(figures: dict, args, wall_s: float) -> str:
    """The one ``RESULT:`` line: the validity target's figures (RECAP b=1 vs BC, oracle's) for
    each recipe run (from scratch; ``sft_``: from the expert-only BC policy, with its base's rate),
    with both fine-tunes lora - ft at beta 1; ``met`` when a recipe meets the target."""
    fields = [f"seeds={len(args.seeds)}", f"episodes={args.episodes}", f"steps={args.steps}"]
    scratch, met_scratch = recipe_fields(figures, args, "")
    fields += scratch
    if any(name.split(" ")[0] in FINETUNED for name in figures["arms"]):
        fields.append(f"finetune_steps={args.finetune_steps}")
    if "bcsft b=1" in figures["arms"]:
        fields.append(f"sft_base={figures['arms']['bcsft b=1']['mean']:.3f}")
    sft, met_sft = recipe_fields(figures, args, "sft_")
    fields += sft
    met = bool(met_scratch) or bool(met_sft)
    # RLinf's labels (demonstrations forced positive), with the paper's dropout and with RLinf's
    for arm, key in (("sft_recap_forced", "sft_forced"), ("sft_rlinf", "sft_rlinf")):
        if f"{arm} b=1" not in figures["arms"]:
            continue
        entry = figures["arms"][f"{arm} b=1"]
        low, high = entry["vs"]["interval"]
        met_arm = meets_target(entry["vs"], args)
        fields += [f"{key}_b1={entry['mean']:.3f}",
                   f"{key}_b1_minus_bc={entry['vs']['mean']:+.3f}",
                   f"{key}_ci=[{low:+.3f},{high:+.3f}]",
                   f"met_{key}={'yes' if met_arm else 'no'}"]  # fmt: skip
        met = met or met_arm
    if met_sft is not None:
        fields += [f"met_scratch={'yes' if met_scratch else 'no'}",
                   f"met_sft={'yes' if met_sft else 'no'}"]  # fmt: skip
    if "b=1" in figures.get("lora_vs_ft", {}):
        ft, lora = figures["arms"]["ft b=1"], figures["arms"]["lora b=1"]
        diff = figures["lora_vs_ft"]["b=1"]
        fields += [f"ft_b1={ft['mean']:.3f}",
                   f"lora_b1={lora['mean']:.3f}", f"lora_minus_ft={diff['mean']:+.3f}",
                   f"lora_ci=[{diff['interval'][0]:+.3f},{diff['interval'][1]:+.3f}]"]  # fmt: skip
    fields += [f"wall_s={wall_s:.0f}", f'target="{TARGET}"', f"met={'yes' if met else 'no'}"]
    return "RESULT: " + " ".join(fields)


def figure(figures: dict, seeds: list[int], path: Path) -> None:
    from recap.viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(figures["arms"])
    for k, name in enumerate(names):
        entry = figures["arms"][name]
        ax.scatter([k] * len(seeds), entry["per_seed"], color="grey", s=18, zorder=2)
        low, high = entry["interval"]
        ax.errorbar(
            [k],
            [entry["mean"]],
            yerr=[[entry["mean"] - low], [high - entry["mean"]]],
            fmt="o",
            color="C0" if name.startswith("bc") else "C1",
            capsize=5,
            zorder=3,
        )
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("success rate")
    ax.set_title(f"demo closed loop: per-seed rates (grey), mean and 95% interval, seeds {seeds}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def track(figures: dict, lines: list[str], png: Path, args, work: Path) -> None:
    """The figures, the table and the PNG as one MLflow run (experiment ``bench``)."""
    metrics = {}
    for name, entry in figures["arms"].items():
        key = name.replace(" ", "_").replace("=", "")
        metrics[f"{key}/mean"] = entry["mean"]
        if "vs" in entry:
            metrics[f"{key}/vs_baseline"] = entry["vs"]["mean"]
            low, high = entry["vs"]["interval"]
            metrics[f"{key}/vs_baseline_low"], metrics[f"{key}/vs_baseline_high"] = low, high
    for beta, entry in figures.get("lora_vs_ft", {}).items():
        key = f"lora_minus_ft_{beta.replace('=', '')}"
        metrics[key] = entry["mean"]
        metrics[f"{key}_low"], metrics[f"{key}_high"] = entry["interval"]
    tags = {"seeds": str(args.seeds), "episodes": str(args.episodes)}
    log_run("recap_vs_bc", work, tags, metrics, args.steps, lines, figures, png)


def log_run(name: str, work: Path, tags: dict, metrics: dict, step: int, lines: list[str],
            figures: dict, png: Path) -> None:  # fmt: skip
    """One MLflow run ``name`` (experiment ``bench``): the metrics, the table as
    ``{name}.txt``, the figures as ``{name}.json`` and the PNG."""
    from recap.tracking import Tracker

    tracker = Tracker(experiment="bench", run_name=name)
    tracker.start(work / "runs" / "bench_record", name, tags=tags)
    tracker.log_metrics(metrics, step=step)
    tracker.log_text("\n".join(lines) + "\n", f"{name}.txt")
    tracker.log_dict(figures, f"{name}.json")
    tracker.log_png(png)
    tracker.finish()


def arms_with_dependencies(arms: list[str]) -> list[str]:
    """``arms`` with bc (the reference), each fine-tuned arm's base and each arm's baseline, in
    ARMS order: bases before the arms that start from them."""
    wanted, grown = {"bc", *arms}, set()
    while grown != wanted:
        grown = set(wanted)
        wanted |= {FINETUNED[a] for a in grown if a in FINETUNED}
        wanted |= {BASELINE[a] for a in grown if a in BASELINE}
    return [a for a in ARMS if a in wanted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="runs/bench_recap_vs_bc", help="working directory")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--steps", type=int, default=4000, help="policy training steps")
    parser.add_argument("--finetune-steps", type=int, default=1000,
                        help="ft / lora: fine-tuning steps from the bc run")  # fmt: skip
    parser.add_argument("--value_steps", type=int, default=500)
    parser.add_argument("--betas", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--state-targets", action="store_true",
                        help="the demo with the targets in the state (demo/state.gin); use its "
                        "own --work directory")  # fmt: skip
    parser.add_argument("--label-position", default="task", choices=["task", "action"],
                        help="the conditioned arms' policy_data.label_position (\"action\": "
                        "the label after the state); use its own --work directory")  # fmt: skip
    parser.add_argument("--sft-episodes", type=int, default=300, help="demo data size")
    parser.add_argument("--rollout-episodes", type=int, default=300, help="demo data size")
    parser.add_argument("--quick", action="store_true", help="tiny budget: check the machinery")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.episodes, args.steps, args.value_steps = [0, 1], 8, 20, 20
        args.finetune_steps = 10
    args.arms = arms_with_dependencies(args.arms)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # the demo gin files read demo_data/ and write runs/ relative to here
    log = work / "bench.log"
    start = time.perf_counter()
    print(f"recap_vs_bc: {len(args.arms)} arms x {len(args.seeds)} seeds, {args.steps} steps, "
          f"{args.episodes} episodes; log {log}", flush=True)  # fmt: skip
    prepare(work, args, log)
    records = {(arm, seed): train_and_evaluate(work, arm, seed, args, log)
               for seed in args.seeds for arm in args.arms}  # fmt: skip
    lines, figures = summarize(records, args)
    print("\n".join(lines))
    png = work / "recap_vs_bc.png"
    figure(figures, args.seeds, png)
    (work / "recap_vs_bc.json").write_text(json.dumps(figures, indent=2) + "\n")
    track(figures, lines, png, args, work)
    print(result_line(figures, args, time.perf_counter() - start))


if __name__ == "__main__":
    main()
