"""Ranks and collectives: process-group setup, barrier, sums, gathers, and rank-sharded batches.

Works the same under the DeepSpeed launcher (which sets RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT) and as a plain ``python`` process (``ensure_env`` fills in a world of 1,
so DeepSpeed does not go looking for MPI).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from recap.engine import accelerator
from recap.engine.loader import batch_loader
from recap.errors import RecapError
from recap.ports import free_port


def ensure_env() -> None:
    """Default the torch.distributed env variables for a process started without a launcher."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    else:
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def env_world_size() -> int:
    """World size known before the process group exists (launcher env, else 1)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_world_size() -> int:
    """Ranks on this node, known before the process group exists (launcher env, else 1)."""
    return int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or "1")


def init() -> None:
    """Create the process group through DeepSpeed on the accelerator's backend (idempotent)."""
    ensure_env()
    accelerator.select_accelerator()
    # DeepSpeed calls torch.distributed's renamed collectives every step; keep the log readable.
    warnings.filterwarnings(
        "ignore",
        message=r".*is deprecated\. Please use `torch\.distributed",
        category=FutureWarning,
    )
    accelerator.disable_cpu_shm_comm()
    accelerator.share_cpu_cores(local_world_size())
    import deepspeed

    deepspeed.init_distributed(dist_backend=accelerator.comm_backend(), verbose=False)
    accelerator.set_device(int(os.environ["LOCAL_RANK"]))


@contextlib.contextmanager
def launched() -> Iterator[bool]:
    """Whether this process runs under a launcher (``WORLD_SIZE`` > 1: each rank then takes its
    share of the work), with the process group set up for the block and torn down after it
    (:func:`init`, :func:`shutdown`). An error leaves the group to the process's exit: a barrier
    after one rank failed would wait for ranks that never come."""
    sharded = env_world_size() > 1
    if sharded:
        init()
    yield sharded
    if sharded:
        shutdown()


def is_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if is_initialized() else int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return torch.distributed.get_world_size() if is_initialized() else env_world_size()


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_initialized() and world_size() > 1:
        torch.distributed.barrier()


def shutdown() -> None:
    """Wait for every rank, then tear the process group down (idempotent).

    Exiting with a live gloo group leaves its threads to the interpreter's exit, where a rank
    can die with "terminate called without an active exception" (exit 250) after finishing.
    """
    if is_initialized():
        barrier()
        torch.distributed.destroy_process_group()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks (on the accelerator, as the backend requires); returns a CPU copy.

    float64 travels as float32 on the NPU (HCCL reductions are not guaranteed for float64)."""
    if not (is_initialized() and world_size() > 1):
        return values.detach().cpu().clone()
    wire = torch.float32 if values.dtype == torch.float64 and accelerator.name() == "npu" else None
    buffer = values.detach().to(accelerator.device(), dtype=wire or values.dtype).clone()
    torch.distributed.all_reduce(buffer, op=torch.distributed.ReduceOp.SUM)
    return buffer.cpu().to(values.dtype)


def all_gather_stacked(values: torch.Tensor) -> torch.Tensor:
    """``[world, *values.shape]``: every rank's tensor (same shape on all ranks), in rank order."""
    if not (is_initialized() and world_size() > 1):
        return values.detach().cpu().unsqueeze(0)
    is_bool = values.dtype == torch.bool
    local = values.detach().to(accelerator.device())
    local = local.to(torch.uint8) if is_bool else local.contiguous()
    parts = [torch.empty_like(local) for _ in range(world_size())]
    torch.distributed.all_gather(parts, local)
    stacked = torch.stack([p.cpu() for p in parts])
    return stacked.bool() if is_bool else stacked


def step_batch_indices(step: int, num_examples: int, global_batch: int, seed: int) -> np.ndarray:
    """int64[global_batch]: the examples of optimizer step ``step`` (0-based).

    Each epoch is a fresh permutation seeded by ``(seed, epoch)``; the incomplete last global batch
    of an epoch is dropped. The order depends on the seed only, never on the world size.
    """
    steps_per_epoch = num_examples // global_batch
    if steps_per_epoch == 0:
        raise RecapError(
            f"training data: {num_examples} examples are fewer than one global batch "
            f"({global_batch}); lower deepspeed_config.global_batch_size or add data"
        )
    epoch, position = divmod(step, steps_per_epoch)
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + epoch)
    order = torch.randperm(num_examples, generator=generator).numpy()
    return order[position * global_batch : (position + 1) * global_batch]


@dataclass
class StepBatchSampler:
    """Micro-batches of this rank for steps ``start..stop-1``: a ``batch_sampler`` for DataLoader.

    Global batch ``b`` is cut into ``global/micro`` micro-batches; micro-batch ``j`` goes to rank
    ``j % world`` as its accumulation step ``j // world``. So 1 rank x 2 accumulation steps and
    2 ranks x 1 step see exactly the same micro-batches. With ``use_indices`` an example is
    handed out as ``epoch * num_examples + index``, for datasets that draw something afresh
    per epoch (``redraws_per_epoch``: the policy's label dropout).
    """

    num_examples: int
    global_batch: int
    micro_batch: int
    seed: int
    start: int
    stop: int
    rank: int = 0
    world: int = 1
    use_indices: bool = False

    @property
    def accumulation(self) -> int:
        return self.global_batch // (self.micro_batch * self.world)

    def __len__(self) -> int:
        return max(0, self.stop - self.start) * self.accumulation

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start, self.stop):
            indices = step_batch_indices(step, self.num_examples, self.global_batch, self.seed)
            if self.use_indices:
                epoch = step // (self.num_examples // self.global_batch)
                indices = indices + epoch * self.num_examples
            for m in range(self.accumulation):
                j = m * self.world + self.rank
                yield indices[j * self.micro_batch : (j + 1) * self.micro_batch].tolist()


def train_batches(
    dataset, config: dict, seed: int, start: int, stop: int, num_workers: int = 0
) -> Iterator[dict]:
    """Iterator over this rank's collated micro-batches for steps ``start..stop-1`` (the one
    loader, ``recap.engine.loader.batch_loader``, with persistent workers)."""
    sampler = StepBatchSampler(
        len(dataset),
        config["train_batch_size"],
        config["train_micro_batch_size_per_gpu"],
        seed,
        start,
        stop,
        rank(),
        world_size(),
        use_indices=bool(getattr(dataset, "redraws_per_epoch", False)),
    )
    return iter(
        batch_loader(
            dataset,
            sampler,
            num_workers,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(seed + start),
        )
    )
