"""Relabel: new boolean labels for existing advantages, under a new tag, without any model.

A new positive quantile, scope or forcing option is applied to the ``advantage_continuous`` column
of ``meta/advantages_{source_tag}.parquet`` of every listed dataset (the only column it needs
besides the frame keys: RLinf's narrower files relabel too, the columns they lack written as
nulls); the result is written as
``meta/advantages_{new_tag}.parquet`` plus the ``new_tag`` entry of ``meta/mixture_config.yaml``
(other tags kept). Everything is read and computed before anything is written, in one atomic
batch; nothing else in the dataset directories changes. The threshold spans the datasets listed
here, so list the same datasets as the source run to reproduce a fresh labeling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from recap import logs
from recap.configurable import REQUIRED, check_given, configurable
from recap.core import columns as C
from recap.core.advantages import labeling_of, relabel_advantages
from recap.core.frames import align_to_frames, finite_column, frame_layout
from recap.core.thresholds import (
    DEFAULT_POSITIVE_QUANTILE,
    IS_CORRECTION,
    SCOPE_GLOBAL,
    SCOPE_PER_TASK,
    LabelOptions,
)
from recap.data.lerobot import LocalDataset
from recap.data.sidecars import (
    ADVANTAGES,
    advantages_files,
    check_tag,
    dataset_source,
    read_advantages,
    sidecar_path,
    write_atomic,
)
from recap.data.specs import DatasetSpec, parse_dataset_specs
from recap.errors import DatasetError, RecapError, located

log = logs.get(__name__)

# Relabeling needs episode_index, frame_index and advantage_continuous; the other columns are
# carried over when the source has them (RLinf's relabel / STEAM files have 8 of the 11) and
# written as nulls when not.
NEEDED = (C.EPISODE_INDEX, C.FRAME_INDEX, C.ADVANTAGE_CONTINUOUS)
CARRIED = tuple(n for n in C.ADVANTAGES_SCHEMA.names if n not in NEEDED)


def load_source(
    spec: DatasetSpec, tag: str, correction: str | None, with_corrections: bool, with_tasks: bool
) -> tuple[pa.Table, dict]:
    """One dataset's source sidecar, its rows named ``spec.name``, plus what labeling needs.

    Adds ``prompt`` (task text; with ``with_tasks``) and ``is_correction`` (with
    ``with_corrections``; the dataset's ``correction`` column, False where it has none), read
    from the dataset's frames and matched on (episode_index, frame_index).
    """
    table, record = read_advantages(spec.root, tag, None, CARRIED)
    path = sidecar_path(spec.root, ADVANTAGES, tag)
    names = pa.array(np.zeros(table.num_rows, dtype=np.int32))
    names = pa.DictionaryArray.from_arrays(names, pa.array([spec.name])).cast(pa.string())
    columns = {C.DATASET_NAME: names}
    for field in C.ADVANTAGES_SCHEMA:  # what the source lacks (RLinf's narrow files) is null
        if field.name not in columns:
            columns[field.name] = (table.column(field.name) if field.name in table.column_names
                                   else pa.nulls(table.num_rows, field.type))  # fmt: skip
    table = pa.table(
        [columns[n] for n in C.ADVANTAGES_SCHEMA.names], names=C.ADVANTAGES_SCHEMA.names,
        metadata=table.schema.metadata,
    )  # fmt: skip
    try:
        finite_column(table, C.ADVANTAGE_CONTINUOUS, frame_layout(table, spec.name, sort=False))
    except RecapError as exc:
        raise DatasetError(located(path, str(exc))) from exc
    frames = frame_columns(spec, correction if with_corrections else None, with_tasks)
    if frames is not None:
        try:
            table = align_to_frames(table, frames, frames.column_names[2:], "dataset frames")
        except RecapError as exc:
            msg = f"{exc}; the sidecar does not match the dataset's frames, recompute it"
            raise DatasetError(located(path, msg)) from exc
    if with_corrections and IS_CORRECTION not in table.column_names:
        table = table.append_column(IS_CORRECTION, pa.array(np.zeros(table.num_rows, dtype=bool)))
    return table, record


def frame_columns(spec: DatasetSpec, correction: str | None, with_tasks: bool) -> pa.Table | None:
    """episode_index, frame_index, then ``prompt`` and/or ``is_correction``; None if not needed."""
    if correction is None and not with_tasks:
        return None
    with LocalDataset(spec.root) as ds:
        has_correction = correction is not None and ds.has_column(correction)
        if not (has_correction or with_tasks):
            return None
        wanted = [C.EPISODE_INDEX, C.FRAME_INDEX]
        wanted += [C.TASK_INDEX] * with_tasks + [correction] * has_correction
        # the correction flag is read by value (bool, or exactly 0/1), never by truthiness
        frames = ds.read_columns(wanted, flags=[correction] * has_correction)
        out = frames.select([C.EPISODE_INDEX, C.FRAME_INDEX])
        if with_tasks:
            texts = ds.task_texts(frames.column(C.TASK_INDEX).to_numpy())
            out = out.append_column(C.PROMPT, pa.array(texts, pa.string()))
    if has_correction:
        out = out.append_column(IS_CORRECTION, frames.column(correction))
    return out


def relabel_record(source: dict, labeled: pa.Table, specs: list[DatasetSpec], tag: str) -> dict:
    """The new tag's record: the source's, updated with the new labeling and the datasets."""
    known = {d.get("name"): d for d in source.get("datasets") or [] if isinstance(d, dict)}
    datasets = [
        {**known.get(s.name, {}), "name": s.name, "type": s.type, "weight": float(s.weight)}
        for s in specs
    ]
    return {**source, **labeling_of(labeled), "source_tag": tag, "datasets": datasets}


@configurable("relabel")
@dataclass(frozen=True)
class RelabelConfig:
    """The relabel step's settings (gin ``relabel.*``).

    Args:
        datasets: the datasets the source tag labelled (list the same ones to reproduce it).
        source_tag, new_tag: read ``meta/advantages_{source_tag}.parquet``, write ``new_tag``.
        data_root: the directory relative dataset roots are under.
        positive_quantile, scope: the labelling (docs/spec.md §5): the top fraction of
            advantages positive, thresholded over all frames (``"global"``), per task
            (``"per_task"``) or per dataset (``"per_dataset"``).
        force_sft_positive: every frame of an ``sft`` dataset positive.
        correction_column: the frame column that marks expert corrections (positive).
    """

    datasets: list[dict] = REQUIRED
    source_tag: str = REQUIRED
    new_tag: str = REQUIRED
    data_root: str | os.PathLike = ""
    positive_quantile: float = DEFAULT_POSITIVE_QUANTILE
    scope: str = SCOPE_GLOBAL
    force_sft_positive: bool = True
    correction_column: str | None = IS_CORRECTION

    def __post_init__(self):
        check_given(self)


def relabel(config: RelabelConfig) -> dict[str, Path]:
    """Relabel existing advantages with a new quantile/scope under a new tag (no model)."""
    source_tag, new_tag, scope = config.source_tag, config.new_tag, config.scope
    check_tag(source_tag)
    check_tag(new_tag)
    if new_tag == source_tag:
        raise RecapError(f"new_tag: {new_tag!r} equals source_tag; relabeling writes a new tag")
    specs = parse_dataset_specs(config.datasets, config.data_root)
    sft = [s.name for s in specs if s.type == C.SFT] if config.force_sft_positive else []
    correction_column = config.correction_column
    corrections = [s.correction_column or correction_column for s in specs]
    options = LabelOptions(
        config.positive_quantile,
        scope,
        force_positive_datasets=tuple(sft),
        correction_column=IS_CORRECTION if any(corrections) else None,
    )
    loaded = [
        load_source(
            s, source_tag, c, options.correction_column is not None, scope == SCOPE_PER_TASK
        )
        for s, c in zip(specs, corrections, strict=True)
    ]
    labeled = relabel_advantages(pa.concat_tables([t for t, _ in loaded]), options)
    files, parts, start = {}, {}, 0
    for spec, (table, source) in zip(specs, loaded, strict=True):
        parts[spec.name] = part = labeled.slice(start, table.num_rows)
        start += table.num_rows
        record = relabel_record(source, labeled, specs, source_tag)
        record["correction_column"] = correction_column
        files.update(advantages_files(spec.root, new_tag, part, record,
                                      dataset_source(spec.root)))  # fmt: skip
    write_atomic(files)
    _print_summary(parts, labeling_of(labeled), source_tag, new_tag)
    return {s.name: sidecar_path(s.root, ADVANTAGES, new_tag) for s in specs}


def _print_summary(parts: dict[str, pa.Table], record: dict, source: str, new: str) -> None:
    for name, part in parts.items():
        positives = int(np.count_nonzero(part.column(C.ADVANTAGE).to_numpy()))
        log.info(f"{name}: {positives}/{part.num_rows} frames positive")
    thresholds = ", ".join(f"{k}: {v:.6g}" for k, v in record["thresholds"].items())
    log.info(
        f"tag {new!r} from {source!r}: positive_quantile {record['positive_quantile']}, "
        f"scope {record['scope']}, thresholds {{{thresholds}}}, "
        f"{record['num_positive']}/{record['num_frames']} positive"
    )
