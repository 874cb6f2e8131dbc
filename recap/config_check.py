"""Configuration checks made before anything runs: ``gin.REQUIRED`` resolved at plan time.

gin checks a ``gin.REQUIRED`` parameter only when its configurable is called, so a config that
leaves one unbound parses cleanly and dies with a traceback hours later (Step 4 after Steps 1-3
ran on 8 devices). ``missing_required(root)`` walks every configurable a call of ``root`` reaches
(its gin references, in lists and dicts too, and configurable defaults such as
``evaluate_policy``'s ``pi05_policy``), in the scopes gin would call them with, and returns
the REQUIRED parameters left unbound, directly or through a macro that is itself
``%gin.REQUIRED``. ``check_required`` turns the first into one line.

``KNOWN_CONFIGURABLES``: every configurable recap registers. A step process imports only what it
calls, so bindings of recap's other configurables (a file shared by all steps, ``all:``
bindings) are skipped there by name; any other unknown name is still an error, and the pipeline,
which imports everything, checks every binding before anything runs.

Typed model factories (``config_fields``): ``value_model`` and ``pi05_policy`` take the fields of
their config dataclass, and gin checks every binding of theirs against exactly those names at
parse time (``value_model.expert_widht`` is an error there, not a ``TypeError`` on every rank);
their size dicts (``pi05_policy.vision = {...}``) are checked against the Hugging Face config
class they feed (``check_config_dicts``). ``gin_error_line`` turns gin's parse errors into one
line with the nearest valid names.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import gin
from gin import config as gin_config

from recap.errors import RecapError

KNOWN_CONFIGURABLES = (
    "compute_advantages",
    "compute_returns",
    "deepspeed_config",
    "evaluate_policy",
    "iterate",
    "LoraOptions",
    "pi05_policy",
    "pipeline",
    "policy_data",
    "relabel",
    "toy_data",
    "toy_model",
    "train",
    "Tracker",
    "value_data",
    "value_model",
)


@dataclass(frozen=True)
class Missing:
    """A REQUIRED parameter a call would leave unbound: ``key`` (``scope/name.param``) and,
    when it is bound to a macro that is ``%gin.REQUIRED``, that macro's name."""

    key: str
    macro: str | None = None

    def message(self, bind_prefix: str = "") -> str:
        name = self.macro or self.key
        what = f"macro {self.macro} is %gin.REQUIRED" if self.macro else "not bound"
        return (f"{self.key} is required ({what}); bind it, e.g. "
                f"--gin_param '{bind_prefix}{name} = ...'")  # fmt: skip


def _entry(name_or_fn: str | Callable) -> gin_config.Configurable:
    """The registry entry of a configurable, by name/selector or by its gin wrapper."""
    if isinstance(name_or_fn, str):
        found = gin_config._REGISTRY.get_match(name_or_fn)
        if found is None:
            raise RecapError(f"gin: no configurable {name_or_fn!r} is registered")
        return found
    for _, entry in gin_config._REGISTRY.items():
        if entry.wrapper is name_or_fn or entry.wrapped is name_or_fn:
            return entry
    raise RecapError(f"gin: {name_or_fn!r} is not a gin configurable")


def _required_params(
    entry: gin_config.Configurable, bound_names: Iterable[str] = ()
) -> tuple[list[str], list[object]]:
    """(names of REQUIRED parameters, defaults that are configurables) of ``entry``; the
    defaults of ``bound_names`` (parameters bound to something else) are not called."""
    fn = entry.wrapped
    if inspect.isclass(fn):
        fn = fn.__init__
    required, defaults, skip = [], [], set(bound_names)
    for param in inspect.signature(fn).parameters.values():
        if param.default is gin.REQUIRED:
            required.append(param.name)
        elif param.default is not param.empty and callable(param.default):
            if param.name not in skip:
                defaults.append(param.default)
    return required, defaults


def _is(ref: object, fn: Callable) -> bool:
    return isinstance(ref, gin_config.ConfigurableReference) and ref.configurable.wrapped is fn


def _is_required_constant(value: object) -> bool:
    return _is(value, gin_config._retrieve_constant) and value.scopes == ["gin.REQUIRED"]


def _macro_value(name: str) -> object:
    """The value bound to macro ``name`` (``gin.REQUIRED`` when it has none)."""
    return gin_config._CONFIG.get((name, "gin.macro"), {}).get("value", gin.REQUIRED)


def _references(value: object) -> Iterator[object]:
    """Configurable references and macro values inside a bound value (lists, dicts, tuples)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _references(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _references(item)
    elif _is(value, gin_config.macro):
        yield from _references(_macro_value("/".join(value.scopes)))
    elif isinstance(value, gin_config.ConfigurableReference):
        yield value


def resolve(value: object) -> object:
    """A bound value with its macros replaced by their values, in lists and dicts too (what gin
    passes at call time; references to other configurables are left as they are)."""
    if isinstance(value, dict):
        return {k: resolve(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(resolve(v) for v in value)
    if _is(value, gin_config.macro):
        return resolve(_macro_value("/".join(value.scopes)))
    return value


def bound(name: str, default: object = None) -> object:
    """The value bound to ``name`` (``configurable.param``), macros resolved, nested ones too;
    ``default`` when it is not bound."""
    try:
        return resolve(gin.query_parameter(name))
    except ValueError:
        return default


def _unresolved(value: object) -> tuple[bool, str | None]:
    """(whether ``value`` resolves to REQUIRED, the last macro on the way)."""
    macro = None
    while _is(value, gin_config.macro):
        macro = "/".join(value.scopes)
        value = _macro_value(macro)
    return value is gin.REQUIRED or _is_required_constant(value), macro


def _reached(root: str | Callable) -> Iterator[tuple[gin_config.Configurable, list[str], dict]]:
    """``(entry, scope, bindings)`` of ``root`` and of every configurable a call of it reaches
    (gin references in its bindings, configurable defaults), each in the scope gin would use."""
    seen: set[tuple[str, str]] = set()
    pending: list[tuple[gin_config.Configurable, list[str]]] = [(_entry(root), [])]
    while pending:
        entry, scope = pending.pop()
        if (entry.selector, "/".join(scope)) in seen:
            continue
        seen.add((entry.selector, "/".join(scope)))
        bindings = gin_config._get_bindings(entry.selector, scope)
        yield entry, scope, bindings
        for value in bindings.values():
            for ref in _references(value):
                if not _is(ref, gin_config._retrieve_constant):
                    pending.append((ref.configurable, [*scope, *ref.scopes]))
        for default in _required_params(entry, bindings)[1]:
            found = next((e for _, e in gin_config._REGISTRY.items()
                          if e.wrapper is default), None)  # fmt: skip
            if found is not None:
                pending.append((found, scope))


def missing_required(root: str | Callable) -> list[Missing]:
    """Parameters a call of ``root`` (and of the configurables it reaches) would find REQUIRED:
    REQUIRED parameters left unbound, and bindings to a macro that is ``%gin.REQUIRED``."""
    out: list[Missing] = []
    for entry, scope, bindings in _reached(root):
        for name in {*_required_params(entry)[0], *bindings}:
            unresolved, macro = _unresolved(bindings.get(name, gin.REQUIRED))
            if unresolved:
                out.append(Missing("/".join([*scope, f"{entry.name}.{name}"]), macro))
    return sorted(out, key=lambda m: (m.key.count("/"), m.key))  # unscoped first


def check_required(root: str | Callable, where: str = "", bind_prefix: str = "") -> None:
    """One-line ``RecapError`` when a call of ``root`` would meet an unbound REQUIRED value: the
    first parameter, what to bind, and the other names still to bind."""
    missing = missing_required(root)
    if missing:
        names = list(dict.fromkeys(m.macro or m.key for m in missing))
        also = f"; also unbound: {', '.join(names[1:])}" if len(names) > 1 else ""
        raise RecapError(f"{where}{missing[0].message(bind_prefix)}{also}")


def macros_read(root: str | Callable) -> set[str]:
    """Names of the macros a call of ``root`` reads (through any configurable it reaches)."""
    out: set[str] = set()
    for _, _, bindings in _reached(root):
        for value in bindings.values():
            _collect_macros(value, out)
    return out


def _collect_macros(value: object, out: set[str]) -> None:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            _collect_macros(item, out)
    elif _is(value, gin_config.macro):
        name = "/".join(value.scopes)
        out.add(name)
        _collect_macros(_macro_value(name), out)


def macros_defined() -> set[str]:
    """Names of the macros the parsed config defines."""
    return {scope for scope, selector in gin_config._CONFIG if selector == "gin.macro"}


# ---- typed model factories ------------------------------------------------------------------


def config_fields(config: type, **dicts: type | tuple[type, tuple[str, ...]]) -> Callable:
    """Declare that a gin factory ``fn(..., **fields)`` takes exactly the fields of dataclass
    ``config``: its signature (what gin checks each binding name against while parsing) lists
    them as keyword-only parameters in place of ``**fields``. Apply it below
    ``@gin.configurable``. Only bound fields reach ``fields`` (an unbound one keeps the config's
    or the checkpoint's value), so the added parameters carry no default.

    ``dicts``: parameters holding keyword arguments of a Hugging Face config class, as
    ``name=Class`` or ``name=(Class, keys the factory sets itself)``; ``check_config_dicts``
    checks their keys after parsing."""

    def declare(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        taken = {p.name for p in own}
        added = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=f.type)
                 for f in dataclasses.fields(config) if f.name not in taken]  # fmt: skip
        fn.__signature__ = sig.replace(parameters=[*own, *added])
        fn.config_dicts = {k: v if isinstance(v, tuple) else (v, ()) for k, v in dicts.items()}
        return fn

    return declare


@functools.cache
def config_keys(cls: type) -> tuple[str, ...]:
    """The keys a Hugging Face config class accepts: its ``__init__`` parameters and the
    attributes ``to_dict`` writes (``model_type``, ``_name_or_path``, ...)."""
    return tuple(sorted({*_param_names(cls.__init__), *cls().to_dict()}))


def _param_names(fn: Callable) -> list[str]:
    """Names ``fn`` takes by keyword (not ``self``, ``*args``, ``**kwargs``), in order."""
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"]  # fmt: skip


def _nearest(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f"nearest valid: {', '.join(close)}" if close else f"valid: {', '.join(names)}"


def check_config_dicts() -> None:
    """One-line ``RecapError`` for a key of a bound size dict (``config_fields`` ``dicts``, any
    scope) that its Hugging Face config class does not take, or that the factory sets itself."""
    for _, entry in sorted(gin_config._REGISTRY.items(), key=lambda item: item[0]):
        dicts = getattr(entry.wrapped, "config_dicts", None)
        if not dicts:
            continue
        for (scope, selector), bindings in gin_config._CONFIG.items():
            if selector != entry.selector:
                continue
            where = f"{scope}/{entry.name}" if scope else entry.name
            for param, (cls, own) in dicts.items():
                value = resolve(bindings.get(param))
                if value is None or isinstance(value, gin_config.ConfigurableReference):
                    continue
                if not isinstance(value, dict):
                    raise RecapError(f"gin config: {where}.{param}={value!r}; bind a dict of "
                                     f"{cls.__name__} arguments")  # fmt: skip
                keys = [k for k in config_keys(cls) if k not in own]
                for key in value:
                    if key in own:
                        raise RecapError(f"gin config: {where}.{param} sets {key!r}, which "
                                         f"{entry.name} sets itself; remove it")  # fmt: skip
                    if key not in keys:
                        raise RecapError(
                            f"gin config: {where}.{param} has unknown key {key!r} (not a "
                            f"{cls.__name__} argument); {_nearest(str(key), keys)}"
                        )


_NO_PARAMETER = re.compile(r"Configurable '(.+)' doesn't have a parameter named '(.+)'\.")
_LOCATION = re.compile(r'^\s*In (?:file "(.+)", line (\d+)|bindings string line (\d+))$')


def gin_error_line(exc: BaseException, sources: Sequence[str]) -> str:
    """gin's parse error in one line: the message, where (file and line, or the binding; else
    the ``sources`` parsed), and for an unknown parameter the nearest names the configurable
    takes."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return f"{type(exc).__name__}; check the binding names in {list(sources)}"
    first, where = lines[0], f"; check the binding names in {list(sources)}"
    location = _LOCATION.match(lines[1]) if len(lines) > 1 else None
    if location:
        file, line, _ = location.groups()
        text = lines[2].strip() if len(lines) > 2 else ""
        where = f" ({file} line {line}: {text})" if file else f" (binding {text!r})"
    unknown = _NO_PARAMETER.match(first)
    if unknown:
        selector, param = unknown.groups()
        found = gin_config._REGISTRY.get_match(selector)
        if found is not None:
            fn = found.wrapped.__init__ if inspect.isclass(found.wrapped) else found.wrapped
            names = _param_names(fn)
            return f"{selector} has no parameter {param!r}{where}; {_nearest(param, names)}"
    return f"{first}{where}"
