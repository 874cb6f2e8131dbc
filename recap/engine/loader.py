"""The one DataLoader construction: training, inference and the frame-loader benchmark use it.

``batch_loader(dataset, batches, num_workers, ...)`` takes the batch order (an iterable of index
lists) and returns a DataLoader whose workers fetch a whole batch per call: the dataset's
``__getitems__`` when it has one, else its items, then its ``collate`` (default
``torch.utils.data.default_collate``). Callers build only the order:

- training (``distributed.train_batches``): ``StepBatchSampler``, the micro-batches of
  ``step_batch_indices`` (persistent workers, a generator seeded from the seed and start step);
- in-order passes (``inference.predict``, ``make_loader(shuffle=False)``): the DataLoader hands
  batch ``i`` to worker ``i % W``, so ``worker_interleave`` orders the batches for worker ``w``
  to walk its own contiguous block front to back (every frame decoded once, no seeks); a worker
  whose block is used up takes empty turns, which come back as ``None``.

Workers start with forkserver by default, not fork: a worker forked from a process whose FFmpeg,
OpenMP or gloo threads hold a lock deadlocks on that lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler

T = TypeVar("T")


def fetch_batch(dataset: Any, indices: list[int]) -> Any:
    """One collated batch: ``dataset.__getitems__`` (a whole batch at once) when it has one."""
    fetch = getattr(dataset, "__getitems__", None)
    items = fetch(indices) if fetch is not None else [dataset[i] for i in indices]
    collate: Callable = getattr(dataset, "collate", None) or torch.utils.data.default_collate
    return collate(items)


class _WholeBatches(Dataset):
    """DataLoader view of ``dataset`` whose ``__getitems__`` returns a collated batch (``None``
    for the empty turns that keep the workers' blocks aligned)."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: list[int]) -> Any:
        return fetch_batch(self.dataset, list(indices)) if len(indices) else None


def _as_is(batch: Any) -> Any:
    return batch


def batch_loader(
    dataset: Any,
    batches: Iterable[list[int]],
    num_workers: int = 0,
    *,
    persistent_workers: bool = False,
    start_method: str = "forkserver",
    prefetch_factor: int | None = None,
    generator: torch.Generator | None = None,
) -> DataLoader:
    """A DataLoader over ``batches`` (index lists, in order) fetching a whole batch per call.

    ``num_workers`` 0 fetches in the main process. ``persistent_workers`` keeps the workers (and
    their open decoders) across epochs; ``start_method`` is their multiprocessing context;
    ``prefetch_factor`` batches are queued per worker (torch's default 2 when None).
    ``generator`` draws the workers' base seed (None: from the global torch RNG; a DataLoader
    draws it at each epoch's start even without workers).
    """
    workers = num_workers > 0
    return DataLoader(
        _WholeBatches(dataset),
        batch_sampler=batches,
        collate_fn=_as_is,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=persistent_workers and workers,
        multiprocessing_context=start_method if workers else None,
        generator=generator,
    )


def contiguous_blocks(count: int, parts: int) -> list[range]:
    """``0 .. count-1`` cut into ``parts`` contiguous blocks, the longer ones last."""
    return [range(count * p // parts, count * (p + 1) // parts) for p in range(parts)]


def worker_interleave(blocks: Sequence[Sequence[T]], empty: T) -> list[T]:
    """The entries of ``blocks`` in the order a DataLoader with ``len(blocks)`` workers must
    receive them so that worker ``w`` (which gets every ``len(blocks)``-th batch) walks
    ``blocks[w]`` front to back; a worker whose block is used up takes ``empty`` turns."""
    longest = max((len(b) for b in blocks), default=0)
    return [b[j] if j < len(b) else empty for j in range(longest) for b in blocks]


def worker_order(num_batches: int, num_workers: int) -> list[int | None]:
    """Batch ids ``0 .. num_batches-1`` in worker order (``worker_interleave``): worker ``w`` gets
    a contiguous run of batches; ``None`` is an empty turn."""
    return worker_interleave(contiguous_blocks(num_batches, max(1, num_workers)), None)


class ShardedSequentialBatches(Sampler[list[int]]):
    """Batches for one in-order pass with ``num_workers`` DataLoader workers.

    Each worker's contiguous block of items is cut into batches, and ``worker_interleave`` hands
    them out so each worker decodes its own block front to back and no frame is decoded twice.
    Batches carry ``row`` so results can be put back in order.
    """

    def __init__(self, num_items: int, batch_size: int, num_workers: int):
        self.num_items, self.batch_size = num_items, batch_size
        self.workers = max(1, num_workers)

    def _order(self) -> list[list[int]]:
        blocks = [
            [list(range(s, min(s + self.batch_size, b.stop))) for s in b[:: self.batch_size]]
            for b in contiguous_blocks(self.num_items, self.workers)
        ]
        return worker_interleave(blocks, [])

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._order())

    def __len__(self) -> int:
        return len(self._order())


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 2,
    prefetch_factor: int = 4,
    drop_last: bool = False,
    sampler: Sampler | None = None,
    start_method: str = "forkserver",
) -> DataLoader:
    """``batch_loader`` with persistent workers over shuffled or in-order batches of a dataset
    (e.g. ``recap.data.loader.FrameDataset``).

    ``shuffle`` draws a seeded permutation each epoch; ``shuffle=False`` is one in-order pass
    sharded so each worker decodes a contiguous block (``ShardedSequentialBatches``; an empty turn
    of a worker whose block is used up comes back as ``None``).
    """
    if sampler is not None:
        batches: Sampler[list[int]] = BatchSampler(sampler, batch_size, drop_last)
    elif shuffle:
        generator = torch.Generator().manual_seed(seed)
        batches = BatchSampler(RandomSampler(dataset, generator=generator), batch_size, drop_last)
    else:
        batches = ShardedSequentialBatches(len(dataset), batch_size, num_workers)
    return batch_loader(
        dataset,
        batches,
        num_workers,
        persistent_workers=True,
        start_method=start_method,
        prefetch_factor=prefetch_factor,
    )
