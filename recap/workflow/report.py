"""The pipeline's summary: its figures (``summary_metrics``), the paired comparison of two
evaluated arms, the table it prints, its MLflow run and its picture. Stages say how their own
results read (``recap.workflow.stages``); this module only assembles them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from recap import logs
from recap.configurable import clear_config, configured
from recap.io import write_atomic, write_json
from recap.workflow.config import PipelineConfig
from recap.workflow.stages import BY_NAME, SCOPES, AdvantagesStage

log = logs.get(__name__)


def summary_metrics(report: dict[str, dict]) -> dict[str, float]:
    """Flat figures of a pipeline run (MLflow metrics of the pipeline run); each paired
    comparison as ``paired/{arm}-{baseline}/beta_{b}`` and its ``_low`` / ``_high``."""
    out: dict[str, float] = {}
    for name, entry in report.items():
        out[f"wall_s/{name}"] = float(entry["wall_s"])
        out.update(BY_NAME[name].metrics(entry.get("result", {})))
    for row in paired(report):
        key = f"paired/{row['arm']}-{row['baseline']}/beta_{row['beta']}"
        out.update({key: row["mean"], f"{key}_low": row["low"], f"{key}_high": row["high"]})
    return out


@dataclass(frozen=True)
class _Arm:
    name: str  # the trained stage
    label: str
    outcomes: dict[str, list[int]]  # beta_{b} -> 0/1 per episode


def paired(report: dict[str, dict]) -> list[dict]:
    """Per beta of each ``PairedEvaluateStage`` with ``against`` (both finished with their
    outcomes): the two arms' success rates on the same episodes and the difference's paired
    95% bootstrap interval over the episodes (``recap.core.bootstrap``; against the baseline's
    beta 1, its only prompt). One training seed: the interval says nothing of seeds."""
    from recap.core.bootstrap import paired_bootstrap

    def arm(name: str) -> _Arm | None:
        stage, result = BY_NAME[name], report.get(name, {}).get("result", {})
        if "outcomes" not in result:
            return None
        return _Arm(stage.trained, stage.label or stage.trained, result["outcomes"])

    rows = []
    for name in report:
        other = getattr(BY_NAME[name], "against", "")
        mine, base = arm(name), arm(other) if other in report else None
        if mine is None or base is None:
            continue
        reference = np.asarray([base.outcomes["beta_1"]], dtype=np.float64)
        for key, won in mine.outcomes.items():
            outcome = np.asarray([won], dtype=np.float64)
            diff = paired_bootstrap(outcome, reference)
            rows.append({"arm": mine.name, "label": mine.label, "baseline": base.name,
                         "baseline_label": base.label, "beta": key.removeprefix("beta_"),
                         "rate": float(outcome.mean()), "baseline_rate": float(reference.mean()),
                         "episodes": outcome.shape[1], "mean": diff.mean, "low": diff.low,
                         "high": diff.high})  # fmt: skip
    return rows


def paired_line(row: dict) -> str:
    """One paired comparison of ``paired`` as the summary prints it."""
    return (
        f"{row['label']} ({row['arm']}, beta {row['beta']}) {row['rate']:.3f} vs "
        f"{row['baseline_label']} ({row['baseline']}) {row['baseline_rate']:.3f} on the same "
        f"{row['episodes']} held-out episodes: {row['mean']:+.3f} [{row['low']:+.3f}, "
        f"{row['high']:+.3f}] (paired 95% bootstrap interval over the episodes)"
    )


ONE_SEED = (
    "closed-loop success above: one training seed on one machine, an anecdote, not "
    "evidence; RECAP vs BC over seeds with 95% intervals: python bench/recap_vs_bc.py "
    "(docs/results/recap-vs-bc.md)"
)

PAIRED_SEED = (
    "one training seed: the intervals cover the evaluation episodes, not training seeds; RECAP "
    "vs BC over seeds: python bench/recap_vs_bc.py --arms sft_rlinf (docs/results/recap-vs-bc.md)"
)


def summary_table(config: PipelineConfig, report: dict[str, dict], uri: str) -> str:
    """The final table: per step status, wall time, headline figures; the MLflow command."""
    rows = [("step", "status", "wall", "result", "outputs")]
    for name, entry in report.items():
        wall = f"{entry['wall_s']:.0f} s"
        where = entry.get("run_dir") or ""
        rows.append((name, entry["status"], wall, BY_NAME[name].describe(entry["result"]), where))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"pipeline {config.name!r}: " + ", ".join(f"{k} {v}" for k, v in _headline(report))]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row[:4], widths, strict=True)]
        lines.append("  ".join([*cells, row[4]]).rstrip())
    rows = paired(report)
    lines += [paired_line(row) for row in rows]
    if rows:
        lines.append(PAIRED_SEED)
    elif any(k.startswith("success/") for k in summary_metrics(report)):
        lines.append(ONE_SEED)
    lines.append(f"compare runs: mlflow ui --backend-store-uri {uri}   (experiment "
                 f"{config.experiment!r}: one run per pipeline configuration)")  # fmt: skip
    return "\n".join(lines)


def _headline(report: dict[str, dict]) -> list[tuple[str, str]]:
    metrics = summary_metrics(report)
    stages = sorted((BY_NAME[name] for name in report), key=lambda s: s.headline_rank)
    return [pair for stage in stages for pair in stage.headline(metrics)]


def track(config: PipelineConfig, scoped: dict[str, list[str]], report: dict[str, dict]) -> str:
    """One MLflow run per pipeline configuration (experiment ``config.experiment``): the step
    bindings as params, the summary as metrics. Returns the tracking URI."""
    from recap.tracking import Tracker

    key = hashlib.sha256("".join(e["fingerprint"] for e in report.values()).encode()).hexdigest()
    run_dir = config.run_root / "pipelines" / f"{config.name}-{key[:12]}"
    run_dir.mkdir(parents=True, exist_ok=True)
    tracker = configured(Tracker)(
        config.experiment, run_name=config.name, sweep_name=config.sweep_name
    )
    clear_config()
    tracker.start(run_dir, "pipeline")
    params = {"pipeline.name": config.name, "pipeline.stages": ",".join(config.stages)}
    for scope in SCOPES:
        for binding in [*config.bindings.get(scope, []), *scoped.get(scope, [])]:
            lhs, _, rhs = binding.partition("=")
            params[f"{scope}/{lhs.strip()}"] = rhs.strip()
    params.update({f"fingerprint/{k}": e["fingerprint"][:12] for k, e in report.items()})
    tracker.log_params(params)
    tracker.log_metrics(summary_metrics(report), 0)
    tracker.log_dict(report, "pipeline_report.json")
    png = summary_figure(report, run_dir / "pipeline.png")
    if png is not None:
        tracker.log_png(png)
    tracker.finish()
    write_json(run_dir / "summary.json", {"name": config.name, "stages": report})
    # the summary as printed, for the pages that quote it (scripts/docs_figures.py)
    text = summary_table(config, report, tracker.uri) + "\n"
    write_atomic({run_dir / "summary.txt": lambda tmp: tmp.write_text(text)})
    return tracker.uri


def summary_figure(report: dict[str, dict], path: Path) -> Path | None:
    """``path`` (PNG): closed-loop success per arm and beta (the paired difference's interval
    over the episodes in the title), and the value model's value beside the return along four
    rollout episodes (the two of highest and the two of lowest return). None when the run has
    no closed-loop result; a failing picture (matplotlib, the ``viz`` extra, missing) is a
    warning, never an error."""
    arms = [(BY_NAME[n].trained, e["result"]["success"]) for n, e in report.items()
            if BY_NAME[n].evaluation and "success" in e.get("result", {})]  # fmt: skip
    if not arms:
        return None
    try:
        from recap.viz import _pyplot

        plt = _pyplot()
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        bars = [(f"{arm}\nbeta {k.removeprefix('beta_')}", rate)
                for arm, success in arms for k, rate in success.items()]  # fmt: skip
        left.bar(range(len(bars)), [r for _, r in bars], color="tab:blue")
        left.set_xticks(range(len(bars)), [b for b, _ in bars], fontsize=8)
        for x, (_, rate) in enumerate(bars):
            left.text(x, rate, f"{rate:.2f}", ha="center", va="bottom", fontsize=8)
        left.set_ylim(0, 1.05)
        left.set_ylabel("success rate (held-out episodes)")
        left.set_title("\n".join(f"{r['arm']} b{r['beta']} - {r['baseline']}: {r['mean']:+.3f} "
                                 f"[{r['low']:+.3f}, {r['high']:+.3f}]" for r in paired(report))
                       or "closed-loop success", fontsize=8)  # fmt: skip
        _value_panel(right, report)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
    except Exception as exc:  # a picture never fails the run
        log.warning(f"pipeline picture skipped: {type(exc).__name__}: {exc}")
        return None
    return path


def _value_panel(ax, report: dict[str, dict]) -> None:
    """Value and return along four episodes of the advantages sidecar with the lowest return
    (a dataset with failures: the rollouts)."""
    sidecars = [Path(p) for n, e in report.items() if isinstance(BY_NAME[n], AdvantagesStage)
                for p in e.get("outputs", {})]  # fmt: skip
    if not sidecars:
        ax.set_axis_off()
        return
    from recap.core import columns as C

    names = [C.EPISODE_INDEX, C.FRAME_INDEX, C.VALUE_CURRENT, C.RETURN]
    tables = {p: pq.read_table(p, columns=names).to_pandas() for p in sidecars}
    chosen = min(tables, key=lambda p: tables[p][C.RETURN].min())
    table = tables[chosen]
    first = table[table[C.FRAME_INDEX] == 0].sort_values(C.RETURN)
    picks = [*first[C.EPISODE_INDEX].iloc[:2], *first[C.EPISODE_INDEX].iloc[-2:]]
    twin = ax.twinx()  # the return in its own units, the value in the model's
    for k, episode in enumerate(dict.fromkeys(picks)):
        rows = table[table[C.EPISODE_INDEX] == episode]
        ax.plot(rows[C.FRAME_INDEX], rows[C.VALUE_CURRENT], color=f"C{k}",
                label=f"episode {episode}: value")  # fmt: skip
        twin.plot(rows[C.FRAME_INDEX], rows[C.RETURN], color=f"C{k}", ls="--", lw=0.8)
    ax.set_ylabel("value (solid)")
    twin.set_ylabel("return (dashed)")
    ax.set_xlabel("frame")
    ax.set_title(f"value model along episodes of {chosen.parent.parent.name}",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=6, ncol=2)


def ui_address(uri: str, experiment: str) -> str:
    """The MLflow UI page of the experiment's runs (model training view)."""
    from recap.tracking import ui_address as address

    return address(uri, experiment)
