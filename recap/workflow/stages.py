"""The pipeline's stages: what each runs, what it reads from the stages it needs, where its
outputs go, and how its result reads (summary figures, MLflow metrics, summary-table cell,
headline). ``recap.workflow.pipeline`` plans and runs them; ``recap.workflow.report`` sums them up.

A new stage is a ``Stage`` subclass (or an instance of one) added to ``STAGES``: the planner, the
runner and the summary only call its hooks; its fingerprint needs nothing more
(``recap.workflow.fingerprints``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow.parquet as pq

from recap.configurable import bound
from recap.errors import RecapError
from recap.records import Evaluation
from recap.workflow.bindings import Binding

_TRAIN, _EVALUATE = "recap.commands.train", "recap.commands.evaluate_policy"


# ---- stages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One pipeline stage and all of its wiring. A new stage is a subclass (or an instance of
    one) added to ``STAGES``: the planner, the runner and the summary only call these hooks.

    The class says what runs (``module``: ``python -m`` / ``deepspeed --module``; ``entry``: the
    configurable it calls, its ``REQUIRED`` values checked at plan time; ``distributed``:
    under ``deepspeed``, tracking itself in MLflow; ``evaluation``: a closed-loop evaluation,
    run only with ``pipeline.evaluate``)."""

    name: str
    step: str  # key of ``pipeline.steps``: whose gin files it parses
    needs: tuple[str, ...] = ()
    headline_rank: int = 0  # order of its headline figures (stable: equal ranks in stage order)
    module: ClassVar[str]
    entry: ClassVar[str]
    distributed: ClassVar[bool] = False
    evaluation: ClassVar[bool] = False

    @property
    def scopes(self) -> tuple[str, ...]:
        """Keys of ``pipeline.bindings`` / ``STEP:`` bindings it runs with, in this order."""
        return ("all", self.step, *(("evaluate",) if self.evaluation else ()))

    def inputs(self, planned: dict[str, Planned]) -> list[Binding]:
        """The results of the stages it needs that it reads (fingerprinted)."""
        return []

    def owned(
        self, fingerprint: str, planned: dict[str, Planned], root: Path
    ) -> tuple[Path | None, list[Binding]]:
        """Its run directory and the bindings that put its outputs there (not fingerprinted)."""
        raise NotImplementedError

    def check(self) -> None:
        """Plan-time checks beyond gin's (its final bindings are parsed)."""

    def outputs(self, run_dir: Path | None) -> list[Path]:
        """The files its marker stamps (its final bindings are parsed)."""
        return []

    def result(self, item: Planned) -> dict:
        """Its summary figures, read from its outputs once it finished."""
        raise NotImplementedError

    def metrics(self, result: dict) -> dict[str, float]:
        """Its flat figures among the pipeline run's MLflow metrics."""
        return {}

    def describe(self, result: dict) -> str:
        """Its ``result`` cell of the summary table."""
        raise NotImplementedError

    def headline(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        """Its (label, value) pairs in the summary's first line, from ``summary_metrics``."""
        return []


@dataclass(frozen=True)
class ReturnsStage(Stage):
    """Step 1: return sidecars beside the data (the tag of its own gin files; no run dir)."""

    module: ClassVar[str] = "recap.commands.compute_returns"
    entry: ClassVar[str] = "compute_returns"

    def owned(self, fingerprint, planned, root):
        return None, []

    def outputs(self, run_dir):
        return sidecar_outputs("returns", "compute_returns")

    def result(self, item):
        return {"frames": sum(pq.ParquetFile(p).metadata.num_rows for p in item.outputs)}

    def describe(self, result):
        return f"{result['frames']} frames"


@dataclass(frozen=True)
class TrainStage(Stage):
    """A training step: ``{run_root}/{name}/{fingerprint[:12]}``, ``model.safetensors``."""

    module: ClassVar[str] = _TRAIN
    entry: ClassVar[str] = "train"
    distributed: ClassVar[bool] = True

    def owned(self, fingerprint, planned, root):
        run_dir = root / self.name / fingerprint[:12]
        return run_dir, [Binding("train", "run_dir", run_dir)]

    def check(self):  # NVMe parameter offload: can this machine swap at all?
        from recap.engine.deepspeed_config import check_nvme_offload

        try:
            check_nvme_offload(bound("deepspeed_config.offload_param", "none"))
        except RecapError as exc:
            raise RecapError(f"pipeline step {self.name}: {exc}") from exc

    def outputs(self, run_dir):
        return [run_dir / "model.safetensors"]

    def result(self, item):
        metrics, untrained = run_metrics(item.run_dir)
        keys = ("train/loss", "eval/loss", "eval/value_spearman", "eval/value_mae")
        out = {k: metrics[k] for k in keys if k in metrics}
        if "eval/value_spearman" in untrained:  # the same eval before the first step
            out["eval/value_spearman_untrained"] = untrained["eval/value_spearman"]
        return out

    def describe(self, result):
        parts = []
        if "eval/value_spearman" in result:
            parts.append(f"eval Spearman {result['eval/value_spearman']:.3f}")
        if "eval/value_spearman_untrained" in result:
            parts.append(f"untrained {result['eval/value_spearman_untrained']:.3f}")
        if "train/loss" in result:
            parts.append(f"train loss {result['train/loss']:.4g}")
        if "eval/loss" in result:
            parts.append(f"eval loss {result['eval/loss']:.4g}")
        return ", ".join(parts)


@dataclass(frozen=True)
class ValueStage(TrainStage):
    """Step 2, the value model: its eval Spearman (trained, and before the first step)."""

    def metrics(self, result):
        keys = {"eval/value_spearman": "", "eval/value_spearman_untrained": "_untrained"}
        return {f"{self.name}_eval_spearman{s}": float(result[k]) for k, s in keys.items()
                if k in result}  # fmt: skip

    def headline(self, metrics):
        key = f"{self.name}_eval_spearman"
        if key not in metrics:
            return []
        spearman = f"{metrics[key]:.3f}"
        if f"{key}_untrained" in metrics:
            spearman += f" (untrained {metrics[f'{key}_untrained']:.3f})"
        return [(f"{self.name} eval Spearman", spearman)]


@dataclass(frozen=True)
class AdvantagesStage(Stage):
    """Step 3: advantage labels of the value model it needs, tagged ``adv_{fingerprint[:12]}``
    (sidecars beside the data); ``positive_fraction`` is a metric and a headline figure."""

    module: ClassVar[str] = "recap.commands.compute_advantages"
    entry: ClassVar[str] = "compute_advantages"
    distributed: ClassVar[bool] = True

    @staticmethod
    def tag(fingerprint: str) -> str:
        return f"adv_{fingerprint[:12]}"

    def inputs(self, planned):
        return [Binding("compute_advantages", "model_path", planned[self.needs[0]].run_dir)]

    def owned(self, fingerprint, planned, root):
        run_dir = root / self.name / fingerprint[:12]
        return run_dir, [
            Binding("compute_advantages", "tag", self.tag(fingerprint)),
            Binding("compute_advantages", "output_dir", run_dir),
        ]

    def outputs(self, run_dir):
        return sidecar_outputs("advantages", "compute_advantages")

    def result(self, item):
        labels = [pq.read_table(p, columns=["advantage"]).column(0) for p in item.outputs]
        total = sum(len(c) for c in labels)
        positive = sum(int(np.count_nonzero(c.to_numpy())) for c in labels)
        return {"frames": total, "positive_fraction": positive / max(total, 1)}

    def metrics(self, result):
        return {"positive_fraction": float(result["positive_fraction"])}

    def describe(self, result):
        return f"positive fraction {result['positive_fraction']:.3f} of {result['frames']} frames"

    def headline(self, metrics):
        if "positive_fraction" not in metrics:
            return []
        return [("positive fraction", f"{metrics['positive_fraction']:.3f}")]


@dataclass(frozen=True)
class PolicyStage(TrainStage):
    """Step 4, a policy: reads the labels of the advantages stages it needs (none: behaviour
    cloning); its train loss is a metric, and a headline figure with ``headline_loss``."""

    headline_loss: bool = True

    def inputs(self, planned):
        tags = [AdvantagesStage.tag(planned[n].fingerprint) for n in self.needs
                if isinstance(planned[n].stage, AdvantagesStage)]  # fmt: skip
        return [Binding("policy_data", "advantages_tag", tag) for tag in tags]

    def metrics(self, result):
        if "train/loss" not in result:
            return {}
        return {f"{self.name}_train_loss": float(result["train/loss"])}

    def headline(self, metrics):
        key = f"{self.name}_train_loss"
        if not self.headline_loss or key not in metrics:
            return []
        return [(f"{self.name} loss", f"{metrics[key]:.4g}")]


@dataclass(frozen=True)
class FinetuneStage(PolicyStage):
    """Step 4, a policy fine-tuned from the policy a stage it needs trained (its first
    ``PolicyStage``): that run's weights and normalization (``pi05_policy.checkpoint``,
    ``policy_data.checkpoint``) are its inputs, so a change to the base reruns the fine-tune."""

    def inputs(self, planned):
        base = next(planned[n].run_dir for n in self.needs
                    if isinstance(planned[n].stage, PolicyStage))  # fmt: skip
        return [*super().inputs(planned), Binding("pi05_policy", "checkpoint", base),
                Binding("policy_data", "checkpoint", base)]  # fmt: skip


@dataclass(frozen=True)
class EvaluateStage(Stage):
    """Closed-loop evaluation of the trained stage it needs (``needs[0]``) in the environment
    ``evaluate_policy.env`` names (the reach task by default; ``recap.envs.factory``): its step's
    files and inputs, its run directory; success rate per beta."""

    module: ClassVar[str] = _EVALUATE
    entry: ClassVar[str] = "evaluate_policy"
    evaluation: ClassVar[bool] = True

    @property
    def trained(self) -> str:
        return self.needs[0]

    def inputs(self, planned):
        return planned[self.trained].stage.inputs(planned)

    def owned(self, fingerprint, planned, root):
        trained = planned[self.trained].run_dir
        return trained, [Binding("evaluate_policy", "run_dir", trained),
                         Binding("train", "run_dir", trained)]  # fmt: skip

    def result(self, item):
        evaluation = Evaluation.read(item.run_dir)
        return {"success": evaluation.success, "num_episodes": evaluation.num_episodes}

    def metrics(self, result):
        return {f"success/{self.trained}/{beta}": float(rate)
                for beta, rate in result["success"].items()}  # fmt: skip

    def describe(self, result):
        rates = ", ".join(f"beta {k[5:]}: {v:.2f}" for k, v in result["success"].items())
        return f"success {rates} ({result['num_episodes']} episodes)"

    def headline(self, metrics):
        key = f"success/{self.trained}/beta_1"
        if key not in metrics:
            return []
        return [(f"{self.trained} success (beta 1)", f"{metrics[key]:.2f}")]


@dataclass(frozen=True)
class PairedEvaluateStage(EvaluateStage):
    """A closed-loop evaluation that keeps each episode's outcome, so that two policies evaluated
    on the same seeded episodes compare paired; with ``against`` (the other evaluation stage) the
    summary prints the difference with its paired 95% bootstrap interval over the episodes."""

    against: str = ""
    label: str = ""  # the arm's name in the paired line (default: the trained stage's)

    def result(self, item):
        evaluation = Evaluation.read(item.run_dir)
        return {"success": evaluation.success, "num_episodes": evaluation.num_episodes,
                "outcomes": evaluation.outcomes}  # fmt: skip


STAGES: tuple[Stage, ...] = (
    ReturnsStage("returns", "returns"),
    ValueStage("value", "value", ("returns",)),
    AdvantagesStage("advantages", "advantages", ("value",)),
    PolicyStage("policy", "policy", ("advantages",)),
    PolicyStage("baseline", "baseline", (), headline_loss=False),
    # the headline reads the baseline's success before the policy's
    EvaluateStage("evaluate_policy", "policy", ("policy",), headline_rank=1),
    EvaluateStage("evaluate_baseline", "baseline", ("baseline",)),
    # RLinf's recipe (demo/pipeline.gin): a policy on the demonstrations only, then from it RECAP
    # and plain BC with the same budget, evaluated on the same episodes, paired
    PolicyStage("sft", "sft", (), headline_loss=False),
    FinetuneStage("finetune", "finetune", ("advantages", "sft")),
    FinetuneStage("finetune_bc", "finetune_bc", ("sft",), headline_loss=False),
    PairedEvaluateStage("evaluate_finetune_bc", "finetune_bc", ("finetune_bc",), label="BC"),
    PairedEvaluateStage(
        "evaluate_finetune",
        "finetune",
        ("finetune",),
        headline_rank=1,
        against="evaluate_finetune_bc",
        label="RECAP",
    ),
)
BY_NAME = {s.name: s for s in STAGES}
STEP_KEYS = tuple(dict.fromkeys(s.step for s in STAGES))  # the keys of pipeline.steps
SCOPES = (*STEP_KEYS, "evaluate", "all")  # STEP of a STEP:binding, keys of pipeline.bindings


@dataclass
class Planned:
    """One stage resolved: its fingerprint, the bindings it runs with, where its outputs go."""

    stage: Stage
    fingerprint: str
    files: list[str]
    params: list[str]
    run_dir: Path | None
    outputs: list[Path] = field(default_factory=list)

    @property
    def short(self) -> str:
        return self.fingerprint[:12]


def sidecar_outputs(kind: str, prefix: str, tag: str | None = None) -> list[Path]:
    """Sidecar paths of the datasets bound to ``{prefix}.datasets`` (gin parsed now)."""
    from recap.data.sidecars import sidecar_path
    from recap.data.specs import parse_dataset_specs

    specs = parse_dataset_specs(bound(f"{prefix}.datasets", []), bound(f"{prefix}.data_root", ""))
    tag = bound(f"{prefix}.tag", "") if tag is None else tag
    return [sidecar_path(spec.root, kind, tag) for spec in specs]


def run_metrics(run_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(the last value of every metric in ``metrics.jsonl``, the metrics logged at step 0)."""
    out: dict[str, float] = {}
    first: dict[str, float] = {}
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                values = {k: v for k, v in record.items() if k != "step"}
                out.update(values)
                if record.get("step") == 0:
                    first.update(values)
    return out, first
