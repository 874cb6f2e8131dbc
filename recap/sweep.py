"""Grids of gin bindings, shared by ``scripts/sweep.py`` (training sweeps) and the pipeline's
``--sweep`` (whole-pipeline sweeps)."""

from __future__ import annotations

import itertools
import json


def points(grid: dict[str, list]) -> list[dict]:
    """Cartesian product of the grid, in file order: [{binding: value}, ...]."""
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def binding(key: str, value) -> str:
    """``key = value`` as a gin binding line (strings quoted, other values as Python literals)."""
    literal = json.dumps(value) if isinstance(value, str) else repr(value)
    return f"{key} = {literal}"


def label(point: dict) -> str:
    """Short run label of a grid point: ``lr=0.001 positive_quantile=0.5``."""
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items())
