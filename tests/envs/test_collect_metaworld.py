"""recap-collect in Meta-World: ``--env metaworld --expert`` with ``--env_options`` writes a
LeRobot v3.0 dataset recap's reader opens (a tiny untrained π0.5 whose actions the scripted
expert corrects), and bad ``--env_options`` are one line before anything runs. The simulator
tests skip with one line when the metaworld extra or OSMesa is missing
(``tests/envs/test_metaworld.py``'s marker)."""

from __future__ import annotations

import json

import gin
import numpy as np
import pytest

import recap.steps.train  # noqa: F401  (registers policy_data and pi05_policy)
from recap.commands.collect import main
from recap.core.thresholds import IS_CORRECTION
from recap.data.conditioning import QuantileStats
from recap.data.lerobot import LocalDataset
from recap.envs.metaworld import ACTION_DIM, STATE_DIM
from recap.envs.rollout import COLLECT_FILE
from recap.models.checkpoints import write_norm_stats
from recap.processing.transforms import write_word_tokenizer
from tests.envs.test_metaworld import needs_metaworld
from tests.models.test_pi05 import tiny_model

OPTIONS = '{"env_name": "reach-v3", "image_size": 32}'


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny untrained π0.5 for Meta-World: state [39], actions [4] (model action dim 8), and
    the command line that collects with it."""
    root = tmp_path_factory.mktemp("collect_metaworld")
    policy = root / "policy"
    tiny_model(0, action_dim=8).save_pretrained(policy)
    stats = {"state": QuantileStats(-np.ones(STATE_DIM), np.ones(STATE_DIM)),
             "action": QuantileStats(-np.ones(ACTION_DIM), np.ones(ACTION_DIM))}  # fmt: skip
    write_norm_stats(policy, "metaworld", stats)
    write_word_tokenizer(policy, ["Task: reach, State: ;\nAction: Advantage: positive negative"])
    params = ["policy_data.datasets = []", f'policy_data.tokenizer_path = "{policy}"']
    argv = ["--run_dir", str(policy), *[a for p in params for a in ("--gin_param", p)]]
    yield {"root": root, "argv": argv}
    gin.clear_config()


def collect_argv(run, out) -> list[str]:
    return [*run["argv"], "--out", str(out), "--env", "metaworld", "--env_options", OPTIONS,
            "--expert", "--episodes", "3", "--num_envs", "2", "--max_steps", "6",
            "--drift", "0", "--takeover_steps", "3", "--replan_steps", "2",
            "--image_dtype", "image", "--seed", "7"]  # fmt: skip


@pytest.fixture(scope="module")
def alone(run):
    """The unsharded collection: (its directory, the command's last stdout line)."""
    import contextlib
    import io

    out, stdout = run["root"] / "reach_iter1", io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(collect_argv(run, out)) == 0
    gin.clear_config()
    return out, stdout.getvalue().strip().splitlines()[-1]


@needs_metaworld
def test_collect_metaworld_with_the_expert_writes_a_lerobot_dataset(alone):
    out, last = alone
    # drift 0: the expert takes every step of the three 6-step episodes (reach-v3 needs ~37)
    assert last == f"{out}: 3 episodes, 0 successes, 18 frames, 18 corrected frames in 3 episodes"
    record = json.loads((out / COLLECT_FILE).read_text())
    assert (record["env"], record["env_options"]) == ("metaworld", json.loads(OPTIONS))
    assert (record["seed"], record["expert"], record["takeover_steps"]) == (7, True, 3)
    with LocalDataset(out) as ds:
        assert (ds.num_episodes, ds.num_frames, ds.info["codebase_version"]) == (3, 18, "v3.0")
        assert ds.info["fps"] == 80 and ds.info["robot_type"] == "sawyer"
        table = ds.read_columns(["is_success", "action", IS_CORRECTION], flags=[IS_CORRECTION])
        assert table.column("is_success").to_pylist() == [False] * 18
        assert table.column(IS_CORRECTION).to_pylist() == [True] * 18
        actions = np.stack(table.column("action").to_numpy(zero_copy_only=False))
        assert actions.shape == (18, 4) and np.abs(actions).max() <= 1.0
        assert ds.frames("observation.images.image", np.arange(18)).shape == (18, 32, 32, 3)


@needs_metaworld
def test_two_ranks_collect_the_unsharded_dataset(run, alone, tmp_path):
    """``deepspeed --num_gpus 2 --module recap.commands.collect``: each rank its shard of the
    episodes, rank 0 writes the one dataset, the unsharded command's (videos aside: images)."""
    import subprocess
    from pathlib import Path

    from recap.ports import free_port
    from tests.envs.test_metaworld import assert_same_dataset
    from tests.helpers import deepspeed_local, launch_env

    out = tmp_path / "sharded"
    cmd = [*deepspeed_local(2, free_port()), "--module", "recap.commands.collect",
           *collect_argv(run, out)]  # fmt: skip
    done = subprocess.run(cmd, cwd=Path(__file__).parents[2], env=launch_env(tmp_path),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.endswith("in 3 episodes")]
    assert [line.split("] ", 1)[-1] for line in lines] == [
        f"{out}: 3 episodes, 0 successes, 18 frames, 18 corrected frames in 3 episodes"
    ]  # rank 0's line only
    alone_record = json.loads((alone[0] / COLLECT_FILE).read_text())
    assert json.loads((out / COLLECT_FILE).read_text()) == alone_record
    assert_same_dataset(out, alone[0])
    assert not (tmp_path / ".sharded.shards").exists()


def test_bad_env_options_are_one_line(run, capsys):
    out = run["root"] / "never"
    cases = [
        ('{"env_name": "reach-v3",}', "error: --env_options: not JSON (Expecting property name "
         "enclosed in double quotes at column 25); pass an object such as "
         "'{\"env_name\": \"push-v3\"}'"),
        ('["reach-v3"]', "error: --env_options: '[\"reach-v3\"]' is not a JSON object; pass an "
         "object such as '{\"env_name\": \"push-v3\"}'"),
        ('{"task": "push-v3"}', "error: --env_options: 'task' is not an option of MetaWorldEnv; "
         "use one of ['env_name', 'cameras', 'image_size', 'max_steps', 'lazy_images', "
         "'shadows', 'backend']"),
    ]  # fmt: skip
    for options, line in cases:
        argv = [*run["argv"], "--out", str(out), "--env", "metaworld", "--env_options", options]
        assert main(argv) == 2
        gin.clear_config()
        assert capsys.readouterr().err.strip() == line
    assert not out.exists()
