"""Environments by name, for the commands and loops that collect or evaluate in one.

``env_factory("reach", max_steps=..., state_targets=..., expert=True)`` -> (a zero-argument
constructor of the environment, its scripted expert or None): the demo's reaching task
(``recap.envs.synthetic``, configured as the demo data was written) or one LIBERO task
(``recap.envs.libero``, needs ``hf-libero`` with its assets). ``recap-collect`` and
``recap-iterate`` both build their environments here. The environment modules are imported
only when their environment is asked for (LIBERO's on first use).
"""

from __future__ import annotations

from collections.abc import Callable

from recap.envs.base import Env
from recap.errors import RecapError

ENVS = ("reach", "libero")
EXPERTS = ("reach",)  # the environments with a scripted expert


def env_factory(
    name: str = "reach",
    *,
    max_steps: int | None = None,
    state_targets: bool = False,
    suite: str = "libero_10",
    task_id: int = 0,
    expert: bool = False,
) -> tuple[Callable[[], Env], Callable | None]:
    """(a constructor of environment ``name``, its scripted expert if ``expert`` else None).

    ``max_steps``: the episode limit (None: the task's); ``state_targets``: reach only, state[4:8]
    holds the targets' offsets (``ReachConfig.state_targets``); ``suite`` / ``task_id``: libero
    only, the task of the suite."""
    if name not in ENVS:
        raise RecapError(f"env {name!r} is not one of {ENVS}; pick one of them")
    if expert and name not in EXPERTS:
        raise RecapError(f"env {name!r} has no scripted expert; collect without it, or pass a "
                         "controller to recap.envs.collect(expert=...)")  # fmt: skip
    if name == "libero":
        from recap.envs.libero import LiberoEnv

        return (lambda: LiberoEnv(suite, task_id, max_steps=max_steps)), None
    from recap.envs.reach import ReachConfig, reach_expert
    from recap.envs.reach import ReachEnv as ReachTask

    config = ReachConfig(max_steps=max_steps or ReachConfig.max_steps, state_targets=state_targets)
    return (lambda: ReachTask(config)), (reach_expert(config) if expert else None)
