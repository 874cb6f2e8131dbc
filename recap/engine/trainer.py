"""The training loop on a DeepSpeed engine: step, log, evaluate, save, resume, export.

``fit`` is the whole story: plan the resume (before any process group, so a bad checkpoint is a
quick one-line error), start the ranks, build the model (partitioned at construction under
ZeRO-3), restore the latest checkpoint of the run directory, then ``train_step`` / ``maybe_log`` /
``maybe_evaluate`` / ``maybe_save`` until ``max_steps``, and finally export the consolidated
weights to ``run_dir/model.safetensors`` (with ``deepspeed_config.ema_decay``: their moving
average, ``recap.engine.ema``, updated after every optimizer step; evaluation then measures the
average too). Restarting the same command
resumes. Data order and per-step seeds depend only on (seed, step), so a resumed run reproduces
the uninterrupted one. What the loop needs of a model is ``recap.engine.protocol``.
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from recap import logs
from recap.configurable import config_text
from recap.engine import accelerator, distributed
from recap.engine import checkpointing as ckpt
from recap.engine.deepspeed_config import (
    RECAP_KEY,
    for_deepspeed,
    lr_scheduler_factory,
    param_groups,
    resolve_auto,
)
from recap.engine.ema import WeightEMA
from recap.engine.inference import predict
from recap.engine.protocol import EvalFigures, EvalSummaries
from recap.tracking import Tracker

log = logs.get(__name__)


@dataclass(frozen=True)
class LoopOptions:
    """What the loop does and when; ``0`` for an interval means "only at the last step"."""

    run_dir: Path
    max_steps: int
    log_every: int = 10
    eval_every: int = 0
    save_every: int = 0
    keep_checkpoints: int = 2
    seed: int = 0
    eval_batch_size: int | None = None
    num_workers: int = 0
    step_name: str = "train"


@dataclass
class FitResult:
    """Last logged train metrics and eval metrics (rank 0; empty elsewhere), export path."""

    step: int
    train_metrics: dict[str, float] = field(default_factory=dict)
    eval_metrics: dict[str, float] = field(default_factory=dict)
    export_path: Path | None = None


class Stopwatch:
    """Named timers that can never crash a run: a missing timer reads 0 with a warning."""

    def __init__(self):
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds
        self.counts[name] = self.counts.get(name, 0) + 1

    def mean_ms(self, name: str) -> float:
        if not self.counts.get(name):
            warnings.warn(f"timer {name!r} has not been recorded; reporting 0", stacklevel=2)
            return 0.0
        return 1000.0 * self.totals[name] / self.counts[name]

    def reset(self) -> None:
        self.totals.clear()
        self.counts.clear()


class MetricSums:
    """Per-example values averaged over examples, 0-d values over micro-batches, across ranks.

    ``add`` never waits for the device: each value's sum stays a device tensor until ``reduce``
    (at a log step) brings them all to the host at once."""

    def __init__(self):
        self.sums: dict[str, list[torch.Tensor]] = {}
        self.counts: dict[str, float] = {}

    def add(self, name: str, value: torch.Tensor | float) -> None:
        value = torch.as_tensor(value).detach()
        self.sums.setdefault(name, []).append(value.float().sum())
        self.counts[name] = self.counts.get(name, 0.0) + (value.numel() if value.dim() else 1)

    def reduce(self) -> dict[str, float]:
        """Mean of each metric over all ranks (a collective: call on every rank)."""
        keys = sorted(self.sums)
        sums = [float(torch.stack([v.cpu() for v in self.sums[k]]).double().sum()) for k in keys]
        packed = torch.tensor(sums + [self.counts[k] for k in keys], dtype=torch.float64)
        total = distributed.all_reduce_sum(packed)
        self.sums.clear()
        self.counts.clear()
        return {
            k: float(total[i] / max(float(total[len(keys) + i]), 1.0)) for i, k in enumerate(keys)
        }


def step_seed(seed: int, step: int, rank: int) -> int:
    """A seed for (run seed, step, rank): random ops of a step are the same after a resume."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


def build_model(model_fn: Callable[[], torch.nn.Module], ds_config: dict) -> tuple[Any, Any]:
    """Build the model so ZeRO-3 partitions it at construction; returns (model, keepalive).

    Transformers' ``from_config`` / ``from_pretrained`` enter ``deepspeed.zero.Init`` themselves
    while an ``HfDeepSpeedConfig`` is alive (wrapping them in ``zero.Init`` by hand crashes), so
    keep the returned object referenced until training ends."""
    keepalive = None
    if ds_config.get("zero_optimization", {}).get("stage") == 3:
        from transformers.integrations import HfDeepSpeedConfig

        keepalive = HfDeepSpeedConfig(ds_config)
    model = model_fn()
    if keepalive is not None and ds_config.get("bf16", {}).get("enabled"):
        # ZeRO-3 flattens each rank's partitions into one buffer of one dtype: parameters built
        # outside ``zero.Init`` (plain nn.Linear heads, the π0.5 action expert) are still float32
        with torch.no_grad():
            for param in model.parameters():
                if not hasattr(param, "ds_id") and param.dtype == torch.float32:
                    param.data = param.data.to(torch.bfloat16)
    ckpt.load_pending(model)  # pretrained weights read while the model was built partitioned
    return model, keepalive


class Trainer:
    """A DeepSpeed engine plus the loop around it (one instance per run)."""

    def __init__(
        self,
        engine,
        config: dict,
        opts: LoopOptions,
        tracker: Tracker,
        train_data,
        eval_data=None,
        group_names: list[str] | None = None,
        ema: WeightEMA | None = None,
    ):
        self.engine, self.config, self.opts, self.tracker = engine, config, opts, tracker
        self.ema = ema
        self.train_data, self.eval_data = train_data, eval_data
        self.group_names = group_names or []
        self.accumulation = config["gradient_accumulation_steps"]
        self.sums, self.timer = MetricSums(), Stopwatch()
        self.window: float | None = None  # when the timing window opened (perf_counter)
        self.window_steps, self.paused = 0, 0.0
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}

    def batches(self, start: int) -> Iterator[dict]:
        """This rank's micro-batches from step ``start`` (0-based) to ``max_steps``."""
        return distributed.train_batches(
            self.train_data,
            self.config,
            self.opts.seed,
            start,
            self.opts.max_steps,
            self.opts.num_workers,
        )

    def train_step(self, step: int, batches: Iterator[dict]) -> None:
        """One optimizer step: ``accumulation`` micro-batches forward/backward, then step."""
        accelerator.seed_everything(step_seed(self.opts.seed, step, distributed.rank()))
        if self.window is None:  # the first step since the last log: the timing window opens
            self.window, self.window_steps, self.paused = time.perf_counter(), 0, 0.0
        own_norm = None
        for micro in range(self.accumulation):
            batch = accelerator.to_device(next(batches), accelerator.device())
            loss, metrics = self.engine(batch)
            self.engine.backward(loss.mean())
            if micro == self.accumulation - 1 and self.engine.zero_optimization_stage() == 0:
                own_norm = self._gradient_norm()  # the averaged gradients, before clipping
            self.engine.step()
            self.sums.add("loss", loss)
            for name, value in metrics.items():
                self.sums.add(name, value)
        if self.ema is not None:  # the optimizer stepped at the last micro-batch
            self.ema.update()
        norm = self.engine.get_global_grad_norm()
        norm = own_norm if norm is None else norm
        if norm is not None:
            self.sums.add("grad_norm", norm)
        self.window_steps += 1

    def _gradient_norm(self) -> torch.Tensor | None:
        """The 2-norm of every gradient (ZeRO-0: DeepSpeed clips fp32 gradients without keeping
        the norm it computed, so ``get_global_grad_norm`` is None there; after the boundary's
        backward the gradients are already averaged over the ranks, so this is the global norm)."""
        grads = [p.grad.detach() for p in self.engine.module.parameters() if p.grad is not None]
        if not grads:
            return None
        return torch.nn.utils.get_total_norm(grads)

    def _due(self, step: int, every: int) -> bool:
        return step == self.opts.max_steps or (every > 0 and step % every == 0)

    def maybe_log(self, step: int, progress: tqdm | None = None) -> None:
        if not self._due(step, self.opts.log_every):
            return
        # one wait for the device per log, not per step: the window's wall time over its steps,
        # less evaluation and checkpoint time spent inside it
        accelerator.synchronize()
        if self.window is not None and self.window_steps:
            elapsed = time.perf_counter() - self.window - self.paused
            self.timer.add("step", elapsed / self.window_steps)
        self.window = None
        metrics = {f"train/{k}": v for k, v in self.sums.reduce().items()}
        for name, lr in zip(self.group_names, self.engine.get_lr()):
            metrics[f"lr/{name}"] = float(lr)
        step_ms = self.timer.mean_ms("step")
        metrics["time/step_ms"] = step_ms
        metrics["time/samples_per_s"] = (
            self.config["train_batch_size"] * 1000.0 / max(step_ms, 1e-9)
        )
        metrics.update(accelerator.memory_stats())
        self.timer.reset()
        self.last_train = metrics
        self.record(step, metrics)
        if progress is not None:
            progress.set_postfix(loss=f"{metrics.get('train/loss', float('nan')):.4g}")

    def _outside_window(self, work: Callable[[int], None], step: int) -> None:
        """``work(step)``, its wall time kept out of the step timing. The device first finishes
        the steps queued before it: their time is step time, not the work's (evaluation and a
        checkpoint wait for the device themselves, and would otherwise take it from the steps).
        Called only when the work is due, so steps without it never wait for the device."""
        accelerator.synchronize()
        begin = time.perf_counter()
        work(step)
        self.paused += time.perf_counter() - begin

    def maybe_evaluate(self, step: int) -> None:
        if self.eval_data is None or not self._due(step, self.opts.eval_every):
            return
        batch_size = self.opts.eval_batch_size or self.config["train_micro_batch_size_per_gpu"]
        # with an EMA the run exports the averages, so they are what evaluation measures
        weights = contextlib.nullcontext() if self.ema is None else self.ema.applied()
        with weights:
            outputs = predict(self.engine, self.eval_data, batch_size)
        if outputs is None:
            return
        metrics = {f"eval/{k}": float(v.float().mean()) for k, v in outputs.items()}
        module = self.engine.module
        if isinstance(module, EvalSummaries):
            metrics.update({f"eval/{k}": v for k, v in module.summarize_eval(outputs).items()})
        figures = {}
        for owner in (module, self.eval_data):  # the model's pictures, then the data's
            try:
                if isinstance(owner, EvalFigures):
                    figures.update(owner.eval_figures(outputs))
            except Exception as exc:  # a plot must never stop training
                warnings.warn(f"eval_figures failed: {exc}", stacklevel=2)
        for name, fig in figures.items():
            self.tracker.log_figure(fig, f"plots/{name}_step_{step:07d}.png")
        self.last_eval = metrics
        self.record(step, metrics)

    def log_config(self, step: int) -> None:
        self.tracker.log_text(config_text(operative=True), "config/operative_config.gin")

    def maybe_save(self, step: int) -> None:
        if self._due(step, self.opts.save_every):
            ckpt.save(self.engine, self.opts.run_dir, step, self.config,
                      self.opts.keep_checkpoints, self.ema)  # fmt: skip

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Rank 0: append to ``metrics.jsonl`` and MLflow; a failed write is only a warning."""
        if not distributed.is_main():
            return
        try:
            with open(self.opts.run_dir / "metrics.jsonl", "a", encoding="utf-8") as out:
                out.write(json.dumps({"step": step, **metrics}) + "\n")
        except OSError as exc:
            warnings.warn(f"could not write metrics.jsonl: {exc}", stacklevel=2)
        self.tracker.log_metrics(metrics, step)

    def advance(
        self, step: int, batches: Iterator[dict], first: bool = False, progress: tqdm | None = None
    ) -> None:
        """Step ``step``, then what falls due at it: the config (``first`` step of the run), the
        log, evaluation, a checkpoint (the config, evaluation and checkpoint outside the step
        timing)."""
        self.train_step(step, batches)
        if first:
            self._outside_window(self.log_config, step)
        self.maybe_log(step, progress)
        if self.eval_data is not None and self._due(step, self.opts.eval_every):
            self._outside_window(self.maybe_evaluate, step)
        if self._due(step, self.opts.save_every):
            self._outside_window(self.maybe_save, step)

    def run(self, start: int) -> FitResult:
        """Steps ``start+1 .. max_steps`` then the export (the loop itself)."""
        batches = self.batches(start)
        steps = range(start + 1, self.opts.max_steps + 1)
        progress = tqdm(
            steps,
            desc=self.opts.step_name,
            initial=start,
            total=self.opts.max_steps,
            disable=not distributed.is_main(),
            dynamic_ncols=True,
        )
        if start == 0 and self.opts.eval_every > 0:
            self.maybe_evaluate(0)  # the untrained model: what training is measured against
        for step in progress:
            self.advance(step, batches, first=step == start + 1, progress=progress)
        progress.close()
        step = max(start, self.opts.max_steps)
        path = ckpt.export(self.engine, self.opts.run_dir, step, self.ema)
        return FitResult(self.opts.max_steps, self.last_train, self.last_eval, path)


def fit(
    model_fn: Callable[[], torch.nn.Module],
    train_data,
    eval_data,
    config: dict,
    opts: LoopOptions,
    tracker: Tracker,
) -> FitResult:
    """Train ``model_fn()`` on ``train_data`` with the DeepSpeed ``config`` (see module doc)."""
    plan = ckpt.plan_resume(opts.run_dir, distributed.env_world_size(), config)
    distributed.init()
    # after init: every rank plans for the smallest device of them all, so all pick one stage
    config, chosen = resolve_auto(config, model_fn, distributed.world_size(),
                                  distributed.local_world_size(), plan.zero_stage)  # fmt: skip
    if chosen is not None and distributed.is_main():
        log.info(chosen)
    accelerator.seed_everything(opts.seed)
    ds_config = for_deepspeed(config)
    if plan.universal:
        ds_config["checkpoint"] = {"load_universal": True}
    model, keepalive = build_model(model_fn, ds_config)
    groups = param_groups(model, config)
    import deepspeed

    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=groups,
        config=ds_config,
        lr_scheduler=lr_scheduler_factory(config),
    )
    start = ckpt.restore(engine, opts.run_dir, plan)
    decay = config.get(RECAP_KEY, {}).get("ema_decay")
    ema = None if decay is None else WeightEMA(engine.module, decay)
    ckpt.restore_ema(ema, opts.run_dir, plan)
    if distributed.is_main():
        opts.run_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"{accelerator.describe()} world={distributed.world_size()} start_step={start}")
    run_params = {"recap.world_size": str(distributed.world_size()),
                  "recap.zero_stage": str(config["zero_optimization"]["stage"])}  # fmt: skip
    tracker.start(opts.run_dir, opts.step_name, run_params)
    tracker.log_dict(config, "config/deepspeed_config.json")
    names = [g["name"] for g in groups]
    trainer = Trainer(engine, config, opts, tracker, train_data, eval_data, names, ema)
    try:
        result = trainer.run(start)
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish("FINISHED")
    del keepalive
    return result
