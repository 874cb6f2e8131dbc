"""The list of datasets a step works on, as written in gin.

In gin a dataset is a small dict, so a user lists several without new code::

    compute_returns.data_root = "demo_data"
    compute_returns.datasets = [
        {"name": "sft", "root": "sft", "type": "sft"},
        {"name": "rollout", "root": "rollout", "type": "rollout", "weight": 2.0,
         "failure_reward": -300.0, "outcome_column": "next.success"},
    ]

Relative roots resolve against ``data_root``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

from recap.core import columns as C
from recap.errors import RecapError


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset entry: where it is, what it is, and per-entry overrides."""

    name: str
    root: Path
    type: str = C.ROLLOUT
    weight: float = 1.0
    gamma: float | None = None
    failure_reward: float | None = None
    outcome_column: str | None = None
    correction_column: str | None = None


def parse_dataset_specs(
    entries: list[dict], data_root: str | os.PathLike = "", field: str = "datasets"
) -> list[DatasetSpec]:
    """Validate gin dataset entries into ``DatasetSpec``s (unique names, known keys and types)."""
    if not entries:
        raise RecapError(f"{field}: no datasets listed; bind it to a list of dicts in gin")
    known = {f.name for f in fields(DatasetSpec)}
    specs: list[DatasetSpec] = []
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]"
        if not isinstance(entry, dict):
            raise RecapError(f"{where}: expected a dict like {{'name': ..., 'root': ...}}")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise RecapError(f"{where}: unknown keys {unknown}; known keys are {sorted(known)}")
        missing = [k for k in ("name", "root") if k not in entry]
        if missing:
            raise RecapError(f"{where}: missing {missing}; every dataset needs a name and a root")
        kind = entry.get("type", C.ROLLOUT)
        if kind not in C.DATASET_TYPES:
            raise RecapError(f"{where}: type {kind!r} is not one of {list(C.DATASET_TYPES)}")
        root = Path(entry["root"])
        if not root.is_absolute() and data_root:
            root = Path(data_root) / root
        specs.append(DatasetSpec(**{**entry, "root": root, "type": kind}))
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RecapError(f"{field}: dataset names {dupes} repeat; give each entry its own name")
    return specs


def split_specs(
    builder: str,
    split: str,
    datasets: list[dict],
    eval_datasets: list[dict] | None,
    data_root: str | os.PathLike = "",
) -> tuple[list[DatasetSpec], list[DatasetSpec]]:
    """``(training specs, the specs of `split`)`` for a data builder with train/eval splits;
    eval sets are normalized with statistics of the training specs, so both are returned."""
    if split not in ("train", "eval"):
        raise RecapError(f"{builder}.split: {split!r}; use 'train' or 'eval'")
    train = parse_dataset_specs(datasets, data_root, f"{builder}.datasets")
    if split == "train":
        return train, train
    if not eval_datasets:
        raise RecapError(f"{builder}.eval_datasets: empty; list the eval datasets in gin")
    return train, parse_dataset_specs(eval_datasets, data_root, f"{builder}.eval_datasets")
