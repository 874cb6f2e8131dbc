"""Step 1: per-frame returns of several LeRobot datasets into ``meta/returns_{tag}.parquet``.

Each dataset's files are written into temporary files beside their destinations in the
background (while the next dataset is read) and none is moved into place before every dataset
was computed and every file written: a bad dataset anywhere in the list leaves every directory
as it was (the temporary files removed). The datasets' own files are only read.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm

from recap import __version__, logs
from recap.configurable import REQUIRED, check_given, configurable
from recap.core import columns as C
from recap.core.returns import (
    DEFAULT_FAILURE_REWARD,
    DEFAULT_GAMMA,
    add_returns,
    return_stats,
)
from recap.data.lerobot import LocalDataset
from recap.data.sidecars import (
    SOURCE,
    StagedWrites,
    check_tag,
    data_digest,
    dataset_source,
    stage_returns_stats,
    stage_returns_table,
)
from recap.data.specs import DatasetSpec, parse_dataset_specs
from recap.errors import DatasetError, RecapError, located

log = logs.get(__name__)
# Code version in the fingerprints of this step's stages: bump it when its results change (those
# stages and the ones after them rerun); tests check it against recap/workflow/code_versions.json.
STEP_VERSION = "1"


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
    spec: DatasetSpec,
    gamma: float,
    failure_reward: float,
    outcome_column: str,
    staged: StagedWrites | None = None,
    tag: str = "",
) -> ReturnsResult:
    """Read one dataset's columns and compute its returns sidecar. With ``staged``, its files
    (tag ``tag``) are staged there as soon as each is known: the sidecar is written while the
    layout is checked and the statistics computed (nothing is in place before the commit)."""
    gamma = spec.gamma if spec.gamma is not None else gamma
    failure_reward = spec.failure_reward if spec.failure_reward is not None else failure_reward
    outcome = spec.outcome_column or outcome_column
    with LocalDataset(spec.root) as ds, ThreadPoolExecutor(1, "recap-digest") as pool:
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
        # the provenance digest hashes every data file's footer: done while the columns are read
        # (file reads and hashing leave the GIL; in v2.1 that is one footer per episode)
        pending = pool.submit(data_digest, ds)
        # the outcome is read by value (bool, or exactly 0/1), never by truthiness
        table = ds.read_columns(wanted + rollout, check_frames=False, flags=rollout)
        episodes = ds.check_frames(table)
        prompts = ds.task_text_array(table.column(C.TASK_INDEX).to_numpy())
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
        if staged is not None:
            stage_returns_table(staged, spec.root, tag, sidecar)
        ds.check_layout(episodes)  # data, meta/episodes and info.json agree on the frames
        # what readers compare against (stale sidecars), from the open dataset: its rows were
        # all just read, so their count needs no second pass over the footers
        source = dataset_source(spec.root, ds, table.num_rows, pending.result())
    stats = _stats(spec, sidecar, gamma, failure_reward, outcome)
    stats[SOURCE] = source
    if staged is not None:
        stage_returns_stats(staged, spec.root, tag, stats)
    return ReturnsResult(spec, sidecar, stats)


def _stats(spec: DatasetSpec, table: pa.Table, gamma: float, failure: float, outcome: str):
    returns = table.column(C.RETURN).to_numpy()
    episode = table.column(C.EPISODE_INDEX).to_numpy()
    last = np.flatnonzero(episode[1:] != episode[:-1])  # each episode's last row, in row order
    last = np.append(last, episode.size - 1)
    lengths = table.column(C.FRAME_INDEX).to_numpy()[last] + 1
    successes = int(np.sum(table.column(C.REWARD).to_numpy()[last] == 0.0))
    prompt = table.column(C.PROMPT).combine_chunks()
    if not pa.types.is_dictionary(prompt.type):
        prompt = pc.dictionary_encode(prompt)
    codes = prompt.indices.to_numpy()[last]  # the dictionary's entries, not yet its used ones
    used, codes = np.unique(codes, return_inverse=True)
    longest = np.zeros(used.size, dtype=np.int64)
    np.maximum.at(longest, codes, lengths)
    longest_by_task: dict[str, int] = {}
    for text, n in zip(prompt.dictionary.take(pa.array(used)).to_pylist(), longest.tolist()):
        longest_by_task[text] = max(n, longest_by_task.get(text, n))  # tasks, not episodes
    return {
        **return_stats(returns),
        "dataset_name": spec.name,
        "dataset_type": spec.type,
        "gamma": float(gamma),
        "failure_reward": float(failure),
        "outcome_column": outcome if spec.type == C.ROLLOUT else None,
        "num_frames": int(returns.size),
        "num_episodes": int(last.size),
        "num_successes": successes,
        "task_max_episode_length": longest_by_task,
        "recap_version": __version__,
    }


@configurable("compute_returns")
@dataclass(frozen=True)
class ReturnsConfig:
    """Step 1's settings (gin ``compute_returns.*``).

    Args:
        datasets: the LeRobot datasets (``recap.data.specs``: name, root, type, weight, ...).
        tag: the sidecars' tag (``meta/returns_{tag}.parquet``; ``""``: ``returns.parquet``).
        data_root: the directory relative dataset roots are under.
        gamma, failure_reward: the discount and the reward of a failed episode's last frame
            (docs/spec.md; a dataset entry's ``failure_reward`` overrides it).
        outcome_column: the column a rollout dataset's success is read from.
    """

    datasets: list[dict] = REQUIRED
    tag: str = ""
    data_root: str | os.PathLike = ""
    gamma: float = DEFAULT_GAMMA
    failure_reward: float = DEFAULT_FAILURE_REWARD
    outcome_column: str = C.IS_SUCCESS

    def __post_init__(self):
        check_given(self)


def compute_returns(config: ReturnsConfig) -> list[ReturnsResult]:
    """Step 1: compute per-frame returns and write ``meta/returns_{tag}.parquet`` per dataset."""
    tag = config.tag
    check_tag(tag)
    specs = parse_dataset_specs(config.datasets, config.data_root)
    with StagedWrites() as staged:  # each sidecar written while the next dataset is read
        results = [
            returns_for_dataset(
                spec, config.gamma, config.failure_reward, config.outcome_column, staged, tag
            )
            for spec in tqdm(specs, desc="returns", unit="dataset", disable=None)
        ]
        staged.commit()  # every dataset computed and every file written: all moved into place
    for result in results:
        log.info(result.summary())
    low = min(r.stats["return_min"] for r in results)
    high = max(r.stats["return_max"] for r in results)
    log.info(f"tag {tag!r}: global return range [{low:g}, {high:g}] over {len(results)} datasets")
    return results
