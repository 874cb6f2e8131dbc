"""Environments by name: the one place a name in config or on a command line becomes an ``Env``.

``env_factory(name, ...)`` -> (a zero-argument constructor of the environment, its scripted
expert or None). ``name`` is one of :data:`ENVS` or ``"package.module:Factory"`` (any callable
returning a ``recap.envs.Env``):

- ``"reach"``: the demo's reaching task (``recap.envs.reach``, configured as the demo data was
  written: ``max_steps``, ``state_targets``; ``options`` are further ``ReachConfig`` fields);
- ``"metaworld"``: one Meta-World v3 task (``recap.envs.metaworld.MetaWorldEnv``: ``options``
  such as ``env_name``, ``cameras``, ``image_size``; needs the ``metaworld`` extra); its expert is
  Meta-World's scripted policy for that task (``MetaWorldExpert``, no action noise);
- ``"libero"``: one LIBERO task (``recap.envs.libero.LiberoEnv``: ``suite``, ``task_id``; needs
  ``hf-libero`` with its assets);
- ``"package.module:Factory"``: called with ``options`` as its keyword arguments.

``recap-collect``, ``recap-iterate`` and the evaluate step (``evaluate_policy.env``) all build
their environments here. The environment modules are imported only when their environment is
asked for (LIBERO's and Meta-World's on first use).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from recap.envs.base import Env
from recap.errors import RecapError

ENVS = ("reach", "metaworld", "libero")  # by name; else "package.module:Factory"
EXPERTS = ("reach", "metaworld")  # the environments with a scripted expert
# The action entries a takeover compares (``recap.envs.rollout.ActionDrift.dims``): the move.
DRIFT_DIMS = {"reach": 2, "metaworld": 3}  # dx, dy / dx, dy, dz (not the gripper)


def known_env(name: str) -> bool:
    """Whether ``env_factory`` can build ``name``: one of ``ENVS`` or a ``package.module:Factory``
    (whether that imports is known only when it is built)."""
    module, _, attr = name.partition(":")
    return name in ENVS or bool(module and attr)


def drift_dims(name: str) -> int | None:
    """How many leading action entries the expert's takeover compares for env ``name`` (None:
    all the agent and expert actions share)."""
    return DRIFT_DIMS.get(name)


def check_options(constructor: Callable, options: Mapping[str, Any], field: str) -> None:
    """One line naming the first of ``options`` that ``constructor`` takes no keyword for (none
    when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(constructor).parameters
    except (TypeError, ValueError):  # no signature to check against: the call will tell
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    names = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for key in options:
        if key not in names:
            what = getattr(constructor, "__name__", str(constructor))
            raise RecapError(f"{field}_options: {key!r} is not an option of {what}; use one of "
                             f"{names}")  # fmt: skip


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
    if not known_env(name):
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
        from recap.envs.metaworld import MetaWorldEnv, MetaWorldExpert

        check_options(MetaWorldEnv, options, field)
        kwargs = {**limit, **options}
        task = kwargs.get(
            "env_name", inspect.signature(MetaWorldEnv).parameters["env_name"].default
        )
        return (lambda: MetaWorldEnv(**kwargs)), (MetaWorldExpert(task) if expert else None)
    if name == "libero":
        from recap.envs.libero import LiberoEnv

        check_options(LiberoEnv, options, field)
        kwargs = {"suite": suite, "task_id": task_id, **limit, **options}
        return (lambda: LiberoEnv(**kwargs)), None
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise RecapError(f"{field}: {name!r} does not import ({error}); name an importable "
                         "'package.module:Factory'") from None  # fmt: skip
    check_options(factory, options, field)
    return (lambda: factory(**options)), None
