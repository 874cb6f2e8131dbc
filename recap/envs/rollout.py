"""The one closed loop: evaluation and collection of any :class:`~recap.envs.Env`.

Every environment steps as ``obs, success, done = env.step(action)``, and episode k of a run
starts at ``env.reset(seed + k)`` (the one seeding rule: a seed fixes the episodes, and two
policies, or two guidance strengths, are compared on the same ones). A batch of environments runs
in lockstep: whenever some of them have no planned action left, the policy is called once on
their stacked observations and returns float[B, A] (one action) or float[B, H, A] (a chunk), of
which the first ``replan_steps`` actions are executed before it is asked again (openpi's LIBERO
example: ``replan_steps = 5``). A free environment takes the next episode at once.

Corrections: with an ``expert`` (one observation -> float[A]; a scripted controller, a
teleoperator) the expert's action is computed every step, and when ``drift(obs, agent action,
expert action)`` holds the expert takes over for ``takeover_steps`` steps; those frames record
the expert's action and ``is_correction = True`` (Step 3 forces them positive, as the paper
does: ``compute_advantages.correction_column``), and the agent's remaining plan is dropped, so it
replans from where the expert left off.

Step metrics: ``step_metrics`` (name -> ``f(env, action) -> float``, evaluated just before the
action is applied; by default the environment's own ``env.step_metrics`` when it has them, e.g.
the reaching task's ``heading``) are summed per episode (``Result.metrics``), and
:func:`evaluate` reports each one's mean over every step of every episode.

Sharding: with ``sharded=True`` under a launched world (``recap.engine.distributed.init()``;
the launcher training uses, e.g. ``deepspeed --num_gpus 2``), rank r of W runs episodes
r, r + W, r + 2W, ... (:func:`shard`) with its own environments, and the ranks merge: every
rank gets the same outcomes (``episode_outcomes`` / ``evaluate``), and ``collect`` writes one
dataset (rank 0 writes it from the episodes every rank left in ``.<out_dir>.shards`` beside
``out_dir``, a directory all ranks must see). An episode depends only on its seed and the
policy, so the merged result is the unsharded run's for the same seeds (for a policy that maps
the same observations to the same actions, whatever else shares its batch: each batch carries
every row's episode seed and step, ``recap.core.columns.EPISODE_SEED`` / ``EPISODE_STEP``, from
which recap's π0.5 adapters draw that row's sampling noise).
"""

from __future__ import annotations

import collections
import json
import pickle
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recap.core.advantages import IS_CORRECTION
from recap.core.columns import EPISODE_SEED, EPISODE_STEP
from recap.data.lerobot_writer import Episode, write_lerobot_dataset
from recap.envs.base import (
    BatchedPolicy,
    Controller,
    EnvSource,
    Observation,
    make_envs,
    reset_policy,
    stack_observations,
)

Drift = Callable[[Observation, np.ndarray, np.ndarray], bool]
StepMetric = Callable[[Any, np.ndarray], float]  # (env, action about to be applied) -> value


@dataclass(frozen=True)
class ActionDrift:
    """Drift when the agent's action is farther than ``threshold`` (L2, first ``dims`` entries;
    all when None) from the expert's."""

    threshold: float = 1.0
    dims: int | None = None

    def __call__(self, obs: Observation, agent: np.ndarray, expert: np.ndarray) -> bool:
        a, e = np.asarray(agent, np.float64), np.asarray(expert, np.float64)
        n = self.dims or min(a.shape[-1], e.shape[-1])
        return bool(np.linalg.norm(a[:n] - e[:n]) > self.threshold)


@dataclass
class Result:
    """One finished episode: its index, outcome, steps, (when recorded) frames, and the sum of
    each step metric over its steps."""

    index: int
    success: bool
    steps: int
    corrections: int
    episode: Episode | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Slot:
    """One environment's running episode."""

    index: int = -1
    obs: Observation | None = None
    plan: collections.deque = field(default_factory=collections.deque)
    hold: int = 0  # steps the expert still controls
    steps: int = 0
    frames: list[tuple[Observation, np.ndarray, bool]] = field(default_factory=list)
    corrections: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


def run_episodes(
    policy: BatchedPolicy,
    envs: EnvSource,
    num_episodes: int,
    seed: int = 0,
    replan_steps: int = 1,
    num_envs: int = 8,
    expert: Controller | None = None,
    drift: Drift | None = None,
    takeover_steps: int = 5,
    record: bool = False,
    indices: Sequence[int] | None = None,
    step_metrics: Mapping[str, StepMetric] | None = None,
) -> Iterator[Result]:
    """Run episodes ``seed .. seed + num_episodes - 1`` (module docstring); yields each as it
    finishes (not in index order). ``record``: keep the frames (``Result.episode``): frame t holds
    the observation before step t and the action executed at it. ``indices``: run only these
    episodes (a rank's :func:`shard`), in that order. ``step_metrics``: summed per episode into
    ``Result.metrics`` (None: the environments' own ``step_metrics``, if any)."""
    if replan_steps < 1:
        raise ValueError(f"replan_steps={replan_steps}: execute at least one action per chunk")
    if takeover_steps < 1:
        raise ValueError(f"takeover_steps={takeover_steps}: an expert takes at least one step")
    order = list(range(num_episodes)) if indices is None else [int(k) for k in indices]
    envs = make_envs(envs, min(num_envs, max(len(order), 1)))[: max(len(order), 1)]
    drift = drift if drift is not None else ActionDrift()
    metrics = dict(env_step_metrics(envs[0]) if step_metrics is None else step_metrics)
    slots, pending = [_Slot() for _ in envs], iter(order)

    def start(i: int) -> bool:
        k = next(pending, None)
        if k is None:
            slots[i] = _Slot()
            return False
        slots[i] = _Slot(index=k, obs=envs[i].reset(seed + k), metrics=dict.fromkeys(metrics, 0.0))
        if expert is not None:
            reset_policy(expert)
        return True

    live = [i for i in range(len(envs)) if start(i)]
    while live:
        need = [i for i in live if not slots[i].plan]
        if need:
            batch = stack_observations([slots[i].obs for i in need])
            batch[EPISODE_SEED] = np.array([seed + slots[i].index for i in need], np.int64)
            batch[EPISODE_STEP] = np.array([slots[i].steps for i in need], np.int64)
            actions = np.asarray(policy(batch))
            if actions.ndim == 2:
                actions = actions[:, None]
            if actions.ndim != 3 or actions.shape[0] != len(need):
                raise ValueError(f"policy: returned shape {actions.shape} for {len(need)} "
                                 "observations; return float[B, A] or float[B, H, A]")  # fmt: skip
            for i, chunk in zip(need, actions, strict=True):
                slots[i].plan.extend(chunk[:replan_steps])
        for i in list(live):
            slot = slots[i]
            action, corrected = np.asarray(slot.plan.popleft(), np.float32), False
            if expert is not None:
                proposal = np.asarray(expert(slot.obs), np.float32)
                if slot.hold == 0 and drift(slot.obs, action, proposal):
                    slot.hold = takeover_steps
                if slot.hold > 0:
                    action, corrected, slot.hold = proposal, True, slot.hold - 1
                    slot.plan.clear()
            if record:
                slot.frames.append((slot.obs, action, corrected))
            for name, metric in metrics.items():
                slot.metrics[name] += float(metric(envs[i], action))
            slot.obs, success, done = envs[i].step(action)
            slot.steps += 1
            slot.corrections += corrected
            if done:
                episode = _episode(slot.frames, success) if record else None
                yield Result(slot.index, bool(success), slot.steps, slot.corrections, episode,
                             slot.metrics)  # fmt: skip
                if not start(i):
                    live.remove(i)


def _episode(frames: list[tuple[Observation, np.ndarray, bool]], success: bool) -> Episode:
    first = frames[0][0]
    return Episode(
        images={c: np.stack([o["images"][c] for o, _, _ in frames]) for c in first["images"]},
        state=np.stack([np.asarray(o["state"], np.float32) for o, _, _ in frames]),
        action=np.stack([a for _, a, _ in frames]).astype(np.float32),
        task=str(first["task"]),
        success=bool(success),
        flags={IS_CORRECTION: np.array([c for _, _, c in frames], dtype=bool)},
    )


def shard(num_episodes: int, rank: int, world_size: int) -> list[int]:
    """The episodes rank ``rank`` of ``world_size`` runs: k with k % world_size == rank (round
    robin, so every rank gets early and late seeds alike)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"shard: rank {rank} of world_size {world_size}; need 0 <= rank < "
                         "world_size")  # fmt: skip
    return list(range(rank, num_episodes, world_size))


def world(sharded: bool) -> tuple[int, int]:
    """(rank, world size) a sharded run uses: the launched process group's, else (0, 1)."""
    if not sharded:
        return 0, 1
    from recap.engine import distributed

    if distributed.env_world_size() > 1 and not distributed.is_initialized():
        raise RuntimeError("sharded=True under a launcher: call recap.engine.distributed.init() "
                           "first, so the ranks can merge their episodes")  # fmt: skip
    return distributed.rank(), distributed.world_size()


def env_step_metrics(env: Any) -> Mapping[str, StepMetric]:
    """The step metrics an environment declares (``env.step_metrics``; none by default)."""
    return dict(getattr(env, "step_metrics", None) or {})


def _merge_sum(values: np.ndarray) -> np.ndarray:
    """``values`` summed over the ranks (this rank's own when there is one)."""
    import torch

    from recap.engine import distributed

    return distributed.all_reduce_sum(torch.from_numpy(values)).numpy()


@dataclass
class Outcomes:
    """Per episode k (seed ``seed + k``) at position k: ``success`` bool[N], ``steps`` int[N],
    and per step metric the sum over the episode's steps, float64[N]."""

    success: np.ndarray
    steps: np.ndarray
    metrics: dict[str, np.ndarray]

    def metric_mean(self, name: str) -> float:
        """The mean of metric ``name`` over every step of every episode (0.0 for no steps)."""
        total = int(self.steps.sum())
        return float(self.metrics[name].sum() / total) if total else 0.0


def run_outcomes(
    policy: BatchedPolicy,
    envs: EnvSource,
    num_episodes: int,
    seed: int = 0,
    replan_steps: int = 1,
    num_envs: int = 8,
    sharded: bool = False,
    step_metrics: Mapping[str, StepMetric] | None = None,
) -> Outcomes:
    """:class:`Outcomes` of episodes ``seed .. seed + num_episodes - 1``; ``sharded``: this rank
    runs its :func:`shard` and every rank returns the merged outcomes."""
    rank, size = world(sharded)
    mine = shard(num_episodes, rank, size)
    made = make_envs(envs, min(num_envs, max(len(mine), 1)))
    names = list(env_step_metrics(made[0]) if step_metrics is None else step_metrics)
    counts = np.zeros((3, num_episodes), dtype=np.int64)  # [success, ran, steps]
    sums = np.zeros((len(names), num_episodes), dtype=np.float64)
    for result in run_episodes(policy, made, num_episodes, seed, replan_steps, num_envs,
                               indices=mine, step_metrics=step_metrics):  # fmt: skip
        counts[:, result.index] = (int(result.success), 1, result.steps)
        for row, name in enumerate(names):
            sums[row, result.index] = result.metrics[name]
    if size > 1:
        counts, sums = _merge_sum(counts), _merge_sum(sums)
    if not (counts[1] == 1).all():
        raise RuntimeError(f"episode_outcomes: episodes {np.flatnonzero(counts[1] != 1).tolist()} "
                           "ran on no rank or on several")  # fmt: skip
    return Outcomes(counts[0].astype(bool), counts[2], dict(zip(names, sums, strict=True)))


def episode_outcomes(
    policy: BatchedPolicy,
    envs: EnvSource,
    num_episodes: int,
    seed: int = 0,
    replan_steps: int = 1,
    num_envs: int = 8,
    sharded: bool = False,
) -> np.ndarray:
    """bool[num_episodes]: the success of episode k (seed ``seed + k``) at position k;
    ``sharded``: this rank runs its :func:`shard` and every rank returns the merged outcomes."""
    return run_outcomes(policy, envs, num_episodes, seed, replan_steps, num_envs, sharded,
                        step_metrics={}).success  # fmt: skip


def evaluate(
    policy_at: Callable[[float], BatchedPolicy],
    envs: EnvSource,
    num_episodes: int,
    seed: int = 0,
    betas: Sequence[float] = (1.0,),
    replan_steps: int = 1,
    num_envs: int = 8,
    sharded: bool = False,
    step_metrics: Mapping[str, StepMetric] | None = None,
) -> dict[str, Any]:
    """Success rate per guidance strength: ``{"success": {"beta_1": rate, ...}, "outcomes":
    {"beta_1": [0/1 per episode], ...}, "metrics": {name: {"beta_1": mean per step, ...}}, ...}``;
    ``policy_at(beta)`` is the batched policy at beta (e.g.
    :class:`recap.envs.policy.ChunkAdapter`), every beta on the same seeded episodes;
    ``step_metrics``: as :func:`run_episodes`; ``sharded``: the episodes split over the ranks, the
    same result on every rank."""
    success, outcomes, metrics = {}, {}, {}
    for beta in betas:
        run = run_outcomes(policy_at(float(beta)), envs, num_episodes, seed, replan_steps,
                           num_envs, sharded, step_metrics)  # fmt: skip
        key = f"beta_{float(beta):g}"
        success[key] = float(run.success.mean()) if num_episodes else 0.0
        outcomes[key] = run.success.astype(int).tolist()
        for name in run.metrics:
            metrics.setdefault(name, {})[key] = run.metric_mean(name)
    return {"success": success, "outcomes": outcomes, "metrics": metrics,
            "num_episodes": num_episodes, "seed": seed, "replan_steps": replan_steps}  # fmt: skip


COLLECT_FILE = "meta/recap_collect.json"  # the collection's record, beside LeRobot's meta files


def collect(
    policy: BatchedPolicy,
    envs: EnvSource,
    num_episodes: int,
    seed: int,
    out_dir: str | Path,
    expert: Controller | None = None,
    drift: Drift | None = None,
    takeover_steps: int = 5,
    replan_steps: int = 1,
    num_envs: int = 8,
    naming: str = "lerobot",
    image_dtype: str = "video",
    overwrite: bool = False,
    record: Mapping[str, Any] | None = None,
    sharded: bool = False,
) -> dict[str, Any]:
    """Run ``num_episodes`` episodes of ``policy`` (corrected by ``expert`` when given; module
    docstring) and write them, in episode order, as a new LeRobot v3.0 dataset at ``out_dir``
    with ``is_success`` and the boolean ``is_correction`` column (all False without an expert).

    ``meta/recap_collect.json`` records the seed, the counts and ``record`` (e.g. the policy's
    run directory). Returns ``write_lerobot_dataset``'s summary plus ``corrections`` (frames)
    and ``corrected_episodes``. The dataset appears whole or not at all (``write_lerobot_dataset``
    renames it into place), and the record is written atomically just after it.

    ``sharded``: each rank runs its :func:`shard` and leaves its episodes in
    ``.<out_dir name>.shards`` beside ``out_dir``; rank 0 writes the dataset from them in episode
    order (the same files as the unsharded run) and removes them; every rank returns the summary.
    """
    rank, size = world(sharded)
    if size > 1:
        return _collect_sharded(rank, size, policy, envs, num_episodes, seed, out_dir, expert,
                                drift, takeover_steps, replan_steps, num_envs, naming,
                                image_dtype, overwrite, record)  # fmt: skip
    return _collect(policy, envs, num_episodes, seed, out_dir, expert, drift, takeover_steps,
                    replan_steps, num_envs, naming, image_dtype, overwrite, record)  # fmt: skip


def _collect(
    policy: BatchedPolicy,
    envs: EnvSource,
    num_episodes: int,
    seed: int,
    out_dir: str | Path,
    expert: Controller | None,
    drift: Drift | None,
    takeover_steps: int,
    replan_steps: int,
    num_envs: int,
    naming: str,
    image_dtype: str,
    overwrite: bool,
    record: Mapping[str, Any] | None,
    episodes: Callable[[], Iterator[Result]] | None = None,
    spec: Any = None,
) -> dict[str, Any]:
    """``collect`` in one process; ``episodes``/``spec``: the finished results and the env spec
    when they come from elsewhere (the sharded run's rank 0)."""
    if episodes is None:
        made = make_envs(envs, min(num_envs, max(num_episodes, 1)))
        spec = made[0].spec

        def episodes() -> Iterator[Result]:
            return run_episodes(policy, made, num_episodes, seed, replan_steps, num_envs, expert,
                                drift, takeover_steps, record=True)  # fmt: skip

    counts = {"corrections": 0, "corrected_episodes": 0}

    def ordered() -> Iterator[Episode]:
        done: dict[int, Result] = {}
        following = 0
        for result in episodes():
            counts["corrections"] += result.corrections
            counts["corrected_episodes"] += result.corrections > 0
            done[result.index] = result
            while following in done:
                yield done.pop(following).episode
                following += 1

    config = spec.writer(naming, image_dtype)
    out_dir = Path(out_dir)
    summary = write_lerobot_dataset(out_dir, ordered(), config, overwrite=overwrite)
    summary |= counts
    meta = {"seed": seed, "num_episodes": num_episodes, "replan_steps": replan_steps,
            "expert": expert is not None, "takeover_steps": takeover_steps,
            "successes": summary["successes"], **counts, **dict(record or {})}  # fmt: skip
    _write_record(out_dir / COLLECT_FILE, meta)
    return summary


def _write_record(path: Path, record: dict) -> None:
    from recap.data.sidecars import write_atomic

    write_atomic({path: lambda p: p.write_text(json.dumps(record, indent=2) + "\n")})


def _collect_sharded(
    rank: int,
    size: int,
    policy: BatchedPolicy,
    envs: EnvSource,
    num_episodes: int,
    seed: int,
    out_dir: str | Path,
    expert: Controller | None,
    drift: Drift | None,
    takeover_steps: int,
    replan_steps: int,
    num_envs: int,
    naming: str,
    image_dtype: str,
    overwrite: bool,
    record: Mapping[str, Any] | None,
) -> dict[str, Any]:
    from recap.engine import distributed

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:  # every rank stops, none waits for rank 0
        raise FileExistsError(f"{out_dir}: already exists; pass overwrite=True to replace it")
    shards = out_dir.parent / f".{out_dir.name}.shards"
    if rank == 0:
        shutil.rmtree(shards, ignore_errors=True)
        shards.mkdir(parents=True)
    distributed.barrier()
    mine = shard(num_episodes, rank, size)
    made = make_envs(envs, min(num_envs, max(len(mine), 1)))
    spec = made[0].spec
    for result in run_episodes(policy, made, num_episodes, seed, replan_steps, num_envs, expert,
                               drift, takeover_steps, record=True, indices=mine):  # fmt: skip
        path = shards / f"episode-{result.index:06d}.pkl"
        with open(path.with_suffix(".tmp"), "wb") as f:
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        path.with_suffix(".tmp").replace(path)
    distributed.barrier()
    if rank == 0:
        try:

            def episodes() -> Iterator[Result]:
                for k in range(num_episodes):
                    with open(shards / f"episode-{k:06d}.pkl", "rb") as f:
                        yield pickle.load(f)

            summary = _collect(policy, envs, num_episodes, seed, out_dir, expert, drift,
                               takeover_steps, replan_steps, num_envs, naming, image_dtype,
                               overwrite, record, episodes=episodes, spec=spec)  # fmt: skip
            (shards / "summary.json").write_text(json.dumps(summary))
        except BaseException:  # no dataset: the other ranks find no summary and stop too
            distributed.barrier()
            shutil.rmtree(shards, ignore_errors=True)  # the episodes' frames are not kept
            raise
        distributed.barrier()
        summary_text = (shards / "summary.json").read_text()
    else:
        distributed.barrier()
        summary_path = shards / "summary.json"
        if not summary_path.is_file():
            raise RuntimeError(f"collect: rank 0 did not write {out_dir}; see its log")
        summary_text = summary_path.read_text()
    distributed.barrier()
    if rank == 0:
        shutil.rmtree(shards, ignore_errors=True)
    return json.loads(summary_text)
