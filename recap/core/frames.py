"""Frame tables: rows keyed by (dataset, episode, frame) in Arrow, checked and sorted.

The generic plumbing Step 3 and the data readers share, apart from any advantage math: the
(dataset, episode, frame) sort of a table (``frame_layout``), task and dataset keys, numeric
columns read checked (``finite_column``), joins of a sidecar onto a dataset's frames
(``align_to_frames``), and column-sized numpy arrays in Arrow's memory pool (``arrow_empty``,
``column_numpy``). Whole-column numpy: no loop over rows or episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recap.core import columns as C
from recap.core.episodes import Episodes, find_episodes, find_presorted
from recap.errors import RecapError


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
    C.REWARD: "recompute the returns sidecar (Step 1)",
    C.RETURN: "recompute the returns sidecar (Step 1)",
    C.ADVANTAGE_CONTINUOUS: "recompute the advantages (Step 3)",
}


def finite_column(
    table: pa.Table,
    name: str,
    layout: FrameLayout,
    *,
    keep_float32: bool = False,
    fix: str | None = None,
) -> np.ndarray:
    """float64[n] column ``name`` in layout order (float32 stays float32 with ``keep_float32``);
    missing, null or non-finite values raise, their message ending in ``fix`` (the remedy; a
    default for the sidecar columns)."""
    fix = fix or _FIXES.get(name, f"give every frame a finite {name}")
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
