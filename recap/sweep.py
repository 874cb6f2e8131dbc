"""Grids of gin bindings, shared by ``recap.commands.sweep`` (training sweeps, ``recap-sweep``)
and the pipeline's ``--sweep`` (whole-pipeline sweeps)."""

from __future__ import annotations

import itertools
from pathlib import Path

from recap.errors import RecapError
from recap.registry import literal


def load_sweep(path: str, keys: set[str]) -> dict:
    """Read and check a sweep file (a path, or a name under the packaged gin directory,
    ``recap/gin``, e.g. ``sweeps/toy_lr.yaml``) whose fields are ``keys``; errors name the file
    and the field."""
    import yaml

    from recap.cli import resolve_gin_file

    resolved = resolve_gin_file(path)
    spec = yaml.safe_load(Path(resolved).read_text()) or {}
    unknown = set(spec) - keys
    if unknown:
        raise RecapError(f"{resolved}: unknown field(s) {sorted(unknown)}; use {sorted(keys)}")
    if not spec.get("name") or not spec.get("gin_files"):
        raise RecapError(f"{resolved}: 'name' and 'gin_files' are required")
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise RecapError(f"{resolved}: 'grid' must map each binding to a non-empty list of values")
    return spec


def points(grid: dict[str, list]) -> list[dict]:
    """Cartesian product of the grid, in file order: [{binding: value}, ...]."""
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def binding(key: str, value) -> str:
    """``key = value`` as a gin binding line (``recap.registry.literal``)."""
    return f"{key} = {literal(value)}"


def label(point: dict) -> str:
    """Short run label of a grid point: ``lr=0.001 positive_quantile=0.5``."""
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items())
