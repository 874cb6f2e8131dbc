"""The pipeline's stages as objects, planned on the demo pipeline (gin only, nothing launched):
each stage's bindings, run directory and outputs as literal strings, its summary figures, its
fingerprint (pinned: a move reruns every run root's demo stages), and the
``STEP:binding`` command-line syntax (the older ``STEP/binding`` still works, with a warning)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recap.errors import RecapError
from recap.workflow.bindings import Binding, lines, literal
from recap.workflow.pipeline import (
    SWEEP_KEYS,
    config_text,
    load_pipeline,
    main,
    plan,
    split_params,
)
from recap.workflow.report import summary_metrics, summary_table
from recap.workflow.stages import BY_NAME, SCOPES, STAGES, STEP_KEYS, Planned

# The from-scratch demo pipeline as shipped (gin/demo/scratch.gin, no command-line binding; it was
# gin/demo/pipeline.gin, with the same bindings, until RLinf's recipe became `make demo`), computed
# over each stage's resolved config and its step's STEP_VERSION (they moved once from the
# config_str() fingerprints, #38). A change here reruns every demo stage of every run root: only a
# change to what they hash may move them (the demo's gin files, a default of a configurable its
# steps read, a STEP_VERSION).
DEMO_FINGERPRINTS = {
    "returns": "449213778227ce201bc9e49fe1437f624b5ba89d49b0634f478af40962628a6c",
    "value": "cfc56ddc74e8b89279d69c7775a6e71d440413c505d6ea5afcbfff7b7c1ec90d",
    "advantages": "3593f5c24a9ae5e40d9f9492bd0be6c31b239d8f856e5e56b28e819f1ce4cdd4",
    "policy": "27d0fcce84ee7b37575f740f0b4ddf6ebdea3945a6458e546c946173a015579c",
    "baseline": "2167f5f99ba90a7ab704e84f5cb02c38517902d2400343deba46ff2daaa0686f",
    "evaluate_policy": "16990d1085540ca13ebb8e7cdf778432c00416fc8280378d72e4ee89ceb07acf",
    "evaluate_baseline": "dfb9b1d9dde04d98da3bcce92652fd0c2c32a01407cba5b78a2a1e3506bf3764",
}
VALUE = "runs/pipeline/value/cfc56ddc74e8"
ADVANTAGES = "runs/pipeline/advantages/3593f5c24a9a"
POLICY = "runs/pipeline/policy/27d0fcce84ee"
BASELINE = "runs/pipeline/baseline/2167f5f99ba9"
TAG = 'policy_data.advantages_tag = "adv_3593f5c24a9a"'
ZERO1 = "deepspeed_config.zero_stage = 1"
EVALUATE = ["evaluate_policy.num_episodes = 100", "evaluate_policy.betas = [1.0, 2.0]"]

# stage -> (inputs, run dir, owned bindings, output files, every binding it runs with)
WIRING = {
    "returns": ([], None, [], [
        "demo_data/sft/meta/returns.parquet",
        "demo_data/rollout/meta/returns.parquet",
        "demo_data/eval/meta/returns.parquet",
    ], []),
    "value": ([], VALUE, [f'train.run_dir = "{VALUE}"'], [f"{VALUE}/model.safetensors"],
              [f'train.run_dir = "{VALUE}"', 'Tracker.run_name = "scratch/value"']),
    "advantages": (
        [f'compute_advantages.model_path = "{VALUE}"'], ADVANTAGES,
        ['compute_advantages.tag = "adv_3593f5c24a9a"',
         f'compute_advantages.output_dir = "{ADVANTAGES}"'],
        ["demo_data/sft/meta/advantages_adv_3593f5c24a9a.parquet",
         "demo_data/rollout/meta/advantages_adv_3593f5c24a9a.parquet"],
        [f'compute_advantages.model_path = "{VALUE}"',
         'compute_advantages.tag = "adv_3593f5c24a9a"',
         f'compute_advantages.output_dir = "{ADVANTAGES}"',
         'Tracker.run_name = "scratch/advantages"'],
    ),
    "policy": ([TAG], POLICY, [f'train.run_dir = "{POLICY}"'], [f"{POLICY}/model.safetensors"],
               [ZERO1, TAG, f'train.run_dir = "{POLICY}"', 'Tracker.run_name = "scratch/policy"']),
    "baseline": ([], BASELINE, [f'train.run_dir = "{BASELINE}"'],
                 [f"{BASELINE}/model.safetensors"],
                 [ZERO1, f'train.run_dir = "{BASELINE}"', 'Tracker.run_name = "scratch/baseline"']),
    "evaluate_policy": (
        [TAG], POLICY, [f'evaluate_policy.run_dir = "{POLICY}"', f'train.run_dir = "{POLICY}"'],
        [], [ZERO1, *EVALUATE, TAG, f'evaluate_policy.run_dir = "{POLICY}"',
             f'train.run_dir = "{POLICY}"'],
    ),
    "evaluate_baseline": (
        [], BASELINE,
        [f'evaluate_policy.run_dir = "{BASELINE}"', f'train.run_dir = "{BASELINE}"'], [],
        [ZERO1, *EVALUATE, f'evaluate_policy.run_dir = "{BASELINE}"',
         f'train.run_dir = "{BASELINE}"'],
    ),
}  # fmt: skip

DEPRECATED = (
    "warning: --gin_param {old!r}: STEP/binding is deprecated (it hides gin scopes named like a "
    "step); write {new!r}\n"
)


@pytest.fixture(scope="module")
def demo():
    """The demo pipeline as shipped, planned: (config, planned)."""
    config = load_pipeline(["demo/scratch.gin"], [])
    return config, plan(config, {})


def fingerprints(*params: str) -> dict[str, str]:
    own, scoped = split_params(list(params))
    planned = plan(load_pipeline(["demo/scratch.gin"], own), scoped)
    return {name: item.fingerprint for name, item in planned.items()}


def test_the_demo_fingerprints_are_pinned(demo):
    _, planned = demo
    assert {name: item.fingerprint for name, item in planned.items()} == DEMO_FINGERPRINTS


def test_the_stage_classes_say_what_runs():
    rows = [(type(s).__name__, s.name, s.step, s.needs, s.module, s.entry, s.distributed,
             s.evaluation, s.scopes) for s in STAGES]  # fmt: skip
    train, evaluate = "recap.commands.train", "recap.commands.evaluate_policy"
    assert rows == [
        ("ReturnsStage", "returns", "returns", (), "recap.commands.compute_returns",
         "compute_returns", False, False, ("all", "returns")),
        ("ValueStage", "value", "value", ("returns",), train, "train", True, False,
         ("all", "value")),
        ("AdvantagesStage", "advantages", "advantages", ("value",),
         "recap.commands.compute_advantages", "compute_advantages", True, False,
         ("all", "advantages")),
        ("PolicyStage", "policy", "policy", ("advantages",), train, "train", True, False,
         ("all", "policy")),
        ("PolicyStage", "baseline", "baseline", (), train, "train", True, False,
         ("all", "baseline")),
        ("EvaluateStage", "evaluate_policy", "policy", ("policy",), evaluate, "evaluate_policy",
         False, True, ("all", "policy", "evaluate")),
        ("EvaluateStage", "evaluate_baseline", "baseline", ("baseline",), evaluate,
         "evaluate_policy", False, True, ("all", "baseline", "evaluate")),
        ("PolicyStage", "sft", "sft", (), train, "train", True, False, ("all", "sft")),
        ("FinetuneStage", "finetune", "finetune", ("advantages", "sft"), train, "train", True,
         False, ("all", "finetune")),
        ("FinetuneStage", "finetune_bc", "finetune_bc", ("sft",), train, "train", True, False,
         ("all", "finetune_bc")),
        ("PairedEvaluateStage", "evaluate_finetune_bc", "finetune_bc", ("finetune_bc",),
         evaluate, "evaluate_policy", False, True, ("all", "finetune_bc", "evaluate")),
        ("PairedEvaluateStage", "evaluate_finetune", "finetune", ("finetune",), evaluate,
         "evaluate_policy", False, True, ("all", "finetune", "evaluate")),
    ]  # fmt: skip
    assert list(BY_NAME) == [s.name for s in STAGES]
    assert STEP_KEYS == ("returns", "value", "advantages", "policy", "baseline", "sft",
                         "finetune", "finetune_bc")  # fmt: skip
    assert SCOPES == (*STEP_KEYS, "evaluate", "all")


@pytest.mark.parametrize("name", list(WIRING))
def test_each_stage_owns_its_inputs_run_dir_and_outputs(demo, name):
    config, planned = demo
    inputs, run_dir, owned, outputs, params = WIRING[name]
    item, stage = planned[name], BY_NAME[name]
    assert item.stage is stage
    assert lines(stage.inputs(planned)) == inputs
    own_dir, own = stage.owned(item.fingerprint, planned, config.run_root)
    assert (own_dir, lines(own)) == (None if run_dir is None else Path(run_dir), owned)
    assert item.run_dir == (None if run_dir is None else Path(run_dir))
    assert [str(p) for p in item.outputs] == outputs
    assert item.params == params


def demo_report(planned: dict[str, Planned]) -> dict[str, dict]:
    results = {
        "returns": {"frames": 1200},
        "value": {"train/loss": 1.23456, "eval/loss": 2.5, "eval/value_spearman": 0.71234,
                  "eval/value_spearman_untrained": 0.1},
        "advantages": {"frames": 1200, "positive_fraction": 0.3025},
        "policy": {"train/loss": 0.045678, "eval/loss": 0.05},
        "baseline": {"train/loss": 0.04},
        "evaluate_policy": {"success": {"beta_1": 0.5, "beta_2": 0.75}, "num_episodes": 100},
        "evaluate_baseline": {"success": {"beta_1": 0.25, "beta_2": 0.3}, "num_episodes": 100},
    }  # fmt: skip
    return {
        name: {"status": "skipped" if name == "returns" else "ran", "wall_s": 12.3 + i,
               "fingerprint": item.fingerprint,
               "run_dir": str(item.run_dir) if item.run_dir else None, "result": results[name]}
        for i, (name, item) in enumerate(planned.items())
    }  # fmt: skip


def test_the_summary_reads_as_before_the_stages_were_objects(demo):
    """Metric names and order (MLflow, the sweep table) and the table text, as the pipeline
    wrote them before its stages were objects."""
    config, planned = demo
    report = demo_report(planned)
    assert list(summary_metrics(report).items()) == [
        ("wall_s/returns", 12.3), ("wall_s/value", 13.3), ("value_eval_spearman", 0.71234),
        ("value_eval_spearman_untrained", 0.1), ("wall_s/advantages", 14.3),
        ("positive_fraction", 0.3025), ("wall_s/policy", 15.3), ("policy_train_loss", 0.045678),
        ("wall_s/baseline", 16.3), ("baseline_train_loss", 0.04),
        ("wall_s/evaluate_policy", 17.3), ("success/policy/beta_1", 0.5),
        ("success/policy/beta_2", 0.75), ("wall_s/evaluate_baseline", 18.3),
        ("success/baseline/beta_1", 0.25), ("success/baseline/beta_2", 0.3),
    ]  # fmt: skip
    assert summary_table(config, report, "sqlite:///mlflow.db").splitlines() == [
        "pipeline 'scratch': value eval Spearman 0.712 (untrained 0.100), positive fraction 0.302, "
        "policy loss 0.04568, baseline success (beta 1) 0.25, policy success (beta 1) 0.50",
        "step               status   wall  result                                             "
        "                    outputs",
        "returns            skipped  12 s  1200 frames",
        "value              ran      13 s  eval Spearman 0.712, untrained 0.100, train loss "
        f"1.235, eval loss 2.5  {VALUE}",
        "advantages         ran      14 s  positive fraction 0.302 of 1200 frames             "
        f"                    {ADVANTAGES}",
        "policy             ran      15 s  train loss 0.04568, eval loss 0.05                 "
        f"                    {POLICY}",
        "baseline           ran      16 s  train loss 0.04                                    "
        f"                    {BASELINE}",
        "evaluate_policy    ran      17 s  success beta 1: 0.50, beta 2: 0.75 (100 episodes)  "
        f"                    {POLICY}",
        "evaluate_baseline  ran      18 s  success beta 1: 0.25, beta 2: 0.30 (100 episodes)  "
        f"                    {BASELINE}",
        "closed-loop success above: one training seed on one machine, an anecdote, not evidence; "
        "RECAP vs BC over seeds with 95% intervals: python bench/recap_vs_bc.py "
        "(docs/results/recap-vs-bc.md)",
        "compare runs: mlflow ui --backend-store-uri sqlite:///mlflow.db   (experiment "
        "'pipeline': one run per pipeline configuration)",
    ]
    partial = {k: report[k] for k in ("returns", "advantages")}
    assert summary_table(config, partial, "u").splitlines()[0] == (
        "pipeline 'scratch': positive fraction 0.302"
    )


def test_each_stage_reads_its_result_from_its_outputs(tmp_path):
    pq.write_table(pa.table({"x": list(range(7))}), tmp_path / "r1.parquet")
    pq.write_table(pa.table({"x": list(range(5))}), tmp_path / "r2.parquet")
    pq.write_table(pa.table({"advantage": [1, 0, 0, 1, 1]}), tmp_path / "a1.parquet")
    pq.write_table(pa.table({"advantage": [0, 0, 1]}), tmp_path / "a2.parquet")
    records = [
        {"step": 0, "eval/value_spearman": 0.05, "eval/loss": 9.0},
        {"step": 5, "train/loss": 1.5, "lr": 1e-3},
        {"step": 10, "train/loss": 1.2, "eval/loss": 2.0, "eval/value_spearman": 0.6,
         "eval/value_mae": 0.1},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    closed_loop = {"success": {"beta_1": 0.5}, "num_episodes": 8, "seconds": 3}
    (tmp_path / "closed_loop.json").write_text(json.dumps(closed_loop))
    outputs = {"returns": ["r1", "r2"], "advantages": ["a1", "a2"]}

    def result(name: str) -> dict:
        files = [tmp_path / f"{f}.parquet" for f in outputs.get(name, [])]
        return BY_NAME[name].result(Planned(BY_NAME[name], "f" * 64, [], [], tmp_path, files))

    trained = {"eval/loss": 2.0, "eval/value_mae": 0.1, "eval/value_spearman": 0.6,
               "eval/value_spearman_untrained": 0.05, "train/loss": 1.2}  # fmt: skip
    assert result("returns") == {"frames": 12}
    assert result("advantages") == {"frames": 8, "positive_fraction": 0.5}
    assert result("value") == result("policy") == result("baseline") == trained
    assert result("evaluate_policy") == {"success": {"beta_1": 0.5}, "num_episodes": 8}
    assert BY_NAME["value"].describe({}) == ""  # a run with no metrics.jsonl yet


# ---- STEP:binding --------------------------------------------------------------------------


def test_a_step_colon_binding_reaches_its_step(capsys):
    own, scoped = split_params(
        ["pipeline.ranks = 2", "value:train.max_steps = 5", " all : DEMO_DATA = 'x'",
         'all:include "demo/paths.gin"', "evaluate:evaluate_policy.num_episodes = 3"]
    )  # fmt: skip
    assert own == ["pipeline.ranks = 2"]
    assert scoped == {
        "value": ["train.max_steps = 5"],
        "all": ["DEMO_DATA = 'x'", 'include "demo/paths.gin"'],
        "evaluate": ["evaluate_policy.num_episodes = 3"],
    }
    own, scoped = split_params(["value:train.max_steps = 5"])
    planned = plan(load_pipeline(["demo/scratch.gin"], own), scoped)
    assert planned["value"].params[0] == "train.max_steps = 5"
    assert all("max_steps" not in p for p in planned["policy"].params)
    assert capsys.readouterr().err == ""  # no deprecation warning


def test_step_colon_reaches_a_gin_scope_named_like_the_step():
    """``value:value/train.max_steps = 1`` binds gin scope ``value`` inside the value step: it is
    in the step's complete config (what the fingerprint hashes), not the unscoped binding."""
    import gin

    from recap.workflow.pipeline import _parse_step

    own, scoped = split_params(["value:value/train.max_steps = 1"])
    assert scoped == {"value": ["value/train.max_steps = 1"]}
    planned = plan(load_pipeline(["demo/scratch.gin"], own), scoped)
    item = planned["value"]
    assert item.params[0] == "value/train.max_steps = 1"
    try:
        _parse_step(item.files, item.params, "value")
        text = config_text("value")
        assert gin.query_parameter("value/train.max_steps") == 1
        assert gin.query_parameter("train.max_steps") != 1
    finally:
        gin.clear_config()
    assert "value/train.max_steps = 1" in text.splitlines()
    differ = {k for k, v in DEMO_FINGERPRINTS.items() if planned[k].fingerprint != v}
    assert differ == {"value", "advantages", "policy", "evaluate_policy"}


def test_the_old_step_slash_form_still_works_with_one_warning_line(capsys):
    old = [
        "value/train.max_steps = 5",
        "value/value/train.max_steps = 7",  # the prefix comes off once, as it always did
        "all/DEMO_DATA = 'x'",
        "value/train.max_steps = 5",  # the same binding again: warned once
    ]
    assert split_params(old) == split_params(
        ["value:train.max_steps = 5", "value:value/train.max_steps = 7", "all:DEMO_DATA = 'x'",
         "value:train.max_steps = 5"]
    )  # fmt: skip
    assert capsys.readouterr().err == "".join(
        DEPRECATED.format(old=o, new=n)
        for o, n in [
            ("value/train.max_steps = 5", "value:train.max_steps = 5"),
            ("value/value/train.max_steps = 7", "value:value/train.max_steps = 7"),
            ("all/DEMO_DATA = 'x'", "all:DEMO_DATA = 'x'"),
        ]
    )
    assert capsys.readouterr().err == ""
    assert fingerprints("policy/deepspeed_config.lr = 5e-4") == fingerprints(
        "policy:deepspeed_config.lr = 5e-4"
    )
    assert capsys.readouterr().err == DEPRECATED.format(
        old="policy/deepspeed_config.lr = 5e-4", new="policy:deepspeed_config.lr = 5e-4"
    )


def test_a_sweep_warns_once_per_old_binding_and_ships_the_colon_form(tmp_path, capsys):
    from recap.sweep import binding, load_sweep, points

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "name: s\ngin_files: [demo/scratch.gin]\n"
        "gin_params: ['pipeline.stages = [\"returns\", \"value\"]', 'value/train.max_steps = 2']\n"
        "grid:\n  value/deepspeed_config.lr: [1.0e-4, 1.0e-3]\n"
    )
    params = ["--gin_param", f'pipeline.run_root = "{tmp_path / "runs"}"']
    assert main(["--sweep", str(sweep), "--dry_run", *params]) == 0
    assert capsys.readouterr().err == "".join(
        DEPRECATED.format(old=o, new=o.replace("/", ":", 1))
        for o in ["value/train.max_steps = 2", "value/deepspeed_config.lr = 0.0001",
                  "value/deepspeed_config.lr = 0.001"]
    )  # fmt: skip
    # the shipped sweep binds STEP:binding keys: no warning
    spec = load_sweep("sweeps/demo_value_lr_quantile.yaml", SWEEP_KEYS)
    for point in points(spec["grid"]):
        bindings = [binding(k, v) for k, v in point.items()]
        assert sorted(split_params([*spec["gin_params"], *bindings])[1]) == ["advantages", "value"]
    assert capsys.readouterr().err == ""


def test_a_stage_handing_a_parameter_its_step_lacks_fails_the_plan_in_one_line(monkeypatch):
    from recap.workflow.stages import AdvantagesStage

    def renamed(self, planned):
        return [Binding("compute_advantages", "value_model_path", planned["value"].run_dir)]

    monkeypatch.setattr(AdvantagesStage, "inputs", renamed)
    with pytest.raises(RecapError) as err:
        plan(load_pipeline(["demo/scratch.gin"], []), {})
    assert str(err.value) == (
        "binding compute_advantages.value_model_path: compute_advantages "
        "(recap.steps.compute_advantages) takes no parameter 'value_model_path'; rename it where "
        "a stage hands it"
    )


def test_binding_values_are_written_as_literals_gin_reads_back():
    import gin

    from recap.cli import parse_gin
    from recap.registry import register

    register("compute_returns")
    value = [{"name": "d\u00e9mo \"x\"", "root": Path("/data/a b"), "weight": 0.5, "n": None},
             (1,), True]  # fmt: skip
    assert literal(value) == (
        '[{"name": "d\\u00e9mo \\"x\\"", "root": "/data/a b", "weight": 0.5, "n": None}, '
        "(1,), True]"
    )
    gin.clear_config()
    try:
        parse_gin([], [Binding("compute_returns", "datasets", value).line()])
        assert gin.query_parameter("compute_returns.datasets") == [
            {"name": 'd\u00e9mo "x"', "root": "/data/a b", "weight": 0.5, "n": None},
            (1,),
            True,
        ]
    finally:
        gin.clear_config()
    with pytest.raises(RecapError) as err:
        literal(object)
    assert str(err.value) == (
        "binding value <class 'object'>: not a literal (string, path, number, bool, None, or a "
        "list, tuple or dict of those)"
    )
    with pytest.raises(RecapError) as err:
        Binding("compute_retunrs", "tag", "x").line()
    assert str(err.value).startswith(
        "binding compute_retunrs.tag: 'compute_retunrs' is not one of recap's configurables ("
    )
