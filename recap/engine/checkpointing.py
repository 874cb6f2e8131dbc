"""Checkpoints of a run directory: resume plan, save/restore, pruning, and the final export.

Layout of ``run_dir``::

    checkpoints/latest                 DeepSpeed's pointer to the newest complete checkpoint
    checkpoints/step_{N}/              DeepSpeed ZeRO files + recap_state.json (step, world size)
    checkpoints/step_{N}/ema/rank_R.pt with an EMA: each rank's averages (``recap.engine.ema``)
    model.safetensors                  consolidated weights (the EMA when there is one),
                                       loadable without DeepSpeed

``recap_state.json`` is written before DeepSpeed saves and ``latest`` moves only after it finished,
so ``latest`` never points at a half-written checkpoint. ZeRO checkpoints are tied to the world
size; a checkpoint of another world size is refused with the command that converts it to
DeepSpeed's universal format, after which the same command resumes from the conversion.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from recap import logs
from recap.engine import distributed
from recap.engine.inference import TIED_KEY
from recap.engine.protocol import ExportHooks
from recap.errors import RecapError
from recap.weights import save_safetensors

log = logs.get(__name__)

CHECKPOINTS = "checkpoints"
STATE_FILE = "recap_state.json"
EXPORT_FILE = "model.safetensors"
TAG = re.compile(r"^step_(\d+)$")
WEIGHTS_KEY = "recap_weights"  # export metadata: "ema" or "raw"


@dataclass(frozen=True)
class ResumePlan:
    """Which checkpoint to load (``tag`` None: start fresh) and whether it is universal."""

    tag: str | None = None
    step: int = 0
    universal: bool = False
    zero_stage: int | None = None  # the stage it was saved at (None: checkpoints before it)


def _write_json_atomic(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def plan_resume(run_dir: Path, world_size: int, config: dict) -> ResumePlan:
    """Read ``checkpoints/latest`` (no process group needed); refuse a foreign world size."""
    root = Path(run_dir) / CHECKPOINTS
    latest = root / "latest"
    if not latest.is_file():
        return ResumePlan()
    tag = latest.read_text().strip()
    state_file = root / tag / STATE_FILE
    if not state_file.is_file():
        raise RecapError(
            f"{state_file}: missing; {root / tag} is not a recap checkpoint — "
            f"delete {latest} to start over"
        )
    state = json.loads(state_file.read_text())
    if state.get("global_batch_size") != config["train_batch_size"]:
        log.warning(
            f"warning: {state_file}: global batch {state.get('global_batch_size')} differs from "
            f"{config['train_batch_size']}; data order after the resume changes"
        )
    stage = state.get("zero_stage")
    if state["world_size"] == world_size:
        return ResumePlan(tag, int(state["step"]), False, stage)
    universal = root / "latest_universal"
    if universal.is_file() and universal.read_text().strip().startswith(tag):
        return ResumePlan(universal.read_text().strip(), int(state["step"]), True, stage)
    raise RecapError(
        f"{root / tag}: checkpoint saved with world size {state['world_size']} but this run has "
        f"{world_size}; relaunch with {state['world_size']} ranks, or convert it once with "
        f"'python -m deepspeed.checkpoint.ds_to_universal --input_folder {root / tag} "
        f"--output_folder {root / tag}_universal' and rerun the same command"
    )


def restore(engine, run_dir: Path, plan: ResumePlan) -> int:
    """Load the planned checkpoint into ``engine``; returns the number of completed steps."""
    if plan.tag is None:
        return 0
    root = Path(run_dir) / CHECKPOINTS
    path, client_state = engine.load_checkpoint(str(root), tag=plan.tag)
    if path is None:
        raise RecapError(
            f"{root / plan.tag}: DeepSpeed could not load this checkpoint; delete "
            f"{root / 'latest'} to start over"
        )
    return int((client_state or {}).get("step", plan.step))


def restore_ema(ema, run_dir: Path, plan: ResumePlan) -> None:
    """Load the planned checkpoint's EMA (a universal or EMA-less checkpoint restarts it from
    the restored weights, with a warning)."""
    if ema is None or plan.tag is None:
        return
    tag = plan.tag.removesuffix("_universal") if plan.universal else plan.tag
    ema.load(Path(run_dir) / CHECKPOINTS / tag)


def save(engine, run_dir: Path, step: int, config: dict, keep: int, ema=None) -> None:
    """Save ``checkpoints/step_{step}`` on all ranks, then prune to the ``keep`` newest (rank 0).
    The EMA files are written before DeepSpeed moves ``latest``."""
    root = Path(run_dir) / CHECKPOINTS
    tag = f"step_{step}"
    if distributed.is_main():
        _write_json_atomic(
            root / tag / STATE_FILE,
            {
                "step": step,
                "world_size": distributed.world_size(),
                "global_batch_size": config["train_batch_size"],
                "micro_batch_size": config["train_micro_batch_size_per_gpu"],
                "zero_stage": config["zero_optimization"]["stage"],
            },
        )
    if ema is not None:
        ema.save(root / tag)
    distributed.barrier()
    engine.save_checkpoint(str(root), tag=tag, client_state={"step": step})
    distributed.barrier()
    if distributed.is_main() and keep > 0:
        tags = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := TAG.match(p.name)))
        for _, old in tags[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def _untie(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Keep one copy of weights that share memory; map each dropped name to its kept source."""
    kept, tied, seen = {}, {}, {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.numel() and key in seen:
            tied[name] = seen[key]
            continue
        seen[key] = name
        kept[name] = tensor.detach().cpu().contiguous()
    return kept, tied


def save_exported(
    state: dict[str, torch.Tensor], path: Path, step: int, extra: dict[str, str] | None = None
) -> Path:
    """Write ``state`` atomically as safetensors; tied aliases (and ``extra``) go in the
    metadata."""
    kept, tied = _untie(state)
    metadata = {"format": "pt", TIED_KEY: json.dumps(tied), "step": str(step), **(extra or {})}
    return save_safetensors(kept, path, metadata)


def export(engine, run_dir: Path, step: int, ema=None) -> Path:
    """Gather the full weights (ZeRO-3: all ranks take part) and write ``model.safetensors``.

    With an ``ema`` the file holds the averaged weights (the parameters' dtype) and its metadata
    says so: ``recap_weights`` = ``"ema"`` (else ``"raw"``), ``recap_ema_decay``,
    ``recap_ema_updates``. A model with ``ExportHooks`` (``recap.engine.protocol``) turns the
    state into what the file holds and adds metadata: a LoRA model writes its adapter alone as
    peft does under ``run_dir/adapter/`` and the merged weights, under the names of a full
    fine-tune, to ``model.safetensors`` (metadata ``recap_lora`` = ``"merged"``)."""
    if engine.zero_optimization_partition_weights():
        state = engine._zero3_consolidated_16bit_state_dict()
    else:
        state = engine.module.state_dict() if distributed.is_main() else None
    extra = {WEIGHTS_KEY: "raw"}
    if ema is not None:
        state = ema.full_state(state)
        extra = {WEIGHTS_KEY: "ema", "recap_ema_decay": repr(ema.decay),
                 "recap_ema_updates": str(ema.updates)}  # fmt: skip
    path = Path(run_dir) / EXPORT_FILE
    if distributed.is_main() and isinstance(engine.module, ExportHooks):  # e.g. LoRA: merged
        state, metadata = engine.module.export_state(state, Path(run_dir))
        extra.update(metadata)
    if distributed.is_main():
        save_exported(state, path, step, extra)
    distributed.barrier()
    return path


def load_pending(model: torch.nn.Module) -> None:
    """Load the weights a model factory left in ``model.pending_state`` (a π0.5 checkpoint read
    while ZeRO-3 built the model partitioned, ``models.checkpoints.load_strict``): each
    partitioned parameter is gathered, filled on rank 0 and partitioned again (broadcast on
    exit); one built outside ``zero.Init`` (whole on every rank) is filled on every rank."""
    state = model.__dict__.pop("pending_state", None)
    if state is None:
        return
    import deepspeed

    rank0 = distributed.rank() == 0
    for name, param in model.named_parameters():
        value = state.get(name.replace(".base_layer.", "."))  # a LoRA layer's base weight
        if value is None and ".lora_" in name:
            continue  # a LoRA adapter: freshly initialized, not in the checkpoint
        if not hasattr(param, "ds_id"):  # built outside zero.Init: every rank holds it whole
            param.data.copy_(value.to(param.device, param.dtype))
            continue
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
            if rank0:
                param.data.copy_(value.to(param.device, param.dtype))
    for name, buffer in model.named_buffers():
        if name in state:
            buffer.data.copy_(state[name].to(buffer.device, buffer.dtype))
