"""Steps 1-4 as one job: each step in its launcher, finished steps skipped, one summary.

A pipeline gin file names each step's own gin files and extra bindings::

    pipeline.name = "demo"
    pipeline.steps = {"returns": ["demo/returns.gin"], "value": ["demo/value.gin"],
                      "advantages": ["demo/advantages.gin"], "policy": ["demo/policy.gin"],
                      "baseline": ["demo/policy_bc.gin"]}
    pipeline.bindings = {"value": ["train.max_steps = 300"]}   # also "all", "evaluate"
    pipeline.ranks = 2

Command-line bindings ``STEP:binding`` (``value:deepspeed_config.lr = 3e-4``; STEP is a step
name, ``evaluate`` or ``all``) go to that step; a colon is never part of a gin binding, so a gin
scope named like a step is plain ``value:value/x.y`` (gin scope ``value`` in the value step). The
older ``STEP/binding`` still works as it did (prefix taken off once) with a deprecation warning.
Other bindings configure the pipeline itself (``pipeline.*``, a macro its files read,
``include``): any other is a one-line error.

Stages, in order (``needs`` in brackets): returns; value [returns]; advantages [value];
policy [advantages]; baseline (behaviour cloning, no advantage text) []; evaluate_policy
[policy]; evaluate_baseline [baseline]; and RLinf's recipe (``demo/pipeline.gin``): sft (a
policy on the demonstrations) []; finetune [advantages, sft] and finetune_bc [sft], both
starting from sft's weights and normalization; evaluate_finetune_bc [finetune_bc];
evaluate_finetune [finetune], paired with evaluate_finetune_bc over the same episodes.
Each is a ``Stage`` object in ``STAGES`` that owns
its wiring: the bindings pointing it at what it needs, the paths it owns, its output files, and
how its result reads (summary figures, MLflow metrics, summary-table cell, headline). Steps 2-4
run under ``deepspeed --num_gpus {ranks}`` (or one plain process with ``pipeline.launcher =
"python"``); Step 1 and the closed-loop evaluations (demo task only, ``pipeline.evaluate``) are
single processes. Several nodes: ``pipeline.hostfile`` / ``num_nodes`` / ``master_addr`` /
``multinode_launcher`` add ``--hostfile`` / ``--num_nodes`` / ``--master_addr`` / ``--launcher``
to every ``deepspeed`` command (``ranks`` is then per node).

Content-addressed outputs: a stage's fingerprint hashes its resolved configuration (every
parameter of the configurables its step reads, bound value or default, canonical JSON;
``Tracker`` left out), its step's ``STEP_VERSION`` and the fingerprints of the stages it needs
(``recap.workflow.fingerprints``; binding a default changes nothing). Its run directory is
``{run_root}/{stage}/{fingerprint[:12]}`` and the advantages tag
``adv_{fingerprint[:12]}``, so rerunning the same configuration skips finished stages, changing
one binding reruns only that stage and those after it (an interrupted training resumes from its
checkpoint), going back to an earlier configuration reuses its outputs, sweep points share what
they have in common, and no earlier result is overwritten. A stage counts as finished when its
marker ``{run_root}/.pipeline/{stage}-{fingerprint}.json`` exists and the output files it lists
have the recorded sizes and modification times (``--force STAGE`` reruns one anyway). The
pipeline binds the paths it owns (``train.run_dir``, ``compute_advantages.model_path`` / ``tag`` /
``output_dir``, ``policy_data.advantages_tag``, ``evaluate_policy.run_dir``, ``Tracker.run_name``)
after everything else. Step 1 writes the returns tag of its own gin files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import gin
import numpy as np
import pyarrow.parquet as pq

from recap import logs, registry
from recap.cli import parse_gin
from recap.config_check import bound, check_required, macros_read
from recap.errors import RecapError
from recap.io import write_atomic
from recap.workflow.fingerprints import stage_fingerprint

log = logs.get(__name__)
MARKERS = ".pipeline"
MULTINODE_LAUNCHERS = ("pdsh", "openmpi", "mvapich", "slurm", "impi")  # deepspeed --launcher
_TRAIN, _EVALUATE = "recap.commands.train", "recap.commands.evaluate_policy"


# ---- stages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One pipeline stage and all of its wiring. A new stage is a subclass (or an instance of
    one) added to ``STAGES``: the planner, the runner and the summary only call these hooks.

    The class says what runs (``module``: ``python -m`` / ``deepspeed --module``; ``entry``: the
    configurable it calls, its ``gin.REQUIRED`` values checked at plan time; ``distributed``:
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

    def inputs(self, planned: dict[str, Planned]) -> list[str]:
        """Bindings pointing it at the outputs of the stages it needs (fingerprinted)."""
        return []

    def owned(
        self, fingerprint: str, planned: dict[str, Planned], root: Path
    ) -> tuple[Path | None, list[str]]:
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
        return _sidecars("returns", "compute_returns")

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
        return run_dir, [f'train.run_dir = "{run_dir}"']

    def check(self):  # NVMe parameter offload: can this machine swap at all?
        from recap.engine.deepspeed_config import check_nvme_offload

        try:
            check_nvme_offload(bound("deepspeed_config.offload_param", "none"))
        except RecapError as exc:
            raise RecapError(f"pipeline step {self.name}: {exc}") from exc

    def outputs(self, run_dir):
        return [run_dir / "model.safetensors"]

    def result(self, item):
        metrics, untrained = _run_metrics(item.run_dir)
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
        return [f'compute_advantages.model_path = "{planned[self.needs[0]].run_dir}"']

    def owned(self, fingerprint, planned, root):
        run_dir = root / self.name / fingerprint[:12]
        return run_dir, [
            f'compute_advantages.tag = "{self.tag(fingerprint)}"',
            f'compute_advantages.output_dir = "{run_dir}"',
        ]

    def outputs(self, run_dir):
        return _sidecars("advantages", "compute_advantages")

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
        return [f'policy_data.advantages_tag = "{AdvantagesStage.tag(planned[n].fingerprint)}"'
                for n in self.needs if isinstance(planned[n].stage, AdvantagesStage)]  # fmt: skip

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
        return [*super().inputs(planned), f'pi05_policy.checkpoint = "{base}"',
                f'policy_data.checkpoint = "{base}"']  # fmt: skip


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
        return trained, [f'evaluate_policy.run_dir = "{trained}"', f'train.run_dir = "{trained}"']

    def result(self, item):
        record = json.loads((item.run_dir / "closed_loop.json").read_text())
        return {"success": record["success"], "num_episodes": record["num_episodes"]}

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
        record = json.loads((item.run_dir / "closed_loop.json").read_text())
        return {"success": record["success"], "num_episodes": record["num_episodes"],
                "outcomes": record["outcomes"]}  # fmt: skip


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
_SCOPED = re.compile(r"^\s*(" + "|".join(SCOPES) + r")\s*:(.+)$", re.DOTALL)
_OLD_SCOPED = re.compile(r"^\s*(" + "|".join(SCOPES) + r")/(.+)$", re.DOTALL)  # deprecated


@dataclass
class PipelineConfig:
    name: str
    steps: dict[str, list[str]]
    bindings: dict[str, list[str]]
    run_root: Path
    ranks: int
    launcher: str
    evaluate: bool
    stages: list[str]
    experiment: str
    sweep_name: str = ""
    hostfile: str = ""
    num_nodes: int = 0
    master_addr: str = ""
    multinode_launcher: str = ""


@gin.configurable("pipeline")
def pipeline_config(
    name: str = gin.REQUIRED,
    steps: dict = gin.REQUIRED,
    bindings: dict | None = None,
    run_root: str = "runs/pipeline",
    ranks: int = 1,
    launcher: str = "deepspeed",
    evaluate: bool = False,
    stages: Sequence[str] | None = None,
    experiment: str = "pipeline",
    sweep_name: str = "",
    hostfile: str = "",
    num_nodes: int = 0,
    master_addr: str = "",
    multinode_launcher: str = "",
) -> PipelineConfig:
    """The pipeline's own settings (gin ``pipeline.*``).

    Args:
        name: label of this pipeline run (summary, MLflow run names); not part of any output path.
        steps: step -> its gin files, for the steps in ``STEP_KEYS`` that run.
        bindings: extra bindings per step, or for ``"evaluate"`` (both evaluations) or ``"all"``.
        ranks: processes per distributed step (``deepspeed --num_gpus ranks``).
        launcher: ``"deepspeed"`` or ``"python"`` (one process; ranks must be 1).
        evaluate: run the closed-loop evaluations (in ``evaluate_policy.env``; the reach task by
            default).
        stages: run only these stages (default: every stage whose step has gin files).
        hostfile: DeepSpeed hostfile (``node1 slots=8`` per line) for the distributed steps
            (``deepspeed --hostfile``); ``ranks`` is then the processes per node.
        num_nodes: ``deepspeed --num_nodes`` (0: every host of the hostfile).
        master_addr: ``deepspeed --master_addr`` (empty: the first host of the hostfile).
        multinode_launcher: ``deepspeed --launcher``, one of ``MULTINODE_LAUNCHERS`` (empty:
            DeepSpeed's default, pdsh).
    """
    unknown = sorted(set(steps) - set(STEP_KEYS))
    if unknown:
        raise RecapError(f"pipeline.steps: unknown step(s) {unknown}; use {list(STEP_KEYS)}")
    extra = bindings or {}
    bad = sorted(set(extra) - set(SCOPES))
    if bad:
        raise RecapError(f"pipeline.bindings: unknown key(s) {bad}; use {list(SCOPES)}")
    if launcher not in ("deepspeed", "python"):
        raise RecapError(f"pipeline.launcher: {launcher!r}; use 'deepspeed' or 'python'")
    if ranks < 1 or (launcher == "python" and ranks != 1):
        raise RecapError(f"pipeline.ranks: {ranks}; use >= 1 (exactly 1 with launcher 'python')")
    _check_multinode(launcher, hostfile, num_nodes, master_addr, multinode_launcher)
    default = [s.name for s in STAGES if s.step in steps and (evaluate or not s.evaluation)]
    chosen = list(stages) if stages is not None else default
    for stage in chosen:
        if stage not in BY_NAME:
            raise RecapError(f"pipeline.stages: unknown stage {stage!r}; use {list(BY_NAME)}")
        if BY_NAME[stage].step not in steps:
            raise RecapError(f"pipeline.stages: {stage!r} needs pipeline.steps[{stage!r}] files")
        missing = [n for n in BY_NAME[stage].needs if n not in chosen]
        if missing:
            raise RecapError(f"pipeline.stages: {stage!r} needs {missing}; add them")
    return PipelineConfig(
        name=name,
        steps={k: list(v) for k, v in steps.items()},
        bindings={k: list(v) for k, v in extra.items()},
        run_root=Path(run_root),
        ranks=int(ranks),
        launcher=launcher,
        evaluate=evaluate,
        stages=[s.name for s in STAGES if s.name in chosen],
        experiment=experiment,
        sweep_name=sweep_name,
        hostfile=str(hostfile),
        num_nodes=int(num_nodes),
        master_addr=str(master_addr),
        multinode_launcher=str(multinode_launcher),
    )


def _check_multinode(
    launcher: str, hostfile: str, num_nodes: int, master_addr: str, multinode_launcher: str
) -> None:
    """The multi-node options: one line for a bad value, before anything is planned."""
    if multinode_launcher and multinode_launcher not in MULTINODE_LAUNCHERS:
        raise RecapError(
            f"pipeline.multinode_launcher: {multinode_launcher!r}; use one of "
            f"{list(MULTINODE_LAUNCHERS)} (deepspeed --launcher)"
        )
    if int(num_nodes) < 0:
        raise RecapError(f"pipeline.num_nodes: {num_nodes}; use >= 1 (0: every hostfile host)")
    multinode = bool(hostfile or num_nodes or master_addr or multinode_launcher)
    if multinode and launcher != "deepspeed":
        raise RecapError(
            f"pipeline.launcher: {launcher!r} runs one process; the multi-node options "
            "(hostfile, num_nodes, master_addr, multinode_launcher) need 'deepspeed'"
        )
    if hostfile and not Path(hostfile).is_file():
        raise RecapError(
            f"pipeline.hostfile: {hostfile} is not a file; write one line per node, "
            "e.g. 'node1 slots=8'"
        )


def split_params(
    params: Sequence[str], *, warned: set[str] | None = None
) -> tuple[list[str], dict[str, list[str]]]:
    """Command-line bindings -> (pipeline bindings, {scope: step bindings}). ``STEP:binding``
    goes to STEP; the older ``STEP/binding`` too (prefix taken off once), with a one-line
    deprecation warning on stderr (once per binding in ``warned``, when given). A binding that
    configures neither (``valeu:train.max_steps``, ``train.max_steps``) is a one-line error."""
    warned = set() if warned is None else warned
    own, scoped = [], {}
    for param in params:
        match = _SCOPED.match(param)
        if not match:
            match = _OLD_SCOPED.match(param)
            if match and param not in warned:
                warned.add(param)
                new = f"{match.group(1)}:{match.group(2).strip()}"
                print(
                    f"warning: --gin_param {param.strip()!r}: STEP/binding is deprecated (it "
                    f"hides gin scopes named like a step); write {new!r}",
                    file=sys.stderr,
                )
        if match:
            scoped.setdefault(match.group(1), []).append(match.group(2).strip())
        else:
            _check_own(param)
            own.append(param)
    return own, scoped


def _check_own(param: str) -> None:
    """A command-line binding without a step prefix configures the pipeline itself: it must be
    ``pipeline.*``, a macro or an ``include`` / ``import`` (the pipeline's gin files read them);
    anything else would be silently dropped."""
    import difflib

    lhs = param.partition("=")[0].strip()
    if re.match(r"^(include|import)\s", lhs):
        return
    scope, _, name = lhs.rpartition("/")
    steps = ", ".join(SCOPES)
    if ":" in lhs or scope:  # STEP:binding (a colon is no part of a gin binding) or STEP/binding
        step, _, rest = lhs.partition(":" if ":" in lhs else "/")
        step, rest = step.strip(), rest.strip()
        close = difflib.get_close_matches(step, SCOPES, n=1, cutoff=0.6)
        fix = (f"did you mean {close[0]}:{rest}? (STEP one of {steps})" if close
               else f"bind STEP:{rest} with STEP one of {steps}")  # fmt: skip
        raise RecapError(f"--gin_param {param.strip()!r}: {step!r} is not a pipeline step; {fix}")
    if "." in name and name.split(".")[0] != "pipeline":
        raise RecapError(f"--gin_param {param.strip()!r}: configures no step (the pipeline's "
                         f"own bindings are pipeline.*); bind STEP:{name} with STEP one of "
                         f"{steps}")  # fmt: skip


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


def _register_configurables() -> None:
    """Every configurable recap has, so gin checks every binding of every step."""
    registry.register_all()


def _parse_step(files: list[str], params: list[str], where: str) -> None:
    """gin parses ``files`` + ``params`` alone (and checks every binding)."""
    gin.clear_config()
    try:
        parse_gin(files, params)
    except RecapError as exc:
        raise RecapError(f"pipeline step {where}: {exc}") from exc


_TRACKER_LINE = re.compile(r"^(\S+/)?(\S+\.)?Tracker\.\w+ = ")


def config_text(where: str) -> str:
    """The parsed gin config of a stage (gin's public ``config_str()``), less ``Tracker``
    bindings: which configurables are bound, in which scopes, for its fingerprint to resolve
    (``recap.workflow.fingerprints``). Raises rather than fingerprint something partial."""
    try:
        text = gin.config_str(max_line_length=10_000)
    except Exception as exc:
        raise RecapError(
            f"pipeline step {where}: gin.config_str() failed ({type(exc).__name__}: {exc}); "
            "the stage fingerprint needs its complete config"
        ) from exc
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not lines:
        raise RecapError(
            f"pipeline step {where}: gin.config_str() lists no binding of its gin files; "
            "the stage fingerprint needs its complete config"
        )
    return "\n".join(line for line in lines if not _TRACKER_LINE.match(line))


def _sidecars(kind: str, prefix: str, tag: str | None = None) -> list[Path]:
    """Sidecar paths of the datasets bound to ``{prefix}.datasets`` (gin parsed now)."""
    from recap.data.sidecars import sidecar_path
    from recap.data.specs import parse_dataset_specs

    specs = parse_dataset_specs(bound(f"{prefix}.datasets", []), bound(f"{prefix}.data_root", ""))
    tag = bound(f"{prefix}.tag", "") if tag is None else tag
    return [sidecar_path(spec.root, kind, tag) for spec in specs]


def plan(config: PipelineConfig, scoped: dict[str, list[str]]) -> dict[str, Planned]:
    """Fingerprint, bindings and outputs of every chosen stage, in order (gin checks them all)."""
    _register_configurables()
    try:
        return _plan(config, scoped)
    finally:  # a step that fails to parse leaves no bindings behind
        gin.clear_config()


def _plan(config: PipelineConfig, scoped: dict[str, list[str]]) -> dict[str, Planned]:
    from recap.data.plan_checks import PlanChecks  # every dataset's info.json vs each step

    planned: dict[str, Planned] = {}
    checks = PlanChecks()
    for name in config.stages:
        stage = BY_NAME[name]
        files = config.steps[stage.step]
        extra = [b for k in stage.scopes for b in (*config.bindings.get(k, []), *scoped.get(k, []))]
        inputs = stage.inputs(planned)
        _parse_step(files, [*extra, *inputs], name)
        needs = [planned[need].fingerprint for need in stage.needs]
        fingerprint = stage_fingerprint(name, stage.entry, config_text(name), needs)
        run_dir, owned = stage.owned(fingerprint, planned, config.run_root)
        params = [*extra, *inputs, *owned]
        if stage.distributed:  # the steps that track themselves in MLflow
            params.append(f'Tracker.run_name = "{config.name}/{name}"')
            if config.sweep_name:
                params.append(f'Tracker.sweep_name = "{config.sweep_name}"')
        _parse_step(files, params, name)  # the final bindings parse too; queries below use them
        check_required(stage.entry, f"pipeline step {name}: ", f"{stage.step}:")
        stage.check()
        checks.step(name)
        planned[name] = Planned(stage, fingerprint, files, params, run_dir, stage.outputs(run_dir))
    checks.finish()
    return planned


# ---- running ----------------------------------------------------------------------------------


def _marker(root: Path, item: Planned) -> Path:
    return root / MARKERS / f"{item.stage.name}-{item.fingerprint}.json"


def stamp(paths: list[Path]) -> dict[str, list[int]]:
    """Size and modification time (ns) of each file, keyed by its path."""
    out = {}
    for path in paths:
        st = path.stat()
        out[str(path)] = [st.st_size, st.st_mtime_ns]
    return out


def unchanged(outputs: dict[str, list[int]]) -> bool:
    """Whether every file ``stamp`` recorded in ``outputs`` is still there as it was."""
    try:
        return stamp([Path(p) for p in outputs]) == outputs
    except OSError:
        return False


def finished(root: Path, item: Planned) -> dict | None:
    """The stage's marker record when its outputs are still as it left them, else None."""
    marker = _marker(root, item)
    if not marker.is_file():
        return None
    record = json.loads(marker.read_text())
    return record if unchanged(record.get("outputs", {})) else None


def command(item: Planned, config: PipelineConfig) -> tuple[list[str], dict[str, str]]:
    """Argv and environment of one stage (inherited rank variables dropped; a plain process
    sets its own up in ``distributed.init``): ``deepspeed --num_gpus N --master_port P --module
    MODULE`` (plus the multi-node flags that are set) or ``python -m MODULE``, so an installed
    recap needs no checkout."""
    from recap.engine.distributed import free_port

    module = item.stage.module
    flags = [a for f in item.files for a in ("--gin_file", f)]
    flags += [a for p in item.params for a in ("--gin_param", p)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if item.stage.distributed and config.launcher == "deepspeed":
        launcher = Path(sys.executable).parent / "deepspeed"
        argv = [str(launcher) if launcher.exists() else "deepspeed"]
        argv += ["--num_gpus", str(config.ranks), "--master_port", str(free_port())]
        argv += _multinode_flags(config)
        return [*argv, "--module", module, *flags], env
    return [sys.executable, "-m", module, *flags], env


def _multinode_flags(config: PipelineConfig) -> list[str]:
    """``deepspeed`` flags of the multi-node options that are set (none on one node)."""
    flags = []
    if config.hostfile:
        flags += ["--hostfile", str(Path(config.hostfile).resolve())]
    if config.num_nodes:
        flags += ["--num_nodes", str(config.num_nodes)]
    if config.master_addr:
        flags += ["--master_addr", config.master_addr]
    if config.multinode_launcher:
        flags += ["--launcher", config.multinode_launcher]
    return flags


def _run_metrics(run_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
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


def result_of(item: Planned) -> dict:
    """The summary figures of a finished stage, read from its outputs."""
    return item.stage.result(item)


def decide(
    config: PipelineConfig, planned: dict[str, Planned], force: Sequence[str]
) -> dict[str, dict | None]:
    """Stage -> its marker record when it is skipped, None when it runs: a stage runs when it
    is forced, not finished, or needs a stage that runs."""
    unknown = sorted(set(force) - set(config.stages))
    if unknown:
        raise RecapError(f"--force: {unknown} are not stages of this pipeline {config.stages}")
    out: dict[str, dict | None] = {}
    for name, item in planned.items():
        stale = name in force or any(out[n] is None for n in item.stage.needs)
        out[name] = None if stale else finished(config.run_root, item)
    return out


def run_pipeline(
    config: PipelineConfig,
    scoped: dict[str, list[str]],
    force: Sequence[str] = (),
    planned: dict[str, Planned] | None = None,
) -> dict[str, dict]:
    """Run (or skip) every stage; returns stage -> {"status", "wall_s", "result", ...}.
    ``planned``: ``plan(config, scoped)`` when the caller already has it."""
    planned = plan(config, scoped) if planned is None else planned
    skips = decide(config, planned, force)
    root = config.run_root
    (root / MARKERS).mkdir(parents=True, exist_ok=True)
    report: dict[str, dict] = {}
    total = len(planned)
    for index, (name, item) in enumerate(planned.items(), start=1):
        record = skips[name]
        where = item.run_dir if item.run_dir is not None else root
        if record is not None:
            log.info(f"== [{index}/{total}] {name} ({item.short}): finished before, skipped")
            report[name] = {**record, "status": "skipped"}
            continue
        argv, env = command(item, config)
        log.info(f"== [{index}/{total}] {name} ({item.short}): {shlex.join(argv)}")
        if item.run_dir is not None and not item.stage.evaluation:
            item.run_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        code = subprocess.run(argv, env=env).returncode
        wall = time.perf_counter() - start
        if code != 0:
            raise PipelineStepFailed(name, code, where)
        record = {
            "stage": name,
            "fingerprint": item.fingerprint,
            "run_dir": str(item.run_dir) if item.run_dir else None,
            "wall_s": round(wall, 1),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "params": item.params,
            "result": result_of(item),
            "outputs": stamp(item.outputs),
        }
        write_json(_marker(root, item), record)
        report[name] = {**record, "status": "ran"}
    return report


class PipelineStepFailed(RecapError):
    def __init__(self, stage: str, code: int, where: Path):
        super().__init__(
            f"pipeline: step {stage} failed (exit {code}); its error is printed above. Fix it "
            f"and rerun the same command: finished steps are skipped (outputs under {where})"
        )
        self.code = code


def exit_code(body: Callable[[], int]) -> int:
    """Run a command's body: a failed step or a RecapError is one line on stderr and the exit
    code (the step's own, or 2), never a traceback."""
    from recap.errors import one_line

    try:
        return body()
    except PipelineStepFailed as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return exc.code
    except RecapError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2


def write_json(path: Path, obj: dict) -> None:
    """``obj`` as indented, key-sorted JSON at ``path``, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


# ---- summary -----------------------------------------------------------------------------------


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
    from recap.engine.tracking import Tracker

    key = hashlib.sha256("".join(e["fingerprint"] for e in report.values()).encode()).hexdigest()
    run_dir = config.run_root / "pipelines" / f"{config.name}-{key[:12]}"
    run_dir.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(config.experiment, run_name=config.name, sweep_name=config.sweep_name)
    gin.clear_config()
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


def _ui_address(uri: str, experiment: str) -> str:
    """The MLflow UI page of the experiment's runs (model training view)."""
    from recap.engine.tracking import ui_address

    return ui_address(uri, experiment)


# ---- command line -------------------------------------------------------------------------------

SWEEP_KEYS = {"name", "gin_files", "gin_params", "grid"}


def load_pipeline(files: Sequence[str], params: Sequence[str], **overrides) -> PipelineConfig:
    """Parse the pipeline's gin files and (unscoped) bindings into its config."""
    gin.clear_config()
    try:
        parse_gin(files, params)
        read = macros_read("pipeline")
        for param in params:
            macro = param.partition("=")[0].strip()
            if re.fullmatch(r"\w+", macro) and macro not in read:
                raise RecapError(
                    f"--gin_param {param.strip()!r}: the pipeline's own config reads no macro "
                    f"{macro}; bind STEP:{macro} (all:{macro} for every step)"
                )
        return pipeline_config(**overrides)
    finally:
        gin.clear_config()


def dry_run(
    config: PipelineConfig,
    scoped: dict[str, list[str]],
    force: Sequence[str],
    planned: dict[str, Planned] | None = None,
) -> None:
    """Print what would run and what would be skipped."""
    planned = plan(config, scoped) if planned is None else planned
    skips = decide(config, planned, force)
    for name, item in planned.items():
        argv, _ = command(item, config)
        status = "run" if skips[name] is None else "skip (finished)"
        print(f"{name:18s} {item.short}  {status:15s} {shlex.join(argv)}")


def run_sweep(path: str, extra: Sequence[str], force: Sequence[str], dry: bool) -> int:
    """One pipeline per grid point (shared stages run once); prints a comparison table."""
    from recap.sweep import binding, label, load_sweep, points

    spec = load_sweep(path, SWEEP_KEYS)
    grid = spec.get("grid") or {}
    runs, warned = [], set()
    for i, point in enumerate(points(grid) or [{}]):
        params = [*spec.get("gin_params", []), *extra, *(binding(k, v) for k, v in point.items())]
        own, scoped = split_params(params, warned=warned)  # a deprecation warning once
        name = f"{spec['name']}-{i:03d}"
        config = load_pipeline(spec["gin_files"], own, name=name, sweep_name=spec["name"])
        # every point is planned (so gin-checked) before anything runs
        runs.append((name, label(point), config, scoped, plan(config, scoped)))
    rows = []
    for name, text, config, scoped, planned in runs:
        log.info(f"==== sweep {spec['name']}: {name} {text}")
        if dry:
            dry_run(config, scoped, force, planned)
            continue
        report = run_pipeline(config, scoped, force, planned)
        uri = track(config, scoped, report)
        log.info(summary_table(config, report, uri))
        rows.append((name, text, summary_metrics(report)))
    if rows:
        keys = [k for k in rows[0][2] if not k.startswith("wall_s/")]
        log.info(f"sweep {spec['name']}: " + " | ".join(["point", "bindings", *keys]))
        for name, text, metrics in rows:
            values = [f"{metrics[k]:.3f}" if k in metrics else "-" for k in keys]
            log.info(" | ".join([name, text, *values]))
        experiment = runs[0][2].experiment
        log.info(
            f"compare: mlflow ui --backend-store-uri {uri}  (experiment {experiment!r}, "
            f"filter tags.recap.sweep = '{spec['name']}')"
        )
        log.info(f"then open: {_ui_address(uri, experiment)}")
    return 0


def build_parser():
    """``recap-pipeline``'s flags; ``--help`` says what each is, its default and its choices."""
    from recap.cli import build_parser as gin_parser

    parser = gin_parser("Run Steps 1-4 as one job; finished steps are skipped.")
    parser.add_argument("--force", action="append", default=[], help="rerun this stage (repeat)")
    parser.add_argument("--sweep", default=None, help="sweep YAML: one pipeline per grid point")
    parser.add_argument("--dry_run", action="store_true", help="print the plan, run nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        if args.sweep:
            return run_sweep(args.sweep, args.gin_param, args.force, args.dry_run)
        if not args.gin_file:
            raise RecapError("--gin_file: give the pipeline's gin file, e.g. demo/pipeline.gin")
        own, scoped = split_params(args.gin_param)
        config = load_pipeline(args.gin_file, own)
        if args.dry_run:
            dry_run(config, scoped, args.force)
            return 0
        report = run_pipeline(config, scoped, args.force)
        uri = track(config, scoped, report)
        log.info(summary_table(config, report, uri))
        log.info(f"then open: {_ui_address(uri, config.experiment)}")
        return 0

    return exit_code(body)
