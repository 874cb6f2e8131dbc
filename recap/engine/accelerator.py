"""Everything device-specific: which accelerator, seeding, memory, synchronization, bf16.

The accelerator is DeepSpeed's (``deepspeed.accelerator.get_accelerator()``), chosen once per
process before DeepSpeed is imported:

1. ``DS_ACCELERATOR`` when set (``npu``, ``cuda``, ``cpu``, ...);
2. ``npu`` when ``torch_npu`` imports (Ascend, communication backend ``hccl``);
3. ``cuda`` when a CUDA device is visible (``nccl``);
4. ``cpu`` otherwise (``gloo``).

No other module of ``recap`` touches the CUDA API, and nothing patches torch globally to redirect
CUDA calls to the NPU: device code goes through the accelerator object.
"""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

NPU, CUDA, CPU = "npu", "cuda", "cpu"
_CHOSEN: str | None = None


def select_accelerator() -> str:
    """Choose the accelerator name once (env > torch_npu > CUDA > CPU) and export DS_ACCELERATOR."""
    global _CHOSEN
    if _CHOSEN is None:
        name = os.environ.get("DS_ACCELERATOR", "").strip().lower()
        if not name:
            name = NPU if _torch_npu_imports() else CUDA if _cuda_visible() else CPU
        os.environ["DS_ACCELERATOR"] = name
        _CHOSEN = name
    return _CHOSEN


def _torch_npu_imports() -> bool:
    try:
        import torch_npu  # noqa: F401  # registers the NPU device with torch; no patching
    except Exception:
        return False
    return True


def _cuda_visible() -> bool:
    try:
        return torch.cuda.device_count() > 0 and torch.cuda.is_available()
    except Exception:
        return False


def get() -> Any:
    """DeepSpeed's accelerator object for the selected device kind."""
    select_accelerator()
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()


def name() -> str:
    """``"npu"``, ``"cuda"`` or ``"cpu"`` (whatever DeepSpeed resolved)."""
    return get().device_name()


def is_cpu() -> bool:
    return name() == CPU


def comm_backend() -> str:
    """Collective backend for torch.distributed: hccl, nccl or gloo."""
    return get().communication_backend_name()


def device(local_rank: int | None = None) -> torch.device:
    """The torch device this process computes on (``cpu`` on the CPU accelerator)."""
    if is_cpu():
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    return torch.device(get().device_name(index))


def set_device(local_rank: int) -> None:
    """Bind this process to its local device (no-op on CPU)."""
    if not is_cpu():
        get().set_device(local_rank)


def supports_bf16() -> bool:
    """True where bf16 is native (NPU/GPU with bf16); CPU counts as no (emulated, slow)."""
    try:
        return not is_cpu() and bool(get().is_bf16_supported())
    except Exception:
        return False


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy, torch and every device generator of the accelerator."""
    seed = int(seed) % (2**32)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if not is_cpu():
        get().manual_seed_all(seed)


def synchronize() -> None:
    """Wait for queued device work (for honest timing); never raises."""
    try:
        if not is_cpu():
            get().synchronize()
    except Exception as exc:  # timing must not crash training
        warnings.warn(f"accelerator synchronize failed: {exc}", stacklevel=2)


def memory_stats() -> dict[str, float]:
    """Allocated / peak memory in GiB on this process's device; empty when unavailable."""
    gib = float(2**30)
    try:
        acc = get()
        return {
            "memory/allocated_gib": acc.memory_allocated() / gib,
            "memory/max_allocated_gib": acc.max_memory_allocated() / gib,
        }
    except Exception:
        return {}


def free_memory_gib() -> float | None:
    """Free memory of this process's device in GiB (host memory on CPU); None if unknown."""
    try:
        if is_cpu():
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
            return None
        acc = get()
        if hasattr(acc, "available_memory"):
            return acc.available_memory() / 2**30
        return (acc.total_memory() - acc.memory_reserved()) / 2**30
    except Exception:
        return None


def total_memory_gib(local_ranks: int = 1) -> float | None:
    """Memory of this process's device in GiB (on CPU: the host's, shared by ``local_ranks``
    processes); None if unknown."""
    try:
        if is_cpu():
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20 / max(local_ranks, 1)
            return None
        return get().total_memory() / 2**30
    except Exception:
        return None


def disable_cpu_shm_comm() -> None:
    """On CPU, keep DeepSpeed from JIT-building its shared-memory all-reduce op (35-90 s).

    That op only speeds up DeepSpeed's inference all-reduce; training collectives go through
    torch.distributed (gloo) either way. Set ``RECAP_DS_SHM_COMM=1`` to keep it.
    """
    if not is_cpu() or os.environ.get("RECAP_DS_SHM_COMM") == "1":
        return
    import deepspeed.ops

    compatible = vars(deepspeed.ops).setdefault("__compatible_ops__", {})
    compatible["deepspeed_shm_comm"] = False


def share_cpu_cores(local_world_size: int) -> int | None:
    """On CPU, give each of the node's ranks its share of the cores (torch threads).

    Every rank otherwise starts one thread per core, so 2 ranks on 2 cores run 4+ busy threads
    and each step waits on the others' time slices (measured on the demo value model: 1.2 s per
    step, 0.2 s with one thread per rank). ``OMP_NUM_THREADS`` set by the user wins. Returns the
    thread count set, or None when nothing was changed.
    """
    if not is_cpu() or os.environ.get("OMP_NUM_THREADS") or local_world_size <= 1:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // local_world_size)
    torch.set_num_threads(threads)
    return threads


def to_device(batch: Any, target: torch.device) -> Any:
    """Move every tensor of a (nested) dict/list/tuple batch to ``target``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(target, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, target) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, target) for v in batch)
    return batch


def describe() -> str:
    """One line for logs: accelerator, backend, device count."""
    try:
        return f"accelerator={name()} backend={comm_backend()} devices={get().device_count()}"
    except Exception as exc:
        return f"accelerator unavailable ({exc})"
