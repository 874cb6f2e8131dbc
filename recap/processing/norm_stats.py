"""Normalization statistics beside a π0.5 checkpoint, openpi's and LeRobot's files.

openpi keeps them in ``assets/<asset_id>/norm_stats.json`` inside the checkpoint directory
(``{"norm_stats": {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}``), LeRobot in
``policy_preprocessor_step_<i>_normalizer_processor.safetensors`` (flat keys
``observation.state.q01``, ``action.q99``, ...). ``find_norm_stats`` / ``read_norm_stats`` read
either; ``write_norm_stats`` writes openpi's file (recap's exported policies carry it). Data code
(``recap.data.policy_data``) reads and writes them, so they live here, below ``recap.models``
(which re-exports them from ``recap.models.checkpoints``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors.torch import load_file

from recap.errors import RecapError
from recap.processing.normalize import QuantileStats

ASSETS_DIR = "assets"
NORM_STATS_FILE = "norm_stats.json"
LEROBOT_NORMALIZER = "policy_preprocessor_step_*_normalizer_processor.safetensors"
# recap's feature names -> openpi's norm_stats.json keys / LeRobot's feature keys
OPENPI_STATS_KEYS = {"state": "state", "action": "actions"}
LEROBOT_STATS_KEYS = {"state": "observation.state", "action": "action"}
MOMENTS = ("mean", "std", "q01", "q99")


def find_norm_stats(directory: str | os.PathLike, asset_id: str | None = None) -> Path | None:
    """The normalization statistics a checkpoint directory carries: openpi's
    ``assets/<asset_id>/norm_stats.json`` (any asset when ``asset_id`` is None; several are a
    one-line error asking for one), else LeRobot's normalizer file; None when it has neither."""
    path = Path(directory)
    if asset_id is not None:
        found = path / ASSETS_DIR / asset_id / NORM_STATS_FILE
        candidates = [found] if found.is_file() else []
    else:
        candidates = sorted((path / ASSETS_DIR).glob(f"**/{NORM_STATS_FILE}"))
    if len(candidates) > 1:
        ids = [str(c.parent.relative_to(path / ASSETS_DIR)) for c in candidates]
        raise RecapError(f"{path}: normalization statistics of several assets {ids}; pick one "
                         "with policy_data.asset_id")  # fmt: skip
    if candidates:
        return candidates[0]
    lerobot = sorted(path.glob(LEROBOT_NORMALIZER))
    return lerobot[0] if lerobot else None


def read_norm_stats(path: str | os.PathLike) -> dict[str, QuantileStats]:
    """``{"state", "action"}`` statistics of an openpi ``norm_stats.json`` or a LeRobot
    normalizer ``.safetensors``; q01 and q99 are required (π0.5 normalizes by quantiles)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        flat = {k: v.double().numpy() for k, v in load_file(str(path)).items()}
        entries = {ours: {m: flat[f"{theirs}.{m}"] for m in MOMENTS if f"{theirs}.{m}" in flat}
                   for ours, theirs in LEROBOT_STATS_KEYS.items()}  # fmt: skip
        names = LEROBOT_STATS_KEYS
    else:
        try:
            raw = json.loads(path.read_text())["norm_stats"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RecapError(f"{path}: not an openpi norm_stats.json ({type(exc).__name__}: "
                             f"{exc}); expected {{\"norm_stats\": {{\"state\": ..., "
                             f"\"actions\": ...}}}}") from exc  # fmt: skip
        entries = {ours: raw.get(theirs, {}) for ours, theirs in OPENPI_STATS_KEYS.items()}
        names = OPENPI_STATS_KEYS
    out = {}
    for ours, entry in entries.items():
        if "q01" not in entry or "q99" not in entry:
            raise RecapError(f"{path}: no q01/q99 for {names[ours]!r} (have {sorted(entry)}); "
                             "π0.5 needs quantile statistics, use policy_data.norm_stats = "
                             "\"data\"")  # fmt: skip
        values = {m: np.asarray(entry[m], dtype=np.float64).reshape(-1) for m in entry
                  if m in MOMENTS}  # fmt: skip
        out[ours] = QuantileStats(values["q01"], values["q99"], values.get("mean"),
                                  values.get("std"))  # fmt: skip
    return out


def norm_stats_path(directory: str | os.PathLike, asset_id: str) -> Path:
    """``directory/assets/<asset_id>/norm_stats.json`` (openpi's place)."""
    return Path(directory) / ASSETS_DIR / asset_id / NORM_STATS_FILE


def write_norm_stats(
    directory: str | os.PathLike, asset_id: str, stats: dict[str, QuantileStats]
) -> Path:
    """Write ``stats`` (``{"state", "action"}``) as openpi's
    ``directory/assets/<asset_id>/norm_stats.json`` atomically (temporary file, then
    ``os.replace``); mean/std are left out when unknown. Returns the path."""
    path = norm_stats_path(directory, asset_id)
    content = {}
    for ours, theirs in OPENPI_STATS_KEYS.items():
        entry = stats[ours]
        content[theirs] = {m: [float(x) for x in np.asarray(getattr(entry, m)).reshape(-1)]
                           for m in MOMENTS if getattr(entry, m) is not None}  # fmt: skip
    from recap.io import write_atomic

    text = json.dumps({"norm_stats": content}, indent=2) + "\n"
    write_atomic({path: lambda tmp: tmp.write_text(text)})
    return path
