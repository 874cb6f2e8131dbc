"""Environments by name: the one place a name in config or on a command line becomes an ``Env``.

``env_factory(name, ...)`` -> (a zero-argument constructor of the environment, its scripted
expert or None). ``name`` is one of :data:`ENVS` or ``"package.module:Factory"`` (any callable
returning a ``recap.envs.Env``):

- ``"reach"``: the demo's reaching task (``recap.envs.reach``, configured as the demo data was
  written: ``max_steps``, ``state_targets``; ``options`` are further ``ReachConfig`` fields);
- ``"metaworld"``: one Meta-World v3 task (``recap.envs.metaworld.MetaWorldEnv``, needs the
  ``metaworld`` extra);
- ``"libero"``: one LIBERO task (``recap.envs.libero.LiberoEnv``: ``suite``, ``task_id``; needs
  ``hf-libero`` with its assets);
- ``"package.module:Factory"``: called with ``options`` as its keyword arguments.

``recap-collect``, ``recap-iterate`` and the evaluate step (``evaluate_policy.env``) all build
their environments here. The environment modules are imported only when their environment is
asked for (LIBERO's and Meta-World's on first use).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from recap.envs.base import Env
from recap.errors import RecapError

ENVS = ("reach", "metaworld", "libero")  # by name; else "package.module:Factory"
EXPERTS = ("reach",)  # the environments with a scripted expert


def env_factory(
    name: str = "reach",
    *,
    max_steps: int | None = None,
    state_targets: bool = False,
    suite: str = "libero_10",
    task_id: int = 0,
    expert: bool = False,
    options: Mapping[str, Any] | None = None,
    field: str = "env",
) -> tuple[Callable[[], Env], Callable | None]:
    """(a constructor of environment ``name``, its scripted expert if ``expert`` else None).

    ``max_steps``: the episode limit (None: the task's; not passed to a ``module:Factory``);
    ``state_targets``: reach only, state[4:8] holds the targets' offsets
    (``ReachConfig.state_targets``); ``suite`` / ``task_id``: libero only, the task of the suite;
    ``options``: further keyword arguments of the environment's constructor (they win over the
    settings above). ``field`` names the setting that holds ``name`` in the one-line errors (an
    unknown name, a factory that does not import, an expert the env lacks); its options are
    ``{field}_options``."""
    options = dict(options or {})
    module, _, attr = name.partition(":")
    if name not in ENVS and not (module and attr):
        raise RecapError(f"{field}: {name!r} is not one of {list(ENVS)} nor "
                         "'package.module:Factory'; name one of them")  # fmt: skip
    if expert and name not in EXPERTS:
        raise RecapError(f"{field}: {name!r} has no scripted expert; collect without it, or "
                         "pass a controller to recap.envs.collect(expert=...)")  # fmt: skip
    limit = {} if max_steps is None else {"max_steps": max_steps}
    if name == "reach":
        from recap.envs.reach import ReachConfig, ReachEnv, reach_expert

        fields = {"max_steps": max_steps or ReachConfig.max_steps, "state_targets": state_targets}
        try:
            config = ReachConfig(**{**fields, **options})
        except TypeError as error:
            raise RecapError(f"{field}_options: {error}; use ReachConfig fields") from None
        return (lambda: ReachEnv(config)), (reach_expert(config) if expert else None)
    if name == "metaworld":
        from recap.envs.metaworld import MetaWorldEnv

        kwargs = {**limit, **options}
        return (lambda: MetaWorldEnv(**kwargs)), None
    if name == "libero":
        from recap.envs.libero import LiberoEnv

        kwargs = {"suite": suite, "task_id": task_id, **limit, **options}
        return (lambda: LiberoEnv(**kwargs)), None
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise RecapError(f"{field}: {name!r} does not import ({error}); name an importable "
                         "'package.module:Factory'") from None  # fmt: skip
    return (lambda: factory(**options)), None
