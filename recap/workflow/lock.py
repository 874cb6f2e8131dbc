"""Computing and checking ``code_versions.json`` (grimp's import graph; update and test time).

``python -m recap.workflow.lock`` checks the lock against the sources (one line per step that
disagrees, exit 1); ``--update`` rewrites it. Per step module: its ``STEP_VERSION``, a sha256
over every recap module it runs (the step module, the command modules of its stages, all they
import, lazily too; docstrings, comments and layout do not count) and the configurables those
modules register (``recap.registry.CONFIGURABLES`` whose module is among them).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from recap.config_resolve import EXCLUDED
from recap.errors import RecapError
from recap.registry import CONFIGURABLES, register_all
from recap.workflow import code_versions
from recap.workflow.code_versions import LOCK, PACKAGE, UPDATE, lock, step_module, step_version


def _file(module: str) -> Path:
    parts = module.split(".")[1:]
    base = PACKAGE.joinpath(*parts)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _normalized(tree: ast.Module) -> str:
    """The module's syntax tree without docstrings or positions: what its code does."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=True, include_attributes=False)


def compute(stages: Iterable) -> dict[str, dict]:
    """The lock of ``stages`` (objects with ``entry`` and ``module``) from the sources now."""
    try:
        import grimp
    except ImportError as exc:
        raise RecapError(f"grimp is not installed ({exc}); pip install import-linter") from exc
    graph = grimp.build_graph("recap", cache_dir=None)
    runs: dict[str, set[str]] = {}
    for stage in stages:
        runs.setdefault(step_module(stage.entry), set()).add(stage.module)
    out, parsed = {}, {}
    for step, commands in sorted(runs.items()):
        modules = {step, *commands}
        for module in list(modules):
            modules |= graph.find_upstream_modules(module)
        digest = hashlib.sha256()
        for module in sorted(modules):
            if module not in parsed:
                parsed[module] = _normalized(ast.parse(_file(module).read_text(), module))
            digest.update(f"{module}\n{parsed[module]}\n".encode())
        out[step] = {
            "version": step_version(step),
            "sha256": digest.hexdigest(),
            "modules": len(modules),
            "configurables": sorted(
                n for n, m in CONFIGURABLES.items() if m in modules and n not in EXCLUDED
            ),
        }
    return out


def problems(now: dict[str, dict], recorded: dict[str, dict]) -> list[str]:
    """One line per step whose lock entry disagrees with the sources ``now``."""
    lines = []
    for step in sorted(set(now) | set(recorded)):
        path = _file(step).relative_to(PACKAGE.parent)
        if step not in now:
            lines.append(f"{LOCK.name}: {step} runs in no stage; run `{UPDATE}`")
        elif step not in recorded:
            lines.append(f"{LOCK.name}: no entry for {step}; run `{UPDATE}`")
        elif now[step] != recorded[step]:
            lines.append(
                f"{step}: its sources changed since {LOCK.name} was written; bump STEP_VERSION "
                f"in {path} if its results change, then run `{UPDATE}`"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help=f"rewrite {LOCK.name}")
    args = parser.parse_args(argv)
    from recap.io import write_json
    from recap.workflow.stages import STAGES

    register_all()
    now = compute(STAGES)
    if args.update:
        write_json(code_versions.LOCK, now)
        lock.cache_clear()
        print(
            f"wrote {code_versions.LOCK}: "
            + ", ".join(f"{k} {v['version']}" for k, v in now.items())
        )
        return 0
    found = problems(now, lock())
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
