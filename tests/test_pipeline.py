"""The one-command pipeline: Steps 1-4 on tiny demo data, one process per step (the pipeline's
``python`` launcher: what is tested here is planning, skipping finished steps, rerunning only what
a changed binding touches, tracking, inputs untouched; the pipeline under ``deepspeed`` on 2 ranks
is tests/test_rehearsal.py's, the printed launch commands are planned below)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recap.errors import RecapError
from recap.workflow.pipeline import load_pipeline, plan, split_params
from tests.helpers import REPO, launch_env, tree_hashes

PIPELINE = str(REPO / "scripts" / "pipeline.py")
STAGES = [
    "returns",
    "value",
    "advantages",
    "policy",
    "baseline",
    "evaluate_policy",
    "evaluate_baseline",
]


def tiny_params(root: Path) -> list[str]:
    data = root / "data"
    return [
        f'pipeline.run_root = "{root / "runs"}"',
        f'all:DEMO_DATA = "{data}"',
        f'all:DEMO_TOKENIZER = "{data / "tokenizer"}"',
        "value:train.max_steps = 2",
        "policy:train.max_steps = 2",
        "baseline:train.max_steps = 2",
        "evaluate:evaluate_policy.num_episodes = 4",
        "evaluate:evaluate_policy.batch_size = 4",
    ]


# one plain process per step: a DeepSpeed launch costs ~7 s of launcher imports before its ranks
# start, and nothing asserted here depends on the number of ranks; the steps log no MLflow runs of
# their own (importing MLflow costs each ~1-2 s): what is asserted here is the pipeline's run, each
# step's run is tests/test_rehearsal.py's (one per step) and tests/engine's
ONE_PROCESS = ['pipeline.launcher = "python"', "pipeline.ranks = 1", "all:Tracker.enabled = False"]


def pipeline(root: Path, *extra: str, timeout: int = 600) -> subprocess.CompletedProcess:
    params = [a for p in [*tiny_params(root), *ONE_PROCESS, *extra] for a in ("--gin_param", p)]
    cmd = [sys.executable, PIPELINE, "--gin_file", "demo/scratch.gin", *params]
    done = subprocess.run(
        cmd, cwd=root, env=launch_env(root), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"pipeline failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def statuses(out: str) -> dict[str, str]:
    """Stage -> "ran" / "skipped", from the summary table."""
    table = out[out.index("step ") :].splitlines()[1:]
    return {line.split()[0]: line.split()[1] for line in table if line.split()[0] in STAGES}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny demo data, its hashes, then one full pipeline run (one process per step)."""
    from recap.envs.reach import write_demo_datasets, write_demo_tokenizer

    root = tmp_path_factory.mktemp("pipeline")
    write_demo_datasets(
        root / "data", sft_episodes=3, rollout_episodes=4, eval_episodes=3, max_steps=30
    )
    write_demo_tokenizer(root / "data")
    before = tree_hashes(root / "data")
    start = time.perf_counter()
    first = pipeline(root)
    return {"root": root, "before": before, "first": first, "wall": time.perf_counter() - start}


def test_four_steps_run_and_print_the_summary(tiny):
    out = tiny["first"].stdout
    assert statuses(out) == {s: "ran" for s in STAGES}
    headline = next(line for line in out.splitlines() if line.startswith("pipeline 'scratch':"))
    for words in ("value eval Spearman", "(untrained ", "positive fraction", "policy loss"):
        assert words in headline
    fraction = float(headline.split("positive fraction ")[1].split(",")[0])
    assert fraction == pytest.approx(0.3, abs=0.01)  # quantile 0.3; ties at the threshold count
    assert "baseline success (beta 1)" in headline and "policy success (beta 1)" in headline
    assert "one training seed on one machine, an anecdote" in out  # the claim is the bench's
    assert "mlflow ui --backend-store-uri sqlite:///" in out
    runs = tiny["root"] / "runs"
    # the summary as printed, beside summary.json, for the pages that quote it
    (summary,) = (runs / "pipelines").glob("scratch-*/summary.txt")
    assert summary.read_text().startswith("pipeline 'scratch': value eval Spearman ")
    assert summary.read_text() in out
    (value_dir,) = (runs / "value").iterdir()
    assert (value_dir / "model.safetensors").is_file()
    (policy_dir,) = (runs / "policy").iterdir()
    record = json.loads((policy_dir / "closed_loop.json").read_text())
    assert record["num_episodes"] == 4 and set(record["success"]) == {"beta_1", "beta_2"}
    (adv_dir,) = (runs / "advantages").iterdir()
    tag = f"adv_{adv_dir.name}"
    for name in ("sft", "rollout"):
        assert (tiny["root"] / "data" / name / "meta" / f"advantages_{tag}.parquet").is_file()


def test_inputs_are_byte_identical_after_the_pipeline(tiny):
    after = tree_hashes(tiny["root"] / "data")
    assert {k: after[k] for k in tiny["before"]} == tiny["before"]
    added = sorted(set(after) - set(tiny["before"]))
    assert added  # the sidecars, and only sidecars, were added beside the data
    for rel in added:
        name = Path(rel).name
        assert Path(rel).parent.name == "meta", rel
        assert name.startswith(("returns", "advantages_adv_", "mixture_config")), rel


def test_pipeline_run_is_tracked_in_mlflow(tiny):
    db = sqlite3.connect(tiny["root"] / "mlflow.db")
    rows = db.execute(
        "select m.key, m.value from metrics m join runs r on m.run_uuid = r.run_uuid "
        "join experiments e on r.experiment_id = e.experiment_id where e.name = 'pipeline'"
    ).fetchall()
    metrics = dict(rows)
    assert metrics["positive_fraction"] == pytest.approx(0.3, abs=0.01)
    assert "value_eval_spearman" in metrics and "success/policy/beta_1" in metrics
    params = dict(db.execute("select key, value from params").fetchall())
    assert params["value/train.max_steps"] == "2"


def test_rerun_skips_finished_steps_and_a_changed_binding_reruns_its_dependents(tiny):
    root = tiny["root"]
    start = time.perf_counter()
    again = pipeline(root)
    assert statuses(again.stdout) == {s: "skipped" for s in STAGES}
    assert time.perf_counter() - start < tiny["wall"] / 3
    (old_policy,) = (root / "runs" / "policy").iterdir()
    changed = pipeline(root, "policy:deepspeed_config.lr = 5e-4")
    ran = {s for s, status in statuses(changed.stdout).items() if status == "ran"}
    assert ran == {"policy", "evaluate_policy"}
    policies = sorted(p.name for p in (root / "runs" / "policy").iterdir())
    assert len(policies) == 2 and old_policy.name in policies  # the earlier run is kept


# ---- planning (no launches) ---------------------------------------------------------------------


def fingerprints(tmp_path: Path, *extra: str) -> dict[str, str]:
    own, scoped = split_params([*tiny_params(tmp_path), *extra])
    config = load_pipeline(["demo/scratch.gin"], own)
    return {name: item.fingerprint for name, item in plan(config, scoped).items()}


def test_a_value_binding_changes_value_and_everything_after_it_only(tmp_path):
    base = fingerprints(tmp_path)
    assert fingerprints(tmp_path) == base  # deterministic
    changed = fingerprints(tmp_path, "value:deepspeed_config.lr = 3e-4")
    differ = {k for k in base if base[k] != changed[k]}
    assert differ == {"value", "advantages", "policy", "evaluate_policy"}
    quantile = fingerprints(tmp_path, "advantages:compute_advantages.positive_quantile = 0.5")
    assert {k for k in base if base[k] != quantile[k]} == {
        "advantages",
        "policy",
        "evaluate_policy",
    }


def test_a_gin_scope_named_like_a_step_is_reached_under_its_step_prefix(tmp_path):
    """``value:value/train.max_steps`` is the value step's binding ``value/train.max_steps``
    (gin scope ``value``), not the step's unscoped one."""
    own, scoped = split_params([*tiny_params(tmp_path), "value:value/train.max_steps = 7"])
    planned = plan(load_pipeline(["demo/scratch.gin"], own), scoped)
    assert "value/train.max_steps = 7" in planned["value"].params
    assert "train.max_steps = 2" in planned["value"].params  # tiny_params' own, untouched
    base = fingerprints(tmp_path)
    assert planned["value"].fingerprint != base["value"]
    assert planned["returns"].fingerprint == base["returns"]


def test_split_params():
    own, scoped = split_params(
        ["pipeline.ranks = 2", "value:train.max_steps = 3", "all:DEMO_DATA = 'x'"]
    )
    assert own == ["pipeline.ranks = 2"]
    assert scoped == {"value": ["train.max_steps = 3"], "all": ["DEMO_DATA = 'x'"]}


@pytest.mark.parametrize(
    "param, message",
    [
        ('pipeline.stages = ["policy"]', r"'policy' needs \['advantages'\]"),
        ('pipeline.launcher = "python"', r"pipeline.ranks: 2; use >= 1 \(exactly 1"),
        ('pipeline.steps = {"valu": []}', r"unknown step\(s\) \['valu'\]"),
    ],
)
def test_bad_pipeline_config(tmp_path, param, message):
    with pytest.raises(RecapError, match=message):
        load_pipeline(["demo/scratch.gin"], [*split_params(tiny_params(tmp_path))[0], param])


def test_bad_step_binding_fails_before_anything_runs(tmp_path, capsys):
    import gin

    from recap.workflow.pipeline import main

    params = [*tiny_params(tmp_path), "value:train.max_stepz = 3"]
    code = main(
        ["--gin_file", "demo/scratch.gin", *[a for p in params for a in ("--gin_param", p)]]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        "error: pipeline step value: gin config: train has no parameter 'max_stepz' (binding "
        "'train.max_stepz = 3'); nearest valid: max_steps\n"
    )
    assert not (tmp_path / "runs").exists()
    assert gin.config_str() == ""  # the failed plan left no bindings behind


def dry_run_error(tmp_path: Path, capsys, *extra: str) -> str:
    """The one error line of ``--dry_run`` with ``extra`` bindings (exit 2, nothing written)."""
    from recap.workflow.pipeline import main

    params = [*tiny_params(tmp_path), *extra]
    argv = ["--gin_file", "demo/scratch.gin", "--dry_run"]
    assert main([*argv, *[a for p in params for a in ("--gin_param", p)]]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not (tmp_path / "runs").exists()
    return captured.err


STEPS = "returns, value, advantages, policy, baseline, sft, finetune, finetune_bc, evaluate, all"


@pytest.mark.parametrize(
    "param, line",
    [
        ("value:value_model.expert_widht = 64", "pipeline step value: gin config: value_model has "
         "no parameter 'expert_widht' (binding 'value_model.expert_widht = 64'); nearest valid: "
         "expert_width, expert_depth, expert_style"),
        ("policy:pi05_policy.vision = {'hidden_size': 32, 'num_layers': 2}", "pipeline step "
         "policy: gin config: pi05_policy.vision has unknown key 'num_layers' (not a "
         "SiglipVisionConfig argument); nearest valid: num_hidden_layers, num_channels"),
        ("valeu:train.max_steps = 3", "--gin_param 'valeu:train.max_steps = 3': 'valeu' is not a "
         f"pipeline step; did you mean value:train.max_steps? (STEP one of {STEPS})"),
        ("valeu/train.max_steps = 3", "--gin_param 'valeu/train.max_steps = 3': 'valeu' is not a "
         f"pipeline step; did you mean value:train.max_steps? (STEP one of {STEPS})"),
        ("critic:train.max_steps = 3", "--gin_param 'critic:train.max_steps = 3': 'critic' is "
         f"not a pipeline step; bind STEP:train.max_steps with STEP one of {STEPS}"),
        ("evaluate_policy:x.y = 3", "--gin_param 'evaluate_policy:x.y = 3': 'evaluate_policy' is "
         f"not a pipeline step; did you mean evaluate:x.y? (STEP one of {STEPS})"),
        ("train.max_steps = 3", "--gin_param 'train.max_steps = 3': configures no step (the "
         "pipeline's own bindings are pipeline.*); bind STEP:train.max_steps with STEP one of "
         f"{STEPS}"),
        ('DATA = "/data"', "--gin_param 'DATA = \"/data\"': the pipeline's own config reads no "
         "macro DATA; bind STEP:DATA (all:DATA for every step)"),
    ],
)  # fmt: skip
def test_a_typo_in_a_model_size_or_a_step_name_is_one_line_before_any_launch(
    tmp_path, capsys, param, line
):
    assert dry_run_error(tmp_path, capsys, param) == f"error: {line}\n"


def test_a_fingerprint_hashes_the_complete_config_and_fails_loudly(tmp_path, monkeypatch):
    """Values that differ after character 6,000 (MLflow's param limit) are different stages;
    a macro counts through the values that read it; Tracker bindings (where a run is logged) do
    not count; no config text, no plan."""

    note = f'value:NOTE = "{"x" * 7000}a"'
    base = fingerprints(tmp_path, note, "value:train.step_name = %NOTE")
    other = fingerprints(tmp_path, note[:-2] + 'b"', "value:train.step_name = %NOTE")
    assert {k for k in base if base[k] != other[k]} == {
        "value",
        "advantages",
        "policy",
        "evaluate_policy",
    }
    tracked = fingerprints(
        tmp_path, note, "value:train.step_name = %NOTE", 'all:Tracker.experiment = "e"'
    )
    assert tracked == base
    assert fingerprints(tmp_path, note) == fingerprints(tmp_path)  # a macro nothing reads

    from recap import registry

    text = registry.GIN.text

    def broken(operative, max_line_length):  # in config_text only (parsing reads gin directly)
        if sys._getframe(2).f_code.co_name == "config_text":
            raise AttributeError("'Configurable' object has no attribute 'selector'")
        return text(operative, max_line_length)

    monkeypatch.setattr(registry.GIN, "text", broken)
    with pytest.raises(RecapError) as err:
        fingerprints(tmp_path)
    assert str(err.value) == (
        "pipeline step returns: its config could not be written (AttributeError: 'Configurable' "
        "object has no attribute 'selector'); the stage fingerprint needs its complete config"
    )


def test_sweep_plans_every_point_and_shares_common_steps(tmp_path, capsys):
    from recap.workflow.pipeline import main

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "name: s\ngin_files: [demo/scratch.gin]\n"
        'gin_params: [\'pipeline.stages = ["returns", "value", "advantages"]\']\n'
        "grid:\n  value:deepspeed_config.lr: [1.0e-4, 1.0e-3]\n"
        "  advantages:compute_advantages.positive_quantile: [0.3, 0.5]\n"
    )
    params = [a for p in tiny_params(tmp_path) for a in ("--gin_param", p)]
    assert main(["--sweep", str(sweep), "--dry_run", *params]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("==== sweep s: s-") for line in lines) == 4
    value = {line.split()[1] for line in lines if line.startswith("value ")}
    advantages = {line.split()[1] for line in lines if line.startswith("advantages ")}
    assert len(value) == 2 and len(advantages) == 4


LIBERO_PARAMS = [
    'all:DATA = "/data/lerobot"',
    'all:SIGLIP = "/models/siglip2"',
    'all:GEMMA = "/models/gemma-3-270m"',
    'all:TOKENIZER = "/models/paligemma_tokenizer.model"',
    'all:PI05_BASE = "/models/pi05_base"',
]


def libero_argv(tmp_path, params):
    args = ["--gin_file", "experiments/libero_pipeline.gin", "--dry_run"]
    params = [f'pipeline.run_root = "{tmp_path}"', *params]
    return [*args, *[a for p in params for a in ("--gin_param", p)]]


def test_the_libero_pipeline_plans_with_the_real_sizes(tmp_path, capsys):
    from recap.workflow.pipeline import main

    assert main(libero_argv(tmp_path, LIBERO_PARAMS)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == STAGES[:5]
    assert all("--num_gpus 8" in line for line in lines[1:])


def test_a_missing_required_binding_stops_the_plan_before_anything_runs(tmp_path, capsys):
    from recap.workflow.pipeline import main

    params = [p for p in LIBERO_PARAMS if "TOKENIZER" not in p]
    assert main(libero_argv(tmp_path, params)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "error: pipeline step policy: policy_data.tokenizer_path is required (macro TOKENIZER "
        "is %gin.REQUIRED); bind it, e.g. --gin_param 'policy:TOKENIZER = ...'\n"
    )
    assert not (tmp_path / ".pipeline").exists()
