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
Each is a ``Stage`` object in ``recap.workflow.stages.STAGES`` that owns
its wiring: the bindings pointing it at what it needs, the paths it owns, its output files, and
how its result reads (summary figures, MLflow metrics, summary-table cell, headline;
``recap.workflow.report`` assembles the summary). Steps 2-4
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

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from recap import logs, registry
from recap.cli import parse_gin
from recap.config_check import check_required, macros_read
from recap.configurable import clear_config, configured
from recap.configurable import config_text as parsed_config_text
from recap.errors import RecapError
from recap.ports import free_port
from recap.workflow import store
from recap.workflow.bindings import Binding, lines
from recap.workflow.config import PipelineConfig
from recap.workflow.fingerprints import stage_fingerprint
from recap.workflow.launch import deepspeed_executable, gin_flags, module_argv
from recap.workflow.report import summary_metrics, summary_table, track, ui_address
from recap.workflow.stages import BY_NAME, SCOPES, Planned

log = logs.get(__name__)


_SCOPED = re.compile(r"^\s*(" + "|".join(SCOPES) + r")\s*:(.+)$", re.DOTALL)
_OLD_SCOPED = re.compile(r"^\s*(" + "|".join(SCOPES) + r")/(.+)$", re.DOTALL)  # deprecated


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


def _parse_step(files: list[str], params: list[str], where: str) -> None:
    """gin parses ``files`` + ``params`` alone (and checks every binding)."""
    clear_config()
    try:
        parse_gin(files, params)
    except RecapError as exc:
        raise RecapError(f"pipeline step {where}: {exc}") from exc


_TRACKER_LINE = re.compile(r"^(\S+/)?(\S+\.)?Tracker\.\w+ = ")


def config_text(where: str) -> str:
    """The parsed config of a stage (``recap.configurable.config_text``), less ``Tracker``
    bindings: which configurables are bound, in which scopes, for its fingerprint to resolve
    (``recap.workflow.fingerprints``). Raises rather than fingerprint something partial."""
    try:
        text = parsed_config_text(max_line_length=10_000)
    except Exception as exc:
        raise RecapError(
            f"pipeline step {where}: its config could not be written ({type(exc).__name__}: "
            f"{exc}); the stage fingerprint needs its complete config"
        ) from exc
    written = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not written:
        raise RecapError(
            f"pipeline step {where}: its config lists no binding of its gin files; "
            "the stage fingerprint needs its complete config"
        )
    return "\n".join(line for line in written if not _TRACKER_LINE.match(line))


def plan(config: PipelineConfig, scoped: dict[str, list[str]]) -> dict[str, Planned]:
    """Fingerprint, bindings and outputs of every chosen stage, in order (gin checks them all:
    every configurable recap has is registered first)."""
    registry.register_all()
    try:
        return _plan(config, scoped)
    finally:  # a step that fails to parse leaves no bindings behind
        clear_config()


def _plan(config: PipelineConfig, scoped: dict[str, list[str]]) -> dict[str, Planned]:
    from recap.data.plan_checks import PlanChecks  # every dataset's info.json vs each step

    planned: dict[str, Planned] = {}
    checks = PlanChecks()
    for name in config.stages:
        stage = BY_NAME[name]
        files = config.steps[stage.step]
        extra = [b for k in stage.scopes for b in (*config.bindings.get(k, []), *scoped.get(k, []))]
        inputs = lines(stage.inputs(planned))
        _parse_step(files, [*extra, *inputs], name)
        needs = [planned[need].fingerprint for need in stage.needs]
        fingerprint = stage_fingerprint(name, stage.entry, config_text(name), needs)
        run_dir, owned = stage.owned(fingerprint, planned, config.run_root)
        tracking = []
        if stage.distributed:  # the steps that track themselves in MLflow
            tracking.append(Binding("Tracker", "run_name", f"{config.name}/{name}"))
            if config.sweep_name:
                tracking.append(Binding("Tracker", "sweep_name", config.sweep_name))
        params = [*extra, *inputs, *lines([*owned, *tracking])]
        _parse_step(files, params, name)  # the final bindings parse too; queries below use them
        check_required(stage.entry, f"pipeline step {name}: ", f"{stage.step}:")
        stage.check()
        checks.step(name)
        planned[name] = Planned(stage, fingerprint, files, params, run_dir, stage.outputs(run_dir))
    checks.finish()
    return planned


# ---- running ----------------------------------------------------------------------------------


def finished(root: Path, item: Planned) -> dict | None:
    """The stage's marker record when its outputs are still as it left them, else None."""
    return store.finished(root, item.stage.name, item.fingerprint)


def command(item: Planned, config: PipelineConfig) -> tuple[list[str], dict[str, str]]:
    """Argv and environment of one stage (inherited rank variables dropped; a plain process
    sets its own up in ``distributed.init``): ``deepspeed --num_gpus N --master_port P --module
    MODULE`` (plus the multi-node flags that are set) or ``python -m MODULE``, so an installed
    recap needs no checkout."""
    module = item.stage.module
    flags = gin_flags(item.files, item.params)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if item.stage.distributed and config.launcher == "deepspeed":
        words = [deepspeed_executable(), "--num_gpus", str(config.ranks),
                 "--master_port", str(free_port()), *_multinode_flags(config)]  # fmt: skip
        return [*module_argv(words, module), *flags], env
    return [*module_argv(["python"], module), *flags], env


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
    (root / store.MARKERS).mkdir(parents=True, exist_ok=True)
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
            "result": item.stage.result(item),
            "outputs": store.stamp(item.outputs),
        }
        store.record(root, name, item.fingerprint, record)
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


# ---- command line -------------------------------------------------------------------------------

SWEEP_KEYS = {"name", "gin_files", "gin_params", "grid"}


def load_pipeline(files: Sequence[str], params: Sequence[str], **overrides) -> PipelineConfig:
    """Parse the pipeline's gin files and (unscoped) bindings into its config."""
    clear_config()
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
        return configured(PipelineConfig)(**overrides)
    finally:
        clear_config()


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
        log.info(f"then open: {ui_address(uri, experiment)}")
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
        log.info(f"then open: {ui_address(uri, config.experiment)}")
        return 0

    return exit_code(body)
