"""The DeepSpeed config built in code: batch arithmetic, SPEC optimizer defaults, schedule."""

from __future__ import annotations

import pytest
import torch

from recap.engine.deepspeed_config import (
    RECAP_KEY,
    EngineConfig,
    WarmupSchedule,
    for_deepspeed,
    gradient_accumulation,
    lr_scheduler_factory,
    param_groups,
)
from recap.errors import RecapError


@pytest.mark.parametrize(
    "global_batch, micro, world, expected",
    [(256, 32, 1, 8), (256, 32, 8, 1), (256, 16, 2, 8), (8, 4, 2, 1), (8, 4, 1, 2)],
)
def test_gradient_accumulation(global_batch, micro, world, expected):
    assert gradient_accumulation(global_batch, micro, world) == expected


@pytest.mark.parametrize("global_batch, micro, world", [(10, 4, 1), (256, 32, 3), (8, 16, 1)])
def test_non_divisible_batch_is_one_line_error_naming_the_numbers(global_batch, micro, world):
    with pytest.raises(RecapError) as err:
        gradient_accumulation(global_batch, micro, world)
    message = str(err.value)
    assert "\n" not in message
    assert f"global_batch_size={global_batch}" in message
    assert f"multiple of {micro * world}" in message


def test_defaults_follow_spec_step2():
    config = EngineConfig().build(world_size=2, max_steps=100)
    assert config["train_batch_size"] == 256
    assert config["train_micro_batch_size_per_gpu"] == 32
    assert config["gradient_accumulation_steps"] == 4
    assert config["gradient_clipping"] == 1.0
    # the stage is chosen when training starts (recap.engine.deepspeed_config.resolve_auto)
    assert config["zero_optimization"] == {"stage": "auto", "contiguous_gradients": True,
                                           "overlap_comm": False}  # fmt: skip
    assert config[RECAP_KEY]["auto"] == {"offload_optimizer": False, "persistence_threshold": None,
                                         "activation_gb_per_sample": None}  # fmt: skip
    assert config["optimizer"] == {
        "type": "AdamW",
        "params": {
            "lr": 5e-5,
            "betas": [0.9, 0.95],
            "eps": 1e-8,
            "weight_decay": 1e-10,
            "torch_adam": True,
        },
    }
    assert config[RECAP_KEY]["head_lr"] == 1e-4
    assert "bf16" not in config  # "auto" on the CPU accelerator is fp32


def test_precision_offload_and_strip():
    config = EngineConfig(
        precision="bf16", offload_optimizer=True, micro_batch_size=2, global_batch_size=4
    ).build(world_size=1, max_steps=5)
    assert config["bf16"] == {"enabled": True}
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert RECAP_KEY not in for_deepspeed(config) and RECAP_KEY in config
    with pytest.raises(RecapError, match="precision"):
        EngineConfig(precision="fp8").build(world_size=1, max_steps=5)
    with pytest.raises(RecapError, match="schedule"):
        EngineConfig(schedule="linear").build(world_size=1, max_steps=5)


@pytest.mark.parametrize(
    "kind, warmup, expected",
    [
        ("constant", 0, [1.0, 1.0, 1.0, 1.0, 1.0]),
        ("constant", 2, [0.5, 1.0, 1.0, 1.0, 1.0]),
        ("cosine", 1, [1.0, 1.0, 0.5, 0.0, 0.0]),
    ],
)
def test_warmup_schedule(kind, warmup, expected):
    schedule = WarmupSchedule(kind, warmup, total_steps=3, min_lr_ratio=0.0)
    assert [round(schedule(s), 6) for s in range(5)] == expected


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(2, 2)
        self.head = torch.nn.Linear(2, 1)


def test_param_groups_give_the_head_its_own_lr_and_scheduler_scales_both():
    config = EngineConfig(micro_batch_size=1, global_batch_size=1, warmup_steps=2).build(
        world_size=1, max_steps=4
    )
    groups = param_groups(Tiny(), config)
    assert [(g["name"], g["lr"], len(g["params"])) for g in groups] == [
        ("backbone", 5e-5, 2),
        ("head", 1e-4, 2),
    ]
    optimizer = torch.optim.AdamW(groups)
    scheduler = lr_scheduler_factory(config)(optimizer)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([2.5e-5, 5e-5])
    optimizer.step()
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([5e-5, 1e-4])
