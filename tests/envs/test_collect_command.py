"""recap-collect: a (tiny, untrained) demo π0.5 run collected with expert corrections, and the
chunk adapter against the evaluation's adapter."""

from __future__ import annotations

import json

import gin
import numpy as np
import pytest
import torch

import recap.steps.train  # noqa: F401  (registers policy_data and pi05_policy)
from recap.cli import parse_gin
from recap.commands.collect import main
from recap.configurable import configured
from recap.core.thresholds import IS_CORRECTION
from recap.data.lerobot import LocalDataset
from recap.data.policy_data import PolicyDataConfig
from recap.engine.checkpointing import save_exported
from recap.envs.policy import ChunkAdapter
from recap.envs.reach import write_demo_datasets, write_demo_tokenizer
from recap.envs.rollout import COLLECT_FILE
from recap.models.pi05 import pi05_policy
from recap.steps.evaluate_policy import PolicyAdapter


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("collect")
    data = root / "demo_data"
    write_demo_datasets(data, seed=0, sft_episodes=2, rollout_episodes=2, eval_episodes=1)
    write_demo_tokenizer(data)
    params = [
        f'policy_data.data_root = "{data}"',
        f'policy_data.tokenizer_path = "{data / "tokenizer"}"',
        f'train.run_dir = "{root / "run"}"',
    ]
    gin.clear_config()
    parse_gin(["demo/policy_bc.gin"], params)
    torch.manual_seed(0)
    (root / "run").mkdir()
    save_exported(
        configured(pi05_policy)().state_dict(), root / "run" / "model.safetensors", step=0
    )
    gin.clear_config()
    yield {"root": root, "argv": ["--gin_file", "demo/policy_bc.gin"] + sum(
        (["--gin_param", p] for p in params), [])}  # fmt: skip
    gin.clear_config()


def test_collect_command_writes_corrected_rollouts(run, capsys):
    out = run["root"] / "iter1"
    argv = [*run["argv"], "--out", str(out), "--episodes", "3", "--num_envs", "2",
            "--max_steps", "5", "--expert", "--drift", "0.5", "--takeover_steps", "2",
            "--replan_steps", "2", "--image_dtype", "image", "--seed", "11"]  # fmt: skip
    assert main(argv) == 0
    record = json.loads((out / COLLECT_FILE).read_text())
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (f"{out}: 3 episodes, {record['successes']} successes, 15 frames, "
                    f"{record['corrections']} corrected frames in "
                    f"{record['corrected_episodes']} episodes")  # fmt: skip
    assert (record["seed"], record["replan_steps"], record["expert"]) == (11, 2, True)
    assert (record["conditioning"], record["env"], record["beta"]) == ("none", "reach", 1.0)
    assert record["run_dir"] == str(run["root"] / "run")
    with LocalDataset(out) as ds:
        flags = ds.read_columns([IS_CORRECTION], flags=[IS_CORRECTION]).column(IS_CORRECTION)
        assert (ds.num_episodes, ds.num_frames, ds.info["codebase_version"]) == (3, 15, "v3.0")
    # an untrained policy drifts from the expert, which takes over
    assert flags.to_numpy(zero_copy_only=False).sum() == record["corrections"] > 0
    assert main(argv) == 2  # the same --out again: refused before anything runs
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out {out}: already exists; give a new directory"


def test_libero_has_no_scripted_expert(run, capsys):
    argv = [*run["argv"], "--out", str(run["root"] / "x"), "--env", "libero", "--expert"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --env: 'libero' has no scripted expert; collect without it, or pass a "
        "controller to recap.envs.collect(expert=...)"
    )
    assert not (run["root"] / "x").exists()


def test_chunk_adapter_returns_the_chunk_whose_first_action_evaluate_executes(run):
    gin.clear_config()
    parse_gin(["demo/policy_bc.gin"], [a for a in run["argv"][3::2]])
    from recap.envs.policy import load_run

    model, data, _ = load_run()
    obs = {"images": {"image": np.full((2, 64, 64, 3), 90, np.uint8),
                      "wrist_image": np.full((2, 64, 64, 3), 30, np.uint8)},
           "state": np.zeros((2, 8), np.float32), "task": ["reach the red target"] * 2}  # fmt: skip
    chunk = ChunkAdapter(model, data, beta=1.0, seed=3)(obs)
    assert chunk.shape == (2, 5, 7) and chunk.dtype == np.float32
    first = PolicyAdapter(model, configured(PolicyDataConfig)().build(), beta=1.0, seed=3)(obs)
    np.testing.assert_allclose(chunk[:, 0], first, rtol=1e-6, atol=1e-6)
    gin.clear_config()
