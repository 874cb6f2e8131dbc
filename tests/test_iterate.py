"""recap-iterate: two iterations of collect + Steps 1-4 on tiny demo data (one process per step,
CPU) with scripted-expert corrections; a rerun skips both; one MLflow run per iteration; one-line
config errors."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import gin
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recap.core.thresholds import IS_CORRECTION
from recap.data.lerobot import LocalDataset
from recap.envs.rollout import COLLECT_FILE
from tests.helpers import launch_env
from tests.test_pipeline import tiny_params

STEPS = ("returns", "value", "advantages", "policy")  # rerun every iteration
ENV_KEYS = ("DS_ACCELERATOR", "MLFLOW_TRACKING_URI", "PYTHONWARNINGS", "OMP_NUM_THREADS",
            "TOKENIZERS_PARALLELISM")  # fmt: skip


def iterate_params(root: Path, *extra: str) -> list[str]:
    """The pipeline test's tiny steps, one process each, no closed-loop evaluation; 4 episodes
    of at most 8 steps per iteration, corrected by the expert when 2 (dx, dy) off."""
    return [
        *tiny_params(root),
        "pipeline.evaluate = False",
        'pipeline.launcher = "python"',
        "pipeline.ranks = 1",
        "iterate.episodes = 4",
        "iterate.num_envs = 4",
        "iterate.max_steps = 8",
        "iterate.expert = True",
        "iterate.drift = 2.0",
        "iterate.takeover_steps = 2",
        'iterate.image_dtype = "image"',
        "all:Tracker.enabled = False",  # the iterations' runs are asserted, not each step's
        *extra,
    ]


def argv(root: Path, *extra: str) -> list[str]:
    params = [a for p in iterate_params(root, *extra) for a in ("--gin_param", p)]
    return ["--gin_file", "demo/iterate.gin", *params]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """Tiny demo data; the 2-iteration loop (baseline, then 2 x Steps 1-4: 7 trainings); the
    same command again with every launch and collection made to fail, and its dry run."""
    import recap.workflow.iterate as iterate
    import recap.workflow.pipeline as pipeline
    from recap.envs.reach import write_demo_datasets, write_demo_tokenizer

    root = tmp_path_factory.mktemp("iterate")
    write_demo_datasets(
        root / "data", sft_episodes=3, rollout_episodes=4, eval_episodes=3, max_steps=30
    )
    write_demo_tokenizer(root / "data")
    env = launch_env(root)
    params = iterate_params(root)
    out = {"root": root}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for key in ENV_KEYS:
            mp.setenv(key, env[key])
        start = time.perf_counter()
        out["first"], out["uri"], _ = iterate.run_iterations(["demo/iterate.gin"], params)
        out["first_wall"] = time.perf_counter() - start
        out["trained"] = {s: sorted((root / "runs" / s).iterdir()) for s in ("value", "policy")}

        def no_launch(*args, **kwargs):
            raise AssertionError(f"a finished iteration launched {args[0]}")

        def no_collect(*args, **kwargs):
            raise AssertionError("a finished iteration collected again")

        mp.setattr(pipeline.subprocess, "run", no_launch)
        mp.setattr(iterate, "collect_rollouts", no_collect)
        start = time.perf_counter()
        out["again"], _, _ = iterate.run_iterations(["demo/iterate.gin"], params)
        out["again_wall"] = time.perf_counter() - start
        out["trained_again"] = {s: sorted((root / "runs" / s).iterdir()) for s in out["trained"]}
        with pytest.MonkeyPatch.context() as capture:
            lines: list[str] = []
            capture.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
            iterate.run_iterations(["demo/iterate.gin"], params, dry=True)
        out["dry"] = lines
    gin.clear_config()
    return out


def flags(dataset: Path, column: str) -> pa.Table:
    """(episode_index, frame_index, the boolean ``column``) of every frame of a dataset."""
    with LocalDataset(dataset) as ds:
        return ds.read_columns(["episode_index", "frame_index", column], flags=[column])


def test_two_iterations_collect_then_run_steps_1_to_4(loop):
    first, root = loop["first"], loop["root"]
    assert [(r["iteration"], r["status"], r["collect"]["status"]) for r in first] == [
        (1, "ran", "ran"),
        (2, "ran", "ran"),
    ]
    for r in first:  # Steps 1-4 ran; the baseline (policy 0) ran once, in iteration 0
        assert {s: e["status"] for s, e in r["stages"].items()} == {
            **{s: "ran" for s in STEPS},
            "baseline": "skipped",
        }
    # each step reads the base datasets plus every rollout so far (returns: sft, rollout, eval)
    assert first[0]["datasets"] == {"returns": 4, "value": 3, "advantages": 3, "policy": 3}
    assert first[1]["datasets"] == {"returns": 5, "value": 4, "advantages": 4, "policy": 4}
    one, two = ({s: e["fingerprint"] for s, e in r["stages"].items()} for r in first)
    assert {s for s in one if one[s] != two[s]} == set(STEPS)
    assert one["baseline"] == two["baseline"]
    # policy 0 is the baseline, policy 1 iteration 1's RECAP policy
    baseline = first[0]["stages"]["baseline"]["run_dir"]
    assert Path(baseline).parent == root / "runs" / "baseline"
    assert first[0]["collect"]["run_dir"] == baseline
    assert first[1]["collect"]["run_dir"] == first[0]["stages"]["policy"]["run_dir"]
    assert first[1]["collect"]["policy_fingerprint"] == one["policy"]
    assert len(loop["trained"]["value"]) == 2 and len(loop["trained"]["policy"]) == 2


def test_each_iteration_writes_its_rollout_dataset(loop):
    root = loop["root"]
    for k, r in enumerate(loop["first"], start=1):
        out = Path(r["collect"]["out"])
        assert out.parent == root / "runs" / "iterate" / f"iter{k}"
        assert out.name == f"rollout-{r['collect']['fingerprint'][:12]}"
        record = json.loads((out / COLLECT_FILE).read_text())
        assert (record["iteration"], record["seed"], record["num_episodes"]) == (k, 1996 + 4 * k, 4)
        assert (record["expert"], record["takeover_steps"], record["drift"]) == (True, 2, 2.0)
        with LocalDataset(out) as ds:
            assert (ds.num_episodes, ds.info["codebase_version"]) == (4, "v3.0")
            assert 4 <= ds.num_frames <= 32 and ds.num_frames == r["collect"]["frames"]
            assert {"is_success", IS_CORRECTION} <= set(ds.info["features"])
        rows = flags(out, "is_success")
        assert rows.num_rows == r["collect"]["frames"]
        won = {e for e, ok in zip(*(rows.column(c).to_pylist() for c in ("episode_index",
               "is_success"))) if ok}  # fmt: skip
        assert len(won) == r["collect"]["successes"] == record["successes"]


def returns_tag(root: Path, record: dict) -> str:
    """The Step 1 tag an iteration's returns stage ran with (its pipeline marker's params)."""
    fingerprint = record["stages"]["returns"]["fingerprint"]
    marker = root / "runs" / ".pipeline" / f"returns-{fingerprint}.json"
    (tag,) = [p for p in json.loads(marker.read_text())["params"] if "compute_returns.tag" in p]
    return tag.split('"')[1]


def test_each_iteration_has_its_own_returns_tag(loop):
    """Step 1 writes ``{tag}_iter{k}_{F[:12]}`` (the demo's tag is empty), ``F`` Step 1's
    fingerprint under ``iter{k}``, beside every dataset: iteration 2 never overwrites iteration
    1's returns, and no other loop writes either; Steps 2 and 3 read that tag."""
    root = loop["root"]
    tags = [returns_tag(root, r) for r in loop["first"]]
    for k, (r, tag) in enumerate(zip(loop["first"], tags, strict=True), start=1):
        assert tag.startswith(f"iter{k}_") and len(tag) == len(f"iter{k}_") + 12
        binding = {"value": "value_data.returns_tag",
                   "advantages": "compute_advantages.returns_tag"}  # fmt: skip
        for step, key in binding.items():
            fingerprint = r["stages"][step]["fingerprint"]
            marker = root / "runs" / ".pipeline" / f"{step}-{fingerprint}.json"
            assert f'{key} = "{tag}"' in json.loads(marker.read_text())["params"]
    iter1, iter2 = (Path(r["collect"]["out"]) / "meta" for r in loop["first"])
    for meta in (root / "data" / "sft" / "meta", root / "data" / "rollout" / "meta", iter1):
        assert (meta / f"returns_{tags[0]}.parquet").is_file()
        assert (meta / f"returns_{tags[1]}.parquet").is_file()
    assert (iter2 / f"returns_{tags[1]}.parquet").is_file()
    assert not (iter2 / f"returns_{tags[0]}.parquet").exists()  # collected after iteration 1


def test_expert_corrections_are_labelled_positive(loop):
    """The expert took over some frames (not all: drift 2.0), and Step 3 labelled every one of
    them positive in the iteration's advantages sidecar, while other frames stay negative."""
    for r in loop["first"]:
        out = Path(r["collect"]["out"])
        rows = flags(out, IS_CORRECTION)
        corrected = rows.column(IS_CORRECTION).to_numpy(zero_copy_only=False)
        assert 0 < int(corrected.sum()) == r["collect"]["corrections"] < rows.num_rows
        tag = f"adv_{r['stages']['advantages']['fingerprint'][:12]}"
        sidecar = pq.read_table(out / "meta" / f"advantages_{tag}.parquet")
        joined = sidecar.join(rows, ["episode_index", "frame_index"])
        assert joined.num_rows == rows.num_rows
        label = joined.column("advantage").to_numpy(zero_copy_only=False).astype(bool)
        mask = joined.column(IS_CORRECTION).to_numpy(zero_copy_only=False)
        assert label[mask].all()
        # forced: a corrected frame's continuous advantage is below a negative frame's, so the
        # threshold alone would have labelled it negative
        continuous = joined.column("advantage_continuous").to_numpy()
        assert continuous[mask].min() < continuous[~label].max()
        sidecars = sorted((loop["root"] / "data").glob(f"*/meta/advantages_{tag}.parquet"))
        assert [p.parents[1].name for p in sidecars] == ["rollout", "sft"]  # Step 3's base data
        labels = [pq.read_table(p, columns=["advantage"]).column(0).to_numpy() for p in sidecars]
        assert not np.concatenate([*labels, label]).astype(bool).all()  # negatives too


def test_each_iteration_is_one_mlflow_run(loop):
    db = sqlite3.connect(loop["root"] / "mlflow.db")
    assert loop["uri"] == f"sqlite:///{loop['root'] / 'mlflow.db'}"
    query = (
        "select r.run_uuid, r.name, t.value from runs r join experiments e on "
        "r.experiment_id = e.experiment_id join tags t on t.run_uuid = r.run_uuid "
        "where e.name = 'iterate' and t.key = 'iteration' order by t.value"
    )
    runs = db.execute(query).fetchall()
    assert [(name, k) for _, name, k in runs] == [
        ("demo_iterate-iter1", "1"),
        ("demo_iterate-iter2", "2"),
    ]
    for (run, _, _), r in zip(runs, loop["first"], strict=True):
        metrics = dict(db.execute("select key, value from metrics where run_uuid = ?", (run,)))
        params = dict(db.execute("select key, value from params where run_uuid = ?", (run,)))
        assert metrics["iteration"] == r["iteration"]
        assert metrics["collect/corrections"] == r["collect"]["corrections"]
        assert metrics["collect/success"] == r["collect"]["successes"] / 4
        advantages = r["stages"]["advantages"]["result"]
        assert metrics["positive_fraction"] == advantages["positive_fraction"]
        assert params["fingerprint/policy"] == r["stages"]["policy"]["fingerprint"][:12]
        assert params["collect.out"] == r["collect"]["out"]
        assert params["iterate.drift"] == "2.0"


def test_a_rerun_skips_both_iterations_and_trains_nothing(loop):
    """The rerun had every launch and every collection replaced by a failure: it finished, so it
    started none; no new run directory, no new MLflow run."""
    statuses = [(r["iteration"], r["status"]) for r in loop["again"]]
    assert statuses == [(1, "skipped"), (2, "skipped")]
    assert [r["key"] for r in loop["again"]] == [r["key"] for r in loop["first"]]
    assert loop["trained_again"] == loop["trained"]
    db = sqlite3.connect(loop["root"] / "mlflow.db")
    count = db.execute(
        "select count(*) from runs r join experiments e on r.experiment_id = e.experiment_id "
        "where e.name = 'iterate'"
    ).fetchone()
    assert count == (2,)
    assert loop["again_wall"] < loop["first_wall"] / 3


def test_the_dry_run_after_the_loop_skips_everything(loop):
    first = loop["first"]
    baseline = Path(first[0]["stages"]["baseline"]["run_dir"]).name
    assert loop["dry"] == [
        f"iteration 0  baseline {baseline}  skip (finished)",
        f"iteration 1  {first[0]['key'][:12]}  skip (finished)",
        f"iteration 2  {first[1]['key'][:12]}  skip (finished)",
    ]


# ---- configuration errors (nothing runs) ---------------------------------------------------------


@pytest.mark.parametrize(
    "param, line",
    [
        ("iterate.iterations = 0", "iterate.iterations: 0; run at least one iteration"),
        ('iterate.env = "mujoco"', "iterate.env: 'mujoco'; use one of ['reach', 'metaworld', "
         "'libero'] or 'package.module:Factory'"),
        ('iterate.policy_init = "warm"',
         "iterate.policy_init: 'warm'; use one of ['retrain', 'finetune']"),
        ('iterate.env = "libero"', "iterate.expert: env 'libero' has no scripted expert; set "
         "iterate.expert = False"),
        ("iterate.iteratons = 2", "gin config: iterate has no parameter 'iteratons' (binding "
         "'iterate.iteratons = 2'); nearest valid: iterations"),
    ],
)  # fmt: skip
def test_a_bad_loop_setting_is_one_line_and_exit_2(tmp_path, capsys, param, line):
    from recap.workflow.iterate import main

    assert main([*argv(tmp_path, param), "--dry_run"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: {line}\n"
    assert not (tmp_path / "runs").exists()
    assert gin.config_str() == ""


def test_the_loop_settings_are_one_dataclass_coerced_to_its_annotations():
    """gin configures ``IterateConfig`` itself (no factory repeating its fields): a float bound
    to an int field and an int to a float one come out as the annotation says."""
    from recap.workflow.iterate import IterateConfig

    settings = IterateConfig(iterations=2.0, episodes=4.0, beta=1, max_steps=8.0)
    assert (settings.iterations, settings.episodes, settings.max_steps) == (2, 4, 8)
    assert type(settings.iterations) is int and type(settings.max_steps) is int
    assert settings.beta == 1.0 and type(settings.beta) is float
    assert settings.num_steps is None and settings.seed == 2000
    assert settings.collection()["beta"] == 1.0 and "iterations" not in settings.collection()


def test_finetune_starts_each_policy_from_the_previous_one(loop):
    """``policy_init = "finetune"``: iteration k's policy starts from policy k-1's weights (the
    baseline for k = 1), a binding its fingerprint hashes; the value model is retrained."""
    from recap.workflow.iterate import load, plan_iterations, plan_start

    params = iterate_params(loop["root"], 'iterate.policy_init = "finetune"')
    config, scoped, settings = load(["demo/iterate.gin"], params)
    start, _, _ = plan_start(config, scoped, settings)
    one, two = plan_iterations(config, scoped, settings, start)
    first = loop["first"]
    baseline = first[0]["stages"]["baseline"]["run_dir"]
    assert f'pi05_policy.checkpoint = "{baseline}"' in one.planned["policy"].params
    previous = one.planned["policy"].run_dir
    assert f'pi05_policy.checkpoint = "{previous}"' in two.planned["policy"].params
    assert one.planned["value"].fingerprint == first[0]["stages"]["value"]["fingerprint"]
    assert one.planned["policy"].fingerprint != first[0]["stages"]["policy"]["fingerprint"]
    assert gin.config_str() == ""


# ---- a robot's recordings as a round's collection ------------------------------------------------

RECORDED_STAGES = ("returns", "value", "advantages", "policy")
# the recorded round: Steps 1-4 only (no baseline: retraining needs no policy 0), its own name
# and MLflow experiment
RECORDED = (
    "pipeline.stages = ['returns', 'value', 'advantages', 'policy']",
    'pipeline.name = "demo_recorded"',
    'iterate.experiment = "recorded"',
)


def recorded_argv(root: Path, recording: Path, *extra: str) -> list[str]:
    """``recap-iterate --recorded DIR`` over the loop's base data."""
    return [*argv(root, *RECORDED), "--recorded", str(recording), *extra]


@pytest.fixture(scope="module")
def recorded_round(loop, tmp_path_factory):
    """20 reach episodes driven through openpi-client against a recording server (two steps of
    every third the scripted expert's), then ``recap-iterate --recorded DIR --serve`` over the
    loop's base data (recap-serve replaced by a stand-in that keeps its arguments)."""
    import recap.serve.launch as launch
    import recap.workflow.iterate as iterate
    from recap.serve.load import load_served
    from tests.serve.test_record import record_reach, write_reach_policy

    work = tmp_path_factory.mktemp("recorded")
    served = load_served(write_reach_policy(work / "policy"), beta=1.0, device="cpu")
    out = {"work": work, "sent": record_reach(served, work / "rec")}
    root = loop["root"]
    env = launch_env(root)
    base = sorted((root / "data").glob("*/meta/returns_*.parquet"))
    out["base_before"] = {p: p.stat().st_mtime_ns for p in base}
    served_argv: list[list[str]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for key in ENV_KEYS:
            mp.setenv(key, env[key])
        mp.setattr(launch, "serve", lambda options: served_argv.append(options) or 0)
        command = recorded_argv(root, work / "rec", "--serve", "--serve_args", "--port 0")
        start = time.perf_counter()
        out["exit"] = iterate.main(command)
        out["wall"] = time.perf_counter() - start
        out["served_argv"] = served_argv
        params = [*iterate_params(root, *RECORDED), *iterate.recorded_params([work / "rec"])]
        (out["record"],) = iterate.recorded_iterations(["demo/iterate.gin"], params)
    out["params"] = params
    gin.clear_config()
    return out


def test_twenty_reach_episodes_with_interventions_are_recorded(recorded_round):
    """The recording: state and actions exactly as the client sent them, images within the
    codec's tolerance, 14 intervention frames flagged (``tests/serve/test_record.py``)."""
    from tests.serve.test_record import check_twenty

    check_twenty(recorded_round["work"] / "rec", recorded_round["sent"])


def test_one_round_on_the_recordings_runs_steps_1_to_4_then_serves(recorded_round, loop):
    r, sent = recorded_round["record"], recorded_round["sent"]
    assert recorded_round["exit"] == 0
    assert {s: e["status"] for s, e in r["stages"].items()} == dict.fromkeys(RECORDED_STAGES, "ran")
    frames = sum(len(e["state"]) for e in sent)
    c = r["collect"]
    assert (c["status"], c["episodes"], c["corrections"], c["corrected_episodes"]) == (
        "ran", 20, 14, 7)  # fmt: skip
    assert (c["frames"], c["successes"]) == (frames, sum(e["success"] for e in sent))
    assert c["recorded"] == str((recorded_round["work"] / "rec").resolve())
    # the base data (returns: sft, rollout, eval; the others sft, rollout) and the recordings
    assert r["datasets"] == {"returns": 4, "value": 3, "advantages": 3, "policy": 3}
    merged = Path(c["out"])
    assert merged.parent == loop["root"] / "runs" / "iterate" / "iter1"
    assert merged.name == f"recorded-{c['fingerprint'][:12]}"
    with LocalDataset(merged) as ds:
        assert (ds.num_episodes, ds.num_frames) == (20, frames)
        t = ds.read_columns(["observation.state", "action"])
    for column, key in (("observation.state", "state"), ("action", "action")):
        np.testing.assert_array_equal(  # exactly what the client sent, episode after episode
            np.stack(t.column(column).to_numpy(zero_copy_only=False)),
            np.concatenate([np.stack(e[key]) for e in sent]),
        )
    policy = r["stages"]["policy"]["run_dir"]
    from recap.serve.launch import ServeOptions

    assert recorded_round["served_argv"] == [ServeOptions(policy, port=0)]


def test_every_intervention_frame_of_the_recordings_is_positive(recorded_round):
    r = recorded_round["record"]
    merged = Path(r["collect"]["out"])
    rows = flags(merged, IS_CORRECTION)
    tag = f"adv_{r['stages']['advantages']['fingerprint'][:12]}"
    sidecar = pq.read_table(merged / "meta" / f"advantages_{tag}.parquet")
    joined = sidecar.join(rows, ["episode_index", "frame_index"])
    assert joined.num_rows == rows.num_rows == r["collect"]["frames"]
    label = joined.column("advantage").to_numpy(zero_copy_only=False).astype(bool)
    mask = joined.column(IS_CORRECTION).to_numpy(zero_copy_only=False)
    assert (int(mask.sum()), int(label[mask].sum())) == (14, 14)
    episodes = joined.column("episode_index").to_numpy()
    assert sorted(set(episodes[mask].tolist())) == [1, 4, 7, 10, 13, 16, 19]
    base = sorted((merged.parents[3] / "data").glob(f"*/meta/advantages_{tag}.parquet"))
    assert [p.parents[1].name for p in base] == ["rollout", "sft"]  # Step 3's base data
    labels = [pq.read_table(p, columns=["advantage"]).column(0).to_numpy() for p in base]
    assert not np.concatenate([*labels, label]).astype(bool).all()  # negatives too


def test_the_new_policy_is_servable(recorded_round):
    """The round's policy directory loads as ``recap-serve`` loads it and answers a reach
    observation with a chunk of 7-dim actions."""
    from recap.envs.reach import ReachEnv
    from recap.serve.load import load_served
    from tests.serve.test_record import REACH, request

    policy = recorded_round["record"]["stages"]["policy"]["run_dir"]
    served = load_served(policy, beta=1.0, device="cpu")
    actions = served.infer(request(ReachEnv(REACH).reset(0)))["actions"]
    assert actions.dtype == np.float32 and actions.ndim == 2 and actions.shape[1] == 7
    assert np.isfinite(actions).all()


def test_two_loops_over_the_same_base_data_keep_their_own_returns(recorded_round, loop):
    """The recorded round ran Step 1 over the simulated loop's base data under a tag of its own:
    the loop's returns sidecars there were not rewritten, and a rerun of each loop (every
    launch, collection and merge made to fail) skips everything."""
    import recap.workflow.iterate as iterate
    import recap.workflow.pipeline as pipeline

    def no_launch(*args, **kwargs):
        raise AssertionError(f"a finished iteration launched {args[0]}")

    def no_collect(*args, **kwargs):
        raise AssertionError("a finished iteration collected again")

    root = loop["root"]
    ours = returns_tag(root, recorded_round["record"])
    theirs = [returns_tag(root, r) for r in loop["first"]]
    assert ours.startswith("iter1_") and ours not in theirs
    for path, mtime in recorded_round["base_before"].items():
        assert path.stat().st_mtime_ns == mtime
    for name in ("sft", "rollout", "eval"):
        assert (root / "data" / name / "meta" / f"returns_{ours}.parquet").is_file()
    env = launch_env(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for key in ENV_KEYS:
            mp.setenv(key, env[key])
        mp.setattr(pipeline.subprocess, "run", no_launch)
        mp.setattr(iterate, "collect_rollouts", no_collect)
        mp.setattr(iterate, "merge_recorded", no_collect)
        try:
            loop_again, _, _ = iterate.run_iterations(["demo/iterate.gin"], iterate_params(root))
            params = recorded_round["params"]
            recorded_again, _, _ = iterate.run_iterations(["demo/iterate.gin"], params)
        finally:
            gin.clear_config()
    assert [(r["iteration"], r["status"]) for r in loop_again] == [(1, "skipped"), (2, "skipped")]
    assert [(r["iteration"], r["status"]) for r in recorded_again] == [(1, "skipped")]


@pytest.mark.parametrize(
    "extra, line",
    [
        (["--gin_param", "iterate.recorded = ['a', 'b', 'c']", "--dry_run"],
         "iterate.recorded: 3 recording directories for iterations = 2; give one per iteration "
         "(or set iterate.iterations = 3)"),
        (["--serve", "--dry_run"],
         "--serve: a dry run trains no policy to serve; drop one of them"),
        (["--serve", "--serve_args", "--policy x"],
         "--serve_args: --policy is the last iteration's policy; leave it out"),
    ],
)  # fmt: skip
def test_a_bad_recorded_setting_is_one_line_and_exit_2(tmp_path, capsys, extra, line):
    from recap.workflow.iterate import main

    assert main([*argv(tmp_path, *RECORDED), *extra]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"
    assert not (tmp_path / "runs").exists()


def test_an_empty_recording_directory_is_one_line_and_exit_2(tmp_path, capsys):
    from recap.workflow.iterate import main

    (tmp_path / "rec" / "episode_000000").mkdir(parents=True)  # unfinished: no meta/info.json
    assert main([*recorded_argv(tmp_path, tmp_path / "rec"), "--dry_run"]) == 2
    assert capsys.readouterr().err == (
        f"error: iterate.recorded: {tmp_path / 'rec'} holds no finished episode "
        "(episode_NNNNNN/meta/info.json); record some with recap-serve --record "
        f"{tmp_path / 'rec'} first\n"
    )
    assert not (tmp_path / "runs").exists()


def test_the_loop_takes_any_env_the_factory_builds_with_its_options():
    """``iterate.env`` is checked against ``recap.envs.factory`` (its names, its experts, a
    ``module:Factory``); ``env_options`` enter the collection's fingerprint only when set, so
    collections made without them keep theirs."""
    from recap.errors import RecapError, one_line
    from recap.workflow.iterate import IterateConfig

    push = IterateConfig(iterations=1, env="metaworld", expert=True,
                         env_options={"env_name": "push-v3", "image_size": 32})  # fmt: skip
    assert push.collection()["env_options"] == {"env_name": "push-v3", "image_size": 32}
    assert "env_options" not in IterateConfig(iterations=1).collection()
    line = "tests.steps.test_evaluate_env:LineEnv"
    assert IterateConfig(iterations=1, env=line).env_options == {}
    with pytest.raises(RecapError) as caught:
        IterateConfig(iterations=1, env=line, expert=True)
    assert one_line(caught.value) == (f"iterate.expert: env {line!r} has no scripted expert; set "
                                      "iterate.expert = False")  # fmt: skip
