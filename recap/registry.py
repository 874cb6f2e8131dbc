"""recap's gin configurables in one place: gin itself (the one binding of
``recap.configurable``), each configurable's name, the module that declares it, and the checks
that run on its bindings right after parsing.

Library modules import no gin: they declare their configurables (``@configurable()``) and take
settings from the configuration only where they say so (``configured(Tracker)()``). Importing
this module installs gin as that configuration (``GinConfiguration``): every declared
configurable, declared before or after, is registered with gin under its name and its module
(``gin.external_configurable``, the object itself left unchanged), so gin files bind it and
``@name`` references reach it.

gin knows a configurable once the module declaring it is imported. A step process imports only
what it calls (``recap-returns`` never loads torch), so:

- ``CONFIGURABLES`` (name -> module): ``recap.cli.parse_gin`` skips the bindings of a name whose
  module this process has not imported (a gin file or an ``all:`` binding shared by every step);
  any other unknown name is an error. ``tests/test_config_check.py`` checks the table against every
  ``@configurable`` in recap's source and against gin after ``register_all()``.
- ``register(*names)`` / ``register_all()``: import the modules of those configurables (the
  pipeline registers every one and so checks every binding before anything runs). Modules are
  imported by name (``importlib``): importing this module imports nothing of recap beyond
  ``recap.configurable`` and ``recap.errors``, so a light process stays light.
- ``PARSE_CHECKS`` (check -> the configurables whose bindings it validates):
  ``run_parse_checks()`` runs each check whose configurables this process has registered (their
  bindings were parsed, not skipped), e.g. ``recap.config_check.check_model_options`` on
  ``pi05_policy.lora`` / ``freeze``.
- ``name_of(fn)``: the name a configurable function or class is registered under (the declared
  object or gin's wrapper of it); ``declared(fn)``: the declared object behind gin's wrapper.
- ``bound(key)``, ``config_entries()``, ``resolve(value)``: the parsed config read through gin's
  public API (``recap.configurable.bound`` / ``config_entries`` reach these); ``literal(value)``:
  a value written as gin parses it back (what the pipeline and the sweeps hand a step).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable

import gin
from gin.config import ConfigurableReference
from gin.config import macro as gin_macro

from recap import configurable
from recap.errors import RecapError

CONFIGURABLES: dict[str, str] = {
    "compute_advantages": "recap.steps.compute_advantages",
    "compute_returns": "recap.steps.compute_returns",
    "deepspeed_config": "recap.engine.deepspeed_config",
    "evaluate_policy": "recap.steps.evaluate_policy",
    "iterate": "recap.workflow.iterate",
    "LoraOptions": "recap.models.adapters",
    "pi05_policy": "recap.models.pi05",
    "pipeline": "recap.workflow.config",
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
    "recap.config_check.check_model_options": ("LoraOptions", "pi05_policy", "value_model"),
}


class GinConfiguration:
    """gin as ``recap.configurable``'s configuration."""

    def __init__(self) -> None:
        self.wrapped: dict[str, object] = {}  # declared name -> gin's wrapper of the object

    def declare(self, name: str, obj: object) -> None:
        if name not in self.wrapped:
            self.wrapped[name] = gin.external_configurable(obj, name=name)

    def configured(self, obj: object) -> object:
        return self.wrapped[configurable.declared_name(obj)]

    def bound(self, key: str, default: object) -> object:
        return bound(key, default)

    def entries(self, macros: bool) -> list[tuple[str, str]]:
        return config_entries(macros)

    def text(self, operative: bool, max_line_length: int) -> str:
        if operative:
            return gin.operative_config_str(max_line_length=max_line_length)
        return gin.config_str(max_line_length=max_line_length)

    def clear(self) -> None:
        gin.clear_config()


# ---- reading the parsed config (gin's public API) ------------------------------------------


def refers_to(ref: object, fn: Callable) -> bool:
    """Whether ``ref`` is a gin reference to ``fn`` (gin's own wrapper, as ``gin.macro``)."""
    return isinstance(ref, ConfigurableReference) and ref.configurable.wrapped is fn


def macro_value(name: str) -> object:
    """The value bound to macro ``name`` (``gin.REQUIRED`` when it has none)."""
    try:
        return gin.query_parameter(f"{name}/gin.macro.value")
    except ValueError:
        return gin.REQUIRED


def is_required(value: object) -> bool:
    """A required default: recap's ``REQUIRED`` (``recap.configurable``), or gin's own (a
    ``gin.REQUIRED`` default, an unbound macro)."""
    return value is configurable.REQUIRED or value is gin.REQUIRED


def resolve(value: object) -> object:
    """A bound value with its macros replaced by their values, in lists and dicts too (what gin
    passes at call time; references to other configurables are left as they are)."""
    if isinstance(value, dict):
        return {k: resolve(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(resolve(v) for v in value)
    if refers_to(value, gin_macro):
        return resolve(macro_value("/".join(value.scopes)))
    return value


def bound(name: str, default: object = None) -> object:
    """The value bound to ``name`` (``configurable.param``), macros resolved, nested ones too;
    ``default`` when it is not bound."""
    try:
        return resolve(gin.query_parameter(name))
    except ValueError:
        return default


_CONFIG_LINE = 10_000  # gin draws each section's rule as wide as the line length


def config_entries(macros: bool = False) -> list[tuple[str, str]]:
    """The parsed config as gin writes it (``gin.config_str()``): the bindings as
    ``(scope/name.param, value text)``, or with ``macros`` the macros as ``(NAME, value text)``.
    Values gin cannot write back as a literal are left out, as it leaves them; a value gin wraps
    over several lines is joined into one."""
    statements: list[tuple[str | None, str]] = []
    section = None
    for line in gin.config_str(max_line_length=_CONFIG_LINE).splitlines():
        if line.startswith("# Macros:"):
            section = "macros"
        elif line.startswith("# Parameters for "):
            section = "bindings"
        elif line[:1].isspace() and statements:  # a continuation of the statement above
            kind, text = statements[-1]
            statements[-1] = (kind, f"{text.removesuffix(chr(92)).rstrip()} {line.strip()}")
        elif line and not line.startswith("#"):
            statements.append((section, line))
    want = "macros" if macros else "bindings"
    return [(key, text.strip()) for kind, line in statements if kind == want
            for key, _, text in [line.partition(" = ")]]  # fmt: skip


def literal(value: object) -> str:
    """``value`` written as a literal gin parses back to it: strings and paths in double quotes,
    lists, tuples and dicts of literals, numbers, booleans, None."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        return json.dumps(value)
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        items = ", ".join(literal(v) for v in value)
        if isinstance(value, list):
            return f"[{items}]"
        return f"({items},)" if len(value) == 1 else f"({items})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise RecapError(f"binding value {value!r:.100}: not a literal (string, path, number, bool, "
                     "None, or a list, tuple or dict of those)")  # fmt: skip


GIN = GinConfiguration()
configurable.install(GIN)


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


def declared(fn: object) -> object:
    """The declared function or class behind ``fn`` when ``fn`` is gin's wrapper of one (the
    object a ``@name`` reference carries); ``fn`` itself otherwise."""
    for name, wrapper in GIN.wrapped.items():
        if wrapper is fn:
            return configurable.DECLARED[name]
    return fn


def name_of(fn: Callable) -> str:
    """The name ``fn`` is registered under: recap's declared name of the object or of the one
    gin wrapped, else its own ``module.name`` when gin knows it by that."""
    name = configurable.declared_name(declared(fn))
    if name is not None:
        return name
    own = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', '')}"
    try:
        if gin.get_configurable(own) is fn:
            return own
    except (ValueError, KeyError):
        pass
    raise RecapError(f"gin: {fn!r} is not a gin configurable")
