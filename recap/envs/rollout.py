"""Closed-loop evaluation and collection through the :class:`~recap.envs.Env` protocol.

Episode k of a run starts at ``env.reset(seed + k)``, so a seed fixes the episodes and two
policies (or two guidance strengths) are compared on the same ones. A batch of environments runs
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
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recap.core.advantages import IS_CORRECTION
from recap.data.lerobot_writer import Episode, write_lerobot_dataset
from recap.data.synthetic import reset_policy
from recap.envs.base import (
    BatchedPolicy,
    Controller,
    EnvSource,
    Observation,
    make_envs,
    stack_observations,
)

Drift = Callable[[Observation, np.ndarray, np.ndarray], bool]


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
    """One finished episode: its index, outcome, steps and (when recorded) frames."""

    index: int
    success: bool
    steps: int
    corrections: int
    episode: Episode | None = None


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
) -> Iterator[Result]:
    """Run episodes ``seed .. seed + num_episodes - 1`` (module docstring); yields each as it
    finishes (not in index order). ``record``: keep the frames (``Result.episode``): frame t holds
    the observation before step t and the action executed at it."""
    if replan_steps < 1:
        raise ValueError(f"replan_steps={replan_steps}: execute at least one action per chunk")
    if takeover_steps < 1:
        raise ValueError(f"takeover_steps={takeover_steps}: an expert takes at least one step")
    envs = make_envs(envs, min(num_envs, max(num_episodes, 1)))[: max(num_episodes, 1)]
    drift = drift if drift is not None else ActionDrift()
    slots, pending = [_Slot() for _ in envs], iter(range(num_episodes))

    def start(i: int) -> bool:
        k = next(pending, None)
        if k is None:
            slots[i] = _Slot()
            return False
        slots[i] = _Slot(index=k, obs=envs[i].reset(seed + k))
        if expert is not None:
            reset_policy(expert)
        return True

    live = [i for i in range(len(envs)) if start(i)]
    while live:
        need = [i for i in live if not slots[i].plan]
        if need:
            actions = np.asarray(policy(stack_observations([slots[i].obs for i in need])))
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
            slot.obs, success, done = envs[i].step(action)
            slot.steps += 1
            slot.corrections += corrected
            if done:
                episode = _episode(slot.frames, success) if record else None
                yield Result(slot.index, bool(success), slot.steps, slot.corrections, episode)
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


def episode_outcomes(
    policy: BatchedPolicy,
    envs: EnvSource,
    num_episodes: int,
    seed: int = 0,
    replan_steps: int = 1,
    num_envs: int = 8,
) -> np.ndarray:
    """bool[num_episodes]: the success of episode k (seed ``seed + k``) at position k."""
    won = np.zeros(num_episodes, dtype=bool)
    for result in run_episodes(policy, envs, num_episodes, seed, replan_steps, num_envs):
        won[result.index] = result.success
    return won


def evaluate(
    policy_at: Callable[[float], BatchedPolicy],
    envs: EnvSource,
    num_episodes: int,
    seed: int = 0,
    betas: Sequence[float] = (1.0,),
    replan_steps: int = 1,
    num_envs: int = 8,
) -> dict[str, Any]:
    """Success rate per guidance strength: ``{"success": {"beta_1": rate, ...}, "outcomes":
    {"beta_1": [0/1 per episode], ...}}``; ``policy_at(beta)`` is the batched policy at beta
    (e.g. :class:`recap.envs.policy.ChunkAdapter`), every beta on the same seeded episodes."""
    success, outcomes = {}, {}
    for beta in betas:
        won = episode_outcomes(policy_at(float(beta)), envs, num_episodes, seed, replan_steps,
                               num_envs)  # fmt: skip
        key = f"beta_{float(beta):g}"
        success[key] = float(won.mean()) if num_episodes else 0.0
        outcomes[key] = won.astype(int).tolist()
    return {"success": success, "outcomes": outcomes, "num_episodes": num_episodes,
            "seed": seed, "replan_steps": replan_steps}  # fmt: skip


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
) -> dict[str, Any]:
    """Run ``num_episodes`` episodes of ``policy`` (corrected by ``expert`` when given; module
    docstring) and write them, in episode order, as a new LeRobot v3.0 dataset at ``out_dir``
    with ``is_success`` and the boolean ``is_correction`` column (all False without an expert).

    ``meta/recap_collect.json`` records the seed, the counts and ``record`` (e.g. the policy's
    run directory). Returns ``write_lerobot_dataset``'s summary plus ``corrections`` (frames)
    and ``corrected_episodes``. The dataset appears whole or not at all (``write_lerobot_dataset``
    renames it into place), and the record is written atomically just after it.
    """
    made = make_envs(envs, min(num_envs, max(num_episodes, 1)))
    spec = made[0].spec
    counts = {"corrections": 0, "corrected_episodes": 0}

    def ordered() -> Iterator[Episode]:
        done: dict[int, Result] = {}
        following = 0
        for result in run_episodes(policy, made, num_episodes, seed, replan_steps, num_envs,
                                   expert, drift, takeover_steps, record=True):  # fmt: skip
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
