"""End to end on the CPU accelerator with the real DeepSpeed engine (ZeRO-3, 2 ranks)."""

from __future__ import annotations

import math

import pytest
import torch

from recap.engine.inference import load_exported
from recap.models.toy import ToyRegressionData, toy_model
from tests.engine.conftest import STEPS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def losses(metrics: dict, steps) -> list[float]:
    return [metrics[(s, "train")]["train/loss"] for s in steps]


def test_two_ranks_zero3_loss_decreases(two_rank):
    full = two_rank["full"]
    assert "world=2" in two_rank["logs"][0]
    train = losses(full, range(1, STEPS + 1))
    assert all(math.isfinite(x) for x in train)
    assert sum(train[-3:]) / 3 < sum(train[:3]) / 3
    assert full[(STEPS, "eval")]["eval/loss"] < full[(4, "eval")]["eval/loss"]


def test_restart_resumes_and_reproduces_losses_exactly(two_rank):
    full, resumed = two_rank["full"], two_rank["resumed"]
    assert "start_step=4" in two_rank["logs"][1]
    assert min(step for step, _ in resumed) == 5
    assert losses(resumed, range(5, STEPS + 1)) == losses(full, range(5, STEPS + 1))
    assert resumed[(STEPS, "eval")]["eval/loss"] == full[(STEPS, "eval")]["eval/loss"]


def test_export_reproduces_eval_loss_in_plain_process(two_rank):
    torch.manual_seed(123)
    model = toy_model()
    load_exported(model, two_rank["run_dir"] / "model.safetensors")
    assert model.backbone.lm_head.weight is model.backbone.model.embed_tokens.weight
    data = ToyRegressionData(37, seed=1)
    batch = torch.utils.data.default_collate([data[i] for i in range(len(data))])
    with torch.no_grad():
        loss, _ = model.eval()(batch)
    expected = two_rank["full"][(STEPS, "eval")]["eval/loss"]
    assert float(loss.mean()) == pytest.approx(expected, rel=1e-6, abs=1e-8)


def test_one_rank_matches_two_ranks_at_same_global_batch(two_rank, sweep):
    one = sweep_metrics(sweep, 0)
    steps = range(1, STEPS + 1)
    assert losses(one, steps) == pytest.approx(losses(two_rank["full"], steps), rel=1e-5)
    assert one[(STEPS, "eval")]["eval/loss"] == pytest.approx(
        two_rank["full"][(STEPS, "eval")]["eval/loss"], rel=1e-5
    )


def sweep_metrics(sweep, index: int) -> dict:
    from tests.engine.conftest import read_metrics

    return read_metrics(sweep["runs"][index] / "metrics.jsonl")
