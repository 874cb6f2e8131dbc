"""recap-iterate: two iterations of collect + Steps 1-4 on tiny demo data (one process per step,
CPU) with scripted-expert corrections; a rerun skips both; one MLflow run per iteration; one-line
config errors."""

from __future__ import annotations

import json
import os
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
        *extra,
    ]


def argv(root: Path, *extra: str) -> list[str]:
    params = [a for p in iterate_params(root, *extra) for a in ("--gin_param", p)]
    return ["--gin_file", "demo/iterate.gin", *params]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """Tiny demo data; the 2-iteration loop (baseline, then 2 x Steps 1-4: 7 trainings); the
    same command again with every launch and collection made to fail, and its dry run."""
    import recap.iterate as iterate
    import recap.pipeline as pipeline
    from recap.data.synthetic import write_demo_datasets, write_demo_tokenizer

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


def test_each_iteration_has_its_own_returns_tag(loop):
    """Step 1 writes ``{tag}_iter{k}`` (the demo's tag is empty: ``iter{k}``) beside every
    dataset, so iteration 2 never overwrites iteration 1's returns."""
    root = loop["root"]
    for k, r in enumerate(loop["first"], start=1):
        fingerprint = r["stages"]["returns"]["fingerprint"]
        binding = {"returns": "compute_returns.tag", "value": "value_data.returns_tag",
                   "advantages": "compute_advantages.returns_tag"}  # fmt: skip
        for step, key in binding.items():
            fingerprint = r["stages"][step]["fingerprint"]
            marker = root / "runs" / ".pipeline" / f"{step}-{fingerprint}.json"
            assert f'{key} = "iter{k}"' in json.loads(marker.read_text())["params"]
    iter1, iter2 = (Path(r["collect"]["out"]) / "meta" for r in loop["first"])
    for meta in (root / "data" / "sft" / "meta", root / "data" / "rollout" / "meta", iter1):
        assert (meta / "returns_iter1.parquet").is_file()
        assert (meta / "returns_iter2.parquet").is_file()
    assert (iter2 / "returns_iter2.parquet").is_file()
    assert not (iter2 / "returns_iter1.parquet").exists()  # collected after iteration 1's Step 1


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


def test_the_records_of_a_loop_outlive_a_rewrite_of_its_base_returns(loop):
    """Another loop over the same base data rewrites ``returns_iter1`` beside it (same content,
    a new time): the iteration no longer counts as finished, its marker's record still reads."""
    import recap.iterate as iterate

    root = loop["root"]
    sidecar = root / "data" / "sft" / "meta" / "returns_iter1.parquet"
    before = sidecar.stat()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        params = iterate_params(root)
        records = iterate.recorded_iterations(["demo/iterate.gin"], params)
        assert [r["key"] for r in records] == [r["key"] for r in loop["first"]]
        assert [r["stages"]["policy"]["run_dir"] for r in records] == [
            r["stages"]["policy"]["run_dir"] for r in loop["first"]]  # fmt: skip
        config, scoped, settings = iterate.load(["demo/iterate.gin"], params)
        start, _, _ = iterate.plan_start(config, scoped, settings)
        first = iterate.plan_iterations(config, scoped, settings, start)[0]
        where = iterate.root_of(config, settings).resolve()
        assert iterate.finished_iteration(where, first) is not None
        try:
            os.utime(sidecar, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
            assert iterate.finished_iteration(where, first) is None
            again = iterate.recorded_iterations(["demo/iterate.gin"], params)
            assert [r["key"] for r in again] == [r["key"] for r in records]
        finally:
            os.utime(sidecar, ns=(before.st_atime_ns, before.st_mtime_ns))
            gin.clear_config()
        assert iterate.finished_iteration(where, first) is not None


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
        ('iterate.env = "mujoco"', "iterate.env: 'mujoco'; use one of ['reach', 'libero']"),
        ('iterate.policy_init = "warm"',
         "iterate.policy_init: 'warm'; use one of ['retrain', 'finetune']"),
        ('iterate.env = "libero"', "iterate.expert: env 'libero' has no scripted expert; set "
         "iterate.expert = False"),
        ("iterate.iteratons = 2", "gin config: iterate has no parameter 'iteratons' (binding "
         "'iterate.iteratons = 2'); nearest valid: iterations"),
    ],
)  # fmt: skip
def test_a_bad_loop_setting_is_one_line_and_exit_2(tmp_path, capsys, param, line):
    from recap.iterate import main

    assert main([*argv(tmp_path, param), "--dry_run"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: {line}\n"
    assert not (tmp_path / "runs").exists()
    assert gin.config_str() == ""


def test_the_loop_settings_are_one_dataclass_coerced_to_its_annotations():
    """gin configures ``IterateConfig`` itself (no factory repeating its fields): a float bound
    to an int field and an int to a float one come out as the annotation says."""
    from recap.iterate import IterateConfig

    settings = IterateConfig(iterations=2.0, episodes=4.0, beta=1, max_steps=8.0)
    assert (settings.iterations, settings.episodes, settings.max_steps) == (2, 4, 8)
    assert type(settings.iterations) is int and type(settings.max_steps) is int
    assert settings.beta == 1.0 and type(settings.beta) is float
    assert settings.num_steps is None and settings.seed == 2000
    assert settings.collection()["beta"] == 1.0 and "iterations" not in settings.collection()


def test_finetune_starts_each_policy_from_the_previous_one(loop):
    """``policy_init = "finetune"``: iteration k's policy starts from policy k-1's weights (the
    baseline for k = 1), a binding its fingerprint hashes; the value model is retrained."""
    from recap.iterate import load, plan_iterations, plan_start

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
