"""RECAP on Meta-World: the real recipe against plain fine-tuning on public MT1 tasks.

For each task (``--tasks``: one reach-like, one manipulation task by default), in
``{--work}/{task}/``:

1. data (``recap.envs.metaworld.write_metaworld_datasets``): ``mw_data/sft``, successful
   scripted-expert demonstrations (action noise 0.1), and ``mw_data/rollout``, the expert with
   action noise 0.3 / 1.0 / 2.0 under a tighter step limit (failure-rich), on disjoint seeds, the
   corner camera at 32 px; the word tokenizer of every Meta-World task (``gin/metaworld/``);
2. Step 1 (returns), Step 2 (a value model from scratch), Step 3 (tag ``mw``: the value model's
   top 30% positive), the oracle labels (each episode's outcome) and ``mw_forced`` (``mw`` with the
   demonstrations forced positive, RLinf's default);
3. per training seed (``train.seed``), the recipe's base ``bcsft`` (behaviour cloning on the
   demonstrations, ``--steps``), then ``--finetune-steps`` of fine-tuning from it on
   demonstrations + rollouts, five ways:

   - ``sft_bc``: plain behaviour cloning on every frame (the baseline every arm is compared with);
   - ``sft_rlinf``: RECAP as RLinf runs it (``mw_forced`` labels, label dropout 0.1, the label
     after the state);
   - ``sft_recap``: RECAP in the paper's mode (``mw`` labels, dropout 0.3);
   - ``sft_oracle``: the paper's mode with the oracle labels (no value model: the conditioning
     path's ceiling on this data);
   - ``sft_filtered``: behaviour cloning on the frames of successful episodes only;

4. each policy evaluated in the simulator on the same ``--episodes`` held-out episodes (seeds
   5,000,000 on; conditioned arms at beta 1), sharded over ``--ranks`` processes
   (``evaluate_policy`` under the launcher);
5. with ``--iterate``: one ``recap-iterate`` round on the first task with the scripted expert
   correcting (takeover on drift), from the seed-0 ``sft_rlinf`` policy.

Per task and arm the success rate with its 95% interval; per arm the difference from
``sft_bc`` with a paired two-level bootstrap interval (seeds, then episodes:
``recap.core.bootstrap``); one ``RESULT:`` line per task and a table, a PNG and the figures as one
MLflow run (experiment ``bench``), the table and RESULT lines also to ``{--work}/metaworld.txt``
(``scripts/docs_figures.py --block bench-metaworld=...``). Finished runs are reused (a run
directory keeps its ``closed_loop.json``), so an interrupted benchmark continues.

    MUJOCO_GL=osmesa python bench/recap_metaworld.py   # 2 tasks x 3 seeds x 100 episodes
    python bench/recap_metaworld.py --quick             # the machinery on a tiny budget
    MUJOCO_GL=egl python bench/recap_metaworld.py --ranks 8 --episodes 200 --seeds 0 1 2 3 4

Needs the ``metaworld`` extra (``make test-metaworld`` installs it) and OSMesa on a CPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recap_vs_bc import DATASETS, distributed, gin_args, log_run, run, write_oracle  # noqa: E402

from recap.core.bootstrap import paired_bootstrap, rate_interval  # noqa: E402
from recap.records import EVALUATION_FILE, Evaluation  # noqa: E402

TASKS = ("reach-v3", "push-v3")
# Evaluation episode limit per task (the expert's successful episodes take 40-60 and 50-70 steps)
EPISODE_LIMIT = {"reach-v3": 100, "push-v3": 150, "pick-place-v3": 150}
ROLLOUT_LIMIT = 100  # the rollout set's step limit (failure-rich)
FORCED = ['policy_data.advantages_tag = "mw_forced"', "policy_data.dropout = 0.1",
          'policy_data.label_position = "action"']  # fmt: skip
ARMS = {
    "bcsft": (["metaworld/sft.gin"], []),
    "sft_bc": (["metaworld/finetune.gin"], ['policy_data.conditioning = "none"']),
    "sft_rlinf": (["metaworld/finetune.gin"], FORCED),
    "sft_recap": (["metaworld/finetune.gin"], []),
    "sft_oracle": (["metaworld/finetune.gin"], ['policy_data.advantages_tag = "oracle"']),
    "sft_filtered": (
        ["metaworld/finetune.gin"],
        ['policy_data.advantages_tag = "oracle"', 'policy_data.conditioning = "filtered"'],
    ),
}
CONDITIONED = ("sft_rlinf", "sft_recap", "sft_oracle")
BASELINE = "sft_bc"
DATA = ['MW_DATA = "mw_data"', 'MW_TOKENIZER = "mw_data/tokenizer"']
TARGET = "RECAP (RLinf's recipe) - plain fine-tune > 0 with a 95% interval excluding 0, per task"


def env_options(task: str, image_size: int) -> str:
    limit = EPISODE_LIMIT.get(task, 150)
    options = {"env_name": task, "image_size": image_size, "max_steps": limit, "lazy_images": True}
    return f"evaluate_policy.env_options = {options!r}"


def prepare(task: str, args, log: Path) -> dict:
    """Data, tokenizer, Steps 1-3, the oracle and forced labels of ``task`` (in the cwd)."""
    from recap.envs.metaworld import write_metaworld_datasets, write_metaworld_tokenizer

    start = time.perf_counter()
    write_metaworld_datasets("mw_data", task, demo_episodes=args.demo_episodes,
                             rollout_episodes=args.rollout_episodes, seed=0,
                             rollout_max_steps=ROLLOUT_LIMIT, workers=2, image_size=32)  # fmt: skip
    write_metaworld_tokenizer("mw_data/tokenizer")
    data_s = time.perf_counter() - start
    run([sys.executable, "-m", "recap.commands.compute_returns",
         *gin_args(["metaworld/returns.gin"], DATA)], log)  # fmt: skip
    if not Path("runs/mw_value/model.safetensors").is_file():
        value = [*DATA, f"train.max_steps = {args.value_steps}",
                 f"train.save_every = {args.value_steps}"]  # fmt: skip
        run(distributed("recap.commands.train", args.ranks)
            + gin_args(["metaworld/value.gin"], value), log)  # fmt: skip
    if not Path("mw_data/rollout/meta/advantages_mw.parquet").is_file():
        run([sys.executable, "-m", "recap.commands.compute_advantages",
             *gin_args(["metaworld/advantages.gin"], DATA)], log)  # fmt: skip
    write_oracle(Path("mw_data"), "mw")
    if not Path("mw_data/rollout/meta/advantages_mw_forced.parquet").is_file():
        from recap.data import sidecars

        _, record = sidecars.read_advantages(Path("mw_data/rollout"), "mw")
        forced = [*DATA, f"relabel.positive_quantile = {record['positive_quantile']}"]
        run([sys.executable, "-m", "recap.commands.relabel",
             *gin_args(["metaworld/relabel.gin"], forced)], log)  # fmt: skip
    return {"data_s": data_s, **data_summary(Path("mw_data"))}


def data_summary(data: Path) -> dict:
    """Episodes, frames and successes of each dataset, and Step 3's positive fraction."""
    from recap.data import sidecars

    out = {}
    for name in DATASETS:
        info = json.loads((data / name / "meta" / "info.json").read_text())
        _, stats = sidecars.read_returns(data / name, "")
        table, _ = sidecars.read_advantages(data / name, "mw")
        positive = float(np.mean(table.column("advantage").to_numpy(zero_copy_only=False)))
        out[name] = {"episodes": info["total_episodes"], "frames": info["total_frames"],
                     "positive_fraction": round(positive, 3),
                     **{k: v for k, v in stats.items() if "success" in k}}  # fmt: skip
    return out


def run_dir(arm: str, seed: int, args) -> str:
    if arm == "bcsft":
        return f"runs/bcsft_s{seed}_{args.steps}"
    return f"runs/{arm}_s{seed}_bcsft{args.steps}_ft{args.finetune_steps}"


def train_and_evaluate(task: str, arm: str, seed: int, args, log: Path) -> dict:
    """The arm's policy for ``seed`` (reused when its evaluation exists) and its evaluation
    record (``closed_loop.json``) with the training seconds."""
    files, extra = ARMS[arm]
    directory = run_dir(arm, seed, args)
    steps = args.steps if arm == "bcsft" else args.finetune_steps
    params = [*DATA, *extra, f"train.seed = {seed}", f'train.run_dir = "{directory}"',
              f"train.max_steps = {steps}", f"train.save_every = {steps}"]  # fmt: skip
    if arm != "bcsft":
        params.append(f'BASE_POLICY = "{run_dir("bcsft", seed, args)}"')
    timing = Path(directory) / "bench_train.json"
    if (Path(directory) / EVALUATION_FILE).is_file():
        record = Evaluation.read(directory).as_record()
        if record["num_episodes"] == args.episodes:
            return {**record, "train_s": json.loads(timing.read_text())["train_s"]}
    if not (Path(directory) / "model.safetensors").is_file():
        start = time.perf_counter()
        run(distributed("recap.commands.train", args.ranks) + gin_args(files, params), log)
        timing.write_text(json.dumps({"train_s": time.perf_counter() - start}) + "\n")
    evaluation = [*params, f"evaluate_policy.num_episodes = {args.episodes}",
                  "evaluate_policy.betas = [1.0]", env_options(task, 32)]  # fmt: skip
    start = time.perf_counter()
    run(distributed("recap.commands.evaluate_policy", args.ranks)
        + gin_args(files, evaluation), log)  # fmt: skip
    record = Evaluation.read(directory).as_record()
    train_s = json.loads(timing.read_text())["train_s"]
    print(f"  {task} {arm} seed {seed}: success {record['success']['beta_1']:.3f} "
          f"(trained {train_s:.0f} s, evaluated {time.perf_counter() - start:.0f} s)",
          flush=True)  # fmt: skip
    return {**record, "train_s": train_s}


def outcomes(records: dict, arm: str, seeds: list[int]) -> np.ndarray:
    return np.array([records[(arm, s)]["outcomes"]["beta_1"] for s in seeds], dtype=np.float64)


def summarize(task: str, records: dict, args) -> tuple[list[str], dict]:
    """The task's table lines and figures: per arm the rate and interval, per fine-tuned arm the
    paired difference from ``sft_bc`` (``bcsft``'s from nothing: it is the base)."""
    seeds = list(args.seeds)
    lines = [f"{task}: {'arm':<13} | " + " | ".join(f"seed {s}" for s in seeds)
             + " | mean  | 95% interval   | vs sft_bc (95% interval)"]  # fmt: skip
    figures: dict = {}
    for arm in ARMS:
        won = outcomes(records, arm, seeds)
        rate = rate_interval(won)
        row = f"{task}: {arm:<13} | " + " | ".join(f"{r:6.3f}" for r in won.mean(1))
        row += f" | {rate.mean:.3f} | [{rate.low:.3f}, {rate.high:.3f}]"
        entry = {
            "per_seed": won.mean(1).tolist(),
            "mean": rate.mean,
            "interval": [rate.low, rate.high],
            "train_s": float(np.mean([records[(arm, s)]["train_s"] for s in seeds])),
        }
        if arm not in ("bcsft", BASELINE):
            diff = paired_bootstrap(won, outcomes(records, BASELINE, seeds))
            row += f" | {diff.mean:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}]"
            entry["vs_sft_bc"] = {"mean": diff.mean, "interval": [diff.low, diff.high]}
        if arm in CONDITIONED:
            probes = [records[(arm, s)].get("sensitivity", {}) for s in seeds]
            entry["sensitivity"] = {
                k: float(np.mean([p[k] for p in probes]))
                for k in sorted({k for p in probes for k in p})
            }
        lines.append(row)
        figures[arm] = entry
    return lines, figures


def result_line(task: str, figures: dict, args, seconds: float) -> str:
    fields = [f"task={task}", f"seeds={len(args.seeds)}", f"episodes={args.episodes}",
              f"steps={args.steps}", f"finetune_steps={args.finetune_steps}"]  # fmt: skip
    for arm, entry in figures.items():
        fields.append(f"{arm}={entry['mean']:.3f}")
    met = False
    for arm in ("sft_rlinf", "sft_recap", "sft_oracle", "sft_filtered"):
        diff = figures[arm]["vs_sft_bc"]
        low, high = diff["interval"]
        fields.append(f"{arm}_minus_bc={diff['mean']:+.3f}[{low:+.3f},{high:+.3f}]")
        if arm == "sft_rlinf":
            met = diff["mean"] > 0 and low > 0
    fields += [f"wall_s={seconds:.0f}", f'target="{TARGET}"', f"met={'yes' if met else 'no'}"]
    return "RESULT: " + " ".join(fields)


def iterate_round(task: str, args, log: Path) -> tuple[str, dict]:
    """One ``recap-iterate`` round on ``task`` (``gin/metaworld/iterate.gin``) from the seed-0
    ``sft_rlinf`` policy, Meta-World's expert correcting: its RESULT line and figures (the
    collection, and the new policy against the collecting one on the same held-out episodes,
    paired over episodes: one training seed)."""
    start_run = run_dir("sft_rlinf", 0, args)
    limit = EPISODE_LIMIT.get(task, 150)
    collect = {"env_name": task, "image_size": 32, "max_steps": limit}
    params = [*(f"all:{p}" for p in DATA), f'policy:BASE_POLICY = "{run_dir("bcsft", 0, args)}"',
              f"policy:train.max_steps = {args.finetune_steps}",
              f"policy:train.save_every = {args.finetune_steps}",
              f"value:train.max_steps = {args.value_steps}",
              f"value:train.save_every = {args.value_steps}",
              f"evaluate:evaluate_policy.num_episodes = {args.episodes}",
              "evaluate:evaluate_policy.betas = [1.0]", f"evaluate:{env_options(task, 32)}",
              f'iterate.start_run = "{start_run}"', f"iterate.env_options = {collect!r}",
              f"iterate.episodes = {args.iterate_episodes}"]  # fmt: skip
    start = time.perf_counter()
    run([sys.executable, "-m", "recap.commands.iterate",
         *gin_args(["metaworld/iterate.gin"], params)], log)  # fmt: skip
    summaries = sorted(Path("runs/pipeline/iterate").glob("iter1/*/summary.json"),
                       key=lambda p: p.stat().st_mtime)  # fmt: skip
    record = json.loads(summaries[-1].read_text())
    policy = Path(record["policy"]["run_dir"])
    after = Evaluation.read(policy).outcomes["beta_1"]
    before = Evaluation.read(start_run).outcomes["beta_1"]
    after, before = np.array([after], np.float64), np.array([before], np.float64)
    diff = paired_bootstrap(after, before)
    c = record["collect"]
    figures = {"episodes": c.get("episodes"), "successes": c.get("successes"),
               "corrections": c.get("corrections"),
               "corrected_episodes": c.get("corrected_episodes"),
               "before": float(before.mean()), "after": float(after.mean()),
               "diff": diff.mean, "interval": [diff.low, diff.high]}  # fmt: skip
    line = (f"RESULT: iterate task={task} collected={c.get('episodes')} "
            f"collect_successes={c.get('successes')} corrected_frames={c.get('corrections')} "
            f"corrected_episodes={c.get('corrected_episodes')} sft_rlinf_s0={before.mean():.3f} "
            f"iter1={after.mean():.3f} iter1_minus_sft_rlinf={diff.mean:+.3f}"
            f"[{diff.low:+.3f},{diff.high:+.3f}] episodes={args.episodes} seeds=1 "
            f"wall_s={time.perf_counter() - start:.0f}")  # fmt: skip
    return line, figures


def figure(all_figures: dict, seeds: list[int], path: Path) -> None:
    from recap.viz import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(all_figures), figsize=(6 * len(all_figures), 4), squeeze=False)
    for ax, (task, figures) in zip(axes[0], all_figures.items()):
        for k, (arm, entry) in enumerate(figures.items()):
            ax.scatter([k] * len(seeds), entry["per_seed"], color="grey", s=18, zorder=2)
            low, high = entry["interval"]
            ax.errorbar([k], [entry["mean"]], yerr=[[entry["mean"] - low], [high - entry["mean"]]],
                        fmt="o", capsize=5, zorder=3,
                        color="C1" if arm in CONDITIONED else "C0")  # fmt: skip
        ax.set_xticks(range(len(figures)), list(figures), rotation=25)
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("success rate")
        ax.set_title(f"Meta-World {task}: per seed (grey), mean, 95% interval")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="runs/bench_metaworld", help="working directory")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=100, help="evaluation episodes")
    parser.add_argument("--steps", type=int, default=1000, help="bcsft training steps")
    parser.add_argument("--finetune-steps", type=int, default=300)
    parser.add_argument("--value-steps", type=int, default=300)
    parser.add_argument("--demo-episodes", type=int, default=40)
    parser.add_argument("--rollout-episodes", type=int, default=80)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iterate", action="store_true", help="one recap-iterate round")
    parser.add_argument("--iterate-episodes", type=int, default=50, help="episodes collected")
    parser.add_argument("--quick", action="store_true", help="tiny budget: check the machinery")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.episodes, args.steps, args.finetune_steps = [0, 1], 4, 10, 5
        args.value_steps, args.demo_episodes, args.rollout_episodes = 5, 4, 6
        args.iterate_episodes = 4
    os.environ.setdefault("MUJOCO_GL", "osmesa")
    root = Path(args.work).resolve()
    start = time.perf_counter()
    all_lines, all_figures, results, iterated = [], {}, [], None
    for task in args.tasks:
        work = root / task
        work.mkdir(parents=True, exist_ok=True)
        os.chdir(work)  # the gin files read mw_data/ and write runs/ relative to here
        log = work / "bench.log"
        task_start = time.perf_counter()
        print(f"metaworld {task}: {len(ARMS)} arms x {len(args.seeds)} seeds, "
              f"{args.episodes} episodes; log {log}", flush=True)  # fmt: skip
        data = prepare(task, args, log)
        print(f"  {task} data: {json.dumps(data)}", flush=True)
        records = {(arm, seed): train_and_evaluate(task, arm, seed, args, log)
                   for seed in args.seeds for arm in ARMS}  # fmt: skip
        lines, figures = summarize(task, records, args)
        all_lines += lines
        all_figures[task] = figures
        results.append(result_line(task, figures, args, time.perf_counter() - task_start))
        (work / "metaworld.json").write_text(json.dumps({"data": data, "arms": figures},
                                                        indent=2) + "\n")  # fmt: skip
    if args.iterate:
        os.chdir(root / args.tasks[0])
        line, iterated = iterate_round(args.tasks[0], args, root / args.tasks[0] / "bench.log")
        results.append(line)
        print(line, flush=True)
    os.chdir(root)
    png = root / "metaworld.png"
    figure(all_figures, args.seeds, png)
    metrics = {
        f"{task}/{arm}/{key}": value
        for task, figures in all_figures.items()
        for arm, entry in figures.items()
        for key, value in [("mean", entry["mean"])]
        + ([("vs_sft_bc", entry["vs_sft_bc"]["mean"])] if "vs_sft_bc" in entry else [])
    }
    log_run("metaworld", root, {"seeds": str(args.seeds), "episodes": str(args.episodes),
                                "tasks": " ".join(args.tasks)},
            metrics, args.steps, all_lines + results,
            {"tasks": all_figures, "iterate": iterated}, png)  # fmt: skip
    text = [*all_lines, f"wall {time.perf_counter() - start:.0f} s", *results]
    (root / "metaworld.txt").write_text("\n".join(text) + "\n")  # scripts/docs_figures.py
    print("\n".join(text))


if __name__ == "__main__":
    main()
