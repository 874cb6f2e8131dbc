"""Step 1: per-frame returns of several LeRobot datasets into ``meta/returns_{tag}.parquet``.

All datasets are read and computed before anything is written, so a bad dataset anywhere in the
list leaves every directory untouched. The datasets' own files are only read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import gin
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm

from recap import __version__, logs
from recap.core import columns as C
from recap.core.returns import (
    DEFAULT_FAILURE_REWARD,
    DEFAULT_GAMMA,
    add_returns,
    return_stats,
)
from recap.data.lerobot import LocalDataset
from recap.data.sidecars import SOURCE, check_tag, dataset_source, write_returns
from recap.data.specs import DatasetSpec, parse_dataset_specs
from recap.errors import DatasetError, RecapError, located

log = logs.get(__name__)


@dataclass
class ReturnsResult:
    """What Step 1 computed for one dataset."""

    spec: DatasetSpec
    table: pa.Table
    stats: dict

    def summary(self) -> str:
        s = self.stats
        return (
            f"{self.spec.name}: {s['num_episodes']} episodes, {s['num_successes']} successes, "
            f"{s['num_frames']} frames, return min {s['return_min']:g} max {s['return_max']:g}"
        )


def returns_for_dataset(
    spec: DatasetSpec, gamma: float, failure_reward: float, outcome_column: str
) -> ReturnsResult:
    """Read one dataset's columns and compute its returns sidecar (writes nothing)."""
    gamma = spec.gamma if spec.gamma is not None else gamma
    failure_reward = spec.failure_reward if spec.failure_reward is not None else failure_reward
    outcome = spec.outcome_column or outcome_column
    with LocalDataset(spec.root) as ds:
        wanted = [C.EPISODE_INDEX, C.FRAME_INDEX, C.TASK_INDEX]
        has_outcome = ds.has_column(outcome)
        if spec.type == C.ROLLOUT and not has_outcome:
            raise DatasetError(
                located(
                    ds.root / "meta" / "info.json",
                    f"rollout dataset {spec.name!r} has no outcome column {outcome!r}; set its "
                    "'outcome_column' (e.g. 'next.success') or list it with type 'sft'",
                )
            )
        rollout = [outcome] if spec.type == C.ROLLOUT else []
        # the outcome is read by value (bool, or exactly 0/1), never by truthiness
        table = ds.read_columns(wanted + rollout, check_frames=False, flags=rollout)
        episodes = ds.check_frames(table)
        ds.check_layout(episodes)  # data, meta/episodes and info.json agree on the frames
        prompts = ds.task_text_array(table.column(C.TASK_INDEX).to_numpy())
        # what readers compare against (stale sidecars), from the open dataset: its rows were
        # all just read, so their count needs no second pass over the footers
        source = dataset_source(spec.root, ds, num_frames=table.num_rows)
    try:
        sidecar = add_returns(
            table,
            gamma=gamma,
            failure_reward=failure_reward,
            success=None if spec.type == C.ROLLOUT else np.ones(episodes.lengths.size, bool),
            outcome_column=outcome,
            prompts=prompts,
            episodes=episodes,
        )
    except RecapError as exc:
        raise DatasetError(located(spec.root / "data", str(exc))) from exc
    stats = _stats(spec, sidecar, gamma, failure_reward, outcome)
    stats[SOURCE] = source
    return ReturnsResult(spec, sidecar, stats)


def _stats(spec: DatasetSpec, table: pa.Table, gamma: float, failure: float, outcome: str):
    returns = table.column(C.RETURN).to_numpy()
    episode = table.column(C.EPISODE_INDEX).to_numpy()
    last = np.append(episode[1:] != episode[:-1], True)
    lengths = table.column(C.FRAME_INDEX).to_numpy()[last] + 1
    successes = int(np.sum(table.column(C.REWARD).to_numpy()[last] == 0.0))
    prompts = pc.dictionary_encode(table.column(C.PROMPT).filter(pa.array(last))).combine_chunks()
    longest = np.zeros(len(prompts.dictionary), dtype=np.int64)
    np.maximum.at(longest, prompts.indices.to_numpy(), lengths)
    longest_by_task = dict(zip(prompts.dictionary.to_pylist(), longest.tolist()))
    return {
        **return_stats(returns),
        "dataset_name": spec.name,
        "dataset_type": spec.type,
        "gamma": float(gamma),
        "failure_reward": float(failure),
        "outcome_column": outcome if spec.type == C.ROLLOUT else None,
        "num_frames": int(returns.size),
        "num_episodes": int(last.sum()),
        "num_successes": successes,
        "task_max_episode_length": longest_by_task,
        "recap_version": __version__,
    }


@gin.configurable
def compute_returns(
    datasets: list[dict] = gin.REQUIRED,
    tag: str = "",
    data_root: str | os.PathLike = "",
    gamma: float = DEFAULT_GAMMA,
    failure_reward: float = DEFAULT_FAILURE_REWARD,
    outcome_column: str = C.IS_SUCCESS,
) -> list[ReturnsResult]:
    """Step 1: compute per-frame returns and write ``meta/returns_{tag}.parquet`` per dataset."""
    check_tag(tag)
    specs = parse_dataset_specs(datasets, data_root)
    results = [
        returns_for_dataset(spec, gamma, failure_reward, outcome_column)
        for spec in tqdm(specs, desc="returns", unit="dataset", disable=None)
    ]
    for result in results:
        write_returns(result.spec.root, tag, result.table, result.stats)
        log.info(result.summary())
    low = min(r.stats["return_min"] for r in results)
    high = max(r.stats["return_max"] for r in results)
    log.info(f"tag {tag!r}: global return range [{low:g}, {high:g}] over {len(results)} datasets")
    return results
