"""The evaluate step evaluates any ``recap.envs.Env`` named in config (``evaluate_policy.env``),
run as the pipeline's evaluate stage runs it (``recap.commands.evaluate_policy`` with gin
bindings), and writes the same ``closed_loop.json`` fields for a non-reach env as for the reach
task."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import gin
import numpy as np
import pytest

from recap.commands.evaluate_policy import main
from recap.envs.base import EnvSpec
from recap.envs.factory import env_factory
from recap.errors import RecapError
from recap.ports import free_port
from tests.helpers import REPO, deepspeed_local, launch_env
from tests.serve.test_record import write_reach_policy

FIELDS = {"env", "conditioning", "num_episodes", "seed", "guidance", "success", "heading",
          "outcomes", "sensitivity"}  # fmt: skip
LINE = "tests.steps.test_evaluate_env:LineEnv"
FIELD = "evaluate_policy.env"  # the setting the step names in its errors


class LineEnv:
    """A small non-reach environment: a point on a line moved by action[0]; success past 0.5.
    Its cameras and state have the reach policy's shapes, and it declares no step metrics."""

    resets: list[int] = []  # every seed any instance was reset with

    def __init__(self, max_steps: int = 3, task: str = "reach the blue target", goal: float = 0.5):
        self.max_steps, self.task, self.goal = max_steps, task, goal
        self.spec = EnvSpec(("image", "wrist_image"), tuple(f"s{i}" for i in range(8)),
                            tuple(f"a{i}" for i in range(7)), 10, max_steps, "line")  # fmt: skip

    def observe(self) -> dict:
        shade = np.uint8(255 * min(max(self.x, 0.0), 1.0))
        state = np.zeros(8, np.float32)
        state[0] = self.x
        image = np.full((64, 64, 3), shade, np.uint8)
        return {"images": {"image": image, "wrist_image": 255 - image}, "state": state,
                "task": self.task}  # fmt: skip

    def reset(self, seed: int) -> dict:
        LineEnv.resets.append(seed)
        self.x, self.steps = 0.1 * (seed % 5), 0
        return self.observe()

    def step(self, action: np.ndarray):
        self.x += 0.2 * float(np.clip(action[0], -1, 1))
        self.steps += 1
        success = self.x > self.goal
        return self.observe(), success, success or self.steps >= self.max_steps


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_reach_policy(tmp_path_factory.mktemp("evaluate_env"))


def evaluate(run_dir, *bindings: str) -> dict:
    """The step as the pipeline's evaluate stage runs it: the command, its run directory bound."""
    gin.clear_config()
    params = [f'evaluate_policy.run_dir = "{run_dir}"', f'train.run_dir = "{run_dir}"',
              "evaluate_policy.num_episodes = 3", "evaluate_policy.batch_size = 2",
              "evaluate_policy.betas = [1.0, 2.0]", *bindings]  # fmt: skip
    argv = [arg for p in params for arg in ("--gin_param", p)]
    try:
        assert main(argv) == 0
    finally:
        gin.clear_config()
    return json.loads((run_dir / "closed_loop.json").read_text())


def test_a_non_reach_env_writes_the_reach_evaluations_fields(run_dir):
    from recap.workflow.stages import PairedEvaluateStage

    reach = evaluate(run_dir, "evaluate_policy.max_steps = 3",
                     "evaluate_policy.state_targets = False")  # fmt: skip
    LineEnv.resets.clear()
    line = evaluate(run_dir, f'evaluate_policy.env = "{LINE}"',
                    'evaluate_policy.env_options = {"max_steps": 2}')  # fmt: skip
    assert set(reach) == set(line) == FIELDS
    assert (reach["env"], line["env"]) == ("reach", LINE)
    assert set(line["success"]) == set(line["outcomes"]) == {"beta_1", "beta_2"}
    for key, won in line["outcomes"].items():
        assert len(won) == 3 and set(won) <= {0, 1} and line["success"][key] == np.mean(won)
    assert line["heading"] == {"beta_1": None, "beta_2": None}  # no heading metric: null
    assert all(-1 <= h <= 1 for h in reach["heading"].values())
    assert set(line["sensitivity"]) == set(reach["sensitivity"])
    # each beta runs episodes seed .. seed + 2, then the probe resets its 64 first episodes
    assert LineEnv.resets == [1000, 1001, 1002] * 2 + list(range(1000, 1064))
    # and the pipeline's stage reads the record as it reads the reach task's
    stage = PairedEvaluateStage("evaluate_line", "policy", ("policy",))
    assert stage.result(SimpleNamespace(run_dir=run_dir)) == {
        "success": line["success"], "num_episodes": 3, "outcomes": line["outcomes"]}  # fmt: skip


def test_each_chunk_executes_replan_steps_actions(run_dir, monkeypatch):
    """``evaluate_policy.replan_steps`` actions of each sampled chunk run before the policy is
    asked again: a 6-step episode (the goal out of reach) asks it 6 times at 1, twice at 3."""
    from recap.loading import PolicyAdapter

    calls, chunk = [], PolicyAdapter.chunk
    monkeypatch.setattr(
        PolicyAdapter, "chunk", lambda self, obs: calls.append(len(obs["task"])) or chunk(self, obs)
    )
    for replan, asked in ((1, 6), (3, 2)):
        calls.clear()
        record = evaluate(run_dir, f'evaluate_policy.env = "{LINE}"',
                          'evaluate_policy.env_options = {"max_steps": 6, "goal": 99.0}',
                          "evaluate_policy.num_episodes = 1", "evaluate_policy.betas = [1.0]",
                          f"evaluate_policy.replan_steps = {replan}")  # fmt: skip
        assert calls == [1] * asked
        assert record["outcomes"] == {"beta_1": [0]}


def test_two_launched_ranks_write_the_record_one_process_writes(run_dir, tmp_path):
    """Under the launcher each rank runs its share of the episodes (k on rank k % 2) and rank 0
    writes the merged record: the same file as one process writes for the same seeds."""
    line = [f'evaluate_policy.env = "{LINE}"', 'evaluate_policy.env_options = {"max_steps": 4}',
            "evaluate_policy.num_episodes = 5", "evaluate_policy.betas = [1.0, 2.0]"]  # fmt: skip
    alone = evaluate(run_dir, *line)
    (run_dir / "closed_loop.json").unlink()
    params = [f'evaluate_policy.run_dir = "{run_dir}"', f'train.run_dir = "{run_dir}"',
              "evaluate_policy.batch_size = 2", *line]  # fmt: skip
    cmd = [*deepspeed_local(2, free_port()), "--module", "recap.commands.evaluate_policy",
           *[arg for p in params for arg in ("--gin_param", p)]]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=launch_env(tmp_path), capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert json.loads((run_dir / "closed_loop.json").read_text()) == alone
    assert len(alone["outcomes"]["beta_1"]) == 5


def test_an_unknown_env_is_one_line():
    """The step builds its env with ``recap.envs.factory`` (as recap-collect and recap-iterate
    do), naming its own setting in the errors."""
    with pytest.raises(RecapError) as caught:
        env_factory("mujoco", field=FIELD)
    assert str(caught.value) == ("evaluate_policy.env: 'mujoco' is not one of ['reach', "
                                 "'metaworld', 'libero'] nor 'package.module:Factory'; name one "
                                 "of them")  # fmt: skip
    with pytest.raises(RecapError) as caught:
        env_factory("tests.steps.test_evaluate_env:NoSuchEnv", field=FIELD)
    assert str(caught.value) == (
        "evaluate_policy.env: 'tests.steps.test_evaluate_env:NoSuchEnv' does not import (module "
        "'tests.steps.test_evaluate_env' has no attribute 'NoSuchEnv'); name an importable "
        "'package.module:Factory'")  # fmt: skip
    with pytest.raises(RecapError) as caught:
        env_factory("reach", options={"colour": "red"}, field=FIELD)
    assert str(caught.value) == ("evaluate_policy.env_options: ReachConfig.__init__() got an "
                                 "unexpected keyword argument 'colour'; use ReachConfig "
                                 "fields")  # fmt: skip
    make, expert = env_factory(LINE, options={"max_steps": 4}, field=FIELD)
    assert make().spec.max_steps == 4 and make() is not make() and expert is None


def test_the_step_names_its_own_setting_in_the_factorys_line(run_dir, capsys):
    """Run as the stage runs it, an unknown env fails with the line naming evaluate_policy.env,
    and no closed_loop.json is written."""
    (run_dir / "closed_loop.json").unlink(missing_ok=True)
    gin.clear_config()
    params = [f'evaluate_policy.run_dir = "{run_dir}"', f'train.run_dir = "{run_dir}"',
              'evaluate_policy.env = "mujoco"']  # fmt: skip
    try:
        assert main([arg for p in params for arg in ("--gin_param", p)]) == 2
    finally:
        gin.clear_config()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: evaluate_policy.env: 'mujoco' is not one of ['reach', 'metaworld', 'libero'] nor "
        "'package.module:Factory'; name one of them")  # fmt: skip
    assert not (run_dir / "closed_loop.json").exists()
