"""The MLflow UI opens on recap's runs: experiments tagged as model development, the address of
an experiment's runs page, and (headless Chromium against `mlflow ui`) a two-point sweep's summary
runs compared side by side with the swept binding and the success metric."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gin
import pytest
from mlflow import MlflowClient

from recap.ports import free_port
from recap.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, Tracker, ui_address
from recap.workflow.pipeline import load_pipeline, plan, split_params
from recap.workflow.report import summary_metrics, track
from tests.chromium import CHROMIUM_MISSING, browser, chromium_path

REPO = Path(__file__).resolve().parents[1]
LRS = ("0.001", "0.0003")  # the swept binding's values, one per point
SUCCESS = (0.5, 0.75)  # the RECAP policy's closed-loop success at beta 1, one per point
SWEPT = "value/deepspeed_config.lr"


@pytest.fixture
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_experiments_are_tagged_as_model_development(tmp_path, monkeypatch, clean_gin):
    monkeypatch.delenv("RANK", raising=False)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(tracking_uri=uri)
    old = client.create_experiment("old", artifact_location=(tmp_path / "mlruns").as_uri())
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags  # made before the tag
    for name in ("new", "old"):
        tracker = Tracker(experiment=name, tracking_uri=uri)
        tracker.start(tmp_path / name, "train")
        tracker.finish()
    for name in ("new", "old"):
        tags = client.get_experiment_by_name(name).tags
        assert tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"
    new = client.get_experiment_by_name("new").experiment_id
    assert ui_address(uri, "new") == (
        f"http://127.0.0.1:5000/#/experiments/{new}/runs?workflowType=machine_learning"
    )
    assert ui_address(uri, "new", port=5123).startswith("http://127.0.0.1:5123/#/experiments/")
    assert ui_address(uri, "absent") == (
        "http://127.0.0.1:5000/#/experiments?workflowType=machine_learning"
    )


def _report(planned, success: float) -> dict[str, dict]:
    results = {
        "returns": {"frames": 1200},
        "value": {"train/loss": 1.2, "eval/value_spearman": 0.65,
                  "eval/value_spearman_untrained": 0.03},
        "advantages": {"frames": 1200, "positive_fraction": 0.3},
        "policy": {"train/loss": 0.05},
        "baseline": {"train/loss": 0.04},
        "evaluate_policy": {"success": {"beta_1": success, "beta_2": 0.6}, "num_episodes": 100},
        "evaluate_baseline": {"success": {"beta_1": 0.25}, "num_episodes": 100},
    }  # fmt: skip
    return {
        name: {"status": "ran", "wall_s": 10.0 + i, "fingerprint": item.fingerprint,
               "run_dir": str(item.run_dir) if item.run_dir else None, "result": results[name]}
        for i, (name, item) in enumerate(planned.items())
    }  # fmt: skip


def tiny_sweep(tmp_path: Path) -> tuple[str, list[str]]:
    """Two points of a value-lr sweep over the demo pipeline, tracked by the pipeline's own
    ``track`` (the summary run of each point); the stages' results are written by hand."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for i, (lr, success) in enumerate(zip(LRS, SUCCESS, strict=True)):
        own, scoped = split_params([f"value:deepspeed_config.lr = {lr}"])
        config = load_pipeline(
            ["demo/scratch.gin"], own, name=f"lr-{i:03d}", sweep_name="lr",
            run_root=str(tmp_path / "runs"),
        )  # fmt: skip
        planned = plan(config, scoped)
        report = _report(planned, success)
        assert summary_metrics(report)["success/policy/beta_1"] == success
        os.environ["MLFLOW_TRACKING_URI"] = uri
        try:
            assert track(config, scoped, report) == uri
        finally:
            del os.environ["MLFLOW_TRACKING_URI"]
    return uri, tiny_sweep_ids(uri)


def tiny_sweep_ids(uri: str) -> list[str]:
    """The summary runs' ids, point 0 first."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("pipeline").experiment_id
    runs = client.search_runs([experiment], order_by=["attributes.run_name ASC"])
    assert [r.info.run_name for r in runs] == ["lr-000", "lr-001"]
    return [r.info.run_id for r in runs]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[str, list[str]]:
    """The tiny sweep's tracking URI and its two summary runs (shared by the tests below)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        patch.delenv("RANK", raising=False)
        gin.clear_config()
        try:
            return tiny_sweep(tmp_path_factory.mktemp("sweep"))
        finally:
            gin.clear_config()


def test_sweep_summary_runs_carry_the_swept_binding_and_figures(sweep):
    uri, run_ids = sweep
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("pipeline")
    assert experiment.tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    for run_id, lr, success in zip(run_ids, LRS, SUCCESS, strict=True):
        run = client.get_run(run_id)
        assert run.data.params[SWEPT] == lr
        assert run.data.tags["recap.sweep"] == "lr"
        metrics = run.data.metrics
        assert metrics["success/policy/beta_1"] == success
        assert metrics["success/baseline/beta_1"] == 0.25
        assert metrics["value_eval_spearman"] == 0.65
        assert metrics["positive_fraction"] == 0.3
        assert metrics["wall_s/policy"] == 13.0


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow ui exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"mlflow ui did not answer {url} in {timeout} s")


def _click(page, selector: str) -> None:
    page.wait_for(f"document.querySelector({selector!r}) !== null")
    page.evaluate(f"document.querySelector({selector!r}).click()")


@pytest.mark.skipif(chromium_path() is None, reason=CHROMIUM_MISSING)
def test_mlflow_ui_compares_two_sweep_runs_in_chromium(sweep, tmp_path):
    uri, run_ids = sweep
    port = free_port()
    mlflow = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
              "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    with open(tmp_path / "mlflow-ui.log", "w") as log:
        proc = subprocess.Popen(mlflow, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", proc)
        experiment = MlflowClient(tracking_uri=uri).get_experiment_by_name("pipeline")
        with browser(1400, 1000) as page:
            # The address recap prints lands on the runs table in the model-training view
            # (a bare experiment address opens MLflow 3's GenAI overview: Traces, Judges, ...).
            page.goto(ui_address(uri, "pipeline", port=port))
            page.wait_for("document.body.innerText.includes('lr-001')", timeout=60)
            text = page.text()
            assert "lr-000" in text and "2 matching runs" in text
            assert "Model registry" in text and "Judges" not in text and "Sessions" not in text

            ids = ",".join(f'"{r}"' for r in run_ids)
            page.goto(
                f"http://127.0.0.1:{port}/#/compare-runs?runs=[{ids}]"
                f'&experiments=["{experiment.experiment_id}"]&workflowType=machine_learning'
            )
            page.wait_for("document.body.innerText.includes('success/policy/beta_1')", timeout=60)
            _click(page, "button[aria-label='Close']")  # the assistant panel
            _click(page, "button[aria-label='Parameters - Show diff only']")
            _click(page, "button[aria-label='Metrics - Show diff only']")
            page.wait_for("!document.body.innerText.includes('fingerprint/returns')")
            text = page.text()
            assert "Comparing 2 Runs from 1 Experiment" in text
            # the swept binding, its two values, and the success metric's two values
            params = text[text.index("Parameters\nShow diff only") : text.index("Metrics\n")]
            assert SWEPT in params and all(lr in params for lr in LRS)
            metrics = text[text.index("Metrics\n") : text.index("Artifacts")]
            assert "success/policy/beta_1" in metrics
            assert "0.75" in metrics and "0.5" in metrics
            assert "value_eval_spearman" not in metrics  # equal in both runs: diff only
            page.evaluate(
                "[...document.querySelectorAll('h2,h3,span,div')].find("
                "e => e.innerText === 'Run details').scrollIntoView({block: 'start'})"
            )
            shot = tmp_path / "mlflow-compare.png"
            page.screenshot(shot)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            if os.environ.get("RECAP_DOCS_SCREENSHOT"):  # refresh docs/img/mlflow-compare.png
                shutil.copy(shot, os.environ["RECAP_DOCS_SCREENSHOT"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
