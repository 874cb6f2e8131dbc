"""What library code knows of configuration: which of its functions and classes are
configurable, which parameters are required, and where a call takes its unbound parameters from
the configuration. No configuration language here: gin binds these at the edge
(``recap.registry`` installs it; ``recap.cli`` parses the files), and nothing below the edge
imports gin.

- ``@configurable()`` / ``@configurable("name")``: declare a function or class configurable
  under its name (its own by default). The object is returned unchanged: a direct call is a
  plain call with the arguments given.
- ``REQUIRED``: the default of a parameter the configuration must bind (checked before a step
  runs, ``recap.config_check.check_required``).
- ``configured(obj)``: ``obj`` whose unbound parameters come from the configuration (``obj``
  itself where none is installed, or for an object that is not declared). A step calls it
  where it takes a part's settings from the configuration, e.g. ``configured(Tracker)()``.
- ``bound(key, default)``, ``config_entries()``, ``config_text()``, ``clear_config()``: the
  parsed configuration read (and forgotten) through the installed edge.
- ``config_fields(...)``: a model factory takes exactly the fields of its config dataclass.
- ``check_given(config)``, ``config_class(step)``: a step takes one frozen config dataclass,
  declared configurable under the step's name (``compute_returns(ReturnsConfig(...))``; gin binds
  ``compute_returns.*`` to the dataclass's fields); the CLI builds it from the configuration.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from recap.errors import RecapError

T = TypeVar("T")


class _Required:
    """The default of a parameter the configuration must bind."""

    _instance: _Required | None = None

    def __new__(cls) -> _Required:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "REQUIRED"

    def __reduce__(self):
        return (_Required, ())


REQUIRED: Any = _Required()
DECLARED: dict[str, Any] = {}  # name -> the declared function or class, in declaration order


class Configuration(Protocol):
    """What the edge provides (``recap.registry``'s gin binding)."""

    def declare(self, name: str, obj: Any) -> None: ...

    def configured(self, obj: Any) -> Any: ...

    def bound(self, key: str, default: object) -> object: ...

    def entries(self, macros: bool) -> list[tuple[str, str]]: ...

    def text(self, operative: bool, max_line_length: int) -> str: ...

    def clear(self) -> None: ...


_installed: Configuration | None = None


def configurable(name: str | None = None) -> Callable[[T], T]:
    """Declare the decorated function or class configurable as ``name`` (default: its own
    ``__name__``); it is returned unchanged. Written with parentheses: ``@configurable()``."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"write @configurable() or @configurable('name'), not @configurable "
                        f"(on {_where(name)})")  # fmt: skip

    def declare(obj: T) -> T:
        key = name or obj.__name__  # type: ignore[attr-defined]
        if key in DECLARED and DECLARED[key] is not obj:
            raise ValueError(f"configurable {key!r} is declared twice: "
                             f"{_where(DECLARED[key])} and {_where(obj)}")  # fmt: skip
        DECLARED[key] = obj
        obj.__recap_configurable__ = key  # type: ignore[attr-defined]
        if _installed is not None:
            _installed.declare(key, obj)
        return obj

    return declare


def _where(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"


def declared_name(obj: object) -> str | None:
    """The name ``obj`` is declared under (None for anything not declared)."""
    name = getattr(obj, "__recap_configurable__", None)
    return name if name is not None and DECLARED.get(name) is obj else None


def install(configuration: Configuration) -> None:
    """Make ``configuration`` the one every call below reads; it is told of every declared
    configurable, those declared so far and each one declared later."""
    global _installed
    _installed = configuration
    for name, obj in list(DECLARED.items()):
        configuration.declare(name, obj)


def configured(obj: T) -> T:
    """``obj`` whose unbound parameters come from the configuration (``obj`` itself where none
    is installed, or for an object that is not a declared configurable)."""
    if _installed is None or declared_name(obj) is None:
        return obj
    return _installed.configured(obj)


def bound(key: str, default: object = None) -> object:
    """The value bound to ``key`` (``scope/name.param``), macros resolved; ``default`` when it
    is not bound or no configuration is installed."""
    return default if _installed is None else _installed.bound(key, default)


def config_entries(macros: bool = False) -> list[tuple[str, str]]:
    """The bindings as ``(scope/name.param, value text)`` (with ``macros``, the macros as
    ``(NAME, value text)``), as the configuration writes them."""
    return [] if _installed is None else _installed.entries(macros)


def config_text(operative: bool = False, max_line_length: int = 80) -> str:
    """The parsed configuration as text (``operative``: only what was called so far)."""
    return "" if _installed is None else _installed.text(operative, max_line_length)


def clear_config() -> None:
    """Forget every parsed binding."""
    if _installed is not None:
        _installed.clear()


def config_fields(config: type, **dicts: type | tuple[type, tuple[str, ...]]) -> Callable:
    """Declare that a factory ``fn(..., **fields)`` takes exactly the fields of dataclass
    ``config``: its signature (what the configuration checks each binding name against while
    parsing) lists them as keyword-only parameters in place of ``**fields``. Apply it below
    ``@configurable()``. Only bound fields reach ``fields`` (an unbound one keeps the config's
    or the checkpoint's value), so the added parameters carry no default.

    ``dicts``: parameters holding keyword arguments of a Hugging Face config class, as
    ``name=Class`` or ``name=(Class, keys the factory sets itself)``;
    ``recap.config_check.check_config_dicts`` checks their keys after parsing."""

    def declare(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        taken = {p.name for p in own}
        added = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=f.type)
                 for f in dataclasses.fields(config) if f.name not in taken]  # fmt: skip
        fn.__signature__ = sig.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        fn.config_dicts = {k: v if isinstance(v, tuple) else (v, ()) for k, v in dicts.items()}  # type: ignore[attr-defined]
        return fn

    return declare


def check_given(config: object) -> None:
    """One-line ``RecapError`` when the config dataclass ``config`` was built without one of its
    REQUIRED fields (a step config's ``__post_init__`` calls it: a direct call fails here, not
    deep inside the step)."""
    name = declared_name(type(config))
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        if getattr(config, field.name) is REQUIRED:
            raise RecapError(f"{name}.{field.name} is required; give "
                             f"{type(config).__name__}({field.name}=...) or bind it, e.g. "
                             f"--gin_param '{name}.{field.name} = ...'")  # fmt: skip


def config_class(step: Callable) -> type:
    """The config dataclass ``step`` takes: the annotation of its one parameter, a declared
    configurable (``def compute_returns(config: ReturnsConfig)``)."""
    params = list(inspect.signature(step).parameters)
    cls = typing.get_type_hints(step).get(params[0]) if len(params) == 1 else None
    if not dataclasses.is_dataclass(cls) or declared_name(cls) is None:
        raise TypeError(f"{_where(step)}: a step takes one parameter, annotated with its config "
                        "dataclass declared @configurable('<step name>')")  # fmt: skip
    return cls  # type: ignore[return-value]
