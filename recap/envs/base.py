"""The environment protocol closed-loop evaluation and collection run through.

An environment runs one episode at a time::

    obs = env.reset(seed)                      # the seed fixes the episode's start
    obs, success, done = env.step(action)      # float[A] action; done at success or time limit

An observation is ``{"images": {camera: uint8[H, W, 3]}, "state": float32[S], "task": str}``,
the same dict ``recap.envs.reach`` and ``recap.loading.PolicyAdapter`` use. An environment may
declare ``step_metrics`` (name -> ``f(env, action) -> float``), which ``recap.envs.rollout``
averages over the steps of an evaluation (the reaching task's ``heading``).
``env.spec`` names the cameras, the state and action entries, the frame rate and the step limit:
what a recorded dataset's ``meta/info.json`` needs (``EnvSpec.writer``), so data collected from
an environment reads back under the key map the policy's training data uses
(``EnvSpec.key_map``; cameras ``image`` and ``wrist_image``: ``observation.images.image`` ...
with LeRobot naming, ``image`` ... with LIBERO naming).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from recap.data.lerobot import KeyMap
from recap.data.lerobot_writer import V30, WriterConfig, column_names

Observation = dict[str, Any]
# batched observations (``stack_observations``) -> float[B, A] actions or float[B, H, A] chunks
BatchedPolicy = Callable[[Observation], np.ndarray]
# one observation -> float[A] (a scripted expert, a teleoperator, any controller)
Controller = Callable[[Observation], np.ndarray]


@dataclass(frozen=True)
class EnvSpec:
    """What a dataset recorded from an environment is made of.

    cameras: observation image keys, base camera first; state_names / action_names: one name per
    entry of ``state`` / the action; fps: control rate; max_steps: the step limit of an episode;
    robot_type: written to ``meta/info.json``.
    """

    cameras: tuple[str, ...]
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    fps: int
    max_steps: int
    robot_type: str

    def writer(self, naming: str = "lerobot", image_dtype: str = "video", **kwargs) -> WriterConfig:
        """A LeRobot v3.0 ``WriterConfig`` for this environment's episodes."""
        return WriterConfig(V30, naming, image_dtype, self.fps, robot_type=self.robot_type,
                            state_names=self.state_names, action_names=self.action_names,
                            **kwargs)  # fmt: skip

    def key_map(self, naming: str = "lerobot") -> KeyMap:
        """The feature keys a dataset written under ``naming`` has, as the policy data reads
        them (``recap.data.lerobot.KeyMap``: cameras base first, state, action)."""
        names = column_names(naming, self.cameras)
        return KeyMap(tuple(names[c] for c in self.cameras), names["state"], names["action"])


@runtime_checkable
class Env(Protocol):
    """One environment instance (see the module docstring)."""

    spec: EnvSpec

    def reset(self, seed: int) -> Observation: ...

    def step(self, action: np.ndarray) -> tuple[Observation, bool, bool]: ...


EnvSource = Sequence[Env] | Callable[[], Env]


def make_envs(envs: EnvSource, num_envs: int) -> list[Env]:
    """The batch of environments: ``envs`` as given, or ``num_envs`` made by the factory."""
    if callable(envs) and not isinstance(envs, Sequence):
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs}: run at least one environment")
        return [envs() for _ in range(num_envs)]
    made = list(envs)
    if not made:
        raise ValueError("envs: no environments; pass a list of Env or a factory")
    first = {}
    for i, env in enumerate(made):
        if first.setdefault(id(env), i) != i:
            raise ValueError(
                f"envs: the same environment twice (entries {first[id(env)]} and "
                f"{i}); make one instance per entry, or pass a factory"
            )
    return made


def stack_observations(observations: Sequence[Observation]) -> Observation:
    """Batch observations of any environment: images uint8[B,H,W,3] per camera, state
    float32[B,S], task list."""
    cams = observations[0]["images"]
    return {
        "images": {c: np.stack([o["images"][c] for o in observations]) for c in cams},
        "state": np.stack([np.asarray(o["state"], np.float32) for o in observations]),
        "task": [o["task"] for o in observations],
    }


def reset_policy(policy: Callable) -> None:
    """``policy.reset()`` when it has one (a controller starting an episode)."""
    reset = getattr(policy, "reset", None)
    if callable(reset):
        reset()


def unstack_observations(batch: Observation) -> list[Observation]:
    """The inverse of :func:`stack_observations`."""
    return [
        {
            "images": {c: frames[i] for c, frames in batch["images"].items()},
            "state": batch["state"][i],
            "task": task,
        }
        for i, task in enumerate(batch["task"])
    ]


def batched(controller: Controller) -> BatchedPolicy:
    """A batched policy applying a per-observation ``controller`` to each row, in order."""

    def policy(batch: Observation) -> np.ndarray:
        return np.stack([np.asarray(controller(o)) for o in unstack_observations(batch)])

    return policy
