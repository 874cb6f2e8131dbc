"""recap's gin configurables in one place: each one's name, the module that registers it, and the
checks that run on its bindings right after parsing.

gin knows a configurable once the module defining it is imported. A step process imports only
what it calls (``recap-returns`` never loads torch), so:

- ``CONFIGURABLES`` (name -> module): ``recap.cli.parse_gin`` skips the bindings of a name whose
  module this process has not imported (a gin file or an ``all:`` binding shared by every step);
  any other unknown name is an error. ``tests/test_config_check.py`` checks the table against every
  ``@gin.configurable`` in recap's source and against gin after ``register_all()``.
- ``register(*names)`` / ``register_all()``: import the modules of those configurables (the
  pipeline registers every one and so checks every binding before anything runs). Modules are
  imported by name (``importlib``): importing this module imports nothing of recap, so the
  registry sits below everything in ``.importlinter``'s layers and a light process stays light.
- ``PARSE_CHECKS`` (check -> the configurables whose bindings it validates):
  ``run_parse_checks()`` runs each check whose configurables this process has registered (their
  bindings were parsed, not skipped), e.g. ``recap.models.adapters.check_gin`` on
  ``pi05_policy.lora`` / ``freeze``.
- ``name_of(fn)``: the name a configurable function or class is registered under.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable

import gin

from recap.errors import RecapError

CONFIGURABLES: dict[str, str] = {
    "compute_advantages": "recap.steps.compute_advantages",
    "compute_returns": "recap.steps.compute_returns",
    "deepspeed_config": "recap.engine.deepspeed_config",
    "evaluate_policy": "recap.steps.evaluate_policy",
    "iterate": "recap.iterate",
    "LoraOptions": "recap.models.adapters",
    "pi05_policy": "recap.models.pi05",
    "pipeline": "recap.pipeline",
    "policy_data": "recap.data.policy_data",
    "relabel": "recap.steps.relabel",
    "toy_data": "recap.models.toy",
    "toy_model": "recap.models.toy",
    "train": "recap.steps.train",
    "Tracker": "recap.tracking",
    "value_data": "recap.data.datasets",
    "value_model": "recap.models.value",
}
KNOWN = tuple(CONFIGURABLES)
# "module.function" -> the configurables whose bindings it checks after parsing
PARSE_CHECKS: dict[str, tuple[str, ...]] = {
    "recap.models.adapters.check_gin": ("LoraOptions", "pi05_policy", "value_model"),
}


def _module(name: str) -> str:
    try:
        return CONFIGURABLES[name]
    except KeyError:
        raise RecapError(
            f"gin: {name!r} is not one of recap's configurables ({', '.join(KNOWN)})"
        ) from None


def register(*names: str) -> None:
    """Import the modules that register ``names`` with gin."""
    for module in dict.fromkeys(_module(name) for name in names):
        importlib.import_module(module)


def register_all() -> None:
    """Import every module that registers one of recap's configurables."""
    register(*KNOWN)


def registered(name: str) -> bool:
    """Whether this process has registered ``name`` (its module is imported)."""
    return _module(name) in sys.modules


def run_parse_checks() -> None:
    """Each of ``PARSE_CHECKS`` whose configurables this process has registered."""
    for check, names in PARSE_CHECKS.items():
        if any(registered(name) for name in names):
            module, _, function = check.rpartition(".")
            getattr(importlib.import_module(module), function)()


def name_of(fn: Callable) -> str:
    """The name ``fn`` (a gin configurable: the function or class gin returned) is registered
    under: one of recap's, else its own ``module.name`` when gin knows it by that."""
    for name in _loaded(KNOWN):
        if gin.get_configurable(name) is fn:
            return name
    own = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', '')}"
    try:
        if gin.get_configurable(own) is fn:
            return own
    except (ValueError, KeyError):
        pass
    raise RecapError(f"gin: {fn!r} is not a gin configurable")


def _loaded(names: Iterable[str]) -> list[str]:
    return [name for name in names if registered(name)]
