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
