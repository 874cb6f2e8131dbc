"""Column names (exactly as in the parquet files) and sidecar schemas."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from recap.errors import RecapError

# LeRobot frame columns present in every dataset.
EPISODE_INDEX = "episode_index"
FRAME_INDEX = "frame_index"
INDEX = "index"
TIMESTAMP = "timestamp"
TASK_INDEX = "task_index"

# Episode outcome (broadcast per frame, read at an episode's last frame).
IS_SUCCESS = "is_success"
NEXT_SUCCESS = "next.success"  # the name some LeRobot datasets use

# Keys a closed loop (recap.envs.rollout) adds to each batch of observations it gives a policy:
# per row, the episode's seed and the step it is at. recap.loading's adapters draw each row's
# sampling noise from them, so an episode's actions do not depend on what shares its batch, on
# the batch size or on the rank that runs it.
EPISODE_SEED = "episode_seed"
EPISODE_STEP = "episode_step"

# Step 1 sidecar: meta/returns_{tag}.parquet
RETURN = "return"
REWARD = "reward"
PROMPT = "prompt"

RETURNS_SCHEMA = pa.schema(
    [
        pa.field(EPISODE_INDEX, pa.int64()),
        pa.field(FRAME_INDEX, pa.int64()),
        pa.field(RETURN, pa.float32()),
        pa.field(REWARD, pa.float32()),
        pa.field(PROMPT, pa.string()),
    ]
)

# Step 3 sidecar: meta/advantages_{tag}.parquet
ADVANTAGE_CONTINUOUS = "advantage_continuous"
VALUE_CURRENT = "value_current"
VALUE_NEXT = "value_next"
REWARD_SUM = "reward_sum"
REWARD_SUM_RAW = "reward_sum_raw"
NUM_VALID_REWARDS = "num_valid_rewards"
DATASET_NAME = "dataset_name"
ADVANTAGE = "advantage"

ADVANTAGES_SCHEMA = pa.schema(
    [
        pa.field(EPISODE_INDEX, pa.int64()),
        pa.field(FRAME_INDEX, pa.int64()),
        pa.field(ADVANTAGE_CONTINUOUS, pa.float64()),
        pa.field(RETURN, pa.float64()),
        pa.field(VALUE_CURRENT, pa.float64()),
        pa.field(VALUE_NEXT, pa.float64()),
        pa.field(REWARD_SUM, pa.float64()),
        pa.field(REWARD_SUM_RAW, pa.float64()),
        pa.field(NUM_VALID_REWARDS, pa.int64()),
        pa.field(DATASET_NAME, pa.string()),
        pa.field(ADVANTAGE, pa.bool_()),
    ]
)

# Dataset types (docs/spec.md §1: sft = all successes, rollout = mixed outcomes).
SFT = "sft"
ROLLOUT = "rollout"
DATASET_TYPES = (SFT, ROLLOUT)


def sidecar_name(kind: str, tag: str) -> str:
    """``meta/`` file name of a sidecar: ``{kind}.parquet`` or ``{kind}_{tag}.parquet``."""
    return f"{kind}.parquet" if not tag else f"{kind}_{tag}.parquet"


# ---- column meaning: booleans and indices, checked over whole columns ----------------------
# A boolean-meaning column (an episode outcome, a correction flag, a sidecar's ``advantage``)
# is read by value, never by truthiness: bool, or integers/floats whose every value is exactly
# 0 or 1. An index column (episode_index, frame_index, index, task_index) holds integers; floats
# are accepted only when every value is finite and integral (cast exactly, e.g. 3.0 -> 3).

INDEX_COLUMNS = (EPISODE_INDEX, FRAME_INDEX, INDEX, TASK_INDEX)
FLAG_RULE = "it must hold bool, or integers/floats that are exactly 0 or 1; rewrite it as bool"
INDEX_RULE = "it must hold integers (integral floats are cast exactly); rewrite it as int64"


class ColumnValueError(RecapError):
    """A value that breaks a column's meaning; ``row`` is its position in the column given,
    ``value`` a short repr of it (``'yes'``, ``nan``, ``2``, ``null``), ``rule`` the fix."""

    def __init__(self, column: str, row: int, value: str, rule: str):
        self.column, self.row, self.value, self.rule = column, row, value, rule
        super().__init__(self.describe(f"row {row}"))

    def describe(self, where: str) -> str:
        """The one-line message with the row described as ``where`` (e.g. 'episode 2 frame 6')."""
        return f"column {self.column!r}: {where} has value {self.value}; {self.rule}"


def _plain(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def _value_repr(array: pa.Array, row: int) -> str:
    value = array[row].as_py()
    return "null" if value is None else repr(value)


def _first_null(array: pa.Array) -> int:
    return int(np.argmax(~np.asarray(array.is_valid())))


def as_flags(column: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """bool[n] of a boolean-meaning column; anything but bool or exact 0/1 numbers (NaN, null,
    2, strings) raises ``ColumnValueError`` at its first offending row."""
    array = _plain(column)
    if array.null_count:
        raise ColumnValueError(name, _first_null(array), "null", FLAG_RULE)
    kind = array.type
    if pa.types.is_boolean(kind):
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        values = array.to_numpy(zero_copy_only=False)
        bad = ~((values == 0) | (values == 1))  # NaN compares unequal to both
        if bad.any():
            row = int(np.argmax(bad))
            raise ColumnValueError(name, row, _value_repr(array, row), FLAG_RULE)
        return values == 1
    if len(array) == 0:
        return np.zeros(0, dtype=bool)
    raise ColumnValueError(name, 0, f"{_value_repr(array, 0)} (type {kind})", FLAG_RULE)


def as_index(column: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """int64[n] of an index column: integers, or floats that are all finite and integral (cast
    exactly); null, NaN, 2.5, strings raise ``ColumnValueError`` at the first offending row."""
    array = _plain(column)
    if array.null_count:
        raise ColumnValueError(name, _first_null(array), "null", INDEX_RULE)
    kind = array.type
    if pa.types.is_integer(kind):
        values = array.to_numpy(zero_copy_only=False)
        if pa.types.is_uint64(kind) and values.size and values.max() > np.iinfo(np.int64).max:
            row = int(np.argmax(values > np.iinfo(np.int64).max))
            raise ColumnValueError(name, row, _value_repr(array, row), INDEX_RULE)
        return values.astype(np.int64, copy=False)
    if pa.types.is_floating(kind):
        values = array.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values) | (np.floor(values) != values) | (np.abs(values) > 2.0**53)
        if bad.any():
            row = int(np.argmax(bad))
            raise ColumnValueError(name, row, _value_repr(array, row), INDEX_RULE)
        return values.astype(np.int64)
    if len(array) == 0:
        return np.zeros(0, dtype=np.int64)
    raise ColumnValueError(name, 0, f"{_value_repr(array, 0)} (type {kind})", INDEX_RULE)
