"""Step 2 end to end on tiny demo data: train the demo value model in a real process (the same
command `make demo` runs, one rank here), then reload the exported weights in this process."""

import json
import subprocess
import sys

import gin
import pytest
import torch

import recap.steps.train  # noqa: F401  (registers the train step and engine configurables)
from recap.cli import parse_gin
from recap.configurable import configured
from recap.data.datasets import ValueDataConfig
from recap.engine.inference import load_exported
from recap.envs.reach import write_demo_datasets, write_demo_tokenizer
from recap.models.value import value_model
from recap.steps.compute_returns import ReturnsConfig, compute_returns
from tests.helpers import REPO, launch_env

STEPS = 6


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("value")
    data = root / "demo_data"
    write_demo_datasets(data, seed=0, sft_episodes=4, rollout_episodes=8, eval_episodes=3)
    write_demo_tokenizer(data)
    gin.clear_config()
    compute_returns(ReturnsConfig(
        datasets=[{"name": n, "root": str(data / n), "type": t}
                  for n, t in (("sft", "sft"), ("rollout", "rollout"), ("eval", "rollout"))]
    ))  # fmt: skip
    params = [
        f'value_data.data_root = "{data}"',
        f'value_data.tokenizer_path = "{data / "tokenizer"}"',
        f'train.run_dir = "{root / "run"}"',
        f"train.max_steps = {STEPS}",
        "train.log_every = 1",
        f"train.eval_every = {STEPS}",
        "train.save_every = 0",
    ]
    env = launch_env(root)
    cmd = [sys.executable, str(REPO / "scripts" / "train.py"), "--gin_file", "demo/value.gin"]
    for p in params:
        cmd += ["--gin_param", p]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = {}
    for line in (root / "run" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        metrics.setdefault(row["step"], {}).update(row)
    return {"root": root, "params": params, "metrics": metrics, "stdout": done.stdout}


def test_training_logs_the_spec_metrics(run):
    last = run["metrics"][STEPS]
    for key in ("train/loss", "train/value_mae", "train/predicted_value_mean",
                "train/predicted_value_std", "train/target_value_mean", "train/target_value_std",
                "train/value_spearman", "train/grad_norm", "lr/backbone", "lr/head",
                "eval/loss", "eval/value_spearman"):  # fmt: skip
        assert key in last, key
    assert 3.0 < run["metrics"][1]["train/loss"] < 6.5  # about ln 201 = 5.3 untrained
    # the untrained model is evaluated before the first step: what training is measured against
    untrained = run["metrics"][0]
    assert "eval/value_spearman" in untrained and "train/loss" not in untrained
    assert untrained["eval/predicted_value_std"] < 0.01  # SPEC: an untrained model's std ~0.01
    assert untrained["eval/target_value_std"] == last["eval/target_value_std"]
    # warmup 30 steps, f(s) = (s + 1) / 30 for 0-based s; logged after the scheduler stepped
    assert last["lr/head"] == pytest.approx(1e-3 * (STEPS + 1) / 30)


def test_exported_weights_reload_and_reproduce_the_eval(run):
    gin.clear_config()
    parse_gin(["demo/value.gin"], run["params"])
    model = configured(value_model)()
    load_exported(model, run["root"] / "run" / "model.safetensors")
    data = configured(ValueDataConfig)(split="eval").build()
    batch = data.__getitems__(list(range(len(data))))
    # One thread, as in the training subprocess (launch_env): after a few steps the predictions
    # nearly tie, so another thread count's float sums can swap ranks in the Spearman.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            loss, metrics = model.eval()(batch)
    finally:
        torch.set_num_threads(threads)
    summary = model.summarize_eval({k: v for k, v in metrics.items() if v.dim()})
    expected = run["metrics"][STEPS]
    assert float(loss.mean()) == pytest.approx(expected["eval/loss"], rel=1e-5)
    assert summary["value_spearman"] == pytest.approx(expected["eval/value_spearman"], abs=1e-6)
    gin.clear_config()
