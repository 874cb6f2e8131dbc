"""Loop helpers that must never crash a run, and per-step seeds."""

from __future__ import annotations

import pytest
import torch

from recap.engine.trainer import MetricSums, Stopwatch, step_seed


def test_missing_timer_is_a_warning_and_reads_zero():
    timer = Stopwatch()
    with pytest.warns(UserWarning, match="has not been recorded"):
        assert timer.mean_ms("run_eval") == 0.0
    timer.add("step", 0.5)
    timer.add("step", 1.5)
    assert timer.mean_ms("step") == 1000.0


def test_metric_sums_average_examples_and_batch_values():
    sums = MetricSums()
    sums.add("loss", torch.tensor([1.0, 2.0, 3.0]))
    sums.add("loss", torch.tensor([6.0]))
    sums.add("grad_norm", 2.0)
    sums.add("grad_norm", torch.tensor(4.0))
    assert sums.reduce() == {"grad_norm": 3.0, "loss": 3.0}
    assert sums.reduce() == {}


def test_step_seeds_are_deterministic_and_distinct():
    assert step_seed(0, 5, 0) == step_seed(0, 5, 0)
    seeds = {step_seed(s, t, r) for s in range(2) for t in range(3) for r in range(2)}
    assert len(seeds) == 12


class FakeDevice:
    """A clock and an asynchronous device: each optimizer step queues ``STEP_S`` of work that
    only ``synchronize`` (or a checkpoint, which waits for the device) lets the clock pass."""

    STEP_S, SAVE_S = 1 / 64, 1.0  # binary fractions: the step time comes out exact

    def __init__(self):
        self.now, self.queued = 0.0, 0.0

    def perf_counter(self) -> float:
        return self.now

    def synchronize(self) -> None:
        self.now, self.queued = self.now + self.queued, 0.0


class QueuingEngine:
    """What ``Trainer.train_step`` / ``maybe_log`` call on a DeepSpeed engine."""

    def __init__(self, device: FakeDevice):
        self.device = device

    def __call__(self, batch):
        return torch.ones(2), {}

    def backward(self, loss):
        pass

    def step(self):
        self.device.queued += FakeDevice.STEP_S

    def get_global_grad_norm(self):
        return None

    def zero_optimization_stage(self):
        return 3  # DeepSpeed keeps the norm itself (none here: no gradients to measure)

    def get_lr(self):
        return [1e-4]


def test_logged_step_time_excludes_a_checkpoint_saved_inside_the_window(monkeypatch, tmp_path):
    from recap.engine import accelerator
    from recap.engine import checkpointing as ckpt
    from recap.engine import trainer as trainer_module
    from recap.engine.trainer import LoopOptions, Trainer
    from recap.tracking import Tracker

    device = FakeDevice()

    def slow_save(*args):  # like DeepSpeed's: waits for the device, then writes for 1 s
        device.synchronize()
        device.now += FakeDevice.SAVE_S

    monkeypatch.setattr(trainer_module, "time", device)
    monkeypatch.setattr(accelerator, "synchronize", device.synchronize)
    monkeypatch.setattr(ckpt, "save", slow_save)
    config = {"gradient_accumulation_steps": 1, "train_batch_size": 8}
    opts = LoopOptions(run_dir=tmp_path, max_steps=4, log_every=4, save_every=2)
    trainer = Trainer(QueuingEngine(device), config, opts, Tracker(enabled=False), [], None)
    batches = iter([{"x": torch.zeros(2)}] * 4)
    for step in range(1, 5):
        trainer.advance(step, batches)
    # 4 steps of 15.625 ms; the 1 s save at step 2 (and the steps queued before it) not in it
    assert device.now == 4 * FakeDevice.STEP_S + 2 * FakeDevice.SAVE_S  # saves at 2 and 4
    assert trainer.last_train["time/step_ms"] == 15.625
    assert trainer.last_train["time/samples_per_s"] == 512.0
