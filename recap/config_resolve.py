"""The resolved config of a parsed gin config, in canonical form: what a stage fingerprint
hashes (``recap.workflow.fingerprints``). Part of the gin edge (with ``recap.registry``,
``recap.config_check`` and ``recap.cli``): only gin's public API, ``config_str`` (which bindings
exist), ``get_bindings``, ``query_parameter``, ``get_configurable`` and the configurables'
signatures.

``resolved_config`` gives every parameter of every configurable a step reads, with its bound
value when bound and its signature default when not (see ``recap.workflow.fingerprints`` for
what counts); ``canonical_json`` writes it (sorted keys, floats as ``repr``, tuples as lists,
paths as strings).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import re
from collections.abc import Iterable
from pathlib import PurePath

import gin
from gin.config import ConfigurableReference

from recap.errors import RecapError
from recap.registry import declared, is_required, name_of

EXCLUDED = ("Tracker",)  # where a run is logged, not what it computes
_BINDING = re.compile(r"^([A-Za-z_][\w./]*)\s*=")
_SKIP = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def bound_keys(text: str) -> list[tuple[str, str]]:
    """``(scope, selector)`` of every configurable bound in ``gin.config_str()`` text (its
    binding lines ``scope/selector.param = value``; macros, which have no dot, left out)."""
    keys = []
    for line in text.splitlines():
        match = _BINDING.match(line)
        if match and "." in match.group(1):
            scoped = match.group(1).rpartition(".")[0]
            scope, _, selector = scoped.rpartition("/")
            keys.append((scope, selector))
    return list(dict.fromkeys(keys))


def short(selector: str) -> str:
    """A configurable's name without its module (``recap.steps.train.train`` -> ``train``)."""
    return selector.rsplit(".", 1)[-1]


class _Resolver:
    """Canonical resolved configs of the configurables of one parsed gin config."""

    def __init__(self, where: str, unknown_hint: str = ""):
        self.where, self.unknown_hint = where, unknown_hint
        self.pending: list[tuple[str, str]] = []

    def fail(self, what: str) -> RecapError:
        return RecapError(f"pipeline step {self.where}: fingerprint: {what}")

    def config(self, scope: str, selector: str, bound: bool = True) -> dict:
        """Every parameter of ``selector`` in ``scope``: bound value (unless not ``bound``),
        else signature default."""
        try:
            fn = declared(gin.get_configurable(selector))  # its own signature, not gin's wrapper
        except ValueError as exc:
            raise self.fail(
                f"{selector} is not a registered configurable ({exc}){self.unknown_hint}"
            ) from exc
        params = {p.name: p.default for p in inspect.signature(fn).parameters.values()
                  if p.kind not in _SKIP and p.default is not p.empty}  # fmt: skip
        if bound:
            key = f"{scope}/{selector}" if scope else selector
            params.update(gin.get_bindings(key, resolve_references=False))
        return {name: self.canonical(value, scope) for name, value in params.items()}

    def canonical(self, value: object, scope: str, depth: int = 0) -> object:
        """A JSON value that stands for ``value`` (references queued for resolving)."""
        if depth > 50:
            raise self.fail(f"a value nests deeper than 50 levels: {value!r:.200}")
        again = lambda v: self.canonical(v, scope, depth + 1)  # noqa: E731
        if is_required(value):
            return {"gin": "REQUIRED"}
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value  # json writes repr(value): the shortest round trip
        if isinstance(value, ConfigurableReference):
            return self.reference(value, scope, depth)
        if isinstance(value, (list, tuple)):
            return [again(v) for v in value]
        if isinstance(value, (set, frozenset)):
            return sorted((again(v) for v in value), key=canonical_json)
        if isinstance(value, dict):
            if all(isinstance(k, str) for k in value):
                return {k: again(v) for k, v in value.items()}
            return sorted(([again(k), again(v)] for k, v in value.items()), key=canonical_json)
        if isinstance(value, PurePath):
            return str(value)
        if isinstance(value, enum.Enum):
            return {"enum": f"{type(value).__qualname__}.{value.name}"}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: again(getattr(value, f.name)) for f in dataclasses.fields(value)}
            return {"dataclass": type(value).__qualname__, "fields": fields}
        if callable(value):
            try:
                return {"gin.ref": name_of(value)}  # a configurable as a default: as @name binds
            except RecapError:
                return {"callable": f"{value.__module__}.{value.__qualname__}"}
        if hasattr(value, "item") and hasattr(value, "dtype"):  # a numpy scalar
            return again(value.item())
        raise self.fail(
            f"cannot write a {type(value).__name__} ({value!r:.100}) in canonical form; "
            "use a literal (number, string, list, dict) as the default"
        )

    def reference(self, ref: ConfigurableReference, scope: str, depth: int) -> object:
        """A macro or constant: its value; a configurable: ``@scope/name`` (``()`` if called),
        queued so that its own parameters count."""
        if ref.configurable.selector == "gin.constant":
            return self.canonical(ref.scoped_configurable_fn(), scope, depth + 1)
        if ref.configurable.selector == "gin.macro":
            return self.canonical(gin.query_parameter(repr(ref)), scope, depth + 1)
        inner = "/".join(ref.scopes)
        self.pending.append(("/".join(s for s in (scope, inner) if s), ref.selector, True))
        name = "/".join(s for s in (inner, short(ref.selector)) if s)
        return {"gin.ref": name + ("()" if ref.evaluate else "")}


def resolved_config(
    text: str, reads: Iterable[str], where: str, unknown_hint: str = ""
) -> dict[str, dict]:
    """``{"scope/name": {param: canonical value}}`` of the parsed config (``config_str()`` text
    ``text``): ``reads`` and everything a value references, defaults included; everything else
    bound, unless it resolves to its defaults (a binding of a default of a configurable the step
    does not read); ``Tracker`` left out. ``unknown_hint`` ends the error for a configurable
    gin does not know."""
    resolver = _Resolver(where, unknown_hint)
    resolver.pending = [
        *((s, k, False) for s, k in bound_keys(text)),
        *(("", r, True) for r in reads),
    ]
    configs: dict[tuple[str, str], dict] = {}
    selectors: dict[tuple[str, str], str] = {}
    read: set[tuple[str, str]] = set()
    while resolver.pending:
        scope, selector, reached = resolver.pending.pop()
        key = (scope, short(selector))
        if key[1] in EXCLUDED:
            continue
        if reached:
            read.add(key)
        first = key not in configs
        if first:
            configs[key], selectors[key] = resolver.config(scope, selector), selector
        if scope and (first or reached):  # its parent, to compare with (read if it is)
            resolver.pending.append((scope.rpartition("/")[0], selector, reached))
    out = {}
    for (scope, name), config in configs.items():
        if scope:
            if configs.get((scope.rpartition("/")[0], name)) == config:
                continue  # resolves exactly as the scope above it: says nothing
        elif (scope, name) not in read:
            if config == resolver.config("", selectors[scope, name], bound=False):
                continue  # bound to its defaults, and the step does not read it
        out[f"{scope}/{name}" if scope else name] = config
    return out


def canonical_json(value: object) -> str:
    """``value`` as canonical JSON: sorted keys, no spaces, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
