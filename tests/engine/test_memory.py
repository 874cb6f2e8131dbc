"""The memory planner's arithmetic with literal numbers, and its measurement on tiny models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recap.engine import memory
from recap.engine.memory import Activations, ParamCounts, Plan
from recap.errors import RecapError
from tests.models.test_pi05 import tiny_config

GI = 2**30
COUNTS = ParamCounts(total=GI, trainable=GI, largest_layer=GI // 4)


def test_zero3_states_over_eight_ranks():
    s = memory.zero3_model_states(COUNTS, ranks=8)
    # 2 + 2 + 12 bytes per param over 8 ranks, + 4 bytes x the largest layer (1/4 Gi params).
    assert (s.params, s.grads, s.optimizer, s.gathered) == (0.25, 0.25, 1.5, 1.0)
    assert s.total == 3.0
    assert s.deepspeed == 1.0 + 18 / 8  # DeepSpeed: 18 bytes/param + 4 x largest layer
    assert s.planned == 3.25


def test_frozen_parameters_carry_no_gradients_or_optimizer_state():
    s = memory.zero3_model_states(ParamCounts(GI, GI // 2, GI // 4), ranks=8)
    assert (s.params, s.grads, s.optimizer) == (0.25, 0.125, 0.75)


def test_offloaded_optimizer_leaves_the_device():
    s = memory.zero3_model_states(COUNTS, ranks=8, offload_optimizer=True)
    assert s.optimizer == 0.0
    assert s.deepspeed == 1.0 + 2 / 8


def test_zero_ranks_is_an_error():
    with pytest.raises(RecapError, match="ranks 0"):
        memory.zero3_model_states(COUNTS, ranks=0)


@pytest.mark.parametrize(
    ("base", "slopes", "depths", "expected"),
    [
        (10.0, {"vision": 2.0, "expert": 3.0}, {"vision": 27, "expert": 4}, 71.0),
        (5.0, {"decoder": 1.0}, {"decoder": 1}, 5.0),
    ],
)
def test_extrapolate_linear_in_depth(base, slopes, depths, expected):
    assert memory.extrapolate(base, slopes, depths) == expected


@pytest.mark.parametrize(
    ("device", "fixed", "per_sample", "expected"),
    [(64.0, 10.0, 1.5, 36), (64.0, 70.0, 1.0, 0), (64.0, 7.25, 0.25, 227)],
)
def test_max_micro_batch(device, fixed, per_sample, expected):
    assert memory.max_micro_batch(device, fixed, per_sample) == expected


def test_max_micro_batch_needs_positive_activations():
    with pytest.raises(RecapError, match="must be > 0"):
        memory.max_micro_batch(64.0, 1.0, 0.0)


def test_count_parameters_trainable_and_largest_layer():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model[0].requires_grad_(False)
    assert memory.count_parameters(model) == ParamCounts(23, 8, 15)


def plan(micro: int, checkpointing: bool = False) -> Plan:
    states = memory.zero3_model_states(COUNTS, ranks=8)
    acts = Activations(per_sample=1.0, checkpointed=0.25, source="literal")
    return Plan(COUNTS, 8, 64.0, micro, states, acts, checkpointing, reserve_gb=4.0)


def test_plan_that_fits():
    p = plan(micro=16)
    assert (p.activation_gb, p.total_gb, p.fits) == (16.0, 23.25, True)
    assert memory.verdict(p) == (
        "FITS: 23.2 GiB of 64 GiB per rank at micro batch 16 (largest micro batch that fits: 56)"
    )


def test_plan_that_does_not_fit_names_the_fixes():
    p = plan(micro=64)
    assert (p.total_gb, p.fits) == (71.25, False)
    line = memory.verdict(p)
    assert line.startswith("DOES NOT FIT: 71.2 GiB of 64 GiB per rank at micro batch 64; change:")
    assert "gradient checkpointing" in line and "16.0 GiB activations, up to micro 227" in line
    assert "micro batch 56" in line and "offload" not in line


def test_checkpointing_uses_the_checkpointed_figure():
    p = plan(micro=64, checkpointing=True)
    assert (p.per_sample_gb, p.activation_gb, p.fits) == (0.25, 16.0, True)


def test_states_alone_too_large_suggest_offload():
    big = ParamCounts(total=40 * GI, trainable=40 * GI, largest_layer=GI // 4)
    states = memory.zero3_model_states(big, ranks=8)
    p = Plan(big, 8, 64.0, 1, states, Activations(1.0, None, "literal"))
    assert "offload the optimizer" in memory.verdict(p)


class Square(nn.Module):
    """``loss = relu(Linear(4, 8)(x)).sum()``: saves x (32 bytes) and the relu output (64)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 8)

    def forward(self, batch):
        return torch.relu(self.linear(batch["x"])).sum(), {}


def test_saved_activation_bytes_counts_saved_storages_but_not_parameters():
    batch = {"x": torch.randn(2, 4)}
    assert memory.saved_activation_bytes(Square(), batch) == 2 * 4 * 4 + 2 * 8 * 4


def test_measured_activations_of_a_tiny_pi05():
    acts = memory.measure_activations(tiny_config(), cameras=2, prompt_tokens=6)
    assert 0 < acts.checkpointed < acts.per_sample
    assert "vision 1 layers" in acts.source and "decoder 2 layers" in acts.source


def test_meta_build_counts_without_memory():
    from recap.models.pi05 import build_pi05

    model = memory.build_on_meta(lambda: build_pi05(tiny_config()))
    assert next(model.parameters()).is_meta
    counts = memory.count_parameters(model)
    assert counts.total == sum(p.numel() for p in build_pi05(tiny_config()).parameters())
    assert 0 < counts.trainable < counts.total


def load_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "plan_memory.py"
    spec = importlib.util.spec_from_file_location("plan_memory_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("gin_files", "per_sample", "total", "verdict"),
    [
        (["value.gin", "models/value_real.gin"], 0.885, "604,490,297 total", "FITS: 34.2 GiB"),
        (["experiments/libero_pi05.gin"], 3.716, "3,353,433,872 total", "DOES NOT FIT: 131.7"),
    ],
)
def test_script_plans_the_real_gin_configs(capsys, gin_files, per_sample, total, verdict):
    """Real sizes counted on the meta device; activations given (no measurement)."""
    import gin

    args = [f"--gin_file={f}" for f in gin_files] + [f"--activation_gb_per_sample={per_sample}"]
    gin.clear_config()
    try:
        assert load_script().main([*args, "--micro_batch=32"] + ["--reserve_gb=4"]) == 0
    finally:
        gin.clear_config()
    out = capsys.readouterr().out
    assert total in out and verdict in out
