"""MLflow contents of the end-to-end runs: params, metrics, gin artifacts, sweep runs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def client_and_runs(tmp):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("toy")
    return client, client.search_runs([experiment.experiment_id])


def test_run_has_params_metrics_and_gin_artifacts(two_rank):
    client, runs = client_and_runs(two_rank["tmp"])
    (run,) = [r for r in runs if r.data.tags["recap.run_dir"] == str(two_rank["run_dir"])]
    assert run.info.status == "FINISHED"
    assert run.data.params["deepspeed_config.zero_stage"] == "3"
    assert run.data.params["train.max_steps"] == "8"
    assert run.data.tags["recap.step"] == "train"
    assert run.data.tags["recap.world_size"] == "2"
    assert run.data.tags["recap.git_commit"]
    assert {"train/loss", "train/grad_norm", "lr/head", "eval/loss", "eval/pearson"} <= set(
        run.data.metrics
    )
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert {m.step for m in history} == set(range(1, 9))
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "config")}
    assert artifacts == {
        "config/config.gin",
        "config/operative_config.gin",
        "config/deepspeed_config.json",
    }
    config = client.download_artifacts(run.info.run_id, "config/config.gin", str(two_rank["tmp"]))
    assert "train.model_fn = @toy_model" in open(config).read()
    assert client.list_artifacts(run.info.run_id, "plots")


def test_sweep_gives_two_runs_with_different_varied_binding(sweep):
    _, runs = client_and_runs(sweep["tmp"])
    swept = [r for r in runs if r.data.tags.get("recap.sweep") == "test_sweep"]
    assert len(swept) == 2
    assert sorted(r.data.params["deepspeed_config.lr"] for r in swept) == ["0.001", "0.002"]
    assert all(r.info.status == "FINISHED" for r in swept)
    assert sweep["stdout"].count(" -m recap.commands.train ") == 2
