"""Step 3: the value of every frame, n-step advantages, thresholds and labels, and pictures.

Every rank loads the whole exported value model (no DeepSpeed engine: inference needs no
partitioning at these sizes) and computes V(o_t) once per frame of its contiguous block of
batches, in dataset order, without augmentation (``recap.engine.inference.predict``). Rank 0
gathers the values and computes advantages (V(o_{t+N}) is the same array shifted, never a second
forward pass), thresholds and labels with ``recap.core.advantages``; then it writes every dataset's
``meta/advantages_{tag}.parquet`` and ``meta/mixture_config.yaml`` entry in one atomic batch,
prints the positive split and saves pictures to ``output_dir`` and MLflow. Bad input (model path,
returns tag, quantile, ...) is reported before any model is loaded, and nothing is written.

    python scripts/compute_advantages.py --gin_file demo/advantages.gin
    deepspeed --num_gpus 8 scripts/compute_advantages.py --gin_file my_advantages.gin
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm

import recap.steps.train  # noqa: F401  (declares train/value_model/value_data: value gin files)
from recap import logs, viz
from recap.configurable import REQUIRED, check_given, configurable, configured
from recap.core import columns as C
from recap.core.advantages import (
    DEFAULT_LOOKAHEAD,
    VALUE,
    add_advantages,
    check_lookahead,
    labeling_of,
)
from recap.core.frames import align_to_frames
from recap.core.normalize import GLOBAL, ReturnRange
from recap.core.oracle import episode_success
from recap.core.thresholds import (
    DEFAULT_POSITIVE_QUANTILE,
    IS_CORRECTION,
    SCOPE_GLOBAL,
    LabelOptions,
    check_positive_quantile,
)
from recap.data.datasets import ValueDataset, read_return_range
from recap.data.lerobot import frames_of
from recap.data.sidecars import (
    ADVANTAGES,
    advantages_files,
    check_tag,
    dataset_source,
    read_returns,
    sidecar_path,
    write_atomic,
)
from recap.data.specs import DatasetSpec, parse_dataset_specs
from recap.engine import accelerator, distributed
from recap.engine.inference import predict, shard_positions
from recap.errors import RecapError
from recap.loading import load_value, value_weights
from recap.models.value import ValueModel
from recap.processing.pi05 import PROCESSOR_FILE
from recap.processing.transforms import load_tokenizer
from recap.processing.value import read_value_processor
from recap.steps.relabel import frame_columns
from recap.tracking import RUN_FILE, Tracker

log = logs.get(__name__)
# Code version in the fingerprints of this step's stages: bump it when its results change (those
# stages and the ones after them rerun); tests check it against recap/workflow/code_versions.json.
STEP_VERSION = "1"

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


@configurable("compute_advantages")
@dataclasses.dataclass(frozen=True)
class AdvantagesConfig:
    """Step 3's settings (gin ``compute_advantages.*``).

    Args:
        datasets, data_root: the datasets to label (``recap.data.specs``), every frame once.
        tag: the sidecars written (``meta/advantages_{tag}.parquet``); ``returns_tag``: the
            Step 1 sidecars read.
        model_path: a value run directory or a ``save_pretrained`` directory, loaded with its
            processor by ``recap.loading.load_value`` (``model_fn``: the architecture of an
            older run that recorded none, i.e. the value model's gin file).
        tokenizer_path: the tokenizer the prompts are encoded with; ``image_size`` (default:
            the model's), ``max_length``: the value model's inputs.
        lookahead, lookahead_s, gamma: the n-step advantage (docs/spec.md): N frames, or a
            duration converted at each dataset's ``fps`` (``recap.data.lerobot.frames_of``;
            datasets of different rates get their own N) replacing ``lookahead`` when set;
            ``gamma``: default the Step 1 discount.
        positive_quantile, scope, force_sft_positive, correction_column: the labels (as
            ``relabel``).
        normalization: the value scale (``recap.core.normalize``): ``"global"`` (the return
            range mapped to [-1, 0]) or ``"task_length"`` (the paper's: by the task's longest
            episode).
        return_range: (min, max) of the value model's training returns; default: the range
            its processor recorded (``processor.json``; ``return_range.json`` of older runs),
            else the listed datasets'.
        batch_size, num_workers, precision: inference (``"fp32"`` or ``"bf16"``).
        output_dir, plot_episodes: where the pictures go (default
            ``runs/advantages_{tag}``) and how many episodes they draw.
    """

    datasets: list[dict] = REQUIRED
    tag: str = REQUIRED
    model_path: str | os.PathLike = REQUIRED
    tokenizer_path: str | os.PathLike = REQUIRED
    model_fn: Callable[[], ValueModel] | None = None
    data_root: str | os.PathLike = ""
    returns_tag: str = ""
    image_size: int | None = None
    max_length: int = 200
    lookahead: int = DEFAULT_LOOKAHEAD
    lookahead_s: float | None = None
    gamma: float | None = None
    positive_quantile: float = DEFAULT_POSITIVE_QUANTILE
    scope: str = SCOPE_GLOBAL
    normalization: str = GLOBAL
    return_range: tuple[float, float] | None = None
    force_sft_positive: bool = True
    correction_column: str | None = IS_CORRECTION
    batch_size: int = 32
    num_workers: int = 0
    precision: str = "fp32"
    output_dir: str | os.PathLike | None = None
    plot_episodes: int = 4

    def __post_init__(self):
        check_given(self)


def compute_advantages(config: AdvantagesConfig) -> dict[str, Path]:
    """Step 3: values on every rank, then advantages, labels and pictures from rank 0
    (``AdvantagesConfig``). Returns name -> sidecar (rank 0)."""
    c = config
    check_positive_quantile(c.positive_quantile)  # the cheap checks first
    plan = Plan.checked(c.datasets, c.data_root, c.tag, c.returns_tag, c.model_path,
                        c.tokenizer_path, c.lookahead, c.gamma, c.return_range,
                        c.precision)  # fmt: skip
    lookahead = c.lookahead
    if c.lookahead_s is not None:  # seconds -> frames per dataset rate
        lookahead = frames_of(c.lookahead_s, plan.specs, "compute_advantages.lookahead_s")
        log.info(f"look-ahead {c.lookahead_s:g} s = {lookahead} frames")
    sft = tuple(s.name for s in plan.specs if s.type == C.SFT) if c.force_sft_positive else ()
    corrections = any(s.correction_column or c.correction_column for s in plan.specs)
    options = LabelOptions(c.positive_quantile, c.scope, sft,
                           IS_CORRECTION if corrections else None)  # fmt: skip
    distributed.init()
    model, processor = load_value(plan.weights, c.model_fn)  # its resize rule (RLinf: none)
    model = model.to(device=accelerator.device(), dtype=PRECISIONS[c.precision])
    size = c.image_size or int(model.config.vision["image_size"])
    data = ValueDataset(plan.specs, c.returns_tag, plan.range, plan.tokenizer, size,
                        c.max_length, resize=processor.resize,
                        max_length_binding="compute_advantages.max_length")  # fmt: skip
    begin = time.perf_counter()
    values = infer_values(model, data, c.batch_size, c.num_workers)
    if values is None:  # ranks other than 0 are done
        return {}
    rate = len(data) / max(time.perf_counter() - begin, 1e-9)
    log.info(f"values: {len(data)} frames, {rate:.1f} frames/s on {distributed.world_size()} ranks")
    log.info(f"return range [{plan.range.return_min:g}, {plan.range.return_max:g}] from "
             f"{plan.range_source}")  # fmt: skip
    table = advantage_input(data, values, plan.returns, c.correction_column)
    labeled = add_advantages(table, return_range=plan.range, normalization=c.normalization,
                             lookahead=lookahead, gamma=plan.gamma, labels=options)  # fmt: skip
    counts = {s.name: t.num_rows for s, t in zip(plan.specs, plan.returns, strict=True)}
    parts = split_datasets(labeled, counts)
    record = plan.record(labeling_of(labeled), c.correction_column)
    files = [advantages_files(s.root, c.tag, parts[s.name], record, dataset_source(s.root))
             for s in plan.specs]  # fmt: skip
    write_atomic({path: writer for f in files for path, writer in f.items()})
    out = Path(c.output_dir or Path("runs") / f"advantages_{c.tag or 'untagged'}")
    report(plan, data, parts, record, out, c.plot_episodes, {"time/frames_per_s": rate})
    return {s.name: sidecar_path(s.root, ADVANTAGES, plan.tag) for s in plan.specs}


@dataclasses.dataclass
class Plan:
    """Step 3's inputs, all checked before any model is loaded or anything is computed."""

    tag: str
    returns_tag: str
    specs: list[DatasetSpec]
    weights: Path
    tokenizer: object
    returns: list[pa.Table]
    gamma: float
    range: ReturnRange
    range_source: str

    @classmethod
    def checked(
        cls,
        datasets: list[dict],
        data_root: str | os.PathLike,
        tag: str,
        returns_tag: str,
        model_path: str | os.PathLike,
        tokenizer_path: str | os.PathLike,
        lookahead: int,
        gamma: float | None,
        return_range: tuple[float, float] | None,
        precision: str,
    ) -> Plan:
        """Parse and check everything; every error is one line (nothing has been written)."""
        check_tag(tag)
        specs = parse_dataset_specs(datasets, data_root)
        specs = [dataclasses.replace(s, weight=1.0) for s in specs]  # every frame once
        if precision not in PRECISIONS:
            raise RecapError(f"compute_advantages.precision: {precision!r}; use {list(PRECISIONS)}")
        weights = value_weights(model_path)
        inputs = [read_returns(s.root, returns_tag) for s in specs]  # errors name the tags found
        stats = [s for _, s in inputs]
        gamma = returns_gamma(specs, stats) if gamma is None else gamma
        check_lookahead(lookahead, gamma)
        recorded = read_return_range(weights.parent)
        processor = read_value_processor(weights.parent)
        if return_range:
            rng, where = ReturnRange(*return_range), "compute_advantages.return_range"
        elif processor is not None and processor.return_range is not None:
            rng, where = ReturnRange(*processor.return_range), str(weights.parent / PROCESSOR_FILE)
        elif recorded is not None:  # the range the value model was trained with (older runs)
            rng, where = recorded[0], str(recorded[1])
        else:  # imported or older value models record none
            rng = ReturnRange.union([ReturnRange(s["return_min"], s["return_max"]) for s in stats])
            where = "the listed datasets (the value model recorded no training range)"
        tokenizer = load_tokenizer(tokenizer_path)
        return cls(tag, returns_tag, specs, weights, tokenizer, [t for t, _ in inputs], gamma, rng,
                   where)  # fmt: skip

    def record(self, labeling: dict, correction_column: str | None) -> dict:
        """The tag's entry of ``meta/mixture_config.yaml``."""
        return {
            **labeling,
            "returns_tag": self.returns_tag,
            "value_model": str(self.weights),
            "correction_column": correction_column,
            "datasets": [{"name": s.name, "type": s.type, "weight": 1.0} for s in self.specs],
        }


def returns_gamma(specs: list[DatasetSpec], stats: list[dict]) -> float:
    """The discount Step 1 used (one for all datasets: the value model learned those returns)."""
    gammas = {float(s.get("gamma", 1.0)) for s in stats}
    if len(gammas) > 1:
        found = ", ".join(f"{sp.name}: {s.get('gamma')}" for sp, s in zip(specs, stats))
        raise RecapError(
            f"returns gamma differs between datasets ({found}); set compute_advantages.gamma "
            "or recompute the returns with one gamma"
        )
    return gammas.pop()


def infer_values(
    model: torch.nn.Module, data: ValueDataset, batch_size: int, num_workers: int = 0
) -> np.ndarray | None:
    """float64[len(data)] V(o) of every item, each computed once across the ranks, on rank 0
    (None elsewhere); a progress bar with frames/s on rank 0. Call on all ranks together."""
    world = distributed.world_size()
    per_rank = len(shard_positions(len(data), 0, world, batch_size))
    bar = tqdm(total=per_rank, unit="frame", unit_scale=world, desc=f"values ({world} ranks)",
               disable=None if distributed.is_main() else True, dynamic_ncols=True)  # fmt: skip

    def value(m: ValueModel, batch: dict) -> dict[str, torch.Tensor]:
        out = m.predict_value(batch)
        bar.update(out.shape[0])
        return {VALUE: out}

    with bar:
        outputs = predict(model, data, batch_size, value, num_workers)
    return None if outputs is None else outputs[VALUE].double().numpy()


def advantage_input(
    data: ValueDataset, values: np.ndarray, returns: list[pa.Table], correction: str | None
) -> pa.Table:
    """Returns sidecars + ``value`` (+ ``is_correction``) + ``dataset_name``, all datasets."""
    tables = []
    for s, (source, sidecar) in enumerate(zip(data.sources, returns, strict=True)):
        sel = data.source_of == s
        per_row = np.empty(len(source.frames), dtype=np.float64)
        per_row[data.row_of[sel]] = values[sel]
        keys = source.frames.columns
        by_row = pa.table({C.EPISODE_INDEX: keys[C.EPISODE_INDEX],
                           C.FRAME_INDEX: keys[C.FRAME_INDEX], VALUE: per_row})  # fmt: skip
        table = align_to_frames(sidecar, by_row, [VALUE], "value table")
        flags = frame_columns(source.spec, source.spec.correction_column or correction, False)
        if flags is not None:
            table = align_to_frames(table, flags, [IS_CORRECTION], "dataset frames")
        name = pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(table.num_rows, dtype=np.int32)), pa.array([source.spec.name])
        )
        tables.append(table.append_column(C.DATASET_NAME, name))  # no string copies
    if any(IS_CORRECTION in t.column_names for t in tables):  # before dataset_name, as read
        tables = [t if IS_CORRECTION in t.column_names else t.add_column(
            t.num_columns - 1, IS_CORRECTION, pa.array(np.zeros(t.num_rows, dtype=bool)))
            for t in tables]  # fmt: skip
    return pa.concat_tables(tables)


def split_datasets(labeled: pa.Table, counts: dict[str, int]) -> dict[str, pa.Table]:
    """Each dataset's rows (``counts``: name -> frames) of the joint sidecar, whose rows
    ``add_advantages`` sorts by (dataset_name, episode_index, frame_index)."""
    parts, start = {}, 0
    for name in sorted(counts):
        parts[name] = part = labeled.slice(start, counts[name])
        start += counts[name]
        if part.num_rows and part.column(C.DATASET_NAME)[0].as_py() != name:
            raise RecapError(f"advantages: rows of dataset {name!r} are not where expected")
    return {name: parts[name] for name in counts}  # in the listed order


# ---- what a person looks at: the positive split, pictures -------------------------------------


def report(plan: Plan, data, parts: dict, record: dict, out: Path, episodes: int, metrics: dict):
    """Print the positive split; pictures to ``out`` and MLflow (rank 0). A failing picture
    (e.g. matplotlib, the ``viz`` extra, missing) is a warning, never an error."""
    outcomes = {s.name: episode_success(r) for s, r in zip(plan.specs, plan.returns, strict=True)}
    metrics = print_summary(plan.tag, parts, outcomes, record) | metrics
    try:
        traces = viz.advantage_episodes(data, parts, outcomes, plan.returns, record, episodes)
        figures = viz.advantage_figures(parts, outcomes, traces, record)
    except Exception as exc:
        warnings.warn(f"advantage pictures skipped: {exc}", stacklevel=2)
        figures = {}
    save_pictures(out, figures, metrics)


def print_summary(tag: str, parts: dict, outcomes: dict, record: dict) -> dict[str, float]:
    """Print per-dataset positives and the split between successful and failed episodes."""
    label, from_success, episodes, successes = [], [], 0, 0
    for name, part in parts.items():
        ids, ok = outcomes[name]
        positive = part.column(C.ADVANTAGE).to_numpy(zero_copy_only=False)
        success = np.isin(part.column(C.EPISODE_INDEX).to_numpy(), ids[ok])
        log.info(f"{name}: {int(positive.sum())}/{positive.size} frames positive")
        label.append(positive)
        from_success.append(positive & success)
        episodes, successes = episodes + ids.size, successes + int(ok.sum())
    n, positives = sum(p.size for p in label), int(sum(p.sum() for p in label))
    split = int(sum(s.sum() for s in from_success)) / max(positives, 1)
    rate = successes / max(episodes, 1)
    log.info(
        f"positives: {positives / n:.1%} of {n} frames; {split:.0%} of positives from successful "
        f"episodes (success rate of the data {rate:.0%})"
    )
    thresholds = ", ".join(f"{k}: {v:.6g}" for k, v in record["thresholds"].items())
    log.info(
        f"tag {tag!r}: lookahead {record['lookahead']}, positive_quantile "
        f"{record['positive_quantile']}, scope {record['scope']}, thresholds {{{thresholds}}}"
    )
    return {"positive_fraction": positives / n, "positives_from_success": split,
            "success_rate": rate, "num_frames": float(n)}  # fmt: skip


def save_pictures(out: Path, figures: dict, metrics: dict) -> None:
    """PNGs in ``out``, then a new MLflow run with them and ``metrics`` (rank 0)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_FILE).unlink(missing_ok=True)  # every Step 3 run is a new MLflow run
    tracker = configured(Tracker)()
    tracker.start(out, "advantages", {"recap.world_size": str(distributed.world_size())})
    tracker.log_metrics(metrics, 0)
    for name, figure in figures.items():
        figure.savefig(out / f"{name}.png", dpi=110)
        tracker.log_png(out / f"{name}.png", "plots")
        viz.close(figure)
    tracker.finish("FINISHED")
    log.info(f"pictures: {', '.join(str(out / f'{n}.png') for n in figures) or 'none'}")
