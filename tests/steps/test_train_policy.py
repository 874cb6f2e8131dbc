"""Step 4 end to end on tiny demo data: one launch of the demo policy on 2 CPU ranks (ZeRO-3,
paper-mode advantage prompts), then the exported weights reloaded in this process: equal to the
engine's own ZeRO-3 checkpoint consolidated by DeepSpeed, sampling reproducibly, and driving the
closed-loop evaluation step."""

from __future__ import annotations

import json
import subprocess

import gin
import numpy as np
import pytest
import torch

import recap.steps.train  # noqa: F401  (registers the train step and the policy configurables)
from recap.cli import parse_gin
from recap.configurable import configured
from recap.data.policy_data import PolicyDataConfig
from recap.engine.inference import load_exported
from recap.envs.reach import write_demo_datasets, write_demo_tokenizer
from recap.models.pi05 import frames_to_images, pi05_policy
from recap.ports import free_port
from recap.records import Evaluation
from recap.steps.evaluate_policy import EvaluateConfig, PolicyAdapter, evaluate_policy
from tests.data.test_policy_data import write_test_advantages
from tests.helpers import REPO, deepspeed_local, launch_env

STEPS = 24


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("policy")
    data = root / "demo_data"
    write_demo_datasets(data, seed=0, sft_episodes=3, rollout_episodes=4, eval_episodes=1)
    write_demo_tokenizer(data)
    gin.clear_config()
    write_test_advantages(data, tag="demo")
    params = [
        f'policy_data.data_root = "{data}"',
        f'policy_data.tokenizer_path = "{data / "tokenizer"}"',
        f'train.run_dir = "{root / "run"}"',
        f"train.max_steps = {STEPS}",
        "train.log_every = 1",
        f"train.save_every = {STEPS}",
        "train.num_workers = 0",
        "deepspeed_config.zero_stage = 3",  # the consolidation tests read ZeRO-3's shards
    ]
    env = launch_env(root)
    cmd = [*deepspeed_local(2, free_port()),
           str(REPO / "scripts" / "train.py"), "--gin_file", "demo/policy.gin"]  # fmt: skip
    for p in params:
        cmd += ["--gin_param", p]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    metrics = {}
    for line in (root / "run" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        metrics.setdefault(row["step"], {}).update(row)
    yield {"root": root, "params": params, "metrics": metrics}
    gin.clear_config()


def reload(run) -> torch.nn.Module:
    gin.clear_config()
    parse_gin(["demo/policy.gin"], run["params"])
    model = configured(pi05_policy)()
    load_exported(model, run["root"] / "run" / "model.safetensors")
    return model.eval()


def test_two_ranks_train_with_per_branch_metrics_and_the_loss_decreases(run):
    metrics = run["metrics"]
    losses = [metrics[s]["train/loss"] for s in range(1, STEPS + 1)]
    assert np.mean(losses[-6:]) < 0.8 * np.mean(losses[:6]), losses
    last = metrics[STEPS]
    for key in ("train/loss_conditional", "train/loss_unconditional", "train/loss_ratio",
                "train/conditional", "train/grad_norm", "lr/backbone"):  # fmt: skip
        assert key in last, key
    assert 0.4 < last["train/conditional"] < 0.95  # paper mode: ~70% carry the label's text


def test_export_equals_the_engine_checkpoint_and_samples_reproducibly(run):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    model = reload(run)
    engine = get_fp32_state_dict_from_zero_checkpoint(
        str(run["root"] / "run" / "checkpoints"), tag=f"step_{STEPS}"
    )
    exported = model.state_dict()
    for name, value in engine.items():
        torch.testing.assert_close(exported[name], value, rtol=0, atol=0, msg=name)
    data = configured(PolicyDataConfig)().build()
    batch = data.__getitems__(list(range(0, len(data), 16)))
    noise = torch.randn(batch["actions"].shape, generator=torch.Generator().manual_seed(0))
    first = model.sample_actions(batch, noise, beta=1.0)
    again = reload(run).sample_actions(batch, noise, beta=1.0)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert first.shape == batch["actions"].shape and torch.isfinite(first).all()
    images = {**batch, "images": frames_to_images(batch["frames"], train=False)}
    torch.testing.assert_close(model.sample_actions(images, noise, beta=1.0), first)


def test_closed_loop_step_runs_every_beta(run):
    model = reload(run)
    config = configured(EvaluateConfig)(num_episodes=4, batch_size=4, betas=[1.0, 2.0], max_steps=6)
    evaluation = evaluate_policy(config)
    results = evaluation.success
    assert set(results) == {"beta_1", "beta_2"} and all(0 <= r <= 1 for r in results.values())
    record = json.loads((run["root"] / "run" / "closed_loop.json").read_text())
    assert record == evaluation.as_record() and Evaluation.read(run["root"] / "run") == evaluation
    assert record["success"] == results and record["conditioning"] == "paper"
    for key, rate in results.items():  # per-episode outcomes, for the benchmark's bootstrap
        assert len(record["outcomes"][key]) == 4 and np.mean(record["outcomes"][key]) == rate
    probe = record["sensitivity"]
    assert set(probe) == {"positive_vs_plain", "positive_vs_negative", "noise_reference"}
    assert probe["noise_reference"] > 0 and probe["positive_vs_plain"] > 0
    adapter = PolicyAdapter(model, configured(PolicyDataConfig)().build(), beta=2.0, seed=5)
    obs = {"images": {"image": np.zeros((2, 64, 64, 3), np.uint8),
                      "wrist_image": np.zeros((2, 64, 64, 3), np.uint8)},
           "state": np.zeros((2, 8), np.float32), "task": ["reach the red target"] * 2}  # fmt: skip
    actions = adapter(obs)
    assert actions.shape == (2, 7) and np.isfinite(actions).all()
    again = PolicyAdapter(model, configured(PolicyDataConfig)().build(), beta=2.0, seed=5)(obs)
    np.testing.assert_array_equal(actions, again)


def test_the_evaluation_guides_with_each_rlinf_guidance_type(run):
    model, data = reload(run), configured(PolicyDataConfig)().build()
    obs = {"images": {"image": np.full((2, 64, 64, 3), 90, np.uint8),
                      "wrist_image": np.full((2, 64, 64, 3), 30, np.uint8)},
           "state": np.zeros((2, 8), np.float32), "task": ["reach the red target"] * 2}  # fmt: skip

    def act(beta, guidance):
        return PolicyAdapter(model, data, beta=beta, seed=5, guidance=guidance)(obs)

    # no_guide is the plain prompt alone: beta is ignored, and positive at beta 0 is the same
    np.testing.assert_array_equal(act(3.0, "no_guide"), act(0.0, "positive"))
    # negative guides with the "Advantage: negative" prompt: its batch carries that prompt
    adapter = PolicyAdapter(model, data, beta=2.0, guidance="negative")
    assert "input_ids" not in adapter.batch(obs)  # the negative guide and the plain prompt
    batch = adapter.processor.obs_to_batch(obs, branches=("positive", "negative"))
    assert not torch.equal(batch["neg_input_ids"], batch["input_ids"])
    assert not np.array_equal(act(2.0, "negative"), act(2.0, "positive"))


def test_the_run_serves_and_evaluates_from_its_directory_alone(run):
    # no gin at all: processor.json and recap_pi05.json, written by the training, say everything
    from recap.loading import load_policy
    from recap.serve.load import load_served

    gin.clear_config()
    directory = run["root"] / "run"
    processor = json.loads((directory / "processor.json").read_text())
    assert (processor["kind"], processor["conditioning"], processor["num_steps"],
            processor["image_size"], processor["action_horizon"], processor["cameras"]) == (
            "pi05", "paper", 5, 64, 5, ["image", "wrist_image"])  # fmt: skip
    assert processor["tokenizer"] == str(run["root"] / "demo_data" / "tokenizer")
    served = load_served(directory, beta=2.0, device="cpu")
    meta = served.metadata()
    assert (meta["conditioning"], meta["num_steps"], meta["normalization"], meta["state_dim"],
            meta["action_horizon"]) == ("paper", 5, "openpi", 8, 5)  # fmt: skip
    obs = {
        "observation/image": np.zeros((64, 64, 3), np.uint8),
        "observation/wrist_image": np.zeros((64, 64, 3), np.uint8),
        "observation/state": np.zeros(8, np.float32),
        "prompt": "reach the red target",
    }
    assert served.infer(obs)["actions"].shape == (5, 7)
    model, loaded = load_policy(directory)
    assert loaded.to_json() == served.processor.to_json()
    np.testing.assert_array_equal(loaded.state_stats.q01, policy_data_stats(run)["state"].q01)
    gin.clear_config()


def policy_data_stats(run):
    """The statistics the training data computed (with the run's bindings), then gin cleared."""
    gin.clear_config()
    parse_gin(["demo/policy.gin"], run["params"])
    stats = configured(PolicyDataConfig)().build().stats
    gin.clear_config()
    return stats
