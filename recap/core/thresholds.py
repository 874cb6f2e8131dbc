"""Step 3 labels: advantages thresholded into ``advantage`` booleans (docs/spec.md §5).

Per scope (all frames, per task, per dataset) the threshold is the ``1 - positive_quantile``
quantile of A with linear interpolation (``np.percentile``'s default); ``advantage = A >=
threshold``, or forced positive (frames of listed datasets, e.g. ``sft`` ones; frames flagged as
human corrections). Forced frames still take part in the threshold, as in RLinf: a threshold
depends on A and the scope only, so toggling a forcing option never moves any other frame's label.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from recap.core.frames import FrameLayout, TaskKeys, arrow_empty
from recap.errors import RecapError

IS_CORRECTION = "is_correction"  # default name of the boolean human-correction column
SCOPE_GLOBAL, SCOPE_PER_TASK, SCOPE_PER_DATASET = "global", "per_task", "per_dataset"
SCOPES = (SCOPE_GLOBAL, SCOPE_PER_TASK, SCOPE_PER_DATASET)
ALL_FRAMES = "all"  # threshold key of the global scope
DEFAULT_POSITIVE_QUANTILE = 0.3


@dataclass(frozen=True)
class LabelOptions:
    """How continuous advantages become boolean labels.

    Attributes:
        positive_quantile: fraction of frames at or above the threshold, in (0, 1).
        scope: ``global`` (RLinf), ``per_task`` (paper) or ``per_dataset``.
        force_positive_datasets: names of datasets whose frames are all positive (RLinf: sft).
        correction_column: bool column of human-correction frames, forced positive; ``None``
            disables it, and a table without the column has no corrections.
    """

    positive_quantile: float = DEFAULT_POSITIVE_QUANTILE
    scope: str = SCOPE_GLOBAL
    force_positive_datasets: tuple[str, ...] = ()
    correction_column: str | None = IS_CORRECTION

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "positive_quantile", check_positive_quantile(self.positive_quantile)
        )
        if self.scope not in SCOPES:
            raise RecapError(f"scope: {self.scope!r} is not one of {list(SCOPES)}")
        object.__setattr__(self, "force_positive_datasets", tuple(self.force_positive_datasets))


def check_positive_quantile(q: float) -> float:
    """``q`` as a float when it lies in (0, 1), else a RecapError."""
    ok = isinstance(q, (int, float, np.floating)) and not isinstance(q, bool)
    if not ok or not 0.0 < float(q) < 1.0:
        raise RecapError(
            f"positive_quantile: {q!r} is outside (0, 1); it is the fraction of frames labeled "
            "positive, e.g. 0.3"
        )
    return float(q)


def quantile_threshold(advantages: np.ndarray, positive_quantile: float) -> float:
    """float64[n] -> ``np.quantile(A, 1 - q)`` (linear interpolation), bit for bit (spec §5).

    numpy interpolates between the order statistics at ``floor(v)`` and ``floor(v) + 1`` with
    ``v = (n - 1)(1 - q)``; one single-k ``np.partition`` finds them (several times faster than
    ``np.quantile``'s multi-k partition) and ``np.quantile`` of that pair at ``v - floor(v)``
    applies numpy's own interpolation to them.
    """
    q = check_positive_quantile(positive_quantile)
    a = np.asarray(advantages, dtype=np.float64)
    if a.size == 0:
        raise RecapError("advantage_continuous: no frames to threshold")
    virtual = (a.size - 1) * (1.0 - q)
    k = min(int(np.floor(virtual)), a.size - 1)
    part = arrow_empty(a.size, np.float64)
    part[:] = a
    part.partition(k)
    pair = np.array([part[k], part[k + 1 :].min() if k + 1 < a.size else part[k]])
    return float(np.quantile(pair, virtual - k))


def group_thresholds(
    advantages: np.ndarray, groups: np.ndarray, num_groups: int, positive_quantile: float
) -> np.ndarray:
    """float64[G] ``quantile_threshold`` per group; ``groups`` int64[n] codes in [0, G).

    One stable sort, then a loop over groups (datasets or tasks, never frames or episodes).
    Thresholds do not depend on the sort's tie order; each group's quantile is numpy's.
    """
    if num_groups == 1:
        return np.array([quantile_threshold(advantages, positive_quantile)])
    small = groups.astype(np.int16) if num_groups <= np.iinfo(np.int16).max else groups
    ordered = advantages[np.argsort(small, kind="stable")]  # int16: an O(n) radix sort
    bounds = np.concatenate([[0], np.cumsum(np.bincount(groups, minlength=num_groups))])
    return np.array(
        [
            quantile_threshold(ordered[a:b], positive_quantile)
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
    )


def label_advantages(
    advantages: np.ndarray, thresholds: np.ndarray | float, forced: np.ndarray | None = None
) -> np.ndarray:
    """bool[n] ``A >= threshold`` (float64[n] per frame, or a scalar), OR ``forced`` bool[n]."""
    labels = np.asarray(advantages) >= thresholds
    return labels if forced is None else labels | forced


def label_frames(
    advantage: np.ndarray,
    table: pa.Table,
    layout: FrameLayout,
    tasks: TaskKeys | None,
    opts: LabelOptions,
) -> tuple[np.ndarray, dict]:
    """bool[n] labels in layout order, and the labeling record."""
    if opts.scope == SCOPE_GLOBAL:
        groups, keys = np.zeros(advantage.shape[0], dtype=np.int64), [ALL_FRAMES]
    elif opts.scope == SCOPE_PER_DATASET:
        groups, keys = layout.dataset_codes, layout.dataset_names
    else:
        groups, keys = tasks.codes, tasks.keys
    thresholds = group_thresholds(advantage, groups, len(keys), opts.positive_quantile)
    per_frame = thresholds[0] if len(keys) == 1 else thresholds[groups]
    forced = forced_positive(table, layout, opts)
    labels = label_advantages(advantage, per_frame, forced)
    return labels, {
        "positive_quantile": opts.positive_quantile,
        "scope": opts.scope,
        # always a float (RLinf's tools do float(unified_threshold)): the global threshold, which
        # labels frames only under the global scope; scoped thresholds are under "thresholds"
        "unified_threshold": float(thresholds[0])
        if opts.scope == SCOPE_GLOBAL
        else float(
            group_thresholds(advantage, np.zeros_like(groups), 1, opts.positive_quantile)[0]
        ),
        "thresholds": {str(k): float(t) for k, t in zip(keys, thresholds, strict=True)},
        "force_positive_datasets": sorted(opts.force_positive_datasets),
        "correction_column": opts.correction_column,
        "num_frames": int(advantage.shape[0]),
        "num_positive": int(np.count_nonzero(labels)),
        "num_forced_positive": 0
        if forced is None
        else int(np.count_nonzero(forced & (advantage < per_frame))),
    }


def forced_positive(table: pa.Table, layout: FrameLayout, opts: LabelOptions) -> np.ndarray | None:
    """bool[n] frames forced positive (listed datasets, flagged corrections); None if none."""
    listed = [i for i, n in enumerate(layout.dataset_names) if n in opts.force_positive_datasets]
    forced = np.isin(layout.dataset_codes, listed) if listed else None
    column = opts.correction_column
    if column and column in table.column_names:
        flags = table.column(column)
        if flags.null_count:
            raise RecapError(
                f"{column}: {flags.null_count} null values; mark every frame True or False"
            )
        flags = layout.take(np.asarray(flags.to_numpy(), dtype=bool))
        forced = flags if forced is None else forced | flags
    return forced
