"""The DeepSpeed configuration, built in code (one source of truth, gin-configurable).

``EngineConfig(...).build(world_size=..., max_steps=...)`` (gin: ``deepspeed_config.*``) returns
a plain dict: DeepSpeed's own keys plus one ``"recap"`` section (head learning rate, head
parameter patterns, LR schedule) that the engine applies itself and strips before handing the
rest to DeepSpeed. Defaults follow docs/spec.md §4:
torch AdamW, betas (0.9, 0.95), eps 1e-8, weight decay 1e-10, lr 5e-5 backbone / 1e-4 head,
linear warmup then constant, global-norm clipping 1.0, ZeRO stage "auto".

``zero_stage = "auto"`` (the default): the training run picks, before it builds the model, the
fastest stage (0-3) whose predicted memory fits the smallest device of all ranks at the
configured micro batch (``resolve_auto``, ``recap.engine.memory.auto_stage``; every rank resolves
the same stage, mixed cards included), logs it, and records it in the config it tracks; an
explicit stage always wins. ``recap-plan-memory`` prints the wider search (checkpointing, offload,
micro batch) for a named hardware.
"""

from __future__ import annotations

import copy
import fnmatch
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recap.configurable import configurable
from recap.engine import accelerator
from recap.errors import RecapError

RECAP_KEY = "recap"
PRECISIONS = ("auto", "bf16", "fp32")
STAGES = (0, 1, 2, 3, "auto")
AUTO = "auto"
SCHEDULES = ("constant", "cosine")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
AIO_FIX = (
    "install libaio on every node (apt-get install libaio-dev, or yum install libaio-devel), "
    'or offload to the host: deepspeed_config.offload_param = "cpu"'
)


def gradient_accumulation(global_batch: int, micro_batch: int, world_size: int) -> int:
    """global / (micro x world), or a one-line error saying which numbers to change."""
    per_step = micro_batch * world_size
    if micro_batch < 1 or global_batch < 1 or global_batch % per_step:
        raise RecapError(
            f"gin config: deepspeed_config.global_batch_size={global_batch} is not divisible by "
            f"micro_batch_size {micro_batch} x world size {world_size} = {per_step}; set "
            f"global_batch_size to a multiple of {per_step} or change micro_batch_size"
        )
    return global_batch // per_step


def _precision(precision: str) -> dict[str, Any]:
    if precision not in PRECISIONS:
        raise RecapError(f"gin config: deepspeed_config.precision={precision!r}; use {PRECISIONS}")
    bf16 = accelerator.supports_bf16() if precision == "auto" else precision == "bf16"
    return {"bf16": {"enabled": True}} if bf16 else {}


def _fused() -> dict[str, bool]:
    """torch AdamW's one-kernel (fused) step where the accelerator has it (CUDA); elsewhere
    torch's own default (foreach where the device supports it)."""
    return {"fused": True} if accelerator.name() == accelerator.CUDA else {}


def async_io_missing() -> str | None:
    """Why DeepSpeed's ``async_io`` op, through which ZeRO-3 swaps parameters to NVMe, cannot
    load on this machine, as one clause (None: prebuilt with ``DS_BUILD_AIO=1``, or buildable at
    first use because libaio's headers and library are there). Without it DeepSpeed raises inside
    model construction (``zero.Init``), on every rank, after the launch."""
    from deepspeed.git_version_info import installed_ops

    if installed_ops.get("async_io"):
        return None
    builder = accelerator.get().create_op_builder("AsyncIOBuilder")
    if builder is None:
        return f"DeepSpeed's {accelerator.name()} accelerator has no async_io op"
    if builder.is_compatible(verbose=False):
        return None
    return (
        f"DeepSpeed's async_io op cannot be built on this machine ({accelerator.name()} "
        "accelerator; libaio's headers and library not found)"
    )


def check_nvme_offload(device: str) -> None:
    """One-line ``RecapError`` before anything is built when ``device`` (``offload_param``) is
    ``"nvme"`` and this machine cannot swap to NVMe (``async_io_missing``)."""
    if device == "nvme":
        missing = async_io_missing()
        if missing is not None:
            raise RecapError(f'deepspeed_config.offload_param = "nvme": {missing}; {AIO_FIX}')


def _offload_param(stage: int, device: str, nvme_path: str | None) -> dict | None:
    """ZeRO-3's ``offload_param`` section (None when ``device`` is ``"none"``)."""
    if device not in OFFLOAD_DEVICES:
        raise RecapError(f"gin config: deepspeed_config.offload_param={device!r}; use one of "
                         f"{OFFLOAD_DEVICES}")  # fmt: skip
    if device == "none":
        return None
    if stage != 3:
        raise RecapError(
            f"gin config: deepspeed_config.offload_param={device!r} needs "
            f"zero_stage 3 (have {stage}); set deepspeed_config.zero_stage = 3"
        )
    section = {"device": device, "pin_memory": not accelerator.is_cpu()}
    if device == "nvme":
        if not nvme_path:
            raise RecapError("gin config: deepspeed_config.nvme_path is required with "
                             "offload_param 'nvme'; bind a local NVMe directory")  # fmt: skip
        section["nvme_path"] = str(nvme_path)
    return section


def _zero(
    stage: int,
    offload_optimizer: bool,
    persistence_threshold: int | None,
    offload_param: dict | None = None,
) -> dict:
    zero: dict[str, Any] = {"stage": stage, "contiguous_gradients": True, "overlap_comm": False}
    if offload_param is not None:
        zero["offload_param"] = offload_param
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if persistence_threshold is not None:
            zero["stage3_param_persistence_threshold"] = int(persistence_threshold)
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": not accelerator.is_cpu()}
    return zero


@configurable("deepspeed_config")
@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings (gin ``deepspeed_config.*``); ``build(world_size=..., max_steps=...)``
    is the DeepSpeed config dict for ``world_size`` ranks and ``max_steps`` optimizer steps.

    ``precision`` "auto" is bf16 where the accelerator supports it natively, else fp32 (CPU).
    Parameters whose names match ``head_patterns`` (fnmatch) train at ``head_lr``. The schedule
    is linear warmup over ``warmup_steps`` then ``constant`` or ``cosine`` down to
    ``min_lr_ratio`` x lr at ``max_steps``. ``ema_decay`` (None: off; openpi pi05_libero
    0.999) keeps an exponential moving average of the weights, checkpointed, and exports it
    (``recap.engine.ema``). ``offload_param`` (``"cpu"``, or ``"nvme"`` under ``nvme_path``;
    ZeRO-3 only) keeps the parameters on the host between uses, beside ``offload_optimizer``.
    ``zero_stage`` ``"auto"`` is resolved when training starts (module doc), counting
    ``activation_gb_per_sample`` GiB of activations per sample (``recap-plan-memory`` measures
    it; None: half the device is kept for them); with parameter offload it is ZeRO-3.
    """

    micro_batch_size: int = 32
    global_batch_size: int = 256
    zero_stage: int | str = "auto"
    precision: str = "auto"
    lr: float = 5e-5
    head_lr: float | None = 1e-4
    head_patterns: Sequence[str] = ("head.*",)
    betas: Sequence[float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 1e-10
    warmup_steps: int = 0
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    gradient_clipping: float = 1.0
    offload_optimizer: bool = False
    offload_param: str = "none"
    nvme_path: str | None = None
    param_persistence_threshold: int | None = None
    ema_decay: float | None = None
    activation_gb_per_sample: float | None = None

    def __post_init__(self):
        if self.zero_stage not in STAGES or isinstance(self.zero_stage, bool):
            raise RecapError(f"gin config: deepspeed_config.zero_stage={self.zero_stage!r}; use "
                             '0, 1, 2, 3 or "auto"')  # fmt: skip
        if self.schedule not in SCHEDULES:
            raise RecapError(f"gin config: deepspeed_config.schedule={self.schedule!r}; use "
                             f"{SCHEDULES}")  # fmt: skip
        if self.ema_decay is not None and not 0.0 <= self.ema_decay < 1.0:
            raise RecapError(f"gin config: deepspeed_config.ema_decay={self.ema_decay}; use None "
                             "(off) or 0 <= d < 1")  # fmt: skip

    def build(self, *, world_size: int, max_steps: int) -> dict[str, Any]:
        """The DeepSpeed config dict (DeepSpeed's keys and recap's section, module doc)."""
        zero_stage = self.zero_stage
        if zero_stage == AUTO and self.offload_param != "none":
            zero_stage = 3  # parameter offload is ZeRO-3's
        param_section = _offload_param(zero_stage, self.offload_param, self.nvme_path)
        accumulation = gradient_accumulation(
            self.global_batch_size, self.micro_batch_size, world_size
        )
        adam = {
            "lr": self.lr,
            "betas": list(self.betas),
            "eps": self.eps,
            "weight_decay": self.weight_decay,
        }
        return {
            "train_batch_size": self.global_batch_size,
            "train_micro_batch_size_per_gpu": self.micro_batch_size,
            "gradient_accumulation_steps": accumulation,
            "gradient_clipping": self.gradient_clipping,
            "optimizer": {"type": "AdamW", "params": {**adam, "torch_adam": True, **_fused()}},
            "zero_optimization": _zero(
                zero_stage, self.offload_optimizer, self.param_persistence_threshold, param_section
            ),
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
            **_precision(self.precision),
            RECAP_KEY: {
                "head_lr": self.lr if self.head_lr is None else self.head_lr,
                "head_patterns": list(self.head_patterns),
                "ema_decay": None if self.ema_decay is None else float(self.ema_decay),
                "auto": None
                if zero_stage != AUTO
                else {
                    "offload_optimizer": bool(self.offload_optimizer),
                    "persistence_threshold": self.param_persistence_threshold,
                    "activation_gb_per_sample": self.activation_gb_per_sample,
                },
                "schedule": {
                    "kind": self.schedule,
                    "warmup_steps": int(self.warmup_steps),
                    "total_steps": int(max_steps),
                    "min_lr_ratio": float(self.min_lr_ratio),
                },
            },
        }


def resolve_auto(
    config: dict[str, Any], model_fn, ranks: int, local_ranks: int = 1,
    saved_stage: int | None = None,
) -> tuple[dict[str, Any], str | None]:  # fmt: skip
    """(``config`` with ``zero_stage = "auto"`` resolved, one line saying what was chosen and
    why; None when the stage was explicit). The model is counted on the meta device; the
    device's memory is the accelerator's (on CPU the host's over ``local_ranks``), the smallest
    of all ranks' once the process group exists (a collective then: call on every rank, so
    mixed cards agree; ``smallest_device_gib``). Nothing fits,
    or the model or memory cannot be measured: ZeRO-3 (the smallest footprint), saying why.
    ``saved_stage``: the stage of the checkpoint a run resumes from, kept (a checkpoint loads
    only into the stage it was saved at)."""
    auto = config.get(RECAP_KEY, {}).get("auto")
    if config["zero_optimization"]["stage"] != AUTO or auto is None:
        return config, None
    if saved_stage is not None:
        out = copy.deepcopy(config)
        offload = auto["offload_optimizer"] and saved_stage > 0
        out["zero_optimization"] = _zero(int(saved_stage), offload, auto["persistence_threshold"])
        out[RECAP_KEY]["auto"] = {**auto, "chosen_stage": int(saved_stage)}
        return out, (f'zero_stage "auto" on {ranks} rank(s): ZeRO-{saved_stage}, the stage of '
                     "the checkpoint this run resumes from")  # fmt: skip
    from recap.engine import memory

    micro = config["train_micro_batch_size_per_gpu"]
    device_gb = smallest_device_gib(accelerator.total_memory_gib(local_ranks))
    per_sample = auto["activation_gb_per_sample"]
    if not per_sample and device_gb is not None:  # unknown: keep half the device for them
        per_sample = device_gb / 2 / micro
    stage, why = 3, None
    try:
        counts = memory.count_parameters(memory.build_on_meta(model_fn))
    except Exception as exc:  # a model that cannot be built on the meta device
        why = f"the model could not be counted on the meta device ({type(exc).__name__})"
    if why is None and device_gb is None:
        why = "the device's memory is unknown"
    if why is None:
        choice = memory.auto_stage(counts, ranks, device_gb, micro, per_sample,
                                   auto["offload_optimizer"])  # fmt: skip
        if choice is None:
            why = f"no stage fits {device_gb:.1f} GiB at micro batch {micro}"
        else:
            stage = choice.stage
            why = choice.describe().replace("as configured, ", "")
    agreed = _largest_across_ranks(stage)  # the same inputs give the same stage; made sure of
    if agreed != stage:
        stage, why = agreed, f"ZeRO-{stage} here, ZeRO-{agreed} on another rank"
    if not auto["activation_gb_per_sample"]:
        why += ("; activations not given: half the device kept for them (set "
                "deepspeed_config.activation_gb_per_sample from recap-plan-memory)")  # fmt: skip
    out = copy.deepcopy(config)
    offload = auto["offload_optimizer"] and stage > 0
    out["zero_optimization"] = _zero(stage, offload, auto["persistence_threshold"])
    out[RECAP_KEY]["auto"] = {**auto, "chosen_stage": stage}
    return out, f'zero_stage "auto" on {ranks} rank(s): ZeRO-{stage} ({why})'


def smallest_device_gib(local_gb: float | None) -> float | None:
    """The smallest device memory over all ranks (``local_gb`` alone without a process group):
    every rank plans for the smallest card, so mixed cards agree on the stage. Unknown on any
    rank is unknown on all (then ZeRO-3)."""
    from recap.engine import distributed

    if not (distributed.is_initialized() and distributed.world_size() > 1):
        return local_gb
    mine = torch.tensor([-1.0 if local_gb is None else float(local_gb)], dtype=torch.float64)
    smallest = float(distributed.all_gather_stacked(mine).min())
    return None if smallest < 0 else smallest


def _largest_across_ranks(stage: int) -> int:
    """The largest (smallest-footprint) of the ranks' stages: one stage for all of them."""
    from recap.engine import distributed

    if not (distributed.is_initialized() and distributed.world_size() > 1):
        return stage
    return int(distributed.all_gather_stacked(torch.tensor([stage], dtype=torch.int64)).max())


def for_deepspeed(config: dict[str, Any]) -> dict[str, Any]:
    """The config without the ``recap`` section: what ``deepspeed.initialize`` receives."""
    ds = copy.deepcopy(config)
    ds.pop(RECAP_KEY, None)
    return ds


def param_groups(model: torch.nn.Module, config: dict[str, Any]) -> list[dict[str, Any]]:
    """AdamW parameter groups: ``backbone`` at the optimizer lr, ``head`` at the head lr."""
    patterns = config[RECAP_KEY]["head_patterns"]
    head, backbone = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            matched = any(fnmatch.fnmatchcase(name, p) for p in patterns)
            (head if matched else backbone).append(param)
    if patterns and not head:
        warnings.warn(
            f"no parameter matches head patterns {patterns}; one lr for all", stacklevel=2
        )
    groups = [{"name": "backbone", "params": backbone, "lr": config["optimizer"]["params"]["lr"]}]
    if head:
        groups.append({"name": "head", "params": head, "lr": config[RECAP_KEY]["head_lr"]})
    return [g for g in groups if g["params"]]


class WarmupSchedule:
    """LR multiplier of 0-based optimizer step ``s``: linear warmup, then constant or cosine.

    ``f(s) = (s + 1) / warmup`` for ``s < warmup`` (the first step already learns), then 1
    (constant) or ``min + (1 - min) * (1 + cos(pi * p)) / 2`` with ``p`` the post-warmup progress.
    """

    def __init__(self, kind: str, warmup_steps: int, total_steps: int, min_lr_ratio: float):
        self.kind, self.warmup_steps = kind, warmup_steps
        self.total_steps, self.min_lr_ratio = total_steps, min_lr_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return (
            self.min_lr_ratio + (1.0 - self.min_lr_ratio) * (1 + math.cos(math.pi * progress)) / 2
        )


def lr_scheduler_factory(config: dict[str, Any]):
    """``optimizer -> LambdaLR`` for ``deepspeed.initialize(lr_scheduler=...)`` (checkpointed)."""
    schedule = WarmupSchedule(**config[RECAP_KEY]["schedule"])

    def build(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        # A plain function, so checkpoints keep only the step count: on resume the schedule of
        # the current config applies (e.g. a longer max_steps stretches the cosine).
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: schedule(step))

    return build
