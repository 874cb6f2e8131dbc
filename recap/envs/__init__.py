"""Environments behind one protocol, and closed-loop evaluation and collection through it.

``recap.envs.base``: the :class:`Env` protocol (``reset(seed) -> obs``, ``step(action) -> (obs,
success, done)``) and :class:`EnvSpec`; ``recap.envs.reach``: the demo's reaching task, its
scripted policies and demo datasets; ``recap.envs.libero``: LIBERO over ``hf-libero``;
``recap.envs.metaworld``: Meta-World (both imported only when used); ``recap.envs.rollout``: the
one closed loop, ``evaluate`` / ``collect`` (batched, action chunks, expert corrections);
``recap.envs.policy``: a trained π0.5 as a chunk policy (imports torch).
"""

from recap.envs.base import Env, EnvSpec, batched, stack_observations, unstack_observations
from recap.envs.reach import ReachEnv, reach_expert
from recap.envs.rollout import ActionDrift, collect, episode_outcomes, evaluate, run_episodes

__all__ = [
    "ActionDrift",
    "Env",
    "EnvSpec",
    "ReachEnv",
    "batched",
    "collect",
    "episode_outcomes",
    "evaluate",
    "reach_expert",
    "run_episodes",
    "stack_observations",
    "unstack_observations",
]
