"""Does iterative RECAP improve the policy iteration over iteration? BC, iteration 1, iteration 2.

For each training seed and each corrections setting (``plain``: the policy's own episodes;
``corrected``: the scripted expert takes over when the agent drifts, its frames forced positive in
Step 3), ``recap-iterate`` (``gin/demo/iterate.gin`` plus this script's bindings) runs
``--iterations`` rounds: collect ``--collect-episodes`` episodes with policy k-1, Steps 1-4 over
the demo data and every rollout so far, with the pipeline's closed-loop evaluation on
(``--episodes`` episodes, the same layouts for every policy: paired episode by episode).
Iteration 0 is the pipeline's baseline (behaviour cloning on the demo data), shared by both
corrections settings of a seed through content addressing (one run root per seed). The seed is
``train.seed`` of the value model, the policy and the baseline.

Per point (BC, then each iteration per setting): success per seed, mean and 95% interval
(``recap.core.bootstrap.rate_interval``: seeds, then episodes); per step (iteration 1 - BC,
iteration k - iteration k-1) the paired difference and its interval. A PNG of success vs
iteration (per-seed dots, mean and interval per setting) and the table go to MLflow (experiment
``bench``, run ``recap_iterations``); the ``RESULT:`` line reports the target: each iteration's
interval above the previous one's (non-overlapping), 3 seeds x >= 200 episodes. A loop whose
iterations all have records (``recap.workflow.iterate.recorded_iterations``: ``recap-iterate``'s
markers) is read, not run, so a rerun only summarizes and an interrupted bench continues (loops
over the same base data write their own returns sidecars, so one never unfinishes another).

    python bench/recap_iterations.py                      # 3 seeds, both settings, 200 episodes
    python bench/recap_iterations.py --state-targets --sft-episodes 3000 --rollout-episodes 3000
    python bench/recap_iterations.py --quick              # the machinery on a tiny budget
    python bench/recap_iterations.py --work runs/bench_iter_sft --base-work runs/bench_exp \
        --state-targets                                   # from bcsft, RLinf's recipe

``--base-work DIR`` (a ``bench/recap_vs_bc.py`` work directory run with ``--state-targets`` and
the ``bcsft`` arm: the expert-first setting where RECAP's effect exceeded the noise, ``sft_rlinf``
there): policy 0 and BC is the seed's ``bcsft`` run (behaviour cloning on the expert
demonstrations only; the paper's SFT policy), its evaluation checked to be on the loop's
episodes; every iteration fine-tunes the policy before it (``--policy-init finetune``, the
default; ``retrain``: bcsft, the paper's base checkpoint) for ``--policy-steps`` steps
(``demo/finetune.gin``, bcsft's normalization) with the demonstrations forced positive in Step 3,
label dropout 0.1 and the label after the state (RLinf's recipe), over the demo data
(``--base-data demo``) or the demonstrations only (``sft``, the paper's loop) plus every
collection so far; no baseline is trained. When that directory has the seeds' ``sft_more``
runs (bcsft fine-tuned with plain BC on the demonstrations alone, ``--policy-steps`` steps), the
table adds them as the control ``more SFT`` and each iteration's paired difference with it.

Cost on 2 CPU cores: per seed the baseline, then per setting and iteration a collection, a value
model, Step 3 and a policy (``--policy-steps``, fine-tuned from policy k-1 by default) and a
200-episode evaluation: ~20-30 min per (seed, setting) at the defaults, ~2.5 h for the default
3 seeds x 2 settings. With ``--base-work --base-data sft`` (no baseline to train; ~40-47k frames
per Step 3) an iteration took 6.7-8.5 min alone (records' ``wall_s``), ~1.5 h for 3 seeds x 2
settings x 2 iterations.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from recap.core.bootstrap import paired_bootstrap, rate_interval
from recap.records import EVALUATION_FILE, Evaluation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recap_vs_bc import (  # noqa: E402  (one runner, run naming and MLflow record for both)
    SFT_ONLY,
    arm_run_dir,
    log_run,
    run,
)

SETTINGS = ("plain", "corrected")
TARGET = ("RECAP iteration 1 > BC and iteration 2 > iteration 1, non-overlapping 95% intervals, "
          ">= 3 seeds x >= 200 episodes")  # fmt: skip


def prepare(work: Path, args, log: Path) -> None:
    """The demo data (``demo_data/``) when it is not there; with ``--base-work`` a link to that
    benchmark's demo data (its bcsft policies learned it)."""
    if args.base_work is not None and not (work / "demo_data").exists():
        source = (args.base_work / "demo_data").resolve()
        if not (source / "sft").is_dir():
            raise SystemExit(f"error: --base-work {args.base_work}: no demo_data/sft there; "
                             "point it at a bench/recap_vs_bc.py work directory")  # fmt: skip
        (work / "demo_data").symlink_to(source)
    if (work / "demo_data" / "sft").is_dir():
        return
    sizes = ["--sft-episodes", str(args.sft_episodes), "--rollout-episodes",
             str(args.rollout_episodes)]  # fmt: skip
    state = ["--state-targets"] if args.state_targets else []
    run([sys.executable, "-m", "recap.commands.make_demo_data", "--out", "demo_data", *sizes,
         *state], log)  # fmt: skip


def loop_params(seed: int, setting: str, args) -> list[str]:
    """``recap-iterate``'s bindings for one seed and corrections setting."""
    params = [
        f'pipeline.run_root = "runs/s{seed}"',
        f'pipeline.name = "iterations-s{seed}-{setting}"',
        "pipeline.evaluate = True",
        f"evaluate:evaluate_policy.num_episodes = {args.episodes}",
        "evaluate:evaluate_policy.betas = [1.0]",
        f"iterate.iterations = {args.iterations}",
        f"iterate.episodes = {args.collect_episodes}",
        f"iterate.expert = {setting == 'corrected'}",
        f'iterate.policy_init = "{args.policy_init}"',
        f"iterate.state_targets = {bool(args.state_targets)}",
        'iterate.experiment = "bench_iterations"',
    ]
    for step, steps in (("value", args.value_steps), ("policy", args.policy_steps),
                        ("baseline", args.baseline_steps)):  # fmt: skip
        params += [f"{step}:train.seed = {seed}", f"{step}:train.max_steps = {steps}",
                   f"{step}:train.save_every = {steps}"]  # fmt: skip
    if args.state_targets:
        params += ['policy:include "demo/state.gin"', 'baseline:include "demo/state.gin"']
    if args.base_work is not None:
        params += expert_first_params(seed, args)
    if args.ranks == 1:  # one process per step, no launcher
        params += ["pipeline.ranks = 1", 'pipeline.launcher = "python"']
    return params


def base_run(arm: str, seed: int, args) -> Path:
    """A run directory of the ``--base-work`` benchmark (its own naming: bcsft's ``--steps``
    are ``--base-steps`` here, its ``--finetune-steps`` this loop's ``--policy-steps``)."""
    sizes = SimpleNamespace(steps=args.base_steps, finetune_steps=args.policy_steps)
    return (args.base_work / arm_run_dir(arm, seed, sizes)).resolve()


def expert_first_params(seed: int, args) -> list[str]:
    """The loop in bench/recap_vs_bc.py's ``sft_rlinf`` setting: policy 0 is the seed's
    expert-only BC policy (``bcsft``), each iteration fine-tunes the policy before it or, with
    ``--policy-init retrain``, bcsft (``demo/finetune.gin``: lr 3e-4 cosine, bcsft's
    normalization throughout) with the
    demonstrations forced positive, label dropout 0.1 and the label after the state; no
    baseline is trained (BC is policy 0). ``--base-data sft``: the value
    model, Step 3 and the policy see the demonstrations and the collected episodes only, not the
    demo's scripted noisy rollouts (the paper's loop: SFT data plus the policy's own episodes)."""
    start = base_run("bcsft", seed, args)
    if not (start / "model.safetensors").is_file():
        raise SystemExit(f"error: {start}: no model.safetensors; run bench/recap_vs_bc.py "
                         f"--work {args.base_work} --arms bcsft --seeds {seed} first")  # fmt: skip
    steps = {"returns": ["demo/returns.gin"], "value": ["demo/value.gin"],
             "advantages": ["demo/advantages.gin"], "policy": ["demo/finetune.gin"],
             "baseline": ["demo/policy_bc.gin"]}  # fmt: skip
    own = []
    if args.base_data == "sft":  # the paper's loop: demonstrations + the policy's own episodes
        own = [f"{step}:{prefix}.datasets = [{SFT_ONLY}]" for step, prefix in
               (("value", "value_data"), ("advantages", "compute_advantages"),
                ("policy", "policy_data"))]  # fmt: skip
    return [
        *own,
        f"pipeline.steps = {steps!r}",
        'pipeline.stages = ["returns", "value", "advantages", "policy", "evaluate_policy"]',
        f'iterate.start_run = "{start}"',
        f'policy:BASE_POLICY = "{start}"',
        "policy:policy_data.dropout = 0.1",
        'policy:policy_data.label_position = "action"',
        "advantages:compute_advantages.force_sft_positive = True",
    ]


def reference_outcomes(arm: str, seed: int, args, loop_record: dict) -> list[int]:
    """A ``--base-work`` run's outcomes at beta 1, checked to be the loop's evaluation episodes
    (``loop_record``: an iteration's ``closed_loop.json``; the same count and layout seed), so
    the comparison stays paired."""
    path = base_run(arm, seed, args) / EVALUATION_FILE
    if not path.is_file():
        raise SystemExit(f"error: {path} not found; run bench/recap_vs_bc.py --work "
                         f"{args.base_work} --arms bcsft --seeds {seed} --episodes "
                         f"{args.episodes} first")  # fmt: skip
    record = Evaluation.read(path.parent).as_record()
    theirs, ours = (record.get("num_episodes"), record.get("seed")), (
        loop_record.get("num_episodes"), loop_record.get("seed"))  # fmt: skip
    if theirs != ours:
        raise SystemExit(f"error: {path}: {theirs[0]} episodes from layout seed {theirs[1]}, "
                         f"the loop evaluates {ours[0]} from {ours[1]}; rerun that arm with "
                         f"--episodes {ours[0]}")  # fmt: skip
    return record["outcomes"]["beta_1"]


def gin_args(params: list[str]) -> list[str]:
    return ["--gin_file", "demo/iterate.gin", *(a for p in params for a in ("--gin_param", p))]


def evaluation_of(run_dir: str | None) -> dict:
    """A run's closed-loop evaluation record (``closed_loop.json``)."""
    if run_dir is None:
        raise SystemExit("error: an iteration's record names no run directory")
    return Evaluation.read(run_dir).as_record()


def outcomes_of(run_dir: str | None) -> list[int]:
    """The per-episode outcomes at beta 1 of a run's closed-loop evaluation."""
    return evaluation_of(run_dir)["outcomes"]["beta_1"]


def loop_outcomes(seed: int, setting: str, args, log: Path) -> dict:
    """Run (or skip) the loop; ``{"bc": outcomes, 1: outcomes, ...}`` and the loop's wall time
    and collection figures per iteration, from ``recap-iterate``'s records."""
    from recap.workflow.iterate import recorded_iterations

    params = loop_params(seed, setting, args)
    records = recorded_iterations(["demo/iterate.gin"], params)
    if all(records):  # finished before: its records
        seconds = sum(r["wall_s"] for r in records)
    else:
        start = time.perf_counter()
        run([sys.executable, "-m", "recap.commands.iterate", *gin_args(params)], log)
        seconds = time.perf_counter() - start
        records = recorded_iterations(["demo/iterate.gin"], params)
        if not all(records):
            raise SystemExit(f"error: recap-iterate ended without a record of every iteration "
                             f"(seed {seed}, {setting}); see {log}")  # fmt: skip
    if args.base_work is None:
        out: dict = {"bc": outcomes_of(records[0]["stages"]["baseline"]["run_dir"])}
    else:
        first = evaluation_of(records[0]["stages"]["policy"]["run_dir"])
        out = {"bc": reference_outcomes("bcsft", seed, args, first)}
        if (base_run("sft_more", seed, args) / EVALUATION_FILE).is_file():
            out["control"] = reference_outcomes("sft_more", seed, args, first)
    out["wall_s"] = seconds
    for record in records:
        out[record["iteration"]] = outcomes_of(record["stages"]["policy"]["run_dir"])
        collect = record["collect"]
        out[f"collect_{record['iteration']}"] = {
            "success": collect.get("successes", 0) / max(collect.get("episodes", 1), 1),
            "corrections": collect.get("corrections", 0)}  # fmt: skip
    return out


def summarize(results: dict, args) -> tuple[list[str], dict]:
    """The table's lines and the figures: per point success per seed, mean and interval; per
    iteration the paired difference with the point before it (BC for iteration 1)."""
    seeds, ks = list(args.seeds), list(range(1, args.iterations + 1))

    def won(setting: str, k) -> np.ndarray:
        return np.array([results[(seed, setting)][k] for seed in seeds], dtype=np.float64)

    lines = ["point            | " + " | ".join(f"seed {s}" for s in seeds)
             + " | mean  | 95% interval   | vs previous (95% interval)"]  # fmt: skip
    figures: dict = {"points": {}}
    settings = [s for s in SETTINGS if s in args.settings]
    bc = won(settings[0], "bc")
    for setting in settings[1:]:  # one baseline per seed, whatever the setting
        if not np.array_equal(won(setting, "bc"), bc):
            raise SystemExit(
                f"error: the {setting} loop's baseline differs from the "
                f"{settings[0]} loop's; they must share a run root per seed"
            )
    points = [("bc", None, "bc", bc)]
    points += [(f"{s} iter {k}", s, k, won(s, k)) for s in settings for k in ks]
    for name, setting, k, outcome in points:
        rate = rate_interval(outcome)
        row = f"{name:<16} | " + " | ".join(f"{r:6.3f}" for r in outcome.mean(1))
        row += f" | {rate.mean:.3f} | [{rate.low:.3f}, {rate.high:.3f}]"
        entry = {"per_seed": outcome.mean(1).tolist(), "mean": rate.mean,
                 "interval": [rate.low, rate.high], "setting": setting, "iteration": k}  # fmt: skip
        if setting is not None:
            before = bc if k == 1 else won(setting, k - 1)
            diff = paired_bootstrap(outcome, before)
            previous = "bc" if k == 1 else f"iter {k - 1}"
            row += f" | {diff.mean:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}] vs {previous}"
            entry["vs_previous"] = {"mean": diff.mean, "interval": [diff.low, diff.high]}
        lines.append(row)
        figures["points"][name] = entry
    if all("control" in r for r in results.values()):  # --base-work with sft_more runs
        lines += control_lines(won, bc, settings, ks, figures)
    for setting in settings:
        for k in ks:
            rates = [results[(seed, setting)][f"collect_{k}"]["success"] for seed in seeds]
            corr = [results[(seed, setting)][f"collect_{k}"]["corrections"] for seed in seeds]
            lines.append(f"collect {setting} iter {k}: success {np.mean(rates):.3f} mean over "
                         f"seeds, corrected frames {int(np.sum(corr))}")  # fmt: skip
    walls = [results[key]["wall_s"] for key in results]
    figures["wall_s"] = float(np.sum(walls))
    return lines, figures


def control_lines(won, bc: np.ndarray, settings: list[str], ks: list[int], figures: dict):
    """The more-SFT control (policy 0 fine-tuned with plain BC on the demonstrations alone, as
    many steps as an iteration adds): its row, and each iteration's paired difference with it,
    so a gain the extra training alone gives is not read as the loop's."""
    control = won(settings[0], "control")
    rate, diff = rate_interval(control), paired_bootstrap(control, bc)
    row = f"{'more SFT':<16} | " + " | ".join(f"{r:6.3f}" for r in control.mean(1))
    row += f" | {rate.mean:.3f} | [{rate.low:.3f}, {rate.high:.3f}]"
    row += f" | {diff.mean:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}] vs bc"
    figures["points"]["more SFT"] = {
        "per_seed": control.mean(1).tolist(), "mean": rate.mean, "interval": [rate.low, rate.high],
        "setting": None, "iteration": "control",
        "vs_bc": {"mean": diff.mean, "interval": [diff.low, diff.high]}}  # fmt: skip
    lines = [row]
    for setting in settings:
        for k in ks:
            diff = paired_bootstrap(won(setting, k), control)
            figures["points"][f"{setting} iter {k}"]["vs_control"] = {
                "mean": diff.mean, "interval": [diff.low, diff.high]}  # fmt: skip
            lines.append(f"{setting} iter {k} vs more SFT: {diff.mean:+.3f} "
                         f"[{diff.low:+.3f}, {diff.high:+.3f}]")  # fmt: skip
    return lines


def meets(figures: dict, setting: str, args) -> bool:
    """Each iteration's interval strictly above the previous point's, >= 3 seeds x >= 200."""
    points = figures["points"]
    chain = [points["bc"]] + [points[f"{setting} iter {k}"] for k in range(1, args.iterations + 1)]
    above = all(b["interval"][0] > a["interval"][1] for a, b in zip(chain, chain[1:]))
    return above and args.iterations >= 2 and len(args.seeds) >= 3 and args.episodes >= 200


def result_line(figures: dict, args, wall_s: float) -> str:
    points = figures["points"]
    fields = [f"seeds={len(args.seeds)}", f"episodes={args.episodes}",
              f"collect={args.collect_episodes}", f"bc={points['bc']['mean']:.3f}"]  # fmt: skip
    if "more SFT" in points:
        fields.append(f"more_sft={points['more SFT']['mean']:.3f}")
    met = {}
    for setting in (s for s in SETTINGS if s in args.settings):
        for k in range(1, args.iterations + 1):
            entry = points[f"{setting} iter {k}"]
            low, high = entry["vs_previous"]["interval"]
            fields += [f"{setting}_iter{k}={entry['mean']:.3f}",
                       f"{setting}_iter{k}_minus_previous={entry['vs_previous']['mean']:+.3f}",
                       f"{setting}_iter{k}_ci=[{low:+.3f},{high:+.3f}]"]  # fmt: skip
            if "vs_control" in entry:
                fields.append(f"{setting}_iter{k}_minus_more_sft="
                              f"{entry['vs_control']['mean']:+.3f}")  # fmt: skip
        met[setting] = meets(figures, setting, args)
        fields.append(f"met_{setting}={'yes' if met[setting] else 'no'}")
    fields += [f"wall_s={wall_s:.0f}", f'target="{TARGET}"',
               f"met={'yes' if any(met.values()) else 'no'}"]  # fmt: skip
    return "RESULT: " + " ".join(fields)


def figure(figures: dict, args, path: Path) -> None:
    from recap.viz import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ks = list(range(args.iterations + 1))
    for n, setting in enumerate(s for s in SETTINGS if s in args.settings):
        chain = [figures["points"]["bc"]]
        chain += [figures["points"][f"{setting} iter {k}"] for k in ks[1:]]
        x = np.array(ks, dtype=float) + 0.06 * (n - 0.5)
        for xi, entry in zip(x, chain):
            ax.scatter([xi] * len(entry["per_seed"]), entry["per_seed"], color="grey", s=14)
        means = [e["mean"] for e in chain]
        lows = [e["mean"] - e["interval"][0] for e in chain]
        highs = [e["interval"][1] - e["mean"] for e in chain]
        ax.errorbar(x, means, yerr=[lows, highs], fmt="o-", capsize=4, color=f"C{n}",
                    label=setting)  # fmt: skip
    ax.set_xticks(ks, ["BC"] + [f"iter {k}" for k in ks[1:]])
    ax.set_ylabel("success rate")
    ax.set_title(f"iterative RECAP on the demo: seeds {list(args.seeds)}, "
                 f"{args.episodes} episodes each")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def track(figures: dict, lines: list[str], png: Path, args, work: Path) -> None:
    """The figures, the table and the PNG as one MLflow run (experiment ``bench``)."""
    metrics = {}
    for name, entry in figures["points"].items():
        key = name.replace(" ", "_")
        metrics[f"{key}/mean"] = entry["mean"]
        metrics[f"{key}/low"], metrics[f"{key}/high"] = entry["interval"]
    tags = {"seeds": str(args.seeds), "episodes": str(args.episodes)}
    log_run("recap_iterations", work, tags, metrics, args.iterations, lines, figures, png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="runs/bench_iterations", help="working directory")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=200, help="evaluation episodes")
    parser.add_argument("--collect-episodes", type=int, default=200, help="per iteration")
    parser.add_argument("--policy-steps", type=int, default=1000)
    parser.add_argument("--baseline-steps", type=int, default=3000)
    parser.add_argument("--value-steps", type=int, default=500)
    parser.add_argument("--ranks", type=int, default=2, help="training processes per step")
    parser.add_argument("--policy-init", default="finetune", choices=["finetune", "retrain"])
    parser.add_argument("--state-targets", action="store_true",
                        help="the demo with the targets in the state (demo/state.gin)")  # fmt: skip
    parser.add_argument("--sft-episodes", type=int, default=300, help="demo data size")
    parser.add_argument("--rollout-episodes", type=int, default=300, help="demo data size")
    parser.add_argument("--base-work", type=Path, default=None,
                        help="a bench/recap_vs_bc.py work directory: start from its bcsft "
                        "policies (policy 0 and BC) in RLinf's recipe (sft_rlinf)")  # fmt: skip
    parser.add_argument("--base-steps", type=int, default=3000, help="its bcsft --steps")
    parser.add_argument("--base-data", default="demo", choices=["demo", "sft"],
                        help="with --base-work, the data each iteration adds its episodes to: "
                        "the demo's (demonstrations + scripted rollouts) or the demonstrations "
                        "only (the paper's loop)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="tiny budget: check the machinery")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.episodes, args.collect_episodes = [0], 8, 8
        args.policy_steps = args.baseline_steps = args.value_steps = 20
        args.sft_episodes = args.rollout_episodes = 20
        args.ranks = 1
    if args.base_work is not None:
        args.base_work = args.base_work.resolve()  # before the chdir below
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # the demo gin files read demo_data/ and write runs/ relative to here
    log = work / "bench.log"
    start = time.perf_counter()
    print(f"recap_iterations: {len(args.seeds)} seeds x {args.settings}, {args.iterations} "
          f"iterations, {args.collect_episodes} collected and {args.episodes} evaluation "
          f"episodes; log {log}", flush=True)  # fmt: skip
    prepare(work, args, log)
    results = {}
    for seed in args.seeds:
        for setting in args.settings:
            results[(seed, setting)] = loop_outcomes(seed, setting, args, log)
            print(f"  seed {seed} {setting}: {results[(seed, setting)]['wall_s']:.0f} s",
                  flush=True)  # fmt: skip
    lines, figures = summarize(results, args)
    print("\n".join(lines))
    png = work / "recap_iterations.png"
    figure(figures, args, png)
    (work / "recap_iterations.json").write_text(json.dumps(figures, indent=2) + "\n")
    track(figures, lines, png, args, work)
    print(result_line(figures, args, time.perf_counter() - start))


if __name__ == "__main__":
    main()
