"""LIBERO behind the :class:`~recap.envs.Env` protocol, as openpi's LIBERO example drives it.

One ``LiberoEnv`` is one task of a suite (``libero_spatial``, ``libero_object``, ``libero_goal``,
``libero_10``, ``libero_90``), rendered by LIBERO's ``OffScreenRenderEnv`` at ``resolution``.
``reset(seed)`` loads the suite's initial state ``seed % len(initial states)`` and waits
``num_steps_wait`` steps with the dummy action ``[0]*6 + [-1]`` while objects settle (not
recorded); ``step(action)`` sends the first 7 entries (end-effector delta pose, gripper). LIBERO's
``done`` is task success; an episode also ends after the suite's step limit (openpi's, from the
longest training demo): spatial 220, object 280, goal 300, libero_10 520, libero_90 400.

Observations are openpi's and RLinf's training data's: ``image`` / ``wrist_image`` are
``agentview_image`` / ``robot0_eye_in_hand_image`` rotated 180 degrees (``[::-1, ::-1]``), ``state``
float32[8] = end-effector position (3), axis-angle of its quaternion (3, :func:`quat2axisangle`),
gripper joint positions (2); ``task`` is the task's language.

The simulator comes from the ``hf-libero`` package (module ``libero``; robosuite and MuJoCo with
it), imported only when a ``LiberoEnv`` is made; missing, it is one line naming the fix. Its wheel
ships the BDDL and init-state files but not the scene assets (meshes, textures), which LIBERO
fetches from the Hugging Face Hub on first use: offline, install them beside the package first.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from recap.envs.base import EnvSpec, Observation
from recap.errors import RecapError

SUITE_MAX_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
DUMMY_ACTION = (0.0,) * 6 + (-1.0,)
RESOLUTION = 256  # openpi renders (and RLinf's data was recorded) at 256 x 256
STATE_NAMES = ("eef_x", "eef_y", "eef_z", "eef_axis_angle_x", "eef_axis_angle_y",
               "eef_axis_angle_z", "gripper_qpos_0", "gripper_qpos_1")  # fmt: skip
ACTION_NAMES = ("x", "y", "z", "roll", "pitch", "yaw", "gripper")
CAMERAS = {"image": "agentview_image", "wrist_image": "robot0_eye_in_hand_image"}


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """float64[3] axis-angle of an (x, y, z, w) quaternion, as robosuite and openpi compute it:
    w clipped to [-1, 1]; a rotation of (close to) zero degrees is zeros."""
    quat = np.asarray(quat, np.float64)
    w = min(max(float(quat[3]), -1.0), 1.0)
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return quat[:3] * 2.0 * math.acos(w) / den


def libero_state(raw: dict[str, Any]) -> np.ndarray:
    """float32[8] state of a LIBERO observation dict (module docstring)."""
    return np.concatenate(
        [
            np.asarray(raw["robot0_eef_pos"], np.float64),
            quat2axisangle(raw["robot0_eef_quat"]),
            np.asarray(raw["robot0_gripper_qpos"], np.float64),
        ]
    ).astype(np.float32)


def libero_observation(raw: dict[str, Any], task: str) -> Observation:
    """The protocol's observation of a LIBERO observation dict: images rotated 180 degrees."""
    images = {
        cam: np.ascontiguousarray(np.asarray(raw[key])[::-1, ::-1]).astype(np.uint8, copy=False)
        for cam, key in CAMERAS.items()
    }
    return {"images": images, "state": libero_state(raw), "task": task}


def load_libero() -> SimpleNamespace:
    """LIBERO's ``benchmark``, ``get_libero_path`` and ``OffScreenRenderEnv``, or one line saying
    what to install or configure."""
    if importlib.util.find_spec("libero") is None:
        raise RecapError("LIBERO: the 'libero' module is not installed; pip install hf-libero "
                         "(with robosuite and mujoco) and its scene assets")  # fmt: skip
    config = Path(os.environ.get("LIBERO_CONFIG_PATH", "~/.libero")).expanduser() / "config.yaml"
    if not config.is_file():  # importing libero.libero would stop and ask on stdin
        raise RecapError(f"LIBERO: {config} is missing; create it (run `python -c "
                         "'import libero.libero'` once in a terminal) or set "
                         "LIBERO_CONFIG_PATH")  # fmt: skip
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    return SimpleNamespace(
        benchmark=benchmark, get_libero_path=get_libero_path, OffScreenRenderEnv=OffScreenRenderEnv
    )


class LiberoEnv:
    """Task ``task_id`` of LIBERO suite ``suite`` (module docstring). ``seed`` seeds the
    simulator once, as openpi does (it moves objects even from a fixed initial state);
    ``backend``: the namespace :func:`load_libero` returns (tests pass a stand-in)."""

    def __init__(
        self,
        suite: str = "libero_10",
        task_id: int = 0,
        resolution: int = RESOLUTION,
        seed: int = 7,
        num_steps_wait: int = 10,
        max_steps: int | None = None,
        backend: SimpleNamespace | None = None,
    ):
        if suite not in SUITE_MAX_STEPS:
            raise RecapError(f"LiberoEnv.suite: {suite!r} is not one of {list(SUITE_MAX_STEPS)}")
        lib = backend if backend is not None else load_libero()
        self.suite = lib.benchmark.get_benchmark_dict()[suite]()
        if not 0 <= task_id < self.suite.n_tasks:
            raise RecapError(f"LiberoEnv.task_id: {task_id} is out of range; {suite} has tasks "
                             f"0..{self.suite.n_tasks - 1}")  # fmt: skip
        task = self.suite.get_task(task_id)
        self.task = str(task.language)
        self.init_states = self.suite.get_task_init_states(task_id)
        bddl = Path(lib.get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
        self.env = lib.OffScreenRenderEnv(
            bddl_file_name=str(bddl), camera_heights=resolution, camera_widths=resolution
        )
        self.env.seed(seed)
        self.num_steps_wait = num_steps_wait
        self.max_steps = int(max_steps or SUITE_MAX_STEPS[suite])
        self.steps = 0
        self.spec = EnvSpec(tuple(CAMERAS), STATE_NAMES, ACTION_NAMES, fps=10,
                            max_steps=self.max_steps, robot_type="panda")  # fmt: skip

    def reset(self, seed: int) -> Observation:
        self.env.reset()
        raw = self.env.set_init_state(self.init_states[seed % len(self.init_states)])
        for _ in range(self.num_steps_wait):
            raw, _, _, _ = self.env.step(list(DUMMY_ACTION))
        self.steps = 0
        return libero_observation(raw, self.task)

    def step(self, action: np.ndarray) -> tuple[Observation, bool, bool]:
        raw, _reward, done, _info = self.env.step(np.asarray(action, np.float64)[:7].tolist())
        self.steps += 1
        success = bool(done)
        return libero_observation(raw, self.task), success, success or self.steps >= self.max_steps

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
