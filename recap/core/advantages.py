"""Step 3: n-step advantages of every frame, and the advantages sidecar (docs/spec.md §5).

For frame t of an episode ending at T (exclusive), lookahead N >= 1 and discount gamma in (0, 1]::

    S_t = sum_{k < min(N, T-t)} gamma^k r_{t+k}
    t + N <  T:  A_t = norm_sum(S_t) + gamma^N V(o_{t+N}) - V(o_t)
    t + N >= T:  A_t = norm_ret(S_t)                      - V(o_t)

with the shared maps of ``normalize.py``: ``norm_sum(s) = s / scale`` (a difference of returns)
and ``norm_ret(G) = (G - offset) / scale`` (a return; offset = return_max, scale = return_max -
return_min, or offset 0 and scale = the task's longest episode). Past the end the window sum *is*
the return G_t, so it takes the return map, the one the value model was trained on: a perfect
value model (gamma 1) then gives A = 0 on every frame, whatever return_max is. When return_max = 0
(the example of docs/spec.md §5) ``norm_ret = norm_sum`` and this is that formula with bootstrap 0.
``value_next`` is 0 where the window runs past the end (nothing is bootstrapped there), so ``A =
reward_sum + gamma^N value_next - value_current`` holds on every row of the sidecar.

Whole-column numpy, no loop over frames or episodes. ``tests/core/test_advantages.py`` checks
every formula here against a per-frame double loop written straight from docs/spec.md §5; the
fast paths (prefix sums, buffers from Arrow's pool) are the ones ``bench/advantages.py`` measures.

Labels and thresholds: ``thresholds.py``; the frame-table plumbing (sorting, keys, checked
columns, joins): ``frames.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa

from recap.core import columns as C
from recap.core.episodes import Episodes
from recap.core.frames import (
    FrameLayout,
    TaskKeys,
    arrow_empty,
    finite_column,
    frame_layout,
    task_keys,
)
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
from recap.core.thresholds import (
    IS_CORRECTION,  # noqa: F401  (re-exported: recap.envs imports it from here)
    SCOPE_PER_TASK,
    LabelOptions,
    label_frames,
)
from recap.errors import RecapError

VALUE = "value"  # input column: V(o_t) from the value model, on the normalized scale [-1, 0]
DEFAULT_LOOKAHEAD = 10
METADATA_KEY = b"recap.advantages"  # Arrow/parquet schema metadata: JSON labeling record
COMPUTATION_KEYS = ("normalization", "return_min", "return_max", "lookahead", "gamma")
VALUE_FIX = "run value inference over every frame (a NaN value often means a diverged model)"


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
    """The n-step advantage of every frame (docs/spec.md §5)::

        S_t = sum_{k < min(N, T-t)} gamma^k r_{t+k}
        t + N <  T:  A_t = S_t / scale            + gamma^N V(o_{t+N}) - V(o_t)
        t + N >= T:  A_t = (S_t - offset) / scale                      - V(o_t)

    Args:
        values: float64[n] ``V(o_t)``, sorted (episode, frame) order.
        episodes: layout from ``find_episodes`` (gives each frame's t and T).
        rewards: float[n] ``r_t`` (preferred), or
        returns: float64[n] ``G_t`` computed with the same ``gamma``; sorted order.
        lookahead: N; gamma: the discount.
        scale, offset: float or float64[n], the shared normalization (``normalize.py``).
    Returns:
        ``NStep`` with ``value_next`` 0 where ``t + N >= T``.
    """
    check_lookahead(lookahead, gamma)
    N, V = int(lookahead), values
    # frames whose window runs past the episode's end (t + N >= T), and T - t there
    past_end, T_minus_t = _past_end(episodes, N)
    S = _window_sums(episodes, N, gamma, past_end, T_minus_t, rewards, returns)  # S_t
    # norm(S_t): S_t / scale, and past the end, where S_t = G_t is a return, (S_t - offset) / scale
    norm_S = normalize_reward_sums(S, scale, out=arrow_empty(S.shape[0], np.float64))
    norm_S[past_end] = normalize_returns(S[past_end], _at(offset, past_end), _at(scale, past_end))
    V_next = _ahead(V, N, past_end)  # V(o_{t+N}), 0 past the end
    A = _plus_discounted(norm_S, gamma**N, V_next)  # A_t = norm(S_t) + gamma^N V(o_{t+N})
    A -= V  # - V(o_t)
    num_valid = arrow_empty(V.shape[0], np.int64)  # min(N, T - t)
    num_valid.fill(N)
    num_valid[past_end] = T_minus_t
    return NStep(A, norm_S, S, V_next, num_valid)


def _window_sums(
    episodes: Episodes,
    N: int,
    gamma: float,
    past_end: np.ndarray,
    T_minus_t: np.ndarray,
    rewards: np.ndarray | None,
    returns: np.ndarray | None,
) -> np.ndarray:
    """float64[n] ``S_t = sum_{k < min(N, T-t)} gamma^k r_{t+k}``, one of two equal ways:

    - gamma 1 with rewards (the case ``bench/advantages.py`` times): prefix sums
      ``P_t = sum_{j<t} r_j`` over the whole column, ``S_t = P_{t+N} - P_t``, and
      ``S_t = P_T - P_t`` past the end (exact for integer-valued rewards, otherwise as precise as
      the global cumulative sum ``discounted_returns`` uses for gamma 1);
    - otherwise from the returns: ``S_t = G_t - gamma^N G_{t+N}``, ``G_{t+N} := 0`` past the end.
    """
    if rewards is not None and gamma == 1.0:
        n = episodes.num_frames
        P = arrow_empty(n + 1, np.float64)
        P[0] = 0.0
        np.cumsum(rewards, dtype=np.float64, out=P[1:])  # float32 rewards add in float64
        S = arrow_empty(n, np.float64)
        m = max(n + 1 - N, 0)
        np.subtract(P[N:], P[:m], out=S[:m])  # P_{t+N} - P_t
        S[past_end] = P[past_end + T_minus_t] - P[past_end]  # P_T - P_t
        return S
    G = returns
    if G is None:
        if rewards is None:
            raise RecapError("n_step_advantages: give rewards or returns")
        G = discounted_returns(rewards, episodes, gamma)
    return G - gamma**N * _ahead(G, N, past_end)


def _past_end(episodes: Episodes, N: int) -> tuple[np.ndarray, np.ndarray]:
    """int64[m] sorted rows whose window runs past the end (``t + N >= T``), and their ``T - t``.

    The last ``min(T, N)`` rows of each episode: at most ``min(n, E N)`` rows, built by repeats.
    """
    count = np.minimum(episodes.lengths, N)
    ends = np.repeat(episodes.ends, count)
    first = np.cumsum(count) - count
    remaining = np.repeat(count, count) - (np.arange(ends.shape[0]) - np.repeat(first, count))
    return ends - remaining, remaining


def _ahead(x: np.ndarray, N: int, past_end: np.ndarray) -> np.ndarray:
    """float64[n] ``x_{t+N}``, 0 on the ``past_end`` rows (where ``t + N`` is past the episode)."""
    out = arrow_empty(x.shape[0], np.float64)
    m = max(x.shape[0] - N, 0)
    out[:m] = x[N:]
    out[m:] = 0.0
    out[past_end] = 0.0
    return out


def _plus_discounted(x: np.ndarray, discount: float, y: np.ndarray) -> np.ndarray:
    """float64[n] ``x + discount * y`` in one new array from Arrow's pool (no temporaries)."""
    out = arrow_empty(x.shape[0], np.float64)
    if discount == 1.0:
        return np.add(x, y, out=out)
    np.multiply(y, discount, out=out)
    out += x
    return out


def _at(x: np.ndarray | float, rows: np.ndarray) -> np.ndarray | float:
    return x[rows] if np.ndim(x) else x


def _arrow(values: np.ndarray | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """An output column: numpy wrapped without a copy, Arrow as it is."""
    return values if isinstance(values, pa.ChunkedArray) else pa.array(values)


# ---- the sidecar -------------------------------------------------------------------------


def add_advantages(
    table: pa.Table,
    *,
    return_range: ReturnRange | None = None,
    normalization: str = GLOBAL,
    lookahead: int | Mapping[str, int] = DEFAULT_LOOKAHEAD,
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
        lookahead: N frames, or per dataset name (datasets recorded at different rates: the
            same duration is a different N); the record then holds the mapping.
    Returns:
        Rows sorted by (dataset_name, episode_index, frame_index); the schema metadata holds the
        labeling record (``labeling_of``).
    """
    per_dataset = isinstance(lookahead, Mapping)
    for n in lookahead.values() if per_dataset else (lookahead,):
        check_lookahead(n, gamma)
    layout = frame_layout(table, dataset_name)
    values = finite_column(table, value_column, layout, fix=VALUE_FIX)
    rewards, returns = _reward_columns(table, layout, gamma)
    needs_tasks = labels.scope == SCOPE_PER_TASK or normalization == TASK_LENGTH
    tasks = task_keys(table, layout) if needs_tasks else None
    offset, scale = _normalization(normalization, return_range, tasks, layout.episodes)
    steps = _dataset_lookahead(lookahead, layout) if per_dataset else None
    nstep = None
    for n in sorted(set(steps.tolist())) if per_dataset else (lookahead,):
        part = n_step_advantages(
            values,
            layout.episodes,
            rewards=rewards,
            returns=returns if rewards is None else None,
            lookahead=int(n),
            gamma=gamma,
            scale=scale,
            offset=offset,
        )
        if nstep is None:
            nstep = part
        else:  # rows of the datasets with this N (windows never cross episodes or datasets)
            rows = steps == n
            for f in fields(NStep):
                getattr(nstep, f.name)[rows] = getattr(part, f.name)[rows]
    label, record = label_frames(nstep.advantage, table, layout, tasks, labels)
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
    label, record = label_frames(advantage, table, layout, tasks, labels)
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


def _dataset_lookahead(lookahead: Mapping[str, int], layout: FrameLayout) -> np.ndarray:
    """int64[n] N of each row (layout order) from a per-dataset mapping; a dataset it does not
    name is a one-line error."""
    missing = [n for n in layout.dataset_names if n not in lookahead]
    if missing:
        raise RecapError(f"lookahead: no value for datasets {missing}; give one per dataset")
    per_code = np.array([int(lookahead[n]) for n in layout.dataset_names], dtype=np.int64)
    return per_code[layout.dataset_codes]


def _computation_record(
    mode: str, rng: ReturnRange | None, lookahead: int | Mapping[str, int], gamma: float
) -> dict:
    return {
        "normalization": mode,
        "return_min": None if rng is None else float(rng.return_min),
        "return_max": None if rng is None else float(rng.return_max),
        "lookahead": {k: int(v) for k, v in lookahead.items()}
        if isinstance(lookahead, Mapping)
        else int(lookahead),
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
