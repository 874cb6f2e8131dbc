"""Exponential moving average of the trained weights (openpi's pi05_libero trains with 0.999).

After every optimizer step ``ema <- ema + (1 - decay) (w - ema)`` (``lerp_``, float32), started
from the weights the run starts with. Only trainable parameters are tracked (frozen ones never
change, so their average is themselves).

Under ZeRO-3 every rank keeps the average of its own partition of each parameter, read from the
optimizer's float32 master slice (``safe_get_local_fp32_param``): no gather during training.
``full_state`` gathers the partitions once, at export. Without ZeRO-3 (stages 0-2) every rank
holds the parameters whole and averages them (under bf16 that is the bf16 copy, not the master).

Evaluation during training reads the averages (``applied``): each rank copies its averages into
the weights the forward reads (under ZeRO-3 its partition ``ds_tensor``, then the parameters
ZeRO-3 keeps gathered are gathered again) and puts the trained weights back, bit for bit, after.

Checkpoints: each rank writes ``step_N/ema/rank_{r}.pt`` (its partitions, float32, by parameter
name), so a resumed run continues the same averages bit for bit. The files are tied to the world
size like the ZeRO files.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from recap.engine import distributed
from recap.errors import RecapError

EMA_DIR = "ema"


def _rank_file(directory: Path, rank: int) -> Path:
    return Path(directory) / EMA_DIR / f"rank_{rank:05d}.pt"


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` is ``b`` or a tied alias of it (same storage, shape and dtype)."""
    if a is b:
        return True
    return bool(a.numel()) and (a.data_ptr(), a.shape, a.dtype) == (b.data_ptr(), b.shape, b.dtype)


class WeightEMA:
    """Float32 moving averages of ``module``'s trainable parameters (this rank's partitions)."""

    def __init__(self, module: torch.nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise RecapError(f"gin config: deepspeed_config.ema_decay={decay}; use 0 <= d < 1")
        self.decay = float(decay)
        self.params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.zero3 = any(hasattr(p, "ds_id") for _, p in self.params)
        self.updates = 0
        with torch.no_grad():
            self.shadow = {n: self._local(p).detach().float().clone() for n, p in self.params}

    def _local(self, param: torch.nn.Parameter) -> torch.Tensor:
        """This rank's current weights of ``param``: the ZeRO-3 float32 master slice, or the
        whole parameter."""
        if hasattr(param, "ds_id"):
            from deepspeed.utils import safe_get_local_fp32_param

            local = safe_get_local_fp32_param(param)
            return param.ds_tensor.view(-1) if local is None else local.view(-1)
        return param.detach()

    @torch.no_grad()
    def update(self) -> None:
        """One average step (call after each optimizer step)."""
        weight = 1.0 - self.decay
        for name, param in self.params:
            self.shadow[name].lerp_(self._local(param).float(), weight)
        self.updates += 1

    @staticmethod
    def _weights(param: torch.nn.Parameter) -> torch.Tensor:
        """The tensor the forward reads ``param``'s values from (ZeRO-3: this rank's partition,
        flat, the same length as its average)."""
        return param.ds_tensor.view(-1) if hasattr(param, "ds_id") else param.data

    def _regather(self) -> None:
        """ZeRO-3: gather again the parameters kept whole between steps (persistent ones), as
        DeepSpeed does after its optimizer step; the others are gathered at their next use.
        All ranks call it together."""
        if not self.zero3:
            return
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        whole = [p for _, p in self.params if p.ds_status == ZeroParamStatus.AVAILABLE]
        if whole:  # release the stale whole copies (the partitions hold the values), then gather
            whole[0].partition(param_list=whole, has_been_updated=False)
            whole[0].all_gather(whole)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Within the block the model computes with the averages (cast to the weights' dtype);
        after it, with the trained weights again, exactly. Under ZeRO-3 all ranks enter it
        together (the persistent parameters are gathered on entry and exit)."""
        saved = []
        with torch.no_grad():
            for name, param in self.params:
                weights = self._weights(param)
                saved.append(weights.clone())
                weights.copy_(self.shadow[name].view_as(weights))
            self._regather()
        try:
            yield
        finally:
            with torch.no_grad():
                for (_, param), weights in zip(self.params, saved, strict=True):
                    self._weights(param).copy_(weights)
                self._regather()

    # ---- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "decay": self.decay,
            "updates": self.updates,
            "world_size": distributed.world_size(),
            "shadow": {n: t.detach().cpu().clone() for n, t in self.shadow.items()},
        }

    def save(self, directory: Path) -> None:
        """Write this rank's averages under ``directory/ema/`` (atomically)."""
        path = _rank_file(directory, distributed.rank())
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)

    def load(self, directory: Path) -> bool:
        """Restore this rank's averages from ``directory/ema/``; False (averages restart from the
        current weights, with a warning) when the checkpoint has none for this world size."""
        path = _rank_file(directory, distributed.rank())
        if not path.is_file():
            warnings.warn(f"{path}: no EMA state; the averages restart from the current weights",
                          stacklevel=2)  # fmt: skip
            return False
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state["world_size"] != distributed.world_size():
            warnings.warn(f"{path}: EMA saved with world size {state['world_size']}; the averages "
                          "restart from the current weights", stacklevel=2)  # fmt: skip
            return False
        missing = sorted(set(self.shadow) - set(state["shadow"]))
        if missing:
            raise RecapError(f"{path}: EMA state lacks {missing[:3]}; delete it to restart the EMA")
        with torch.no_grad():
            for name, tensor in self.shadow.items():
                saved = state["shadow"][name]
                if saved.shape != tensor.shape:
                    raise RecapError(f"{path}: EMA of {name} has shape {tuple(saved.shape)}, "
                                     f"expected {tuple(tensor.shape)}")  # fmt: skip
                tensor.copy_(saved)
        self.updates = int(state["updates"])
        return True

    # ---- export --------------------------------------------------------------------------

    @torch.no_grad()
    def full_state(self, state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
        """``state`` (the consolidated weights on rank 0, ``None`` elsewhere) with every tracked
        parameter and its tied aliases replaced by its average, in the parameter's dtype. Under
        ZeRO-3 all ranks must call it (one gather per parameter)."""
        for name, param in self.params:
            shadow = self.shadow[name]
            if hasattr(param, "ds_id"):
                parts = distributed.all_gather_stacked(shadow)
                full = parts.reshape(-1)[: param.ds_numel].view(param.ds_shape)
            else:
                full = shadow.detach().cpu()
            if state is None:
                continue
            old = state[name]
            value = full.to(old.dtype).clone()
            for key in [k for k, v in state.items() if _same(v, old)]:
                state[key] = value
        return state
