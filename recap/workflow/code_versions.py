"""Code versions of the pipeline's steps, and the lock that keeps them honest.

Each step module (the module defining a stage's ``entry``, e.g. ``recap.steps.train``) declares
``STEP_VERSION``; a stage's fingerprint includes it, so bumping it reruns the stages running
that step and every stage after them, and nothing else. ``code_versions.json`` records per step
module its version, a sha256 over the sources of every recap module it runs (the step module,
the command modules of its stages and everything they import, transitively: grimp's import
graph, lazy imports included; comments, docstrings and formatting do not count) and the
configurables those modules register (what its fingerprint resolves, defaults included).

``tests/test_code_versions.py`` fails when the lock and the sources disagree. Then:
bump ``STEP_VERSION`` of the step if its results change (its stages and those after them rerun),
and run ``python -m recap.workflow.lock --update`` (``recap.workflow.lock``).
"""

from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path

from recap.errors import RecapError
from recap.registry import CONFIGURABLES

LOCK = Path(__file__).with_name("code_versions.json")
UPDATE = "python -m recap.workflow.lock --update"
PACKAGE = Path(__file__).resolve().parents[1]  # recap/


def step_module(entry: str) -> str:
    """The module defining the configurable ``entry`` (``recap.registry.CONFIGURABLES``)."""
    if entry not in CONFIGURABLES:
        raise RecapError(f"stage entry {entry!r} is not in recap.registry.CONFIGURABLES; add it")
    return CONFIGURABLES[entry]


def step_version(module: str) -> str:
    """``STEP_VERSION`` of step module ``module``."""
    version = getattr(importlib.import_module(module), "STEP_VERSION", None)
    if not isinstance(version, str) or not version:
        raise RecapError(
            f'{module}: no STEP_VERSION string; add STEP_VERSION = "1" (the code version in its '
            f"stages' fingerprints) and run `{UPDATE}`"
        )
    return version


@functools.cache
def lock() -> dict[str, dict]:
    """The lock as written (``{}`` when there is none)."""
    return json.loads(LOCK.read_text()) if LOCK.is_file() else {}


def reads(module: str, where: str = "") -> tuple[str, ...]:
    """The configurables step module ``module`` reads (registered by the modules it runs)."""
    if module not in lock():
        raise RecapError(
            f"pipeline step {where}: {LOCK.relative_to(PACKAGE.parent)} has no entry for "
            f"{module}; run `{UPDATE}`"
        )
    return tuple(lock()[module]["configurables"])
