"""State and action normalization, with its statistics and its formula, written once.

Quantile normalization maps q01 -> -1 and q99 -> 1 per dimension, unclipped (values outside
[q01, q99] map outside [-1, 1]); the formula differs by a hair between the systems whose
checkpoints recap reads, and a policy must be fed the one it was trained with (a state one bin
off changes the π0.5 prompt, hence the actions):

- ``openpi`` (openpi's ``Normalize(use_quantiles=True)``, recap's own runs, RLinf):
  ``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1``.
- ``lerobot`` (LeRobot's ``NormalizationMode.QUANTILES``): ``2 (x - q01) / (q99 - q01) - 1``,
  a zero range replaced by 1e-8.

The inverse maps the first D dims of a padded chunk back and drops the padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from recap.errors import RecapError

QUANTILE_EPS = 1e-6  # openpi's epsilon in the denominator
LEROBOT_ZERO_RANGE = 1e-8  # LeRobot's stand-in for a zero q99 - q01
OPENPI_FORMULA, LEROBOT_FORMULA = "openpi", "lerobot"
FORMULAS = (OPENPI_FORMULA, LEROBOT_FORMULA)


def check_formula(formula: str) -> str:
    if formula not in FORMULAS:
        raise RecapError(f"normalization: {formula!r} is not one of {list(FORMULAS)}")
    return formula


@dataclass(frozen=True)
class QuantileStats:
    """Per-dimension 1% and 99% quantiles float64[D] of one feature, with its mean and standard
    deviation when known (openpi's ``norm_stats.json`` requires them; π0.5 reads only q01/q99)."""

    q01: np.ndarray
    q99: np.ndarray
    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.q01)

    def first(self, dim: int) -> QuantileStats:
        """The stats of the first ``dim`` dimensions (openpi normalizes with ``q01[:D]``)."""
        cut = [None if v is None else np.asarray(v)[:dim] for v in (self.mean, self.std)]
        return QuantileStats(np.asarray(self.q01)[:dim], np.asarray(self.q99)[:dim], *cut)

    def to_json(self) -> dict:
        """``{"q01": [...], "q99": [...], "mean"?, "std"?}`` (floats; unknown moments left out)."""
        names = [n for n in ("q01", "q99", "mean", "std") if getattr(self, n) is not None]
        return {n: [float(v) for v in np.asarray(getattr(self, n)).reshape(-1)] for n in names}

    @classmethod
    def from_json(cls, entry: dict, where: str = "stats") -> QuantileStats:
        """The inverse of ``to_json``; q01/q99 of unequal length or missing: one line."""
        if not isinstance(entry, dict) or "q01" not in entry or "q99" not in entry:
            raise RecapError(f'{where}: expected {{"q01": [...], "q99": [...]}}')
        values = {k: np.asarray(entry[k], dtype=np.float64).reshape(-1) for k in entry
                  if k in ("q01", "q99", "mean", "std")}  # fmt: skip
        if len(values["q01"]) != len(values["q99"]):
            raise RecapError(f"{where}: q01 has {len(values['q01'])} dims, q99 "
                             f"{len(values['q99'])}")  # fmt: skip
        return cls(values["q01"], values["q99"], values.get("mean"), values.get("std"))


def _denominator(q01, q99, formula: str):
    if check_formula(formula) == OPENPI_FORMULA:
        return q99 - q01 + QUANTILE_EPS
    span = q99 - q01
    if torch.is_tensor(span):
        return torch.where(span == 0, torch.full_like(span, LEROBOT_ZERO_RANGE), span)
    return np.where(span == 0, LEROBOT_ZERO_RANGE, span)


def normalize_quantile(
    x: np.ndarray | torch.Tensor, stats: QuantileStats, formula: str = OPENPI_FORMULA
):
    """``(x - q01) / denominator * 2 - 1`` over the last dim [..., D], not clipped; the
    denominator is ``formula``'s (module docstring)."""
    q01, q99 = _as(stats.q01, x), _as(stats.q99, x)
    return (x - q01) / _denominator(q01, q99, formula) * 2.0 - 1.0


def unnormalize_quantile(
    y: np.ndarray | torch.Tensor, stats: QuantileStats, formula: str = OPENPI_FORMULA
):
    """Inverse on the first D dims of y [..., >= D]: ``(y + 1) / 2 * denominator + q01``;
    padded dims beyond D are dropped."""
    dim = len(stats.q01)
    y = y[..., :dim]
    q01, q99 = _as(stats.q01, y), _as(stats.q99, y)
    return (y + 1.0) / 2.0 * _denominator(q01, q99, formula) + q01


def _as(values: np.ndarray, like):
    """The stats as ``like``'s kind: a tensor of its dtype, or a float64 array (numpy inputs are
    normalized in float64, as openpi's float32 data against its float64 statistics, so the state
    bins fall where openpi's do)."""
    if torch.is_tensor(like):
        return torch.as_tensor(values, dtype=like.dtype, device=like.device)
    return np.asarray(values, dtype=np.float64)


def pad_last(x: np.ndarray | torch.Tensor, size: int = 32):
    """``(x zero-padded to [..., size], mask bool[size])`` (True on the original D dims)."""
    dim = x.shape[-1]
    if dim > size:
        raise RecapError(f"feature of {dim} dims exceeds the model's {size}; raise action_dim")
    mask = np.arange(size) < dim
    if torch.is_tensor(x):
        return torch.nn.functional.pad(x, (0, size - dim)), torch.from_numpy(mask)
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - dim)]), mask
