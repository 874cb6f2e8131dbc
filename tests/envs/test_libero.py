"""recap.envs.libero against a stand-in for hf-libero with LIBERO's observation dict."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

import recap.envs.libero as libero_env
from recap.data.lerobot import LIBERO_KEYS, LocalDataset, detect_key_map
from recap.envs import collect, evaluate
from recap.envs.libero import LiberoEnv, load_libero, quat2axisangle
from recap.errors import RecapError

TASK = "put both the alphabet soup and the tomato sauce in the basket"


class StubRenderEnv:
    """LIBERO's OffScreenRenderEnv as far as the adapter uses it; succeeds at step ``win``."""

    made: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.seeds, self.actions, self.init = kwargs, [], [], None
        self.win = 4
        StubRenderEnv.made.append(self)

    def seed(self, seed):
        self.seeds.append(seed)

    def reset(self):
        self.actions, self.init = [], None

    def raw(self):
        t = len(self.actions)
        image = np.arange(6 * 4 * 3, dtype=np.uint8).reshape(6, 4, 3) + t
        return {
            "agentview_image": image,
            "robot0_eye_in_hand_image": image + 100,
            "robot0_eef_pos": np.array([0.1, 0.2, 0.3 + t]),
            "robot0_eef_quat": np.array([0.0, 0.0, math.sin(math.pi / 4), math.cos(math.pi / 4)]),
            "robot0_gripper_qpos": np.array([0.04, -0.04]),
            "robot0_joint_pos": np.zeros(7),  # LIBERO has more keys; the adapter ignores them
        }

    def set_init_state(self, state):
        self.init = state
        return self.raw()

    def step(self, action):
        self.actions.append(list(action))
        policy_steps = len(self.actions) - 10
        return self.raw(), 0.0, policy_steps >= self.win, {}


class StubSuite:
    n_tasks = 2

    def get_task(self, i):
        return SimpleNamespace(language=TASK, problem_folder="libero_10", bddl_file=f"t{i}.bddl")

    def get_task_init_states(self, i):
        return np.array([[0.0], [1.0], [2.0]])


BACKEND = SimpleNamespace(
    benchmark=SimpleNamespace(
        get_benchmark_dict=lambda: {"libero_10": StubSuite, "libero_spatial": StubSuite}
    ),
    get_libero_path=lambda key: f"/libero/{key}",
    OffScreenRenderEnv=StubRenderEnv,
)


def test_quat2axisangle_matches_robosuite():
    half = math.sqrt(0.5)
    np.testing.assert_allclose(quat2axisangle([0, 0, half, half]), [0, 0, math.pi / 2])
    np.testing.assert_allclose(quat2axisangle([1, 0, 0, 0]), [math.pi, 0, 0])
    np.testing.assert_array_equal(quat2axisangle([0, 0, 0, 1]), [0, 0, 0])
    np.testing.assert_array_equal(quat2axisangle([0, 0, 0, 1.5]), [0, 0, 0])  # w clipped
    quat = np.array([0.0, 0.0, 0.0, 1.5])
    quat2axisangle(quat)
    assert quat[3] == 1.5  # the input is not modified (robosuite clips it in place)


def test_reset_and_step_follow_openpi():
    env = LiberoEnv("libero_10", task_id=1, backend=BACKEND)
    sim = StubRenderEnv.made[-1]
    assert sim.kwargs == {"bddl_file_name": "/libero/bddl_files/libero_10/t1.bddl",
                          "camera_heights": 256, "camera_widths": 256}  # fmt: skip
    assert sim.seeds == [7] and env.spec.max_steps == 520 and env.spec.fps == 10
    obs = env.reset(4)
    assert sim.init.tolist() == [1.0]  # initial state 4 % 3
    assert sim.actions == [[0.0] * 6 + [-1.0]] * 10  # objects settle first, not recorded
    raw = sim.raw()
    np.testing.assert_array_equal(obs["images"]["image"], raw["agentview_image"][::-1, ::-1])
    np.testing.assert_array_equal(obs["images"]["wrist_image"],
                                  raw["robot0_eye_in_hand_image"][::-1, ::-1])  # fmt: skip
    assert obs["images"]["image"].dtype == np.uint8 and obs["task"] == TASK
    assert obs["state"].dtype == np.float32
    np.testing.assert_allclose(obs["state"], [0.1, 0.2, 10.3, 0, 0, math.pi / 2, 0.04, -0.04],
                               rtol=1e-6)  # fmt: skip
    padded = np.arange(32, dtype=np.float32)  # a model's padded action: 7 entries go out
    results = [env.step(padded)[1:] for _ in range(4)]
    assert sim.actions[-1] == list(range(7))
    assert results == [(False, False)] * 3 + [(True, True)]  # LIBERO's done is success


def test_the_suite_step_limit_ends_failures():
    env = LiberoEnv("libero_spatial", backend=BACKEND)
    assert env.max_steps == 220
    short = LiberoEnv("libero_10", max_steps=3, backend=BACKEND)
    StubRenderEnv.made[-1].win = 99
    short.reset(0)
    assert [short.step(np.zeros(7))[1:] for _ in range(3)] == [(False, False)] * 2 + [(False, True)]


def test_bad_suite_task_and_missing_package_are_one_line_errors(monkeypatch, tmp_path):
    with pytest.raises(RecapError, match=r"^LiberoEnv.suite: 'libero_100' is not one of \["):
        LiberoEnv("libero_100", backend=BACKEND)
    with pytest.raises(RecapError, match=r"^LiberoEnv.task_id: 2 is out of range; libero_10 has "
                       r"tasks 0..1$"):  # fmt: skip
        LiberoEnv("libero_10", task_id=2, backend=BACKEND)
    monkeypatch.setattr(libero_env.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RecapError) as err:
        load_libero()
    assert str(err.value) == (
        "LIBERO: the 'libero' module is not installed; pip install "
        "hf-libero (with robosuite and mujoco) and its scene assets"
    )
    monkeypatch.setattr(libero_env.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path))
    with pytest.raises(RecapError) as err:
        load_libero()
    assert str(err.value) == (
        f"LIBERO: {tmp_path}/config.yaml is missing; create it (run "
        "`python -c 'import libero.libero'` once in a terminal) or set "
        "LIBERO_CONFIG_PATH"
    )


def test_collect_and_evaluate_through_the_adapter(tmp_path):
    def make():
        return LiberoEnv("libero_10", max_steps=6, backend=BACKEND)

    def policy(obs):  # a chunk of 5 (x, y, z, roll, pitch, yaw, gripper) actions
        return np.tile(np.arange(7, dtype=np.float32), (len(obs["task"]), 5, 1))

    out = evaluate(lambda beta: policy, make, 3, seed=0, replan_steps=5, num_envs=2)
    assert out["success"] == {"beta_1": 1.0}
    summary = collect(policy, make, 2, 0, tmp_path / "libero", replan_steps=5, num_envs=2,
                      naming="libero", image_dtype="image")  # fmt: skip
    assert (summary["episodes"], summary["frames"], summary["successes"]) == (2, 8, 2)
    with LocalDataset(tmp_path / "libero") as ds:
        assert detect_key_map(ds.features) == LIBERO_KEYS == make().spec.key_map("libero")
        assert ds.features["state"]["names"][3:6] == ["eef_axis_angle_x", "eef_axis_angle_y",
                                                      "eef_axis_angle_z"]  # fmt: skip
        assert ds.info["robot_type"] == "panda" and ds.tasks == {0: TASK}
        table = ds.read_columns(["state", "actions", "is_correction"], flags=["is_correction"])
        frame = ds.frames("image", np.array([0]))[0]
    assert (
        np.stack(table.column("actions").to_numpy(zero_copy_only=False)).tolist()
        == [list(range(7))] * 8
    )
    assert table.column("is_correction").to_pylist() == [False] * 8
    np.testing.assert_array_equal(frame, (np.arange(72, dtype=np.uint8).reshape(6, 4, 3)
                                          + 10)[::-1, ::-1])  # fmt: skip
