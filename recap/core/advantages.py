"""Step 3: n-step advantages, thresholds and labels over Arrow tables (SPEC, Step 3).

For frame t of an episode of length T, lookahead N >= 1 and discount gamma in (0, 1]::

    t + N <  T:  A_t = norm_sum(sum_{k<N} gamma^k r_{t+k}) + gamma^N V(o_{t+N}) - V(o_t)
    t + N >= T:  A_t = norm_ret(sum_{k<T-t} gamma^k r_{t+k})                   - V(o_t)

with the shared maps of ``normalize.py``: ``norm_sum(s) = s / scale`` (a difference of returns)
and ``norm_ret(G) = (G - offset) / scale`` (a return; offset = return_max, scale = return_max -
return_min, or offset 0 and scale = the task's longest episode). Past the end the remainder *is* the
return G_t, so it takes the return map, the one the value model was trained on: a perfect value
model (gamma 1) then gives A = 0 on every frame, whatever return_max is. When return_max = 0 (the
SPEC example) ``norm_ret = norm_sum`` and this is the SPEC formula with bootstrap 0. Window sums
are whole-column numpy: prefix sums for gamma 1, else ``S_t = G_t - gamma^N G_{t+N}`` (second term
0 past the end); no loop over frames or episodes. ``value_next`` is 0 where the window runs past
the end (``t + N >= T``: nothing is bootstrapped there), so ``A = reward_sum + gamma^N value_next
- value_current`` holds on every row of the sidecar.

Labels: per scope (all frames, per task, per dataset) the threshold is the
``1 - positive_quantile`` quantile of A with linear interpolation (``np.percentile``'s default);
``advantage = A >= threshold``, or forced positive (frames of listed datasets, e.g. ``sft`` ones;
frames flagged as human corrections). Forced frames still take part in the threshold, as in RLinf:
a threshold depends on A and the scope only, so toggling a forcing option never moves any other
frame's label.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recap.core import columns as C
from recap.core.episodes import Episodes, find_episodes, find_presorted
from recap.core.normalize import (
    GLOBAL,
    MODES,
    TASK_LENGTH,
    ReturnRange,
    normalize_returns,
    normalize_reward_sums,
    task_length_scale,
)
from recap.core.returns import DEFAULT_GAMMA, discounted_returns
from recap.errors import RecapError

VALUE = "value"  # input column: V(o_t) from the value model, on the normalized scale [-1, 0]
IS_CORRECTION = "is_correction"  # default name of the boolean human-correction column
SCOPE_GLOBAL, SCOPE_PER_TASK, SCOPE_PER_DATASET = "global", "per_task", "per_dataset"
SCOPES = (SCOPE_GLOBAL, SCOPE_PER_TASK, SCOPE_PER_DATASET)
ALL_FRAMES = "all"  # threshold key of the global scope
DEFAULT_LOOKAHEAD = 10
DEFAULT_POSITIVE_QUANTILE = 0.3
METADATA_KEY = b"recap.advantages"  # Arrow/parquet schema metadata: JSON labeling record
COMPUTATION_KEYS = ("normalization", "return_min", "return_max", "lookahead", "gamma")


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


@dataclass(frozen=True)
class NStep:
    """n-step terms per frame, each [n] in sorted (episode_index, frame_index) order.

    advantage float64 ``A_t``; reward_sum float64 ``norm(S_t)``; reward_sum_raw float64 ``S_t``;
    value_next float64 ``V(o_{t+N})``, 0 when ``t+N >= T``; num_valid int64 ``min(N, T-t)``.
    """

    advantage: np.ndarray
    reward_sum: np.ndarray
    reward_sum_raw: np.ndarray
    value_next: np.ndarray
    num_valid: np.ndarray


def check_positive_quantile(q: float) -> float:
    """``q`` as a float when it lies in (0, 1), else a RecapError."""
    ok = isinstance(q, (int, float, np.floating)) and not isinstance(q, bool)
    if not ok or not 0.0 < float(q) < 1.0:
        raise RecapError(
            f"positive_quantile: {q!r} is outside (0, 1); it is the fraction of frames labeled "
            "positive, e.g. 0.3"
        )
    return float(q)


def check_lookahead(lookahead: int, gamma: float) -> None:
    """N must be an integer >= 1 and gamma in (0, 1]."""
    if isinstance(lookahead, bool) or not isinstance(lookahead, (int, np.integer)) or lookahead < 1:
        raise RecapError(f"lookahead: {lookahead!r} must be an integer >= 1 (frames ahead)")
    if not 0.0 < gamma <= 1.0:
        raise RecapError(f"gamma: {gamma} is outside (0, 1]; use a discount in (0, 1]")


def n_step_advantages(
    values: np.ndarray,
    episodes: Episodes,
    *,
    rewards: np.ndarray | None = None,
    returns: np.ndarray | None = None,
    lookahead: int,
    gamma: float,
    scale: np.ndarray | float,
    offset: np.ndarray | float = 0.0,
) -> NStep:
    """n-step advantages from rewards (or discounted returns) and values (SPEC, Step 3).

    Args:
        values: float64[n] ``V(o_t)``, sorted order.
        episodes: layout from ``find_episodes``.
        rewards: float64[n] ``r_t`` (preferred), or
        returns: float64[n] ``G_t`` computed with the same ``gamma``; sorted order.
        scale, offset: float or float64[n], the shared normalization (``normalize.py``).
    Returns:
        ``t + N < T``: ``A_t = S_t / scale + gamma^N V_{t+N} - V_t`` with
        ``S_t = sum_{k<N} gamma^k r_{t+k} = G_t - gamma^N G_{t+N}``; else
        ``A_t = (S_t - offset) / scale - V_t`` with ``S_t = G_t`` and ``value_next = 0``.
    """
    check_lookahead(lookahead, gamma)
    n = episodes.num_frames
    tail, tail_remaining = _tail_rows(episodes, lookahead)  # rows with t + N >= T, and T - t
    buffer = arrow_empty(n + 1, np.float64)  # prefix sums first, then the normalized sums
    raw = _window_sums(episodes, lookahead, gamma, tail, tail_remaining, rewards, returns, buffer)
    reward_sum = normalize_reward_sums(raw, scale, out=buffer[:n])
    if np.ndim(offset) or offset != 0:  # past the end the remainder is a return: return map
        reward_sum[tail] = normalize_returns(raw[tail], _at(offset, tail), _at(scale, tail))
    discount = float(gamma) ** int(lookahead)
    value_next = _ahead(values, lookahead, tail)
    advantage = arrow_empty(n, np.float64)  # A = reward_sum + gamma^N value_next - value
    if discount == 1.0:
        np.add(reward_sum, value_next, out=advantage)
    else:
        np.multiply(value_next, discount, out=advantage)
        advantage += reward_sum
    advantage -= values
    num_valid = arrow_empty(n, np.int64)
    num_valid.fill(lookahead)
    num_valid[tail] = tail_remaining
    return NStep(advantage, reward_sum, raw, value_next, num_valid)


def _window_sums(
    episodes: Episodes,
    lookahead: int,
    gamma: float,
    tail: np.ndarray,
    tail_remaining: np.ndarray,
    rewards: np.ndarray | None,
    returns: np.ndarray | None,
    scratch: np.ndarray | None = None,
) -> np.ndarray:
    """float64[n] ``S_t = sum_{k < min(N, T-t)} gamma^k r_{t+k}``.

    ``scratch``: optional float64[n + 1] work space (overwritten) for the prefix sums.

    gamma 1 with rewards: prefix sums ``P``, ``S_t = P[t + min(N, T-t)] - P[t]`` (a shift, plus
    a gather on the tail rows; exact for integer-valued rewards, and otherwise as precise as the
    global cumulative sum ``discounted_returns`` uses for gamma 1). Otherwise
    ``S_t = G_t - gamma^N G_{t+N}`` with ``G_{t+N} := 0`` on the tail rows.
    """
    if rewards is not None and gamma == 1.0:
        n = episodes.num_frames
        prefix = arrow_empty(n + 1, np.float64) if scratch is None else scratch
        prefix[0] = 0.0
        np.cumsum(rewards, dtype=np.float64, out=prefix[1:])  # float32 rewards add in float64
        raw = arrow_empty(n, np.float64)
        m = max(n + 1 - lookahead, 0)
        np.subtract(prefix[lookahead:], prefix[:m], out=raw[:m])
        raw[tail] = prefix[tail + tail_remaining] - prefix[tail]
        return raw
    if returns is None:
        if rewards is None:
            raise RecapError("n_step_advantages: give rewards or returns")
        returns = discounted_returns(rewards, episodes, gamma)
    raw = _ahead(returns, lookahead, tail)  # G_{t+N} (0 past the end), then S_t in place
    raw *= -(float(gamma) ** int(lookahead))
    raw += returns
    return raw


def _tail_rows(episodes: Episodes, lookahead: int) -> tuple[np.ndarray, np.ndarray]:
    """int64[m] sorted rows whose window runs past the end (``T - t <= N``), and their ``T - t``.

    The last ``min(T, N)`` rows of each episode: at most ``min(n, E N)`` rows, built by repeats.
    """
    count = np.minimum(episodes.lengths, lookahead)
    ends = np.repeat(episodes.ends, count)
    first = np.cumsum(count) - count
    remaining = np.repeat(count, count) - (np.arange(ends.shape[0]) - np.repeat(first, count))
    return ends - remaining, remaining


def _ahead(x: np.ndarray, k: int, tail: np.ndarray) -> np.ndarray:
    """float64[n] ``x[i + k]``, 0 on the ``tail`` rows (where ``i + k`` is past the episode)."""
    out = arrow_empty(x.shape[0], np.float64)
    m = max(x.shape[0] - k, 0)
    out[:m] = x[k:]
    out[m:] = 0.0
    out[tail] = 0.0
    return out


def _at(x: np.ndarray | float, rows: np.ndarray) -> np.ndarray | float:
    return x[rows] if np.ndim(x) else x


def _arrow(values: np.ndarray | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """An output column: numpy wrapped without a copy, Arrow as it is."""
    return values if isinstance(values, pa.ChunkedArray) else pa.array(values)


def arrow_empty(n: int, dtype: np.dtype | type) -> np.ndarray:
    """Uninitialized writable [n] array in Arrow's memory pool.

    Step 3's columns end in Arrow tables (``pa.array`` wraps them without a copy) and its
    temporaries are column-sized. Taking them from the pool the parquet reader allocates from
    lets a process that labels many datasets reuse pages that pool keeps, instead of faulting
    in fresh ones from the system allocator per column, which cost more than the arithmetic
    (measured in ``bench/advantages.py``).
    """
    dtype = np.dtype(dtype)
    return np.frombuffer(pa.allocate_buffer(int(n) * dtype.itemsize), dtype=dtype)


def column_numpy(column: pa.ChunkedArray | pa.Array, dtype: np.dtype | None = None) -> np.ndarray:
    """The values of an Arrow column as one contiguous numpy array, cast to ``dtype`` if given
    (nulls become NaN: check ``null_count`` first where that matters).

    A single chunk of the right type is viewed without a copy; otherwise the chunks are copied
    (and cast) straight into one array in Arrow's pool: one pass, no intermediate join.
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [chunk.to_numpy(zero_copy_only=False) for chunk in chunks]
    if dtype is None:
        dtype = parts[0].dtype if parts else np.float64
    if len(parts) == 1 and parts[0].dtype == dtype:
        return parts[0]
    out = arrow_empty(sum(p.shape[0] for p in parts), dtype)
    start = 0
    for part in parts:  # a loop over Arrow chunks (a handful per million rows), not rows
        out[start : start + part.shape[0]] = part
        start += part.shape[0]
    return out


def quantile_threshold(advantages: np.ndarray, positive_quantile: float) -> float:
    """float64[n] -> ``np.quantile(A, 1 - q)`` (linear interpolation), bit for bit (SPEC).

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


def add_advantages(
    table: pa.Table,
    *,
    return_range: ReturnRange | None = None,
    normalization: str = GLOBAL,
    lookahead: int = DEFAULT_LOOKAHEAD,
    gamma: float = DEFAULT_GAMMA,
    labels: LabelOptions = LabelOptions(),
    dataset_name: str | None = None,
    value_column: str = VALUE,
) -> pa.Table:
    """The advantages sidecar (``columns.ADVANTAGES_SCHEMA``) of one or several datasets.

    Args:
        table: frames in any order with ``episode_index``, ``frame_index``, ``value_column``,
            and ``reward`` (preferred: G is recomputed with ``gamma``) or ``return`` (then it
            must have been computed with ``gamma``); optional: ``return`` (copied), the
            ``dataset_name`` column (else the ``dataset_name`` argument; several datasets may
            share episode ids), ``prompt`` or ``task_index`` (per-task scope, task_length
            normalization) and the correction column.
        return_range: global [min, max] of the training returns (``global`` normalization).
        normalization: ``global`` (scale = max - min) or ``task_length`` (task's longest episode).
    Returns:
        Rows sorted by (dataset_name, episode_index, frame_index); the schema metadata holds the
        labeling record (``labeling_of``).
    """
    check_lookahead(lookahead, gamma)
    layout = frame_layout(table, dataset_name)
    values = finite_column(table, value_column, layout)
    rewards, returns = _reward_columns(table, layout, gamma)
    needs_tasks = labels.scope == SCOPE_PER_TASK or normalization == TASK_LENGTH
    tasks = task_keys(table, layout) if needs_tasks else None
    offset, scale = _normalization(normalization, return_range, tasks, layout.episodes)
    nstep = n_step_advantages(
        values,
        layout.episodes,
        rewards=rewards,
        returns=returns if rewards is None else None,
        lookahead=lookahead,
        gamma=gamma,
        scale=scale,
        offset=offset,
    )
    label, record = _label(nstep.advantage, table, layout, tasks, labels)
    record.update(_computation_record(normalization, return_range, lookahead, gamma))
    columns = [layout.episode_index, layout.frame_index, nstep.advantage, returns, values]
    columns += [nstep.value_next, nstep.reward_sum, nstep.reward_sum_raw, nstep.num_valid]
    names = layout.dataset_column()
    arrays = [_arrow(c) for c in columns] + [names, pa.array(label)]
    field = C.ADVANTAGES_SCHEMA.get_field_index(C.DATASET_NAME)
    schema = C.ADVANTAGES_SCHEMA.set(field, pa.field(C.DATASET_NAME, names.type))
    return with_labeling(pa.Table.from_arrays(arrays, schema=schema), record)


def relabel_advantages(table: pa.Table, labels: LabelOptions) -> pa.Table:
    """New labels for existing advantages, reusing ``advantage_continuous`` (no model).

    ``table``: advantages sidecar rows of one or several datasets (row order is kept) plus, where
    needed, ``prompt`` or ``task_index`` (per-task scope) and the correction column. The input's
    computation record (normalization, lookahead, gamma) is carried over.
    """
    layout = frame_layout(table, None, sort=False)
    advantage = finite_column(table, C.ADVANTAGE_CONTINUOUS, layout)
    tasks = task_keys(table, layout) if labels.scope == SCOPE_PER_TASK else None
    label, record = _label(advantage, table, layout, tasks, labels)
    previous = labeling_of(table)
    record.update({k: previous[k] for k in COMPUTATION_KEYS if k in previous})
    names = table.column(C.DATASET_NAME)  # kept as given: plain or dictionary-encoded strings
    schema = C.ADVANTAGES_SCHEMA.set(
        C.ADVANTAGES_SCHEMA.get_field_index(C.DATASET_NAME), pa.field(C.DATASET_NAME, names.type)
    )
    out = table.select(C.ADVANTAGES_SCHEMA.names).cast(schema)
    out = out.set_column(out.num_columns - 1, C.ADVANTAGE, pa.array(label))
    return with_labeling(out, record)


def labeling_of(table: pa.Table) -> dict:
    """The labeling record stored by ``add_advantages`` / ``relabel_advantages`` ({} if none)."""
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else {}


def with_labeling(table: pa.Table, record: dict) -> pa.Table:
    """``table`` with ``record`` as JSON in its schema metadata (parquet keeps it)."""
    meta = dict(table.schema.metadata or {})
    meta[METADATA_KEY] = json.dumps(record, sort_keys=True).encode()
    return table.replace_schema_metadata(meta)


def _reward_columns(
    table: pa.Table, layout: FrameLayout, gamma: float
) -> tuple[np.ndarray | None, np.ndarray]:
    """float64[n] rewards (None without a ``reward`` column) and the ``return`` column, which
    is recomputed from the rewards with ``gamma`` when the table has none."""
    has_rewards = C.REWARD in table.column_names
    rewards = finite_column(table, C.REWARD, layout, keep_float32=True) if has_rewards else None
    if C.RETURN in table.column_names or rewards is None:
        return rewards, finite_column(table, C.RETURN, layout)
    return rewards, discounted_returns(rewards, layout.episodes, gamma)


def _computation_record(mode: str, rng: ReturnRange | None, lookahead: int, gamma: float) -> dict:
    return {
        "normalization": mode,
        "return_min": None if rng is None else float(rng.return_min),
        "return_max": None if rng is None else float(rng.return_max),
        "lookahead": int(lookahead),
        "gamma": float(gamma),
    }


def _normalization(
    mode: str, rng: ReturnRange | None, tasks: TaskKeys | None, episodes: Episodes
) -> tuple[float, np.ndarray | float]:
    """(offset, scale): (max, max - min) globally, or (0, the frame's task's longest episode)."""
    if mode not in MODES:
        raise RecapError(f"normalization: {mode!r} is not one of {list(MODES)}")
    if mode == TASK_LENGTH:
        return 0.0, task_length_scale(tasks.codes, episodes.lengths[episodes.episode_of])
    if rng is None:
        raise RecapError(
            "return_range: global normalization needs the training return range; pass "
            "ReturnRange(return_min, return_max) from the Step 1 statistics"
        )
    return rng.offset, rng.scale


def _label(
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
    forced = _forced(table, layout, opts)
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


def _forced(table: pa.Table, layout: FrameLayout, opts: LabelOptions) -> np.ndarray | None:
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


# ---- frame tables: sorting, dataset/task keys, checked columns, joins ------------------------


@dataclass(frozen=True)
class FrameLayout:
    """Rows of a frame table keyed by (dataset, episode, frame), in "layout order".

    Layout order is sorted (dataset_name, episode_index, frame_index) for a sorted layout, else
    the table's own row order. Arrays are [n] in layout order.

    Attributes:
        order: int64[n] row permutation into layout order, or None (identity).
        episodes: episode layout over (dataset, episode) keys (None when not sorted).
        dataset_codes: int64[n] index into ``dataset_names`` (sorted, distinct).
        episode_index, frame_index: int64[n], numpy or (rows kept as given) the Arrow columns.
    """

    order: np.ndarray | None
    episodes: Episodes | None
    dataset_codes: np.ndarray
    dataset_names: list[str]
    episode_index: np.ndarray | pa.ChunkedArray
    frame_index: np.ndarray | pa.ChunkedArray

    def take(self, values: np.ndarray) -> np.ndarray:
        """Per-row values of the table -> layout order."""
        return values if self.order is None else values[self.order]

    def dataset_column(self) -> pa.DictionaryArray:
        """string[n] dataset name per row (layout order), dictionary-encoded: no string copies
        (parquet stores it as a plain string column; ``read_parquet`` returns strings)."""
        n = self.dataset_codes.shape[0]
        one = len(self.dataset_names) == 1  # zeros from calloc: pages appear only when read
        codes = pa.array(np.zeros(n, np.int32) if one else self.dataset_codes.astype(np.int32))
        return pa.DictionaryArray.from_arrays(codes, pa.array(self.dataset_names, pa.string()))


@dataclass(frozen=True)
class TaskKeys:
    """int64[n] task code per row (layout order) into ``keys`` (task text, or dataset/index)."""

    codes: np.ndarray
    keys: list[str]


def frame_layout(table: pa.Table, dataset_name: str | None, *, sort: bool = True) -> FrameLayout:
    """Dataset codes and, with ``sort``, the (dataset, episode, frame) sort of ``table``.

    One dataset whose rows come sorted (the usual case) is recognized chunk by chunk on the
    Arrow columns, which then serve as the output columns as they are (no joined copies).
    """
    if sort and C.DATASET_NAME not in table.column_names and dataset_name is not None:
        episode_col = _int_chunks(table, C.EPISODE_INDEX)
        frame_col = _int_chunks(table, C.FRAME_INDEX)
        episodes = find_presorted(
            [c.to_numpy() for c in episode_col.chunks], [c.to_numpy() for c in frame_col.chunks]
        )
        if episodes is not None:
            codes = np.zeros(table.num_rows, dtype=np.int64)
            return FrameLayout(None, episodes, codes, [dataset_name], episode_col, frame_col)
    episode = _int_column(table, C.EPISODE_INDEX)
    frame = _int_column(table, C.FRAME_INDEX)
    if C.DATASET_NAME in table.column_names:
        codes, names = encode_strings(table.column(C.DATASET_NAME), C.DATASET_NAME)
    elif dataset_name is not None:
        codes, names = np.zeros(table.num_rows, dtype=np.int64), [dataset_name]
    else:
        raise RecapError("dataset_name: no column and no name given; pass dataset_name=...")
    if not sort:
        return FrameLayout(None, None, codes, names, episode, frame)
    episodes = _find_episodes(episode, frame, codes, names)
    order = episodes.order
    if episodes.presorted:  # rows already in (dataset, episode, frame) order
        return FrameLayout(None, episodes, codes, names, episode, frame)
    return FrameLayout(order, episodes, codes[order], names, episode[order], frame[order])


def _find_episodes(episode: np.ndarray, frame: np.ndarray, codes: np.ndarray, names: list[str]):
    """Episodes over (dataset, episode) keys; errors name the dataset when there are several."""
    if len(names) == 1:
        return find_episodes(episode, frame)
    low = int(episode.min())
    span = int(episode.max()) - low + 1
    if span * len(names) >= 2**62:
        raise RecapError(f"{C.EPISODE_INDEX}: ids span {span}; renumber the episodes")
    try:
        return find_episodes(codes * span + (episode - low), frame)
    except RecapError:
        for i, name in enumerate(names):  # error path only: say which dataset is wrong
            rows = codes == i
            try:
                find_episodes(episode[rows], frame[rows])
            except RecapError as exc:
                raise RecapError(f"dataset {name!r}: {exc}") from exc
        raise


def task_keys(table: pa.Table, layout: FrameLayout) -> TaskKeys:
    """Task of each row: the ``prompt`` text, else (dataset, ``task_index``) as "name/index"."""
    if C.PROMPT in table.column_names:
        codes, keys = encode_strings(table.column(C.PROMPT), C.PROMPT)
        return TaskKeys(layout.take(codes), keys)
    if C.TASK_INDEX not in table.column_names:
        raise RecapError(
            "per-task thresholds or task_length normalization need a 'prompt' or 'task_index' "
            "column; add the Step 1 prompt column or the dataset's task_index"
        )
    task = layout.take(_int_column(table, C.TASK_INDEX))
    pairs, codes = np.unique(np.stack([layout.dataset_codes, task]), axis=1, return_inverse=True)
    keys = [f"{layout.dataset_names[d]}/{t}" for d, t in pairs.T.tolist()]
    return TaskKeys(codes.reshape(-1).astype(np.int64), keys)


def encode_strings(column: pa.ChunkedArray, name: str) -> tuple[np.ndarray, list[str]]:
    """string[n] (plain or dictionary) -> (int64[n] codes, sorted distinct strings)."""
    if column.null_count:
        raise RecapError(f"{name}: {column.null_count} null values; every row needs a {name}")
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    encoded = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    words = encoded.dictionary.cast(pa.string()).to_pylist()
    indices = np.asarray(encoded.indices.to_numpy(), dtype=np.int64)
    present = np.flatnonzero(np.bincount(indices, minlength=len(words)))  # skip unused entries
    distinct = sorted({words[i] for i in present})
    position = {w: i for i, w in enumerate(distinct)}
    remap = np.zeros(len(words), dtype=np.int64)
    remap[present] = [position[words[i]] for i in present]
    return remap[indices], distinct


_FIXES = {
    VALUE: "run value inference over every frame (a NaN value often means a diverged model)",
    C.REWARD: "recompute the returns sidecar (Step 1)",
    C.RETURN: "recompute the returns sidecar (Step 1)",
    C.ADVANTAGE_CONTINUOUS: "recompute the advantages (Step 3)",
}


def finite_column(
    table: pa.Table, name: str, layout: FrameLayout, *, keep_float32: bool = False
) -> np.ndarray:
    """float64[n] column ``name`` in layout order (float32 stays float32 with ``keep_float32``);
    missing, null or non-finite values raise."""
    fix = _FIXES.get(name, f"give every frame a finite {name}")
    if name not in table.column_names:
        raise RecapError(f"{name}: column missing (have {table.column_names}); {fix}")
    column = table.column(name)
    native = keep_float32 and pa.types.is_float32(column.type)
    values = layout.take(column_numpy(column, None if native else np.float64))
    if np.isfinite(np.sum(values)):  # NaN and inf propagate into the sum: one cheap pass
        return values
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.argmax(bad))
        where = f"dataset {layout.dataset_names[layout.dataset_codes[i]]!r}, " * (
            len(layout.dataset_names) > 1
        )
        raise RecapError(
            f"{name}: {int(bad.sum())} NaN/null/infinite values (first at {where}episode_index="
            f"{layout.episode_index[i]}, frame_index={layout.frame_index[i]}); {fix}"
        )
    return values


def _int_column(table: pa.Table, name: str) -> np.ndarray:
    return column_numpy(_int_chunks(table, name), np.int64)


def _int_chunks(table: pa.Table, name: str) -> pa.ChunkedArray:
    """Integer column ``name`` as int64 Arrow chunks (a no-op cast when it is int64)."""
    if name not in table.column_names:
        raise RecapError(f"{name}: column missing (have {table.column_names})")
    column = table.column(name)
    if column.null_count:
        raise RecapError(f"{name}: {column.null_count} null values; every frame needs one")
    if not pa.types.is_integer(column.type):
        raise RecapError(f"{name}: type {column.type}, expected integers; re-export the column")
    return column if column.type == pa.int64() else column.cast(pa.int64())


def align_to_frames(frames: pa.Table, other: pa.Table, columns: list[str], what: str) -> pa.Table:
    """``frames`` plus ``columns`` of ``other``, matched on (episode_index, frame_index).

    Every frame must have exactly one row in ``other`` and ``other`` no extra rows; ``what``
    names ``other`` in errors (e.g. "value table").
    """
    f_ep, f_fr = _int_column(frames, C.EPISODE_INDEX), _int_column(frames, C.FRAME_INDEX)
    o_ep, o_fr = _int_column(other, C.EPISODE_INDEX), _int_column(other, C.FRAME_INDEX)
    if f_ep.size and o_ep.size and np.array_equal(f_ep, o_ep) and np.array_equal(f_fr, o_fr):
        index = np.arange(f_ep.size)
    else:
        index = _match_rows(f_ep, f_fr, o_ep, o_fr, what)
    for name in columns:
        if name not in other.column_names:
            raise RecapError(f"{what}: column {name!r} missing (have {other.column_names})")
        frames = frames.append_column(name, other.column(name).take(pa.array(index)))
    return frames


def _match_rows(f_ep, f_fr, o_ep, o_fr, what: str) -> np.ndarray:
    """int64[n] row of ``other`` holding each frame's key; one-line errors on any mismatch."""
    width = int(max(f_fr.max(initial=0), o_fr.max(initial=0))) + 1
    low = int(min(f_ep.min(initial=0), o_ep.min(initial=0)))
    f_key, o_key = (f_ep - low) * width + f_fr, (o_ep - low) * width + o_fr
    order = np.argsort(o_key, kind="stable")
    sorted_key = o_key[order]
    if np.any(sorted_key[1:] == sorted_key[:-1]):
        dup = int(order[np.argmax(sorted_key[1:] == sorted_key[:-1])])
        raise RecapError(
            f"{what}: duplicate row (episode_index={o_ep[dup]}, frame_index={o_fr[dup]}); "
            "give each frame one row"
        )
    pos = np.minimum(np.searchsorted(sorted_key, f_key), max(sorted_key.size - 1, 0))
    found = sorted_key[pos] == f_key if sorted_key.size else np.zeros(f_key.size, dtype=bool)
    if not found.all():
        i = int(np.argmin(found))
        raise RecapError(
            f"{what}: no row for (episode_index={f_ep[i]}, frame_index={f_fr[i]}) "
            f"({int((~found).sum())} of {f_key.size} frames missing); it must cover every frame "
            "of the dataset"
        )
    if o_key.size != f_key.size:
        raise RecapError(
            f"{what}: {o_key.size - f_key.size} rows match no frame of the dataset; "
            "use the table of this dataset"
        )
    return order[pos]
