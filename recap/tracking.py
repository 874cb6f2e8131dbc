"""MLflow tracking on rank 0 only; any MLflow failure is a warning, never a crash.

Outside the engine: the pipeline, recap-iterate and the sweeps log their own runs with it without
importing torch or selecting an accelerator (the rank is the process group's when this process
has one, else the launcher's ``RANK``).

Store: ``Tracker.tracking_uri`` (gin) > ``MLFLOW_TRACKING_URI`` > ``sqlite:///mlflow.db`` in the
working directory, with artifacts in ``mlruns/`` beside the database. A run records: params = the
gin bindings (flattened, ``scope/name.param``), tags = pipeline step, git commit, sweep name,
metrics every log interval, and artifacts: ``config/config.gin`` (the parsed config,
``recap.configurable.config_text``) at start, ``config/operative_config.gin`` after the first
step, ``config/deepspeed_config.json``, and plots.
Restarting the same run directory continues the same MLflow run (``mlflow_run.json``).

Experiments are tagged ``mlflow.experimentKind = custom_model_development``, so MLflow 3's UI
opens them on their runs (model training), not on its GenAI overview; ``ui_address`` is the
address of an experiment's runs page with ``?workflowType=machine_learning``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from recap.configurable import config_entries, config_text, configurable

DEFAULT_URI = "sqlite:///mlflow.db"
RUN_FILE = "mlflow_run.json"
MAX_PARAM_CHARS = 6000
# MLflow 3's UI opens an experiment by this tag: GenAI (traces) unless it says model development.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
UI_HOST, UI_PORT = "127.0.0.1", 5000  # `mlflow ui`'s defaults


def ui_command(tracking_uri: str) -> str:
    """The command that serves the UI on ``tracking_uri``."""
    return f"mlflow ui --backend-store-uri {tracking_uri}"


def ui_address(tracking_uri: str, experiment: str, host: str = UI_HOST, port: int = UI_PORT) -> str:
    """The UI page of ``experiment``'s runs, as model training (``workflowType``); the
    experiments list when the store cannot be read or has no such experiment."""
    base = f"http://{host}:{port}/#/experiments"
    try:
        from mlflow import MlflowClient

        found = MlflowClient(tracking_uri=tracking_uri).get_experiment_by_name(experiment)
    except Exception:
        found = None
    if found is None:
        return f"{base}?workflowType=machine_learning"
    return f"{base}/{found.experiment_id}/runs?workflowType=machine_learning"


def gin_bindings() -> dict[str, str]:
    """Every gin binding as ``{"scope/name.param": value}`` and every macro as ``{"NAME":
    value}``, as gin writes them (``recap.configurable.config_entries``), each cut at MLflow's
    param limit (empty, with a warning, if gin fails to write its config): for MLflow params
    only, where a miss must not stop a run. Stage fingerprints resolve the config instead and
    fail loudly (``recap.workflow.fingerprints``)."""
    try:
        entries = [*config_entries(macros=True), *config_entries()]
        return {key: text[:MAX_PARAM_CHARS] for key, text in entries}
    except Exception as exc:
        warnings.warn(f"could not flatten gin bindings: {exc}", stacklevel=2)
        return {}


def git_commit(directory: str | os.PathLike | None = None) -> str:
    """HEAD commit of the checkout holding this package (``+dirty`` if modified), or of the
    repository at ``directory``. ``"unknown"`` when there is none (recap installed from a wheel:
    a git repository around site-packages is not recap's), git is missing or fails."""
    package = Path(__file__).resolve().parents[1]  # the recap package directory
    cwd = Path(directory) if directory is not None else package
    try:
        run = functools.partial(subprocess.run, cwd=cwd, capture_output=True, text=True, timeout=10)
        if directory is None:
            top = run(["git", "rev-parse", "--show-toplevel"])
            if top.returncode != 0 or Path(top.stdout.strip()).resolve() != package.parent:
                return "unknown"
        head = run(["git", "rev-parse", "HEAD"]).stdout.strip()
        dirty = run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
        return f"{head}+dirty" if head and dirty else head or "unknown"
    except Exception:
        return "unknown"


def is_main_process() -> bool:
    """Rank 0: of the process group when this process has one (torch.distributed, if torch is
    loaded at all), else of the launcher (``RANK``, unset in a plain process)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def _safe(method):
    """Run a tracker method on rank 0 when enabled; turn any exception into a warning."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        starting = method.__name__ == "start"
        if not self.active or (self.run_id is None and not starting):
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            warnings.warn(f"mlflow {method.__name__} failed (run continues): {exc}", stacklevel=2)
            if starting:
                self.enabled = False
            return None

    return wrapper


@configurable()
class Tracker:
    """One MLflow run per training run directory, written by rank 0."""

    def __init__(
        self,
        experiment: str = "recap",
        tracking_uri: str | None = None,
        run_name: str | None = None,
        sweep_name: str = "",
        enabled: bool = True,
    ):
        self.experiment, self.run_name, self.sweep_name = experiment, run_name, sweep_name
        self.uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
        self.enabled = enabled
        self.client: Any = None
        self.run_id: str | None = None

    @property
    def active(self) -> bool:
        return self.enabled and is_main_process()

    def _experiment_id(self) -> str:
        """The experiment's id, created (or, made by an older recap, tagged) as a model
        development experiment."""
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            if found.tags.get(EXPERIMENT_KIND_TAG) is None:
                self.client.set_experiment_tag(
                    found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
                )
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:///"):
            db = Path(self.uri[len("sqlite:///") :]).resolve()
            location = (db.parent / "mlruns").as_uri()
        return self.client.create_experiment(
            self.experiment,
            artifact_location=location,
            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
        )

    def _resumable_run(self, run_file: Path) -> str | None:
        if not run_file.is_file():
            return None
        saved = json.loads(run_file.read_text())
        if saved.get("tracking_uri") != self.uri:
            return None
        try:
            self.client.update_run(saved["run_id"], status="RUNNING")
        except Exception:  # deleted, or another store under the same relative URI: new run
            return None
        return saved["run_id"]

    @_safe
    def start(self, run_dir: str | os.PathLike, step_name: str, tags: dict | None = None) -> None:
        """Open (or resume) the run, log gin bindings as params and the full gin config."""
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        run_file = Path(run_dir) / RUN_FILE
        self.run_id = self._resumable_run(run_file)
        if self.run_id is None:
            all_tags = {
                "recap.step": step_name,
                "recap.git_commit": git_commit(),
                "recap.sweep": self.sweep_name,
                "recap.run_dir": str(run_dir),
                **(tags or {}),
            }
            run = self.client.create_run(
                self._experiment_id(), tags=all_tags, run_name=self.run_name or Path(run_dir).name
            )
            self.run_id = run.info.run_id
            run_file.parent.mkdir(parents=True, exist_ok=True)
            run_file.write_text(json.dumps({"run_id": self.run_id, "tracking_uri": self.uri}))
        self.log_params(gin_bindings())
        self.log_text(config_text(), "config/config.gin")

    @_safe
    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in sorted(params.items())]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    @_safe
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, int(step)) for k, v in sorted(metrics.items())]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    @_safe
    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    @_safe
    def log_dict(self, dictionary: dict, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, dictionary, artifact_file)

    @_safe
    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Log a matplotlib figure (e.g. ``plots/eval_step_100.png``) and close it."""
        try:
            self.client.log_figure(self.run_id, figure, artifact_file)
        finally:
            from matplotlib import pyplot as plt

            plt.close(figure)

    @_safe
    def log_png(self, path: str | os.PathLike, artifact_path: str = "plots") -> None:
        """Log an image file a step already wrote."""
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    @_safe
    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status)
