"""MLflow tracker: rank 0 only, default/overridden store, failures are warnings."""

from __future__ import annotations

import warnings

import gin
import pytest

from recap.tracking import Tracker, gin_bindings, git_commit

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@gin.configurable
def _demo(a=1, b="x"):
    return a, b


def test_gin_bindings_are_flattened_with_scopes(clean_gin):
    gin.parse_config(["_demo.a = 3", "sc/_demo.b = 'y'"])
    assert gin_bindings() == {"_demo.a": "3", "sc/_demo.b": "'y'"}


def test_tracker_logs_params_metrics_and_artifacts(tmp_path, monkeypatch, clean_gin):
    monkeypatch.delenv("RANK", raising=False)
    gin.parse_config(["_demo.a = 5"])
    tracker = Tracker(experiment="unit", tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        tracker.start(tmp_path / "run", "train", {"extra": "1"})
        tracker.log_metrics({"train/loss": 0.5}, step=1)
        tracker.log_dict({"k": 1}, "config/x.json")
        tracker.finish()
    run = tracker.client.get_run(tracker.run_id)
    assert run.data.params == {"_demo.a": "5"}
    assert run.data.metrics == {"train/loss": 0.5}
    assert run.data.tags["recap.step"] == "train" and run.data.tags["extra"] == "1"
    assert (tmp_path / "mlruns").is_dir()
    again = Tracker(experiment="unit", tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    again.start(tmp_path / "run", "train")
    assert again.run_id == tracker.run_id  # same run directory = same MLflow run


def test_mlflow_failure_is_a_warning_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    tracker = Tracker(tracking_uri="nosuchscheme://nowhere")
    with pytest.warns(UserWarning, match="mlflow start failed"):
        tracker.start(tmp_path, "train")
    tracker.log_metrics({"x": 1.0}, step=1)  # disabled now: silently nothing
    tracker.finish()


def test_only_rank_zero_tracks(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    tracker = Tracker(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    tracker.start(tmp_path, "train")
    assert tracker.run_id is None and not (tmp_path / "m.db").exists()


def test_git_commit_is_a_string():
    assert isinstance(git_commit(), str) and git_commit()


def test_importing_tracking_and_ports_loads_neither_torch_nor_the_engine():
    """The pipeline, recap-iterate and the sweeps log and pick ports without selecting an
    accelerator (``recap.engine`` selects one when imported)."""
    import subprocess
    import sys

    loaded = "[m for m in ('torch', 'deepspeed', 'recap.engine') if m in sys.modules]"
    code = f"import sys, recap.tracking, recap.ports; print({loaded})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
