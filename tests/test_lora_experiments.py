"""The LoRA experiment files (``experiments/libero_pi05_lora.gin``, ``libero_value_lora.gin``)
resolve at plan time with the rehearsal's tiny sizes, and build the adapters they ask for (they
train, as shipped, on the rehearsal's stand-ins in ``tests/test_rehearsal.py``; the engine's LoRA
runs are ``tests/engine/test_lora_engine.py``)."""

from __future__ import annotations

import gin
import pytest
import torch

import recap.steps.train  # noqa: F401  (registers train, value_model, pi05_policy, LoraOptions)
from recap.cli import parse_gin
from recap.config_check import bound, missing_required
from recap.models import adapters
from tests.test_config_check import LIBERO_BINDINGS

TINY = "rehearsal/tiny.gin"


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.parametrize("name", ["libero_pi05_lora", "libero_value_lora"])
def test_lora_experiments_resolve_with_the_rehearsal_sizes(name):
    parse_gin([f"experiments/{name}.gin", TINY], LIBERO_BINDINGS)
    assert missing_required("train") == []
    factory = "pi05_policy" if "pi05" in name else "value_model"
    assert bound(f"{factory}.freeze") == []
    options = bound(f"{factory}.lora").scoped_configurable_fn()
    assert (options.rank, options.alpha) == (16, 16.0)
    assert bound("train.run_dir") == f"runs/{name}"


def test_the_pi05_lora_experiment_builds_openpis_ranks():
    parse_gin(["experiments/libero_pi05_lora.gin", TINY],
              [*LIBERO_BINDINGS, "pi05_policy.checkpoint = None"])  # fmt: skip
    assert bound("deepspeed_config.ema_decay") is None
    with torch.device("meta"):
        model = bound("train.model_fn").scoped_configurable_fn()
    ranks = {n.split(".")[1]: p.shape[0] for n, p in model.named_parameters()
             if n.endswith("q_proj.lora_A.default.weight")}  # fmt: skip
    assert ranks == {"paligemma": 16, "gemma_expert": 32}
    assert adapters.is_adapted(model)
