"""The synthetic reaching task (``recap.data.synthetic``) behind the :class:`~recap.envs.Env`
protocol, and its scripted expert.

``ReachEnv.step`` returns ``(obs, done, success)``; :meth:`ReachTask.step` returns the protocol's
``(obs, success, done)``. ``reset(seed)`` draws the episode's layout from
``np.random.default_rng(seed)``, so an episode is fixed by its seed alone.
"""

from __future__ import annotations

import numpy as np

from recap.data.synthetic import (
    ACTION_NAMES,
    ReachConfig,
    ReachEnv,
    ScriptedPolicy,
    sample_layout,
)
from recap.envs.base import EnvSpec, Observation


class ReachTask:
    """``ReachEnv`` with ``reset(seed) -> obs`` and ``step(a) -> (obs, success, done)``."""

    def __init__(self, config: ReachConfig = ReachConfig()):
        self.config = config
        self.env = ReachEnv(0, config)
        self.spec = EnvSpec(
            cameras=("image", "wrist_image"),
            state_names=tuple(config.state_names),
            action_names=ACTION_NAMES,
            fps=config.fps,
            max_steps=config.max_steps,
            robot_type="reach2d",
        )

    def reset(self, seed: int) -> Observation:
        return self.env.reset(sample_layout(np.random.default_rng(seed), self.config))

    def step(self, action: np.ndarray) -> tuple[Observation, bool, bool]:
        obs, done, success = self.env.step(action)
        return obs, success, done


def reach_expert(config: ReachConfig = ReachConfig()) -> ScriptedPolicy:
    """The task's scripted expert: straight for the named target, no noise, never confused."""
    return ScriptedPolicy(max_speed=config.max_speed)
