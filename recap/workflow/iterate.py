"""Iterative RECAP: collect with the current policy, Steps 1-4 over all data so far, repeat.

For k = 1 .. ``iterate.iterations``:

1. **Collect** ``iterate.episodes`` closed-loop episodes (``recap.envs.rollout.collect``) with
   policy k-1 at guidance ``beta``, ``replan_steps`` actions per chunk, optionally corrected by
   the task's scripted expert (``expert``, takeover when the action is farther than ``drift``
   from the expert's) into a new LeRobot v3.0 dataset ``{root}/iter{k}/rollout-{fp[:12]}`` with
   ``is_success`` and ``is_correction``. Policy 0 is the pipeline's ``baseline`` run (behaviour
   cloning on the base data; trained first when it is not finished) or a given run
   (``start_run``, loaded with the gin files of ``pipeline.steps[start_step]``); policy k is
   iteration k's ``policy`` run. Episode seeds: ``seed + (k-1) * episodes`` onwards.
   **Or recorded** (``iterate.recorded``: one ``recap-serve --record`` directory per iteration):
   iteration k's collection is the episodes finished in ``recorded[k-1]`` (a robot's episodes,
   human interventions recorded as ``is_correction``), merged into one LeRobot v3.0 dataset
   ``{root}/iter{k}/recorded-{fp[:12]}`` (``recap.data.merge``; ``fp`` hashes the episodes'
   names, sizes and modification times, so recording more episodes makes a new collection).
   Merged rather than passed as a list: 500 one-episode datasets would be 500 entries in every
   step's bindings and fingerprints, 500 returns and 500 advantages sidecars per round and 500
   datasets opened by every reader; the merge is file copies, once per round. Nothing is
   simulated and no policy 0 is needed (``policy_init = "retrain"``; ``"finetune"`` starts from
   the baseline or ``start_run`` as above). ``recap-iterate --recorded DIR --serve`` runs Steps
   1-4 on the recordings and then serves the new policy (``recap-serve``).
2. **Steps 1-4** through ``recap.workflow.pipeline`` (``plan`` / ``run_pipeline``) with every step's
   dataset list (``compute_returns`` / ``value_data`` / ``compute_advantages`` / ``policy_data``
   ``.datasets``) extended by every rollout collected so far, and a Step 1 tag of its own,
   ``{tag}_iter{k}_{F[:12]}`` with ``F`` the fingerprint of Step 1 planned under the tag
   ``{tag}_iter{k}`` (its gin configuration and dataset list): the returns of the base
   datasets are written beside them once per iteration and per loop, never over an earlier
   iteration's nor over another loop's (two loops over the same base data, say with and without
   corrections, would otherwise rewrite each other's sidecars and so each other's finished
   Step 1). The run root is the pipeline's, shared:
   content addressing gives the changed configurations new fingerprints, so each iteration's
   value model, advantage tag and policy get directories of their own and are kept, and what
   did not change (the baseline) is reused. The policy is retrained from the base checkpoint
   (``policy_init = "retrain"``, the paper) or fine-tuned from policy k-1 (``"finetune"``:
   ``pi05_policy.checkpoint`` = its run directory). The value model is retrained.
3. **Tracking**: one MLflow run per iteration (experiment ``iterate.experiment``, run name
   ``{pipeline.name}-iter{k}``, tags ``iteration`` = k), with the pipeline's summary figures,
   the collection's success rate and corrections, and the stage fingerprints.

A finished iteration is skipped: its marker ``{root}/.iterate/iter{k}-{key}.json`` (``key``
hashes the collection's and the stages' fingerprints) records the collected files' sizes and
modification times, and every stage it ran must still be ``recap.workflow.pipeline.finished``. A
collection is content-addressed too (its fingerprint hashes the collecting policy's fingerprint
and every collection setting), so a changed upstream policy collects into a new directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from recap import logs
from recap.configurable import REQUIRED, clear_config, configurable, configured
from recap.envs.factory import ENVS, EXPERTS, known_env
from recap.errors import RecapError
from recap.io import write_json
from recap.registry import register
from recap.workflow.bindings import Binding, lines
from recap.workflow.config import PipelineConfig
from recap.workflow.pipeline import finished, load_pipeline, plan, run_pipeline, split_params
from recap.workflow.report import summary_metrics
from recap.workflow.store import stamp, unchanged

log = logs.get(__name__)
MARKERS = ".iterate"
# step -> the configurable whose ``datasets`` (and ``data_root``) it reads
DATASETS_OF = {
    "returns": "compute_returns",
    "value": "value_data",
    "advantages": "compute_advantages",
    "policy": "policy_data",
}
# step -> (configurable, parameter) naming the Step 1 tag it writes or reads
RETURNS_TAG_OF = {
    "returns": ("compute_returns", "tag"),
    "value": ("value_data", "returns_tag"),
    "advantages": ("compute_advantages", "returns_tag"),
}
POLICY_INITS = ("retrain", "finetune")
VALUE_INITS = ("retrain",)
_OWN = re.compile(r"^\s*iterate\.")
_KINDS = {"int": int, "float": float, "bool": bool, "str": str}


@configurable("iterate")
@dataclass(frozen=True)
class IterateConfig:
    """The loop's own settings (gin ``iterate.*``; module docstring), coerced to the annotated
    types and checked when constructed: one list of the fields, their defaults and types.

    Args:
        iterations: K, the number of collect + Steps 1-4 rounds.
        episodes: episodes collected per iteration; ``seed``: iteration k's episode j starts at
            ``reset(seed + (k-1) * episodes + j)``.
        beta, guidance, num_steps, noise_seed: the collecting policy's sampling (as
            ``recap-collect``; a behaviour-cloning policy has one prompt, beta does not matter).
        replan_steps, num_envs: actions executed per chunk; environments run in lockstep.
        env, env_options: any environment ``recap.envs.factory.env_factory`` builds:
            ``"reach"`` (the demo task: ``max_steps``, ``state_targets`` as the demo data was
            written), ``"metaworld"`` (``env_options`` such as ``{"env_name": "push-v3",
            "image_size": 32}``), ``"libero"`` (``suite``, ``task_id``; needs ``hf-libero``) or
            ``"package.module:Factory"``; ``env_options``: its constructor's keyword arguments.
        expert, drift, takeover_steps: scripted-expert corrections (reach, metaworld): the expert
            takes over for ``takeover_steps`` steps when the action's L2 distance from its own
            exceeds ``drift`` (over dx, dy for reach; dx, dy, dz for metaworld: the factory's
            ``drift_dims``); those frames are ``is_correction``.
        naming, image_dtype: the collected datasets' column naming and image storage.
        start_run: policy 0's run directory (default: the pipeline's ``baseline`` stage), loaded
            with the gin files of ``pipeline.steps[start_step]``.
        policy_init: ``"retrain"`` (from the policy step's own initialization, the paper) or
            ``"finetune"`` (from policy k-1's weights).
        value_init: ``"retrain"`` (fine-tuning the value model needs a hook recap lacks).
        root: where collections, markers and iteration records go (default
            ``{pipeline.run_root}/iterate``).
        experiment: MLflow experiment of the per-iteration runs.
        recorded: one ``recap-serve --record`` directory per iteration (``iterations`` of
            them; a single string is one): iteration k's collection is ``recorded[k-1]``'s
            finished episodes merged into one dataset, instead of simulated rollouts (module
            docstring); the simulation settings above are then unused.
    """

    iterations: int = REQUIRED
    episodes: int = 100
    seed: int = 2000
    beta: float = 1.0
    guidance: str = "positive"
    num_steps: int | None = None
    noise_seed: int = 0
    replan_steps: int = 1
    num_envs: int = 50
    env: str = "reach"
    env_options: dict | None = None
    max_steps: int | None = None
    state_targets: bool = False
    suite: str = "libero_10"
    task_id: int = 0
    expert: bool = False
    drift: float = 1.0
    takeover_steps: int = 5
    naming: str = "lerobot"
    image_dtype: str = "video"
    start_run: str = ""
    start_step: str = "baseline"
    policy_init: str = "retrain"
    value_init: str = "retrain"
    root: str = ""
    experiment: str = "iterate"
    recorded: tuple[str, ...] = ()

    def __post_init__(self):
        for f in dataclasses.fields(self):  # gin may bind 1 for a float, 1.0 for an int
            kind, value = _KINDS.get(str(f.type).removesuffix(" | None")), getattr(self, f.name)
            if kind is not None and value is not None:
                object.__setattr__(self, f.name, kind(value))
        if self.iterations < 1:
            raise RecapError(f"iterate.iterations: {self.iterations}; run at least one iteration")
        recorded = self.recorded
        recorded = (recorded,) if isinstance(recorded, (str, Path)) else tuple(recorded or ())
        object.__setattr__(self, "recorded", tuple(str(r) for r in recorded if str(r)))
        if self.recorded and len(self.recorded) != self.iterations:
            raise RecapError(f"iterate.recorded: {len(self.recorded)} recording directories for "
                             f"iterations = {self.iterations}; give one per iteration (or set "
                             f"iterate.iterations = {len(self.recorded)})")  # fmt: skip
        if self.episodes < 1:
            raise RecapError(f"iterate.episodes: {self.episodes}; collect at least one episode")
        if self.replan_steps < 1 or self.num_envs < 1 or self.takeover_steps < 1:
            raise RecapError("iterate.replan_steps / num_envs / takeover_steps: use >= 1")
        if not known_env(self.env):
            raise RecapError(f"iterate.env: {self.env!r}; use one of {list(ENVS)} or "
                             "'package.module:Factory'")  # fmt: skip
        if self.expert and self.env not in EXPERTS:
            raise RecapError(f"iterate.expert: env {self.env!r} has no scripted expert; set "
                             "iterate.expert = False")  # fmt: skip
        object.__setattr__(self, "env_options", dict(self.env_options or {}))
        if self.guidance not in ("positive", "negative", "no_guide"):
            raise RecapError(f"iterate.guidance: {self.guidance!r}; use positive, negative or "
                             "no_guide")  # fmt: skip
        if self.policy_init not in POLICY_INITS:
            raise RecapError(f"iterate.policy_init: {self.policy_init!r}; use one of "
                             f"{list(POLICY_INITS)}")  # fmt: skip
        if self.value_init not in VALUE_INITS:
            raise RecapError(f"iterate.value_init: {self.value_init!r}; use 'retrain' "
                             "(fine-tuning the value model needs an initial-weights hook in "
                             "value_model or train, which recap does not have yet)")  # fmt: skip

    def collection(self) -> dict:
        """The settings a collection's content depends on (its fingerprint hashes them)."""
        # num_envs stays in: collections from before each episode drew its own sampling noise
        # (recap.core.columns.EPISODE_SEED) depended on it, and their fingerprints stay
        skip = {"iterations", "start_run", "start_step", "policy_init", "value_init", "root",
                "experiment", "recorded"}  # fmt: skip
        if not self.env_options:  # unset: the fingerprints of collections made before it
            skip.add("env_options")
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


@dataclass(frozen=True)
class Source:
    """A policy to collect with: its run directory, the gin files and bindings that load it,
    and a fingerprint (its stage's, or the given weights' path, size and time)."""

    run_dir: str
    files: list[str]
    params: list[str]
    fingerprint: str


@dataclass
class Iteration:
    """Iteration k planned: the collection and the pipeline it runs."""

    k: int
    source: Source
    collect_fingerprint: str
    out: Path
    seed: int
    config: PipelineConfig
    scoped: dict[str, list[str]]
    planned: dict
    datasets: dict[str, int]
    recorded: list[Path] | None = None  # the episodes merged into ``out`` (recorded rounds)

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.collect_fingerprint.encode())
        for name, item in self.planned.items():
            digest.update(f"{name}:{item.fingerprint}".encode())
        return digest.hexdigest()

    def policy(self) -> Source:
        item = self.planned["policy"]
        return Source(str(item.run_dir), list(item.files), list(item.params), item.fingerprint)


# ---- configuration ------------------------------------------------------------------------------


def split_iterate_params(params: Sequence[str]) -> tuple[list[str], list[str]]:
    """(``iterate.*`` bindings, the rest: the pipeline's and the steps' bindings)."""
    own = [p for p in params if _OWN.match(p)]
    return own, [p for p in params if not _OWN.match(p)]


def load(
    files: Sequence[str], params: Sequence[str]
) -> tuple[PipelineConfig, dict[str, list[str]], IterateConfig]:
    """The pipeline config, its step bindings and the loop's settings from gin files and
    command-line bindings (``iterate.*``, ``pipeline.*``, ``STEP:binding``)."""
    from recap.cli import parse_gin
    from recap.config_check import check_required

    own, rest = split_iterate_params(params)
    pipeline_own, scoped = split_params(rest)
    config = load_pipeline(files, pipeline_own)
    clear_config()
    try:
        parse_gin(files, [*pipeline_own, *own])
        check_required("iterate", "", "")
        settings = configured(IterateConfig)()
    finally:
        clear_config()
    if "policy" not in config.stages:
        raise RecapError(f"pipeline.stages: {config.stages} has no 'policy'; the loop collects "
                         "with each iteration's policy, add it")  # fmt: skip
    if settings.start_step not in config.steps:
        raise RecapError(f"iterate.start_step: {settings.start_step!r} is not in "
                         f"pipeline.steps {sorted(config.steps)}; name the step whose gin "
                         "files load policy 0")  # fmt: skip
    if not settings.start_run and settings.start_step != "baseline":
        raise RecapError("iterate.start_step: without iterate.start_run policy 0 is the "
                         "pipeline's baseline run; set start_run or start_step = "
                         "'baseline'")  # fmt: skip
    return config, scoped, settings


# the configurables of the steps whose bindings the loop parses (their datasets, the collecting
# policy's pi05_policy / policy_data)
REGISTERED = ("compute_advantages", "compute_returns", "evaluate_policy", "train", "pi05_policy",
              "policy_data")  # fmt: skip


def _step_params(config: PipelineConfig, scoped: dict[str, list[str]], step: str) -> list[str]:
    """The extra bindings a step's stage parses (``all`` first, then the step's own)."""
    return [*config.bindings.get("all", []), *scoped.get("all", []),
            *config.bindings.get(step, []), *scoped.get(step, [])]  # fmt: skip


def base_datasets(
    config: PipelineConfig, scoped: dict[str, list[str]]
) -> tuple[dict[str, list[dict]], str]:
    """Each data-reading step's dataset list as configured (before any rollout), and the
    Step 1 tag of the returns step."""
    from recap.cli import parse_gin
    from recap.configurable import bound

    register(*REGISTERED)
    lists: dict[str, list[dict]] = {}
    tag = ""
    try:
        for step, prefix in DATASETS_OF.items():
            if step not in config.steps:
                continue
            clear_config()
            try:
                parse_gin(config.steps[step], _step_params(config, scoped, step))
            except RecapError as exc:
                raise RecapError(f"pipeline step {step}: {exc}") from exc
            entries = bound(f"{prefix}.datasets")
            if not isinstance(entries, (list, tuple)) or not entries:
                raise RecapError(f"pipeline step {step}: {prefix}.datasets is not a list of "
                                 "datasets; bind it in the step's gin files")  # fmt: skip
            lists[step] = [dict(e) for e in entries]
            if step == "returns":
                tag = str(bound("compute_returns.tag", "") or "")
    finally:
        clear_config()
    return lists, tag


def _fingerprint_of_run(run_dir: str) -> str:
    """A given policy's fingerprint: its weights' path, size and modification time."""
    weights = Path(run_dir) / "model.safetensors"
    if not weights.is_file():
        raise RecapError(f"iterate.start_run: {weights} not found; point it at a trained policy "
                         "run directory (model.safetensors)")  # fmt: skip
    st = weights.stat()
    text = json.dumps([str(weights.resolve()), st.st_size, st.st_mtime_ns])
    return hashlib.sha256(text.encode()).hexdigest()


def root_of(config: PipelineConfig, settings: IterateConfig) -> Path:
    return Path(settings.root) if settings.root else config.run_root / "iterate"


# ---- planning -----------------------------------------------------------------------------------


def plan_start(
    config: PipelineConfig, scoped: dict[str, list[str]], settings: IterateConfig
) -> tuple[Source, PipelineConfig | None, dict | None]:
    """Policy 0, and (when it is the pipeline's baseline) the one-stage pipeline training it."""
    step = settings.start_step
    if settings.start_run:
        start = Binding("train", "run_dir", settings.start_run).line()
        params = [*_step_params(config, scoped, step), start]
        source = Source(settings.start_run, list(config.steps[step]), params,
                        _fingerprint_of_run(settings.start_run))  # fmt: skip
        return source, None, None
    if settings.recorded and settings.policy_init == "retrain":  # nothing simulated or loaded
        return Source("", [], [], "recorded"), None, None
    if "baseline" not in config.steps:
        raise RecapError("iterate: iteration 1 collects with the pipeline's baseline (behaviour "
                         "cloning) but pipeline.steps has no 'baseline'; add it or set "
                         "iterate.start_run")  # fmt: skip
    boot = dataclasses.replace(config, name=f"{config.name}-iter0", stages=["baseline"])
    planned = plan(boot, scoped)
    item = planned["baseline"]
    source = Source(str(item.run_dir), list(item.files), list(item.params), item.fingerprint)
    return source, boot, planned


def plan_iterations(
    config: PipelineConfig, scoped: dict[str, list[str]], settings: IterateConfig, start: Source
) -> list[Iteration]:
    """Every iteration's collection and pipeline, planned before anything runs (an iteration's
    plan needs only the fingerprints and paths of the ones before it)."""
    lists, tag = base_datasets(config, scoped)
    root = root_of(config, settings).resolve()
    source, rollouts, out = start, [], []
    for k in range(1, settings.iterations + 1):
        seed = settings.seed + (k - 1) * settings.episodes
        episodes = None
        if settings.recorded:
            episodes = recorded_of(settings.recorded[k - 1])
            fingerprint = recording_fingerprint(episodes)
            where = root / f"iter{k}" / f"recorded-{fingerprint[:12]}"
            rollouts.append({"name": f"recorded_iter{k}", "root": str(where), "type": "rollout"})
        else:
            what = [source.fingerprint, settings.collection(), seed]
            fingerprint = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
            where = root / f"iter{k}" / f"rollout-{fingerprint[:12]}"
            rollouts.append({"name": f"rollout_iter{k}", "root": str(where), "type": "rollout"})
        iter_config = dataclasses.replace(config, name=f"{config.name}-iter{k}")
        step_scoped, counts = _with_datasets(scoped, lists, rollouts)
        if "returns" in lists:
            returns_tag = _loop_returns_tag(iter_config, step_scoped, tag, k)
            for step, (name, param) in RETURNS_TAG_OF.items():
                if step in lists:
                    step_scoped[step].append(Binding(name, param, returns_tag).line())
        if settings.policy_init == "finetune":
            step_scoped.setdefault("policy", []).append(
                Binding("pi05_policy", "checkpoint", source.run_dir).line()
            )
        try:
            planned = plan(iter_config, step_scoped)
        except RecapError as exc:
            raise RecapError(f"iteration {k}: {exc}") from exc
        item = Iteration(k, source, fingerprint, where, seed, iter_config, step_scoped, planned,
                         counts, episodes)  # fmt: skip
        out.append(item)
        source = item.policy()
    return out


def _with_datasets(
    scoped: dict[str, list[str]], lists: dict[str, list[dict]], rollouts: list[dict]
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """The step bindings with every data-reading step's list extended by ``rollouts``, and the
    number of datasets per step."""
    step_scoped = {s: list(v) for s, v in scoped.items()}
    counts = {}
    for step, base in lists.items():
        entries = [*base, *rollouts]
        counts[step] = len(entries)
        step_scoped.setdefault(step, []).append(
            Binding(DATASETS_OF[step], "datasets", entries).line()
        )
    return step_scoped, counts


def _loop_returns_tag(
    config: PipelineConfig, step_scoped: dict[str, list[str]], tag: str, k: int
) -> str:
    """Iteration k's Step 1 tag, of its own loop: ``{tag}_iter{k}_{F[:12]}``, ``F`` the Step 1
    fingerprint planned under ``{tag}_iter{k}`` (module docstring)."""
    base = f"{tag}_iter{k}" if tag else f"iter{k}"
    draft = {s: list(v) for s, v in step_scoped.items()}
    draft["returns"].append(Binding(*RETURNS_TAG_OF["returns"], base).line())
    try:
        planned = plan(dataclasses.replace(config, stages=["returns"]), draft)
    except RecapError as exc:
        raise RecapError(f"iteration {k}: {exc}") from exc
    return f"{base}_{planned['returns'].fingerprint[:12]}"


def recorded_of(directory: str) -> list[Path]:
    """The finished episodes ``recap-serve --record`` wrote under ``directory`` (one line when
    there are none)."""
    from recap.serve.record import recorded_episodes

    path = Path(directory)
    if not path.is_dir():
        raise RecapError(f"iterate.recorded: {directory} is not a directory; pass the directory "
                         "recap-serve --record wrote")  # fmt: skip
    episodes = recorded_episodes(path)
    if not episodes:
        raise RecapError(f"iterate.recorded: {directory} holds no finished episode "
                         "(episode_NNNNNN/meta/info.json); record some with recap-serve "
                         f"--record {directory} first")  # fmt: skip
    return [p.resolve() for p in episodes]


def recording_fingerprint(episodes: Sequence[Path]) -> str:
    """A recorded collection's fingerprint: every episode's files, their sizes and times."""
    what = ["recorded", [[str(p), _stamps(p)] for p in episodes]]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


# ---- markers ------------------------------------------------------------------------------------


def _stamps(directory: Path) -> dict[str, list[int]]:
    """Size and modification time of every file under ``directory``."""
    return stamp(sorted(p for p in directory.rglob("*") if p.is_file()))


def _marker(root: Path, it: Iteration) -> Path:
    return root / MARKERS / f"iter{it.k}-{it.key}.json"


def _collect_marker(root: Path, it: Iteration) -> Path:
    return root / MARKERS / f"collect-iter{it.k}-{it.collect_fingerprint}.json"


def _unchanged(record: dict) -> bool:
    outputs = record.get("outputs", {})
    return bool(outputs) and unchanged(outputs)


def collected(root: Path, it: Iteration) -> dict | None:
    """The collection's record when it is on disk as it was written, else None; a directory
    there that is not (an interrupted or edited collection) is a one-line error."""
    from recap.envs.rollout import COLLECT_FILE

    marker = _collect_marker(root, it)
    if marker.is_file():
        record = json.loads(marker.read_text())
        if _unchanged(record):
            return record
        raise RecapError(f"{it.out}: iteration {it.k}'s collection changed since it was "
                         f"written (files differ from {marker}); remove both and rerun to "
                         "collect again")  # fmt: skip
    if not it.out.exists():
        return None
    meta = it.out / COLLECT_FILE
    saved = json.loads(meta.read_text()) if meta.is_file() else {}
    if saved.get("fingerprint") != it.collect_fingerprint:
        raise RecapError(f"{it.out}: exists but is no finished collection of iteration {it.k} "
                         "(no matching meta/recap_collect.json); remove it and rerun")  # fmt: skip
    record = {"summary": saved, "outputs": _stamps(it.out)}  # written, then interrupted: adopt
    write_json(marker, record)
    return record


def finished_iteration(root: Path, it: Iteration) -> dict | None:
    """The iteration's record when it finished and nothing it made changed since, else None:
    its marker exists, its collection is as written and every stage is ``finished``."""
    marker = _marker(root, it)
    if not marker.is_file():
        return None
    record = json.loads(marker.read_text())
    if not _unchanged(record):
        return None
    if any(finished(it.config.run_root, item) is None for item in it.planned.values()):
        return None
    return record


def recorded_iterations(files: Sequence[str], params: Sequence[str]) -> list[dict | None]:
    """Each planned iteration's record as its marker holds it (None for one that never
    finished), read without ``finished_iteration``'s check that its outputs are unchanged
    since: what a loop measured, for reports (``bench/recap_iterations.py``)."""
    config, scoped, settings = load(files, params)
    root = root_of(config, settings).resolve()
    start, _, _ = plan_start(config, scoped, settings)
    records = []
    for it in plan_iterations(config, scoped, settings, start):
        marker = _marker(root, it)
        records.append(json.loads(marker.read_text()) if marker.is_file() else None)
    return records


# ---- running ------------------------------------------------------------------------------------


def collect_rollouts(it: Iteration, settings: IterateConfig) -> dict:
    """Iteration k's episodes with policy k-1, written to ``it.out`` (module docstring)."""
    from recap.cli import parse_gin
    from recap.config_check import check_required
    from recap.envs.factory import drift_dims, env_factory

    register(*REGISTERED)
    clear_config()
    try:
        parse_gin(it.source.files, it.source.params)
        for name in ("pi05_policy", "policy_data"):
            check_required(name, f"iteration {it.k}: collecting policy: ")
        from recap.envs.policy import ChunkAdapter, load_run
        from recap.envs.rollout import ActionDrift, collect

        model, data, run = load_run(it.source.run_dir)
        policy = ChunkAdapter(model, data, settings.beta, settings.num_steps,
                              settings.noise_seed, settings.guidance)  # fmt: skip
        make_env, expert = env_factory(settings.env, max_steps=settings.max_steps,
                                       state_targets=settings.state_targets,
                                       suite=settings.suite, task_id=settings.task_id,
                                       expert=settings.expert, options=settings.env_options,
                                       field="iterate.env")  # fmt: skip
        record = {"iteration": it.k, "fingerprint": it.collect_fingerprint, "run_dir": str(run),
                  "policy_fingerprint": it.source.fingerprint, "beta": settings.beta,
                  "guidance": settings.guidance, "conditioning": data.conditioning,
                  "env": settings.env, "drift": settings.drift}  # fmt: skip
        summary = collect(policy, make_env, settings.episodes, it.seed, it.out, expert=expert,
                          drift=ActionDrift(settings.drift, dims=drift_dims(settings.env)),
                          takeover_steps=settings.takeover_steps,
                          replan_steps=settings.replan_steps, num_envs=settings.num_envs,
                          naming=settings.naming, image_dtype=settings.image_dtype,
                          record=record)  # fmt: skip
    finally:
        clear_config()
    summary = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))}
    return {"summary": {**summary, **record, "seed": it.seed,
                        "num_episodes": settings.episodes}}  # fmt: skip


def merge_recorded(it: Iteration) -> dict:
    """Iteration k's recorded episodes merged into ``it.out`` (``recap.data.merge``), with the
    collection's record (``meta/recap_collect.json``) written inside before it appears."""
    from recap.core.thresholds import IS_CORRECTION
    from recap.data.lerobot import LocalDataset
    from recap.data.merge import merge_datasets
    from recap.envs.rollout import COLLECT_FILE

    tables = []
    for path in it.recorded:
        with LocalDataset(path) as ds:
            names = ["episode_index", "is_success"]
            flags = [n for n in ("is_success", IS_CORRECTION) if ds.has_column(n)]
            names += [IS_CORRECTION] if IS_CORRECTION in flags else []
            tables.append(ds.read_columns(names, flags=flags).to_pydict())
    frames = sum(len(t["episode_index"]) for t in tables)
    corrections = [sum(t.get(IS_CORRECTION, [])) for t in tables]
    record = {"iteration": it.k, "fingerprint": it.collect_fingerprint,
              "recorded": str(Path(it.recorded[0]).parent), "episodes": len(it.recorded),
              "successes": sum(bool(t["is_success"][0]) for t in tables if t["is_success"]),
              "frames": frames, "corrections": int(sum(corrections)),
              "corrected_episodes": sum(1 for c in corrections if c),
              "run_dir": it.source.run_dir,
              "policy_fingerprint": it.source.fingerprint}  # fmt: skip
    merge_datasets(it.recorded, it.out, extra={COLLECT_FILE: record})
    return {"summary": record}


def track_iteration(
    it: Iteration, settings: IterateConfig, run_dir: Path, collection: dict, report: dict
) -> str:
    """One MLflow run per iteration, tagged with k: the pipeline's summary figures, the
    collection's, the stage fingerprints. Returns the tracking URI."""
    from recap.tracking import Tracker

    tracker = configured(Tracker)(settings.experiment, run_name=it.config.name,
                      sweep_name=it.config.sweep_name)  # fmt: skip
    clear_config()
    tracker.start(run_dir, "iterate", tags={"iteration": str(it.k), "recap.iteration": str(it.k)})
    summary = collection["summary"]
    params = {"iteration": it.k, "iterations": settings.iterations,
              "pipeline.name": it.config.name, "collect.out": str(it.out),
              "collect.policy": it.source.run_dir, "collect.seed": it.seed,
              "policy_init": settings.policy_init, "value_init": settings.value_init,
              **{f"iterate.{k}": v for k, v in settings.collection().items()},
              **{f"datasets/{s}": n for s, n in it.datasets.items()},
              **{f"fingerprint/{n}": e.fingerprint[:12]
                 for n, e in it.planned.items()}}  # fmt: skip
    tracker.log_params(params)
    episodes = max(int(summary.get("episodes", settings.episodes)), 1)
    metrics = {**summary_metrics(report), "iteration": float(it.k),
               "collect/success": float(summary.get("successes", 0)) / episodes,
               "collect/corrections": float(summary.get("corrections", 0)),
               "collect/corrected_episodes": float(summary.get("corrected_episodes", 0)),
               "collect/frames": float(summary.get("frames", 0))}  # fmt: skip
    tracker.log_metrics(metrics, it.k)
    tracker.log_dict({"collect": collection, "stages": report}, "iteration_report.json")
    tracker.finish()
    return tracker.uri


def _stage_record(entry: dict) -> dict:
    """What an iteration's record keeps of one stage's ``run_pipeline`` report."""
    return {"status": entry["status"], "fingerprint": entry["fingerprint"],
            "run_dir": entry.get("run_dir"), "result": entry.get("result", {})}  # fmt: skip


def run_iterations(
    files: Sequence[str], params: Sequence[str], dry: bool = False
) -> tuple[list[dict], str, IterateConfig]:
    """Run (or skip) every iteration; returns (one record per iteration, the tracking URI, the
    loop's settings)."""
    config, scoped, settings = load(files, params)
    root = root_of(config, settings).resolve()
    start, boot, boot_plan = plan_start(config, scoped, settings)
    iterations = plan_iterations(config, scoped, settings, start)
    if dry:
        _print_plan(root, settings, boot, boot_plan, iterations)
        return [], "", settings
    if boot is not None:
        log.info(f"==== iteration 0: policy 0, the baseline ({Path(start.run_dir).name})")
        run_pipeline(boot, scoped, planned=boot_plan)
    from recap.tracking import Tracker

    records = []
    uri = configured(Tracker)(settings.experiment).uri  # where the runs are (all skipped too)
    total = len(iterations)
    for it in iterations:
        record = finished_iteration(root, it)
        if record is not None:
            log.info(f"==== iteration {it.k}/{total} ({it.key[:12]}): finished before, skipped")
            records.append({**record, "status": "skipped"})
            continue
        start_time = time.perf_counter()
        collection = collected(root, it)
        if collection is None and it.recorded is not None:
            log.info(
                f"==== iteration {it.k}/{total}: merge {len(it.recorded)} recorded episodes of "
                f"{settings.recorded[it.k - 1]} -> {it.out}"
            )
            collection = merge_recorded(it)
        elif collection is None:
            log.info(
                f"==== iteration {it.k}/{total}: collect {settings.episodes} episodes with "
                f"{it.source.run_dir} -> {it.out}"
            )
            collection = collect_rollouts(it, settings)
        if "outputs" not in collection:  # collected now
            collection["outputs"] = _stamps(it.out)
            write_json(_collect_marker(root, it), collection)
            status = "ran"
        else:
            log.info(f"==== iteration {it.k}/{total}: collection {it.out} finished before, skipped")
            status = "skipped"
        c = collection["summary"]
        log.info(
            f"{it.out}: {c.get('episodes')} episodes, {c.get('successes')} successes, "
            f"{c.get('frames')} frames, {c.get('corrections')} corrected frames"
        )
        log.info(
            f"==== iteration {it.k}/{total}: Steps 1-4 over {it.datasets.get('policy')} "
            f"datasets ({it.config.name})"
        )
        report = run_pipeline(it.config, it.scoped, planned=it.planned)
        run_dir = root / f"iter{it.k}" / it.key[:12]
        run_dir.mkdir(parents=True, exist_ok=True)
        uri = track_iteration(it, settings, run_dir, collection, report)
        record = {
            "iteration": it.k,
            "key": it.key,
            "name": it.config.name,
            "run_dir": str(run_dir),
            "collect": {"status": status, "out": str(it.out), **collection["summary"]},
            "datasets": it.datasets,
            "policy": dataclasses.asdict(it.policy()),
            "stages": {n: _stage_record(e) for n, e in report.items()},
            "wall_s": round(time.perf_counter() - start_time, 1),
            "outputs": collection["outputs"],
        }
        write_json(run_dir / "summary.json", record)
        write_json(_marker(root, it), record)
        records.append({**record, "status": "ran"})
    return records, uri, settings


def _print_plan(root, settings, boot, boot_plan, iterations) -> None:
    """What would run and what would be skipped, iteration by iteration."""
    earlier: set[str] = set()  # fingerprints of the stages an earlier iteration runs
    if boot is not None:
        item = boot_plan["baseline"]
        done = finished(boot.run_root, item) is not None
        print(f"iteration 0  baseline {item.short}  {'skip (finished)' if done else 'run'}")
        if not done:
            earlier.add(item.fingerprint)
    for it in iterations:
        if finished_iteration(root, it) is not None:
            print(f"iteration {it.k}  {it.key[:12]}  skip (finished)")
            continue
        done = _collect_marker(root, it).is_file()
        what = "skip (finished)" if done else "run"
        if it.recorded is not None:
            print(f"iteration {it.k}  merge {len(it.recorded)} recorded episodes of "
                  f"{settings.recorded[it.k - 1]} -> {it.out}  {what}")  # fmt: skip
        else:
            print(f"iteration {it.k}  collect {settings.episodes} episodes with "
                  f"{it.source.run_dir} -> {it.out}  {what}")  # fmt: skip
        runs: set[str] = set()
        for name, item in it.planned.items():
            stale = any(n in runs for n in item.stage.needs)
            if item.fingerprint in earlier:
                what = "skip (an earlier iteration runs it)"
            elif stale or finished(it.config.run_root, item) is None:
                runs.add(name)
                what = "run"
            else:
                what = "skip (finished)"
            print(f"iteration {it.k}  {name:18s} {item.short}  {what}")
        earlier.update(it.planned[name].fingerprint for name in runs)


def summary_lines(records: list[dict], uri: str, experiment: str) -> str:
    """One line per iteration: status, collection outcome, the headline figures."""
    rows = [("iter", "status", "collected", "positive", "value rho", "policy loss", "run")]
    for r in records:
        c = r.get("collect", {})
        stages = r.get("stages", {})
        adv = stages.get("advantages", {}).get("result", {})
        val = stages.get("value", {}).get("result", {})
        pol = stages.get("policy", {}).get("result", {})
        rows.append((
            str(r["iteration"]), r["status"],
            f"{c.get('successes', '?')}/{c.get('episodes', '?')} ok, "
            f"{c.get('corrections', 0)} corr",
            f"{adv['positive_fraction']:.3f}" if "positive_fraction" in adv else "-",
            f"{val['eval/value_spearman']:.3f}" if "eval/value_spearman" in val else "-",
            f"{pol['train/loss']:.4g}" if "train/loss" in pol else "-",
            str(stages.get("policy", {}).get("run_dir") or ""),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(row[:6], widths)), row[6]]).rstrip()
             for row in rows]  # fmt: skip
    if uri:
        lines.append(f"compare iterations: mlflow ui --backend-store-uri {uri}   (experiment "
                     f"{experiment!r}, one run per iteration, tag iteration)")  # fmt: skip
    return "\n".join(lines)


def build_parser():
    """``recap-iterate``'s flags; ``--help`` says what each is, its default and its choices."""
    from recap.cli import build_parser as gin_parser

    parser = gin_parser("Iterative RECAP: collect with the current policy, Steps 1-4 over all "
                        "data so far, K times; finished iterations are skipped.")  # fmt: skip
    parser.add_argument("--dry_run", action="store_true", help="print the plan, run nothing")
    parser.add_argument(
        "--recorded", nargs="+", default=None, metavar="DIR",
        help="recap-serve --record directories, one per iteration: each iteration's collection "
        "is its directory's recorded episodes instead of simulated rollouts (binds "
        "iterate.recorded and iterate.iterations; default: simulate)",
    )  # fmt: skip
    parser.add_argument(
        "--serve", action="store_true",
        help="when the iterations finish, serve the last iteration's policy with recap-serve "
        "(until Ctrl-C or SIGTERM; default: do not serve)",
    )  # fmt: skip
    parser.add_argument(
        "--serve_args", default="", metavar="ARGS",
        help="recap-serve's arguments beside --policy, as one shell-quoted string, e.g. "
        "'--port 8000 --record rec/round2' to record the next round (default: none)",
    )  # fmt: skip
    return parser


def recorded_params(recorded: Sequence[str] | None) -> list[str]:
    """The bindings ``--recorded DIR ...`` stands for."""
    if not recorded:
        return []
    return lines([Binding("iterate", "recorded", [str(r) for r in recorded]),
                  Binding("iterate", "iterations", len(recorded))])  # fmt: skip


def serve_extra(serve_args: str) -> list[str]:
    """``--serve_args`` split as a shell would, checked before anything runs."""
    try:
        extra = shlex.split(serve_args)
    except ValueError as exc:
        raise RecapError(f"--serve_args: {exc}; quote it as one shell string") from None
    if "--policy" in extra:
        raise RecapError("--serve_args: --policy is the last iteration's policy; leave it out")
    return extra


def main(argv: Sequence[str] | None = None) -> int:
    from recap.workflow.pipeline import exit_code

    args = build_parser().parse_args(argv)

    def body() -> int:
        if not args.gin_file:
            raise RecapError("--gin_file: give the loop's gin file, e.g. demo/iterate.gin")
        if args.serve and args.dry_run:
            raise RecapError("--serve: a dry run trains no policy to serve; drop one of them")
        params = [*args.gin_param, *recorded_params(args.recorded)]
        if args.serve:  # recap-serve's flags checked before anything runs (argparse: exit 2)
            from recap.serve.launch import parse_options, serve

            extra = serve_extra(args.serve_args)
            options = parse_options(["--policy", "", *extra])
        records, uri, settings = run_iterations(args.gin_file, params, args.dry_run)
        if records:
            log.info(summary_lines(records, uri, settings.experiment))
        if args.serve:
            policy = str(records[-1]["stages"]["policy"]["run_dir"])
            log.info("serving the last iteration's policy: recap-serve "
                     f"{shlex.join(['--policy', policy, *extra])}")  # fmt: skip
            return serve(dataclasses.replace(options, policy=policy))
        return 0

    return exit_code(body)
