"""Meta-World MT1 behind the :class:`~recap.envs.Env` protocol, its scripted experts, and
LeRobot v3.0 datasets recorded from them.

One ``MetaWorldEnv`` is one Meta-World v3 task (``reach-v3``, ``push-v3``, ``pick-place-v3``, ...;
``metaworld.env_dict.ALL_V3_ENVIRONMENTS``) as MT1 sets it up: the goal is observable. Each
``reset(seed)`` seeds the simulator with ``seed`` and draws the episode's task variation (object
and goal positions) from the task's random reset space, the distribution MT1 draws its 50 goals
from, so an episode is fixed by its seed alone (same seed: the same first observation, bit for
bit). ``step(action)`` returns ``(obs, success, done)``: success is Meta-World's
``info["success"]``; the episode ends at success or after ``max_steps`` steps (Meta-World's
``max_path_length`` is 500; each step is 5 MuJoCo steps of 2.5 ms: 80 steps per second, the
dataset's fps).

State and action conventions (Meta-World's own, as its scripted experts read and write them):

* ``state`` float32[39] = Meta-World's observation vector: end-effector position (3), gripper
  opening in [0, 1] (1), up to two objects' position (3) and quaternion (w, x, y, z; 4) each,
  zero-padded (14), the previous step's 18 entries, and the goal position (3).
  :data:`STATE_NAMES` names them.
* ``action`` float32[4] = end-effector position delta (x, y, z; 1 unit = 1 cm per step) and
  gripper effort (-1 open, +1 close), each clipped to [-1, 1] by Meta-World; a longer action (a
  policy's padded one) is cut to its first 4 entries.
* ``images`` {camera key: uint8[size, size, 3]}: ``cameras`` maps each key (``image``,
  ``wrist_image``: the names recorded datasets carry) to a Meta-World camera (``corner``,
  ``corner2``, ``corner3``, ``corner4``, ``topview``, ``behindGripper``, ``gripperPOV``),
  rendered by MuJoCo and rotated 180 degrees (``[::-1, ::-1]``: the corner cameras are mounted
  upside down in Meta-World's scene); ``task`` is the task's name in words (``"pick place"``).

Rendering is the slow part on a CPU (OSMesa, against thousands of physics steps per second). Most
of a small frame's cost is Meta-World's 4096 x 4096 shadow map: with ``shadows=False`` (the
default) the scene renders without shadows, some 10 times faster (measured at 64 px: 57 against
6 frames per second on a busy 2-core machine; pixels differ by 2.6 of 255 on average); pass
``shadows=True`` for Meta-World's own look. Beyond that, render only what the policy reads:
with ``lazy_images=True`` an observation's images are rendered when first read, which must
happen before the next ``step`` or ``reset`` of that environment (``recap.envs.rollout``'s
``run_episodes`` reads them only at replanning steps when it does not record; recording reads
every frame, so keep the default ``False`` there).

Meta-World comes from the ``metaworld`` extra (``pip install 'recap[metaworld]'``:
``metaworld==3.1.1`` with ``mujoco==3.3.0``; its wheel ships every scene asset and an expert per
task, ``metaworld.policies.ENV_POLICY_MAP``), imported only when an environment is made. MuJoCo
renders through ``MUJOCO_GL`` (``osmesa`` unless set: ``apt-get install -y libosmesa6``; ``egl`` on
a GPU machine), which must be set before MuJoCo is first imported. Missing either is one line
naming the fix.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from ctypes.util import find_library
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from recap.data.lerobot_writer import Episode, write_lerobot_dataset
from recap.envs.base import EnvSpec, Observation
from recap.errors import RecapError

MAX_STEPS = 500  # Meta-World's max_path_length
FPS = 80  # 1 / (frame_skip 5 x timestep 2.5 ms)
IMAGE_SIZE = 64
CAMERAS: Mapping[str, str] = {"image": "corner"}
MW_CAMERAS = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
_OBJECT = ("x", "y", "z", "qw", "qx", "qy", "qz")
_FRAME = ("hand_x", "hand_y", "hand_z", "gripper") + tuple(
    f"obj{k}_{c}" for k in range(2) for c in _OBJECT
)
STATE_NAMES = _FRAME + tuple(f"prev_{n}" for n in _FRAME) + ("goal_x", "goal_y", "goal_z")
ACTION_NAMES = ("dx", "dy", "dz", "gripper")
STATE_DIM, ACTION_DIM = len(STATE_NAMES), len(ACTION_NAMES)


def task_text(env_name: str) -> str:
    """The task's name in words: ``"pick-place-v3"`` -> ``"pick place"``."""
    return env_name.removesuffix("-v3").replace("-", " ")


def load_metaworld() -> SimpleNamespace:
    """Meta-World's v3 environment classes, its experts and MuJoCo, or one line saying what to
    install or configure. Sets ``MUJOCO_GL`` (and ``PYOPENGL_PLATFORM``) to ``osmesa`` when
    unset."""
    if importlib.util.find_spec("metaworld") is None:
        raise RecapError("Meta-World: the 'metaworld' module is not installed; pip install "
                         "'recap[metaworld]' (metaworld==3.1.1, mujoco==3.3.0)")  # fmt: skip
    gl = os.environ.setdefault("MUJOCO_GL", "osmesa")
    if gl == "osmesa":
        os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
        if find_library("OSMesa") is None:
            raise RecapError("Meta-World: MUJOCO_GL=osmesa needs the OSMesa library "
                             "(libOSMesa.so); apt-get install -y libosmesa6, or set "
                             "MUJOCO_GL=egl on a GPU machine")  # fmt: skip
    import mujoco
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    from metaworld.policies import ENV_POLICY_MAP

    return SimpleNamespace(
        environments=ALL_V3_ENVIRONMENTS, policies=ENV_POLICY_MAP, mujoco=mujoco, gl=gl
    )


class LazyImages(Mapping):
    """{camera key: uint8[H, W, 3]} of one observation, each rendered when first read; reading
    one after its environment moved on is an error (the scene it showed is gone)."""

    def __init__(self, env: MetaWorldEnv, tick: int):
        self._env, self._tick, self._frames = env, tick, {}

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._frames:
            if key not in self._env.cameras:
                raise KeyError(key)
            if self._env.tick != self._tick:
                raise RecapError(f"MetaWorldEnv: the {key!r} image of an earlier observation "
                                 "was never read; with lazy_images=True read an observation's "
                                 "images before the next step or reset")  # fmt: skip
            self._frames[key] = self._env.render(key)
        return self._frames[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._env.cameras)

    def __len__(self) -> int:
        return len(self._env.cameras)


class MetaWorldEnv:
    """Meta-World task ``env_name`` (module docstring). ``cameras``: camera key -> Meta-World
    camera; ``image_size``: the square frames' side; ``max_steps``: the episode limit;
    ``lazy_images``: render an observation's images when first read; ``shadows``: render
    Meta-World's shadows (slow); ``backend``: the namespace :func:`load_metaworld` returns
    (tests pass their own)."""

    def __init__(
        self,
        env_name: str = "reach-v3",
        cameras: Mapping[str, str] = CAMERAS,
        image_size: int = IMAGE_SIZE,
        max_steps: int = MAX_STEPS,
        lazy_images: bool = False,
        shadows: bool = False,
        backend: SimpleNamespace | None = None,
    ):
        mw = backend if backend is not None else load_metaworld()
        if env_name not in mw.environments:
            raise RecapError(f"MetaWorldEnv.env_name: {env_name!r} is not a Meta-World v3 task; "
                             f"use one of {sorted(mw.environments)}")  # fmt: skip
        if not cameras:
            raise RecapError("MetaWorldEnv.cameras: no cameras; map a key such as 'image' to "
                             f"one of {list(MW_CAMERAS)}")  # fmt: skip
        for key, camera in cameras.items():
            if camera not in MW_CAMERAS:
                raise RecapError(f"MetaWorldEnv.cameras[{key!r}]: {camera!r} is not a "
                                 f"Meta-World camera; use one of {list(MW_CAMERAS)}")  # fmt: skip
        if max_steps < 1 or image_size < 1:
            raise RecapError(f"MetaWorldEnv: max_steps={max_steps}, image_size={image_size}; "
                             "both must be >= 1")  # fmt: skip
        self.env_name, self.task = env_name, task_text(env_name)
        self.cameras = dict(cameras)
        self.max_steps, self.lazy_images = int(max_steps), lazy_images
        env = mw.environments[env_name]()
        env._partially_observable = False  # MT1's setting: the goal is in the observation
        if "sawyer_observation_space" in vars(env):  # cached for the hidden goal
            del env.sawyer_observation_space
        env._freeze_rand_vec, env.seeded_rand_vec = False, True  # variations from env.np_random
        env._set_task_called = True
        env.max_path_length = max(env.max_path_length, self.max_steps)
        self.env, self.mujoco = env, mw.mujoco
        if not shadows:
            env.model.vis.quality.shadowsize = 0  # no shadow map (module docstring)
        try:
            self.renderer = mw.mujoco.Renderer(env.model, image_size, image_size)
        except Exception as exc:  # noqa: BLE001 - the GL backend's own error, on one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RecapError(f"Meta-World: MuJoCo cannot render with MUJOCO_GL="
                             f"{os.environ.get('MUJOCO_GL')} ({first}); apt-get install -y "
                             "libosmesa6 and set MUJOCO_GL=osmesa, or MUJOCO_GL=egl on a GPU "
                             "machine") from exc  # fmt: skip
        self.tick, self.steps = 0, 0
        self.spec = EnvSpec(tuple(self.cameras), STATE_NAMES, ACTION_NAMES, fps=FPS,
                            max_steps=self.max_steps, robot_type="sawyer")  # fmt: skip

    def render(self, key: str) -> np.ndarray:
        """uint8[S, S, 3] frame of camera ``key`` now, rotated 180 degrees (module docstring)."""
        self.renderer.update_scene(self.env.data, camera=self.cameras[key])
        return np.ascontiguousarray(self.renderer.render()[::-1, ::-1])

    def observe(self, raw: np.ndarray) -> Observation:
        if self.lazy_images:
            images: Mapping[str, np.ndarray] = LazyImages(self, self.tick)
        else:
            images = {key: self.render(key) for key in self.cameras}
        return {"images": images, "state": np.asarray(raw, np.float32), "task": self.task}

    def reset(self, seed: int) -> Observation:
        self.tick += 1
        self.env.seed(int(seed))
        raw, _info = self.env.reset()
        self.steps = 0
        return self.observe(raw)

    def step(self, action: np.ndarray) -> tuple[Observation, bool, bool]:
        self.tick += 1
        action = np.asarray(action, np.float64).reshape(-1)[:ACTION_DIM]
        raw, _reward, _terminated, _truncated, info = self.env.step(action)
        self.steps += 1
        success = bool(info["success"])
        return self.observe(raw), success, success or self.steps >= self.max_steps

    def close(self) -> None:
        """Free the renderer and the simulator (idempotent; also when garbage-collected).

        The renderer's GL objects are freed with its own context current: MuJoCo's
        ``Renderer.close`` frees them in whichever context is current, which deletes the
        textures of another environment's renderer (its frames then come out wrong)."""
        renderer, self.renderer = getattr(self, "renderer", None), None
        if renderer is not None:
            gl = getattr(renderer, "_gl_context", None)
            mjr = getattr(renderer, "_mjr_context", None)
            if gl is not None and mjr is not None:
                gl.make_current()
                mjr.free()
                renderer._mjr_context = None
            renderer.close()
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            env.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: modules may be gone
            self.close()


@dataclass
class MetaWorldExpert:
    """Meta-World's scripted expert for ``env_name`` as a :data:`~recap.envs.base.Controller`
    (it reads ``obs["state"]`` only), with Gaussian action noise of std ``noise`` (0: the expert)
    from ``np.random.default_rng(seed)``; ``reset(seed)`` restarts that stream for an episode."""

    env_name: str
    noise: float = 0.0
    seed: int = 0
    backend: SimpleNamespace | None = None

    def __post_init__(self) -> None:
        mw = self.backend if self.backend is not None else load_metaworld()
        if self.env_name not in mw.policies:
            raise RecapError(f"MetaWorldExpert.env_name: {self.env_name!r} has no scripted "
                             f"expert; use one of {sorted(mw.policies)}")  # fmt: skip
        self.policy = mw.policies[self.env_name]()
        self.rng = np.random.default_rng(self.seed)

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(self.seed if seed is None else [self.seed, seed])

    def __call__(self, obs: Observation) -> np.ndarray:
        with warnings.catch_warnings():  # "Constant(s) may be too high": Meta-World clips
            warnings.simplefilter("ignore", UserWarning)
            action = np.asarray(self.policy.get_action(np.asarray(obs["state"], np.float64)))
        if self.noise > 0:
            action = action + self.noise * self.rng.standard_normal(action.shape)
        return np.clip(action, -1.0, 1.0).astype(np.float32)


def record_episode(env: MetaWorldEnv, controller: MetaWorldExpert, seed: int) -> Episode:
    """Run episode ``seed`` of ``env`` under ``controller`` (its noise stream restarted from
    ``seed``) through the one closed loop (``recap.envs.rollout``); frame t holds the observation
    before step t and the action taken at it."""
    from recap.envs.base import batched
    from recap.envs.rollout import run_episodes

    controller.reset(seed)
    result = next(run_episodes(batched(controller), [env], 1, seed=seed, record=True))
    return replace(result.episode, flags={})  # no corrections: no such column


def generate_episodes(
    env: MetaWorldEnv,
    num_episodes: int,
    seed: int = 0,
    noise: float | Sequence[float] = 0.0,
    successes_only: bool = False,
    max_tries: int | None = None,
) -> Iterator[Episode]:
    """Episodes ``seed``, ``seed + 1``, ... of the scripted expert with action noise ``noise``
    (a sequence: episode k gets ``noise[k % len(noise)]``); ``successes_only`` skips failed
    ones (demonstrations) and stops with one line after ``max_tries`` (default
    ``2 * num_episodes + 10``) episodes without enough successes."""
    levels = [float(noise)] if np.isscalar(noise) else [float(n) for n in noise]
    experts = [MetaWorldExpert(env.env_name, noise=n, seed=seed) for n in levels]
    tries = max_tries if max_tries is not None else 2 * num_episodes + 10
    made = 0
    for k in range(tries if successes_only else num_episodes):
        if made == num_episodes:
            return
        episode = record_episode(env, experts[k % len(experts)], seed + k)
        if episode.success or not successes_only:
            made += 1
            yield episode
    if made < num_episodes:
        raise RecapError(f"generate_episodes: only {made} of {num_episodes} {env.env_name} "
                         f"episodes succeeded in {tries} tries (noise={noise}); lower the noise "
                         "or raise max_steps")  # fmt: skip


# What a benchmark's data needs: demonstrations (successful expert episodes) and a failure-rich
# rollout set (the expert with light to heavy action noise, cycled per episode, under a tighter
# step limit). Successes of 20 seeds at noise 0.3 / 1.0 / 2.0 with a 100-step limit: reach-v3
# 19 / 16 / 9, push-v3 16 / 0 / 0 (reach-v3 at 150 steps: 20 / 19 / 15; at 60: 15 / 7 / 1).
DEMO_NOISE, ROLLOUT_NOISE = 0.1, (0.3, 1.0, 2.0)


def write_metaworld_dataset(
    root: str | Path,
    env_name: str = "reach-v3",
    num_episodes: int = 50,
    seed: int = 0,
    noise: float | Sequence[float] = 0.0,
    successes_only: bool = False,
    cameras: Mapping[str, str] = CAMERAS,
    image_size: int = IMAGE_SIZE,
    max_steps: int = MAX_STEPS,
    naming: str = "lerobot",
    image_dtype: str = "video",
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``num_episodes`` scripted-expert episodes of ``env_name`` (action noise ``noise``,
    as :func:`generate_episodes`; ``successes_only`` for demonstrations) as a LeRobot v3.0
    dataset at ``root``, with ``is_success`` per frame; returns ``write_lerobot_dataset``'s
    summary."""
    env = MetaWorldEnv(env_name, cameras, image_size, max_steps)
    try:
        episodes = generate_episodes(env, num_episodes, seed, noise, successes_only)
        return write_lerobot_dataset(root, episodes, env.spec.writer(naming, image_dtype),
                                     overwrite=overwrite)  # fmt: skip
    finally:
        env.close()


def write_metaworld_datasets(
    root: str | Path,
    env_name: str = "reach-v3",
    demo_episodes: int = 50,
    rollout_episodes: int = 50,
    seed: int = 0,
    rollout_max_steps: int = 100,
    overwrite: bool = False,
    workers: int = 1,
    **kwargs: Any,
) -> dict[str, dict[str, Any]]:
    """``root/sft``: successful expert demonstrations (noise :data:`DEMO_NOISE`); ``root/rollout``:
    the expert with noise :data:`ROLLOUT_NOISE` and ``rollout_max_steps`` (failure-rich), on
    seeds disjoint from the demonstrations'. Existing datasets are kept unless ``overwrite``
    (the cache); ``workers`` > 1 writes the two in separate processes (the same files: each
    depends on its seeds alone). Returns name -> summary (``{"path", "written": False}`` for a
    kept one); ``kwargs`` go to :func:`write_metaworld_dataset`."""
    jobs: Sequence[tuple[str, dict[str, Any]]] = (
        ("sft", dict(num_episodes=demo_episodes, seed=seed, noise=DEMO_NOISE,
                     successes_only=True)),
        ("rollout", dict(num_episodes=rollout_episodes, seed=seed + 1_000_000,
                         noise=ROLLOUT_NOISE, max_steps=rollout_max_steps)),
    )  # fmt: skip
    out = {name: {"path": str(Path(root) / name), "written": False} for name, _ in jobs}
    todo = [(name, kwargs | job) for name, job in jobs
            if overwrite or not Path(out[name]["path"]).exists()]  # fmt: skip
    paths = [Path(root) / name for name, _ in todo]
    if workers > 1 and len(todo) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("spawn")  # no forked GL or video-codec state
        with ProcessPoolExecutor(min(workers, len(todo)), mp_context=context) as pool:
            futures = [pool.submit(_write_job, p, env_name, overwrite, job)
                       for p, (_, job) in zip(paths, todo)]  # fmt: skip
            summaries = [f.result() for f in futures]
    else:
        summaries = [_write_job(p, env_name, overwrite, job) for p, (_, job) in zip(paths, todo)]
    for (name, _), summary in zip(todo, summaries):
        out[name] = summary | {"written": True}
    return out


# The words of recap's prompts besides the task text: the value model's "Task: ...", openpi's
# state text (one word per bin) and the advantage label.
PROMPT_WORDS = ("Task:", ".", ",", "State:", ";", "Action:", "Advantage:", "positive", "negative")


def write_metaworld_tokenizer(directory: str | Path, force: bool = False) -> Path:
    """A word-level tokenizer (``recap.processing.transforms.write_word_tokenizer``) covering the
    task text of every Meta-World v3 task, :data:`PROMPT_WORDS` and openpi's 256 state bins, at
    ``directory`` (kept if present unless ``force``): one tokenizer for any task, so the gin files
    of ``gin/metaworld/`` fix one vocabulary size (384 covers it)."""
    from recap.processing.transforms import write_word_tokenizer

    path = Path(directory)
    if (path / "tokenizer.json").is_file() and not force:
        return path
    texts = [task_text(name) for name in sorted(load_metaworld().environments)]
    texts += [" ".join(PROMPT_WORDS), " ".join(str(b) for b in range(256))]
    return write_word_tokenizer(path, texts)


def _write_job(path: Path, env_name: str, overwrite: bool, job: dict[str, Any]) -> dict[str, Any]:
    return write_metaworld_dataset(path, env_name, overwrite=overwrite, **job)
