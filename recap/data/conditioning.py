"""Advantage conditioning for the Step 4 policy: prompts, label dropout, labels, quantile stats.

Prompts (docs/spec.md §6): conditional ``"{task}\\nAdvantage: positive"`` (or ``negative``),
unconditional = the plain task. Which frames get the text (``draw_conditional``, one uniform per
frame from a ``torch.Generator``, so a seed reproduces it):

- ``paper``: every frame gets its label's text; dropped (unconditional) with probability
  ``prob`` (default 0.3).
- ``positive_only_conditional`` (RLinf): positives get the positive text except with probability
  ``prob`` (default ``unconditional_prob`` 0.1); negatives always get the plain task.

The prompt texts themselves (styles, label position, state bins) live in
``recap.processing.prompts``, normalization in ``recap.processing.normalize``; their names are
re-exported here for older imports.

Labels: the boolean ``advantage`` column of ``meta/advantages_{tag}.parquet`` joined to frames by
(episode_index, frame_index) (``lookup_labels``). Quantile statistics per dimension come from
``meta/stats.json`` (LeRobot v3.0 writes q01/q99), computed from the data columns when absent
(``quantile_stats``), or from a checkpoint's ``norm_stats.json`` (``recap.data.norm_stats``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from recap.core import columns as C
from recap.errors import RecapError
from recap.processing.normalize import (  # noqa: F401  (re-exported: older imports)
    QUANTILE_EPS,
    QuantileStats,
    normalize_quantile,
    pad_last,
    unnormalize_quantile,
)
from recap.processing.prompts import (  # noqa: F401  (re-exported: older imports)
    ACTION_CUE,
    CONDITIONING,
    DEFAULT_PROB,
    FILTERED,
    LABEL_BEFORE_ACTION,
    LABEL_IN_TASK,
    LABEL_POSITIONS,
    LEROBOT,
    MODES,
    NEGATIVE_TEXT,
    NONE,
    OPENPI,
    PAPER,
    PLAIN,
    POSITIVE_ONLY,
    POSITIVE_TEXT,
    PROMPT_STYLES,
    STATE_BINS,
    Prompt,
    advantage_prompt,
    check_label_position,
    check_style,
    clean_prompt,
    conditioned_prompt,
    discretize_state,
    pi05_prompt,
)


def draw_conditional(
    labels: np.ndarray | torch.Tensor,
    mode: str = PAPER,
    prob: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """bool[N]: which frames get their label's text. u ~ U[0, 1) per frame; ``paper``:
    u >= prob; ``positive_only_conditional``: label & (u >= prob). ``prob`` defaults to the
    mode's (0.3 / 0.1)."""
    if mode not in MODES:
        raise RecapError(f"conditioning mode {mode!r} is not one of {MODES}")
    prob = DEFAULT_PROB[mode] if prob is None else float(prob)
    if not 0.0 <= prob <= 1.0:
        raise RecapError(f"conditioning: dropout probability {prob} not in [0, 1]")
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.bool)
    keep = torch.rand(labels.shape, generator=generator) >= prob
    return keep if mode == PAPER else keep & labels


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed for epoch ``epoch`` of a run seeded ``seed`` (``numpy.SeedSequence``), so
    each epoch's dropout draw is independent of the others and reproducible."""
    return int(np.random.SeedSequence([int(seed), int(epoch)]).generate_state(2, np.uint64)[0] >> 1)


def condition_tasks(
    tasks: Sequence[str],
    labels: np.ndarray | torch.Tensor,
    mode: str = PAPER,
    prob: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[list[str], torch.Tensor]:
    """``(task texts, conditional bool[N])``: ``advantage_prompt(task, label)`` where
    ``draw_conditional`` keeps the text, else the plain task."""
    conditional = draw_conditional(labels, mode, prob, generator)
    flags = np.asarray(labels, dtype=bool).tolist()
    texts = [advantage_prompt(t, lab if c else None)
             for t, lab, c in zip(tasks, flags, conditional.tolist())]  # fmt: skip
    return texts, conditional


def lookup_labels(
    episode_index: np.ndarray, frame_index: np.ndarray, table: pa.Table, source: object
) -> np.ndarray:
    """bool[N] ``advantage`` of each frame from ``table`` (episode_index, frame_index,
    advantage; extra rows allowed). A frame without a row, or a duplicate row, is a one-line
    error naming ``source`` (the advantages file) and the first such frame."""
    for name in (C.EPISODE_INDEX, C.FRAME_INDEX, C.ADVANTAGE):
        if name not in table.column_names:
            raise RecapError(f"{source}: column {name!r} missing (have {table.column_names}); "
                             "recompute the advantages (Step 3)")  # fmt: skip
    t_ep = table.column(C.EPISODE_INDEX).to_numpy().astype(np.int64)
    t_fr = table.column(C.FRAME_INDEX).to_numpy().astype(np.int64)
    ep, fr = np.asarray(episode_index, np.int64), np.asarray(frame_index, np.int64)
    width = int(max(fr.max(initial=0), t_fr.max(initial=0))) + 1
    keys, wanted = t_ep * width + t_fr, ep * width + fr
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    if np.any(sorted_keys[1:] == sorted_keys[:-1]):
        i = order[int(np.argmax(sorted_keys[1:] == sorted_keys[:-1]))]
        raise RecapError(f"{source}: duplicate row for (episode_index={t_ep[i]}, "
                         f"frame_index={t_fr[i]}); recompute the advantages")  # fmt: skip
    pos = np.minimum(np.searchsorted(sorted_keys, wanted), max(len(keys) - 1, 0))
    found = sorted_keys[pos] == wanted if len(keys) else np.zeros(len(wanted), dtype=bool)
    if not found.all():
        i = int(np.argmin(found))
        raise RecapError(f"{source}: no advantage label for (episode_index={ep[i]}, "
                         f"frame_index={fr[i]}) ({int((~found).sum())} of {len(wanted)} frames "
                         "unlabeled); recompute the advantages for this dataset or pick its "
                         "tag")  # fmt: skip
    labels = table.column(C.ADVANTAGE).to_numpy(zero_copy_only=False)
    if labels.dtype == object:
        raise RecapError(f"{source}: column 'advantage' has nulls; recompute the advantages")
    return labels.astype(bool)[order[pos]]


def dataset_labels(
    root: str | os.PathLike, tag: str, episode_index: np.ndarray, frame_index: np.ndarray
) -> np.ndarray:
    """bool[N] labels of the given frames (all of a dataset's) from
    ``{root}/meta/advantages_{tag}.parquet``; ``advantage`` is read by value (bool or exactly
    0/1, ``read_advantages``), and rows for frames the dataset lacks are an error."""
    from recap.data.sidecars import ADVANTAGES, read_advantages, sidecar_path

    needed = (C.EPISODE_INDEX, C.FRAME_INDEX, C.ADVANTAGE)  # RLinf's narrow files have these
    table, _ = read_advantages(root, tag, needed)
    path = sidecar_path(root, ADVANTAGES, tag)
    labels = lookup_labels(episode_index, frame_index, table, path)
    extra = table.num_rows - len(labels)  # every frame found once, no duplicate rows
    if extra > 0:
        raise RecapError(
            f"{path}: {extra} rows match no frame of the dataset (computed from other data); "
            "recompute the advantages (Step 3) for this dataset"
        )
    return labels


def quantile_stats(dataset, keys: Sequence[str]) -> dict[str, QuantileStats]:
    """q01/q99 of each feature in ``keys`` for a ``LocalDataset``: from ``meta/stats.json`` when
    it has them, else computed (linear interpolation) from the data columns."""
    path = Path(dataset.root) / "meta" / "stats.json"
    stats = _read_stats(path)
    out, missing = {}, []
    for key in keys:
        entry = stats.get(key, {})
        if "q01" in entry and "q99" in entry:
            moments = [np.asarray(entry[m], float) if m in entry else None for m in ("mean", "std")]
            out[key] = QuantileStats(
                np.asarray(entry["q01"], float), np.asarray(entry["q99"], float), *moments
            )
        else:
            missing.append(key)
    if missing:
        table = dataset.read_columns(missing, check_frames=False)
        for key in missing:
            values = np.stack(table.column(key).to_numpy(zero_copy_only=False)).astype(float)
            values = values.reshape(len(values), -1)
            q01, q99 = np.quantile(values, [0.01, 0.99], axis=0)
            out[key] = QuantileStats(q01, q99, values.mean(0), values.std(0))
    return out


def _read_stats(path: os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise RecapError(f"{path}: not valid JSON ({exc}); fix or delete it") from exc
