"""RLinf's published LIBERO-10 task 0 experiment (``experiments/rlinf_libero10_task0_*.gin``) as
it ships, rehearsed on the stand-ins: its pipeline (returns, the Gemma1-style value model
trained on the SFT demos and evaluated on the rollouts, Step 3, the positive-only CFG policy) with
``rehearsal/tiny.gin``, one process per step (the shipped pipeline on 2 DeepSpeed ranks is
tests/test_rehearsal.py's; Step 3 on 2 ranks against 1, byte for byte, is
tests/steps/test_compute_advantages.py's); then the trained value model goes to RLinf's
``full_weights.pt`` (``recap-import export-rlinf-value``), comes back (``recap-import
rlinf-value``) and a full Step 3 runs on the imported model (1 rank): the same advantages.
"""

from __future__ import annotations

import io
import json

import gin
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from recap.cli import parse_gin
from recap.commands.import_rlinf import main as import_main
from recap.config_check import bound
from recap.configurable import configured
from recap.steps.compute_advantages import AdvantagesConfig, compute_advantages
from tests.helpers import one_rank_here
from tests.test_rehearsal import TINY, metrics, rehearse, run_dir

PIPELINE = "experiments/rlinf_libero10_task0_pipeline.gin"
STAGES = ["returns", "value", "advantages", "policy"]
EXP = "experiments/rlinf_libero10_task0_{}.gin"


def _bindings(step: str, names: list[str]) -> dict[str, object]:
    import recap.steps.compute_advantages  # noqa: F401
    import recap.steps.compute_returns  # noqa: F401
    import recap.steps.train  # noqa: F401
    import recap.workflow.pipeline  # noqa: F401  (registers every step's configurables)

    gin.clear_config()
    try:
        parse_gin([EXP.format(step)], ['DATA = "/data"'])
        return {n: bound(n) for n in names}
    finally:
        gin.clear_config()


def test_rlinf_experiment_binds_what_rlinf_ships():
    rollouts = {"name": "libero10_task0_train", "root": "libero10_task0_train",
                "type": "rollout", "failure_reward": -300.0}  # fmt: skip
    sft = {"name": "libero10_task0_sft", "root": "libero10_task0_sft", "type": "sft",
           "failure_reward": -300.0}  # fmt: skip
    expert = [
        "value_model.expert_style",
        "value_model.expert_width",
        "value_model.expert_depth",
        "value_model.expert_mlp",
        "value_model.expert_heads",
        "value_model.expert_kv_heads",
    ]  # fmt: skip  (head_dim: the backbone's, 256)
    gemma_1m = {k: v for k, v in zip(expert, ["gemma1", 128, 4, 448, 1, 1], strict=True)}
    value = _bindings("value", [*expert, "value_data.datasets", "value_data.eval_datasets"])
    assert value == {**gemma_1m, "value_data.datasets": [sft],
                     "value_data.eval_datasets": [rollouts]}  # fmt: skip
    names = [*expert, "compute_advantages.datasets", "compute_advantages.lookahead",
             "compute_advantages.positive_quantile", "compute_advantages.scope",
             "compute_advantages.force_sft_positive"]  # fmt: skip
    assert _bindings("advantages", names) == {
        **gemma_1m, "compute_advantages.datasets": [sft, rollouts],
        "compute_advantages.lookahead": 10, "compute_advantages.positive_quantile": 0.3,
        "compute_advantages.scope": "global", "compute_advantages.force_sft_positive": True,
    }  # fmt: skip
    policy = _bindings("pi05", ["policy_data.conditioning", "policy_data.dropout",
                                "policy_data.datasets", "pi05_policy.action_horizon"])  # fmt: skip
    assert policy == {"policy_data.conditioning": "positive_only_conditional",
                      "policy_data.dropout": 0.1, "policy_data.datasets": [sft, rollouts],
                      "pi05_policy.action_horizon": 10}  # fmt: skip
    returns = _bindings("returns", ["compute_returns.datasets"])["compute_returns.datasets"]
    assert [d["failure_reward"] for d in returns] == [-300.0] * 3


@pytest.fixture(scope="module")
def rlinf_rehearsal(tmp_path_factory, fresh_standins):
    """The RLinf pipeline on fresh stand-ins (one process per step), then Step 3 (1 rank) on
    its value model exported to RLinf's format and imported back."""
    import time

    tmp = tmp_path_factory.mktemp("rlinf_rehearsal")
    standins = fresh_standins(tmp / "standins")
    runs = tmp / "runs"
    start = time.perf_counter()
    done = rehearse(PIPELINE, standins, runs, tmp, ranks=1)
    # the trained value model -> RLinf's full_weights.pt -> recap, then Step 3 on it (1 rank, in
    # this process: no launcher, no second interpreter)
    rlinf = tmp / "rlinf" / "full_weights.pt"
    imported = tmp / "imported_value"
    assert (
        import_main(["export-rlinf-value", str(run_dir(runs, "value")), "--out", str(rlinf)]) == 0
    )
    configs = ["--vision-config", str(standins.siglip), "--text-config", str(standins.gemma3)]
    # the range the value model trained with (SFT only): what an RLinf user has as
    # data.return_min / return_max; Step 3 reads the imported values back with it
    trained = json.loads((run_dir(runs, "value") / "processor.json").read_text())
    configs += ["--return-range", *(str(v) for v in trained["return_range"])]
    configs += ["--resize", "antialias"]  # recap trained it: its images were antialiased
    assert import_main(["rlinf-value", str(rlinf), "--out", str(imported), *configs]) == 0
    step3 = [f'include "{TINY}"', *(b.removeprefix("all:") for b in standins.bindings()),
             f'compute_advantages.model_path = "{imported}"', 'compute_advantages.tag = "imported"',
             f'compute_advantages.output_dir = "{tmp / "imported_advantages"}"',
             "Tracker.enabled = False"]  # fmt: skip
    out = io.StringIO()
    with one_rank_here(out):
        parse_gin([EXP.format("advantages")], step3)
        compute_advantages(configured(AdvantagesConfig)())
    print(f"RLinf rehearsal wall time: {time.perf_counter() - start:.0f} s")
    return standins, runs, done.stdout, rlinf, imported, out.getvalue()


def test_rlinf_pipeline_runs_every_stage(rlinf_rehearsal):
    standins, runs, out, _, _, _ = rlinf_rehearsal
    for stage in STAGES:
        assert f"] {stage} (" in out
    assert "] baseline (" not in out  # RLinf's experiment has none
    # Step 1: -300 at a failed episode's end (train: episodes 1, 3, 4 fail)
    returns = pq.read_table(standins.train / "meta" / "returns.parquet")
    rewards = returns.column("reward").to_numpy()
    assert sorted(set(rewards.tolist())) == [-300.0, -1.0, 0.0]
    assert int((rewards == -300.0).sum()) == 3 and returns.num_rows == 66
    # the value model: trained on the 51 SFT frames, evaluated on the 66 rollout frames
    value = metrics(run_dir(runs, "value"))
    assert "eval/value_spearman" in value and np.isfinite(value["train/loss"])
    # Step 3: both training datasets labelled, every SFT frame positive, global threshold
    tag = f"adv_{run_dir(runs, 'advantages').name}"
    sft = pq.read_table(standins.sft / "meta" / f"advantages_{tag}.parquet")
    train = pq.read_table(standins.train / "meta" / f"advantages_{tag}.parquet")
    assert (sft.num_rows, train.num_rows) == (51, 66)
    assert sft.column("advantage").to_numpy().all()
    assert not list(standins.eval.glob("meta/advantages_*.parquet"))
    record = yaml.safe_load((standins.train / "meta" / "mixture_config.yaml").read_text())
    entry = record["tags"][tag]
    assert (entry["lookahead"], entry["positive_quantile"], entry["scope"]) == (10, 0.3, "global")
    assert type(entry["unified_threshold"]) is float
    # the policy: positive-only conditioning (RLinf), fine-tuned from PI05_BASE
    policy = metrics(run_dir(runs, "policy"))
    assert "train/loss_conditional" in policy or "train/conditional" in policy
    assert (run_dir(runs, "policy") / "model.safetensors").is_file()


def test_rlinf_value_checkpoint_is_gemma1_and_step3_on_the_import_matches(rlinf_rehearsal):
    """The trained value model exports to RLinf's key layout (Gemma1 expert: no q/k norms);
    imported back, a full Step 3 on it gives the pipeline's advantages to the bit."""
    standins, runs, _, rlinf, imported, out = rlinf_rehearsal
    state = torch.load(rlinf, weights_only=True)
    expert = "value_expert.experts.value.model.layers.0."
    assert expert + "post_attention_layernorm.weight" in state
    assert not any(k.startswith(expert) and "norm" in k and "layernorm" not in k for k in state)
    config = json.loads((imported / "config.json").read_text())
    assert (config["expert_style"], config["expert_width"], config["expert_depth"]) == (
        "gemma1", 32, 2)  # fmt: skip
    assert "positives: " in out
    assert f"from {imported / 'processor.json'}" in out  # the range it trained with (SFT)
    tag = f"adv_{run_dir(runs, 'advantages').name}"
    for dataset in (standins.sft, standins.train):
        ours = pq.read_table(dataset / "meta" / "advantages_imported.parquet")
        theirs = pq.read_table(dataset / "meta" / f"advantages_{tag}.parquet")
        assert ours.num_rows == theirs.num_rows
        for name in ("value_current", "value_next", "advantage_continuous"):  # to the bit
            assert ours.column(name).equals(theirs.column(name)), name
        assert ours.column("advantage").equals(theirs.column("advantage"))
        assert np.ptp(ours.column("value_current").to_numpy()) > 0  # a model, not a constant
