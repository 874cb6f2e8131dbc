"""The pipeline's own settings as a typed value: gin binds them at the edge (the ``pipeline.*``
bindings), the config checks them when made; the planner, the runner and the summary read only
this."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from recap.configurable import REQUIRED, check_given, configurable
from recap.errors import RecapError
from recap.workflow.stages import BY_NAME, SCOPES, STAGES, STEP_KEYS

MULTINODE_LAUNCHERS = ("pdsh", "openmpi", "mvapich", "slurm", "impi")  # deepspeed --launcher


@configurable("pipeline")
@dataclass(frozen=True)
class PipelineConfig:
    """The pipeline's own settings (gin ``pipeline.*``), checked when made: an unknown step,
    scope or stage, a stage without the stages it needs, a bad launcher or multi-node option is
    one line. ``steps`` and ``bindings`` become lists, ``run_root`` a path, ``stages`` the
    chosen stages in pipeline order.

    Args:
        name: label of this pipeline run (summary, MLflow run names); not part of any output path.
        steps: step -> its gin files, for the steps in ``STEP_KEYS`` that run.
        bindings: extra bindings per step, or for ``"evaluate"`` (both evaluations) or ``"all"``.
        run_root: where the stages' run directories go (``{run_root}/{stage}/{fingerprint[:12]}``).
        ranks: processes per distributed step (``deepspeed --num_gpus ranks``).
        launcher: ``"deepspeed"`` or ``"python"`` (one process; ranks must be 1).
        evaluate: run the closed-loop evaluations (in ``evaluate_policy.env``; the reach task by
            default).
        stages: run only these stages (default: every stage whose step has gin files).
        experiment: the MLflow experiment of the pipeline's run.
        sweep_name: the sweep it belongs to (``Tracker.sweep_name`` of every stage).
        hostfile: DeepSpeed hostfile (``node1 slots=8`` per line) for the distributed steps
            (``deepspeed --hostfile``); ``ranks`` is then the processes per node.
        num_nodes: ``deepspeed --num_nodes`` (0: every host of the hostfile).
        master_addr: ``deepspeed --master_addr`` (empty: the first host of the hostfile).
        multinode_launcher: ``deepspeed --launcher``, one of ``MULTINODE_LAUNCHERS`` (empty:
            DeepSpeed's default, pdsh).
    """

    name: str = REQUIRED
    steps: dict[str, list[str]] = REQUIRED
    bindings: dict[str, list[str]] | None = None
    run_root: str | Path = "runs/pipeline"
    ranks: int = 1
    launcher: str = "deepspeed"
    evaluate: bool = False
    stages: Sequence[str] | None = None
    experiment: str = "pipeline"
    sweep_name: str = ""
    hostfile: str = ""
    num_nodes: int = 0
    master_addr: str = ""
    multinode_launcher: str = ""

    def __post_init__(self):
        check_given(self)
        steps, extra = self.steps, self.bindings or {}
        unknown = sorted(set(steps) - set(STEP_KEYS))
        if unknown:
            raise RecapError(f"pipeline.steps: unknown step(s) {unknown}; use {list(STEP_KEYS)}")
        bad = sorted(set(extra) - set(SCOPES))
        if bad:
            raise RecapError(f"pipeline.bindings: unknown key(s) {bad}; use {list(SCOPES)}")
        if self.launcher not in ("deepspeed", "python"):
            raise RecapError(f"pipeline.launcher: {self.launcher!r}; use 'deepspeed' or 'python'")
        if self.ranks < 1 or (self.launcher == "python" and self.ranks != 1):
            raise RecapError(f"pipeline.ranks: {self.ranks}; use >= 1 (exactly 1 with launcher "
                             "'python')")  # fmt: skip
        _check_multinode(self.launcher, self.hostfile, self.num_nodes, self.master_addr,
                         self.multinode_launcher)  # fmt: skip
        default = [s.name for s in STAGES
                   if s.step in steps and (self.evaluate or not s.evaluation)]  # fmt: skip
        chosen = list(self.stages) if self.stages is not None else default
        for stage in chosen:
            if stage not in BY_NAME:
                raise RecapError(f"pipeline.stages: unknown stage {stage!r}; use "
                                 f"{list(BY_NAME)}")  # fmt: skip
            if BY_NAME[stage].step not in steps:
                raise RecapError(f"pipeline.stages: {stage!r} needs pipeline.steps[{stage!r}] "
                                 "files")  # fmt: skip
            missing = [n for n in BY_NAME[stage].needs if n not in chosen]
            if missing:
                raise RecapError(f"pipeline.stages: {stage!r} needs {missing}; add them")
        typed = {
            "steps": {k: list(v) for k, v in steps.items()},
            "bindings": {k: list(v) for k, v in extra.items()},
            "run_root": Path(self.run_root),
            "ranks": int(self.ranks),
            "stages": [s.name for s in STAGES if s.name in chosen],
            "hostfile": str(self.hostfile),
            "num_nodes": int(self.num_nodes),
            "master_addr": str(self.master_addr),
            "multinode_launcher": str(self.multinode_launcher),
        }
        for key, value in typed.items():
            object.__setattr__(self, key, value)


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
