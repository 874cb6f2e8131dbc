"""Data order: seeded by step, independent of world size; sharding gives each item once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recap.engine.distributed import StepBatchSampler, step_batch_indices
from recap.engine.inference import merge_shards, shard_positions
from recap.errors import RecapError


def micro_batches(world: int, micro: int, steps: int = 3) -> list[list[list[int]]]:
    """Per step, every micro-batch in global order j = m * world + r."""
    samplers = [StepBatchSampler(20, 8, micro, 5, 0, steps, r, world) for r in range(world)]
    per_rank = [list(s) for s in samplers]
    accumulation = 8 // (micro * world)
    out = []
    for step in range(steps):
        chunk = [
            per_rank[r][step * accumulation + m] for m in range(accumulation) for r in range(world)
        ]
        out.append(chunk)
    return out


def test_one_rank_and_two_ranks_see_the_same_micro_batches():
    assert micro_batches(world=1, micro=4) == micro_batches(world=2, micro=4)
    assert micro_batches(world=1, micro=2) == micro_batches(world=4, micro=2)


def test_global_batches_are_seeded_permutations_dropping_the_epoch_tail():
    first = [step_batch_indices(s, 20, 8, seed=5) for s in range(2)]
    assert sorted(np.concatenate(first).tolist()) == sorted(set(np.concatenate(first).tolist()))
    assert np.array_equal(step_batch_indices(1, 20, 8, 5), first[1])
    assert not np.array_equal(step_batch_indices(2, 20, 8, 5)[:8], first[0])  # new epoch order
    assert not np.array_equal(step_batch_indices(0, 20, 8, 6), first[0])


def test_resumed_sampler_continues_where_the_run_stopped():
    full = list(StepBatchSampler(20, 8, 4, 0, 0, 4, 0, 1))
    resumed = list(StepBatchSampler(20, 8, 4, 0, 2, 4, 0, 1))
    assert resumed == full[4:]


def test_dataset_smaller_than_a_global_batch_is_an_error():
    with pytest.raises(RecapError, match="fewer than one global batch"):
        step_batch_indices(0, 4, 8, 0)


@pytest.mark.parametrize("num_items", [1, 2, 5, 10, 37])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_sharded_inference_merges_each_item_once_in_order(num_items, world):
    shards = [torch.tensor(shard_positions(num_items, r, world)) for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # same forward count on every rank
    merged = merge_shards(torch.stack(shards), num_items)
    assert merged.tolist() == list(range(num_items))


def test_use_indices_carry_the_epoch_for_datasets_that_redraw():
    plain = list(StepBatchSampler(20, 8, 4, 0, 0, 6, 0, 1))  # 2 steps per epoch: epochs 0, 1, 2
    used = list(StepBatchSampler(20, 8, 4, 0, 0, 6, 0, 1, use_indices=True))
    for k, (a, b) in enumerate(zip(plain, used)):
        epoch = k // 4  # 2 micro-batches per step, 2 steps per epoch
        assert b == [i + 20 * epoch for i in a]
    assert min(used[8]) >= 40 and max(used[7]) < 40
    resumed = list(StepBatchSampler(20, 8, 4, 0, 3, 6, 0, 1, use_indices=True))
    assert resumed == used[6:]
