"""Column names (exactly as in the parquet files) and sidecar schemas."""

from __future__ import annotations

import pyarrow as pa

# LeRobot frame columns present in every dataset.
EPISODE_INDEX = "episode_index"
FRAME_INDEX = "frame_index"
INDEX = "index"
TIMESTAMP = "timestamp"
TASK_INDEX = "task_index"

# Episode outcome (broadcast per frame, read at an episode's last frame).
IS_SUCCESS = "is_success"
NEXT_SUCCESS = "next.success"  # the name some LeRobot datasets use

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

# Dataset types (SPEC: sft = all successes, rollout = mixed outcomes).
SFT = "sft"
ROLLOUT = "rollout"
DATASET_TYPES = (SFT, ROLLOUT)


def sidecar_name(kind: str, tag: str) -> str:
    """``meta/`` file name of a sidecar: ``{kind}.parquet`` or ``{kind}_{tag}.parquet``."""
    return f"{kind}.parquet" if not tag else f"{kind}_{tag}.parquet"
