"""Configuration checks made before anything runs: ``REQUIRED`` resolved at plan time. Part of
the gin edge (with ``recap.registry`` and ``recap.cli``): library modules declare their
configurables and required parameters through ``recap.configurable``, never gin.

A required parameter (``recap.configurable.REQUIRED``, or gin's own ``gin.REQUIRED``) is met
only when its configurable is called, so a config that leaves one unbound parses cleanly and
dies with a traceback hours later (Step 4 after Steps 1-3 ran on 8 devices).
``missing_required(root)`` walks every configurable a call of ``root`` reaches (its gin
references, in lists and dicts too, and defaults that are configurables), in the scopes gin
would call them with, and returns the REQUIRED parameters left unbound, directly or through a
macro that is itself ``%gin.REQUIRED``. ``check_required`` turns the first into one line.

Only gin's public API is read (``gin.get_bindings``, ``gin.query_parameter``,
``gin.get_configurable``, the references ``gin.config.parse_value`` makes, ``gin.config_str``);
which configurables recap has, and which modules register them, is ``recap.registry``'s.

Typed model factories (``recap.configurable.config_fields``): ``value_model`` and
``pi05_policy`` take the fields of their config dataclass, and gin checks every binding of
theirs against exactly those names at parse time (``value_model.expert_widht`` is an error
there, not a ``TypeError`` on every rank); their size dicts (``pi05_policy.vision = {...}``) are
checked against the Hugging Face config class they feed (``check_config_dicts``).
``gin_error_line`` turns gin's parse errors into one line with the nearest valid names.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import gin
from gin.config import Configurable, ConfigurableReference, parse_value
from gin.config import macro as gin_macro

from recap import registry
from recap.errors import RecapError
from recap.registry import bound, config_entries, is_required, macro_value, refers_to, resolve


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


def _entry(name_or_fn: str | Callable) -> Configurable:
    """gin's record of a configurable (name, selector, the function it wraps), by name/selector
    or by its gin wrapper: the one a reference ``@name`` carries."""
    name = name_or_fn if isinstance(name_or_fn, str) else registry.name_of(name_or_fn)
    try:
        return parse_value(f"@{name}").configurable
    except ValueError:
        raise RecapError(f"gin: no configurable {name!r} is registered") from None


def _default_entry(default: object) -> Configurable | None:
    """The record of a parameter default that is a gin configurable (None for anything else)."""
    try:
        return _entry(default)
    except RecapError:
        return None


def _required_params(
    entry: Configurable, bound_names: Iterable[str] = ()
) -> tuple[list[str], list[object]]:
    """(names of REQUIRED parameters, defaults that are configurables) of ``entry``; the
    defaults of ``bound_names`` (parameters bound to something else) are not called."""
    fn = entry.wrapped
    if inspect.isclass(fn):
        fn = fn.__init__
    required, defaults, skip = [], [], set(bound_names)
    for param in inspect.signature(fn).parameters.values():
        if is_required(param.default):
            required.append(param.name)
        elif param.default is not param.empty and callable(param.default):
            if param.name not in skip:
                defaults.append(param.default)
    return required, defaults


def _is_constant(ref: object) -> bool:
    """A reference to a ``gin.constant`` (``%gin.REQUIRED``, ``%SOME_CONSTANT``)."""
    return isinstance(ref, ConfigurableReference) and ref.configurable.selector == "gin.constant"


def _is_required_constant(value: object) -> bool:
    return _is_constant(value) and value.scopes == ["gin.REQUIRED"]


def _references(value: object) -> Iterator[object]:
    """Configurable references and macro values inside a bound value (lists, dicts, tuples)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _references(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _references(item)
    elif refers_to(value, gin_macro):
        yield from _references(macro_value("/".join(value.scopes)))
    elif isinstance(value, ConfigurableReference):
        yield value


def _unresolved(value: object) -> tuple[bool, str | None]:
    """(whether ``value`` resolves to REQUIRED, the last macro on the way)."""
    macro = None
    while refers_to(value, gin_macro):
        macro = "/".join(value.scopes)
        value = macro_value(macro)
    return is_required(value) or _is_required_constant(value), macro


def _reached(root: str | Callable) -> Iterator[tuple[Configurable, list[str], dict]]:
    """``(entry, scope, bindings)`` of ``root`` and of every configurable a call of it reaches
    (gin references in its bindings, configurable defaults), each in the scope gin would use."""
    seen: set[tuple[str, str]] = set()
    pending: list[tuple[Configurable, list[str]]] = [(_entry(root), [])]
    while pending:
        entry, scope = pending.pop()
        if (entry.selector, "/".join(scope)) in seen:
            continue
        seen.add((entry.selector, "/".join(scope)))
        bindings = gin.get_bindings("/".join([*scope, entry.selector]), resolve_references=False)
        yield entry, scope, bindings
        for value in bindings.values():
            for ref in _references(value):
                if not _is_constant(ref):
                    pending.append((ref.configurable, [*scope, *ref.scopes]))
        for default in _required_params(entry, bindings)[1]:
            found = _default_entry(default)
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
    elif refers_to(value, gin_macro):
        name = "/".join(value.scopes)
        out.add(name)
        _collect_macros(macro_value(name), out)


def macros_defined() -> set[str]:
    """Names of the macros the parsed config defines."""
    return {key for key, _ in config_entries(macros=True)}


# ---- typed model factories ------------------------------------------------------------------


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
    for key, _ in config_entries():
        scoped, _, param = key.rpartition(".")
        scope, _, selector = scoped.rpartition("/")
        entry = _entry(selector)
        dicts = getattr(entry.wrapped, "config_dicts", None) or {}
        if param not in dicts:
            continue
        cls, own = dicts[param]
        where = f"{scope}/{entry.name}" if scope else entry.name
        value = resolve(gin.query_parameter(key))
        if value is None or isinstance(value, ConfigurableReference):
            continue
        if not isinstance(value, dict):
            raise RecapError(f"gin config: {where}.{param}={value!r}; bind a dict of "
                             f"{cls.__name__} arguments")  # fmt: skip
        keys = [k for k in config_keys(cls) if k not in own]
        for name in value:
            if name in own:
                raise RecapError(f"gin config: {where}.{param} sets {name!r}, which "
                                 f"{entry.name} sets itself; remove it")  # fmt: skip
            if name not in keys:
                raise RecapError(
                    f"gin config: {where}.{param} has unknown key {name!r} (not a "
                    f"{cls.__name__} argument); {_nearest(str(name), keys)}"
                )


def check_model_options() -> None:
    """Validate the bound ``lora`` / ``freeze`` of the model factories right after parsing (a
    bad tower or target module is one line before anything is built). It runs only where a
    model factory is registered (``registry.PARSE_CHECKS``), so its module is imported by name:
    a light step's command reaches no model code, nor does its code version."""
    adapters = importlib.import_module("recap.models.adapters")
    check_freeze, LoraOptions = adapters.check_freeze, adapters.LoraOptions  # noqa: N806

    for factory in adapters.FACTORIES:
        freeze = bound(f"{factory}.freeze", None)
        if freeze is not None:
            check_freeze(freeze, f"{factory}.freeze")
        lora = bound(f"{factory}.lora", None)
        if isinstance(lora, ConfigurableReference):
            if not lora.evaluate or registry.declared(lora.configurable.wrapped) is not LoraOptions:
                raise RecapError(f"gin config: {factory}.lora; bind @LoraOptions() or None")
            try:
                lora.scoped_configurable_fn()
            except RecapError as exc:  # gin appends "In call to configurable ..." lines
                raise RecapError(str(exc).strip().splitlines()[0]) from None
        elif lora is not None and not isinstance(lora, LoraOptions):
            raise RecapError(f"gin config: {factory}.lora={lora!r}; bind @LoraOptions() or None")


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
        try:
            found = _entry(selector)
        except RecapError:
            found = None
        if found is not None:
            fn = found.wrapped.__init__ if inspect.isclass(found.wrapped) else found.wrapped
            names = _param_names(fn)
            return f"{selector} has no parameter {param!r}{where}; {_nearest(param, names)}"
    return f"{first}{where}"
