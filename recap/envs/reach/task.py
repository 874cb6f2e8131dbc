"""A tiny rendered 2-D reaching task and its scripted policies (the demo's task).

World: the unit square, y pointing down. An agent (white disc) and two targets (red, blue discs)
start at random positions at least ``min_separation`` apart; the instruction names one target
("reach the red target"), so the language matters. Each step the action's first two entries,
clipped to [-1, 1], move the agent by ``max_speed`` times that; the episode succeeds when the agent
is within ``success_radius`` of the named target and ends then or after ``max_steps`` steps.

Observation (like LIBERO): ``images`` {"image": uint8[64, 64, 3] of the whole square,
"wrist_image": uint8[64, 64, 3] zoomed on the agent}, both showing the agent's path so far as
grey dots, brighter the more recent (as a robot scene keeps the marks of what was done: one frame
shows how the episode is going, not only where the agent is), ``state`` float32[8] =
(x, y, vx, vy, 0...) with v the last applied action, ``task`` str; with
``ReachConfig.state_targets`` the last four are each target's offset from the agent (red dx, dy,
blue dx, dy) and the velocity is left out (0): the state then carries what the camera shows, so a
tiny policy can act on it without first learning to see, and not the last action, which a policy
imitating a steady expert would learn to copy (the "copycat" shortcut: right on recorded frames,
lost in closed loop, where its own first action is what it copies). Actions are float32[7] =
(dx, dy, 0...).

Scripted policies see only the observation (they locate the targets by colour in the base image),
so ``recap.envs.rollout`` runs them, or any learned policy, in closed loop; :class:`ReachEnv` is an
:class:`~recap.envs.base.Env` (``reset(seed)``, ``step -> (obs, success, done)``), and
:func:`heading` is the task's per-step metric of that loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recap.envs.base import EnvSpec

COLORS = {"red": (220, 40, 40), "blue": (40, 90, 230)}
AGENT_RGB, FLOOR_RGB, GRID_RGB, OUTSIDE_RGB = (255, 255, 255), (40, 40, 40), (60, 60, 60), (0, 0, 0)
STATE_NAMES = ("x", "y", "vx", "vy", "pad_4", "pad_5", "pad_6", "pad_7")
TARGET_STATE_NAMES = ("x", "y", "pad_2", "pad_3", "red_dx", "red_dy", "blue_dx", "blue_dy")
ACTION_NAMES = ("dx", "dy", "pad_2", "pad_3", "pad_4", "pad_5", "pad_6")
STATE_DIM, ACTION_DIM = len(STATE_NAMES), len(ACTION_NAMES)

Observation = dict[str, Any]
Policy = Callable[[Observation], np.ndarray]


def task_text(color: str) -> str:
    """The instruction for reaching the ``color`` target."""
    return f"reach the {color} target"


def task_color(task: str) -> str:
    """The target colour named by an instruction."""
    return next(c for c in COLORS if c in task.split())


@dataclass(frozen=True)
class ReachConfig:
    """Task constants, in world units (the square is 1 x 1) unless said otherwise."""

    image_size: int = 64  # pixels, both cameras
    wrist_view: float = 1.0  # side of the square the wrist camera sees
    max_steps: int = 40
    fps: int = 10
    max_speed: float = 0.04  # displacement per step at |action| = 1
    success_radius: float = 0.05
    min_separation: float = 0.25
    margin: float = 0.1  # objects start in [margin, 1 - margin]^2
    agent_radius: float = 0.05
    target_radius: float = 0.1
    grid: float = 0.125  # floor grid spacing, so the wrist camera sees motion
    trail_radius: float = 0.012  # the agent's past positions, drawn as grey dots (0: none)
    state_targets: bool = False  # state[4:8]: each target's offset from the agent (module doc)

    @property
    def state_names(self) -> tuple[str, ...]:
        return TARGET_STATE_NAMES if self.state_targets else STATE_NAMES


@dataclass
class Layout:
    """Start of an episode: agent float64[2], targets colour -> float64[2], named colour."""

    agent: np.ndarray
    targets: dict[str, np.ndarray]
    color: str


def sample_layout(rng: np.random.Generator, config: ReachConfig = ReachConfig()) -> Layout:
    """Agent and both targets uniform in the inner square, pairwise >= ``min_separation`` apart."""
    lo, hi = config.margin, 1.0 - config.margin
    while True:
        points = rng.uniform(lo, hi, size=(3, 2))
        gaps = np.linalg.norm(points[:, None] - points[None], axis=-1)[np.triu_indices(3, 1)]
        if gaps.min() >= config.min_separation:
            break
    color = ("red", "blue")[int(rng.integers(2))]
    return Layout(points[0], {"red": points[1], "blue": points[2]}, color)


def render(
    center: np.ndarray,
    view: float,
    agent: np.ndarray,
    targets: Mapping[str, np.ndarray],
    config: ReachConfig = ReachConfig(),
    trail: np.ndarray | None = None,
) -> np.ndarray:
    """uint8[S, S, 3] picture of the ``view`` x ``view`` world square centred at ``center``.

    ``trail`` float[K, 2]: past agent positions, oldest first, drawn as grey dots under the
    discs (grey 80 for the oldest up to 200 for the newest; never taken for a target colour).
    """
    size = config.image_size
    offsets = (np.arange(size) + 0.5) * (view / size) - view / 2
    x, y = (center[0] + offsets)[None, :], (center[1] + offsets)[:, None]
    image = np.empty((size, size, 3), np.uint8)
    image[:] = OUTSIDE_RGB
    inside = (x >= 0) & (x <= 1) & (y >= 0) & (y <= 1)
    line = 1.0 / 64
    grid = ((x % config.grid) < line) | ((y % config.grid) < line)
    image[inside & ~grid] = FLOOR_RGB
    image[inside & grid] = GRID_RGB
    if trail is not None and len(trail) and config.trail_radius > 0:
        trail = np.asarray(trail, np.float64)
        gaps = (x[None] - trail[:, 0, None, None]) ** 2 + (y[None] - trail[:, 1, None, None]) ** 2
        near = gaps <= config.trail_radius**2  # [K, S, S]
        newest = np.where(near.any(0), len(trail) - 1 - np.argmax(near[::-1], axis=0), -1)
        shade = np.linspace(80, 200, len(trail)) if len(trail) > 1 else np.array([200.0])
        image[newest >= 0] = shade[newest[newest >= 0]].astype(np.uint8)[:, None]
    for color, pos in targets.items():
        image[(x - pos[0]) ** 2 + (y - pos[1]) ** 2 <= config.target_radius**2] = COLORS[color]
    image[(x - agent[0]) ** 2 + (y - agent[1]) ** 2 <= config.agent_radius**2] = AGENT_RGB
    return image


class ReachEnv:
    """The reaching task behind the :class:`~recap.envs.base.Env` protocol: ``reset(seed) ->
    obs`` draws the episode's layout from ``np.random.default_rng(seed)`` (or starts at a given
    :class:`Layout`), ``step(a) -> (obs, success, done)``; dynamics are deterministic."""

    def __init__(self, config: ReachConfig = ReachConfig()):
        self.config = config
        self.layout: Layout | None = None
        self.spec = EnvSpec(
            cameras=("image", "wrist_image"),
            state_names=tuple(config.state_names),
            action_names=ACTION_NAMES,
            fps=config.fps,
            max_steps=config.max_steps,
            robot_type="reach2d",
        )
        self.step_metrics = {"heading": heading}  # averaged by the closed loop's evaluation

    def reset(self, seed: int | Layout) -> Observation:
        """Start an episode at the layout of ``seed`` (or at ``seed`` when it is a Layout)."""
        if isinstance(seed, Layout):
            self.layout = seed
        else:
            self.layout = sample_layout(np.random.default_rng(seed), self.config)
        self.agent = np.array(self.layout.agent, np.float64)
        self.velocity = np.zeros(2)
        self.path: list[np.ndarray] = []  # positions before the current one, oldest first
        self.steps, self.done, self.success = 0, False, False
        return self.observe()

    def observe(self) -> Observation:
        """``{"images": {"image", "wrist_image"}: uint8[S,S,3], "state": float32[8], "task"}``."""
        cfg, targets = self.config, self.layout.targets
        state = np.zeros(STATE_DIM, np.float32)
        state[:2] = self.agent
        if cfg.state_targets:  # no velocity: the last action would let a policy copy itself
            state[4:] = (*(targets["red"] - self.agent), *(targets["blue"] - self.agent))
        else:
            state[2:4] = self.velocity
        trail = np.array(self.path).reshape(-1, 2)
        return {
            "images": {
                "image": render(np.array([0.5, 0.5]), 1.0, self.agent, targets, cfg, trail),
                "wrist_image": render(self.agent, cfg.wrist_view, self.agent, targets, cfg, trail),
            },
            "state": state,
            "task": task_text(self.layout.color),
        }

    def step(self, action: np.ndarray) -> tuple[Observation, bool, bool]:
        """Apply float[>=2] ``action`` (clipped to [-1, 1]); returns (obs, success, done)."""
        if self.layout is None or self.done:
            raise RuntimeError("ReachEnv.step: call reset() first (the episode is over)")
        cfg = self.config
        self.velocity = np.clip(np.asarray(action, np.float64)[:2], -1.0, 1.0)
        self.path.append(self.agent)
        self.agent = np.clip(self.agent + cfg.max_speed * self.velocity, 0.0, 1.0)
        self.steps += 1
        gap = np.linalg.norm(self.agent - self.layout.targets[self.layout.color])
        self.success = bool(gap <= cfg.success_radius)
        self.done = self.success or self.steps >= cfg.max_steps
        return self.observe(), self.success, self.done


def locate_target(image: np.ndarray, color: str) -> np.ndarray | None:
    """World float64[2] centroid of the ``color`` target's pixels in a base image, or None."""
    rgb = image.astype(np.int16)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    mask = (r > 150) & (g < 110) & (b < 110) if color == "red" else (b > 150) & (r < 110)
    rows, cols = np.nonzero(mask)
    if rows.size == 0:
        return None
    return (np.array([cols.mean(), rows.mean()]) + 0.5) / image.shape[1]


def pad_action(xy: np.ndarray) -> np.ndarray:
    """float32[7] action from a float[2] (dx, dy) clipped to [-1, 1]."""
    action = np.zeros(ACTION_DIM, np.float32)
    action[:2] = np.clip(xy, -1.0, 1.0)
    return action


@dataclass
class ScriptedPolicy:
    """Heads straight for a target found in the base image, with Gaussian action noise.

    A confused episode (probability ``confusion``, drawn at ``reset``) heads for the other target
    until it recovers, with probability ``recover_prob`` per step. noise=confusion=0: the expert.
    """

    noise: float = 0.0
    confusion: float = 0.0
    recover_prob: float = 0.0
    seed: int = 0
    max_speed: float = ReachConfig.max_speed
    confused: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def reset(self) -> None:
        """Start an episode: draw whether it is confused."""
        self.confused = bool(self.rng.random() < self.confusion)

    def __call__(self, obs: Observation) -> np.ndarray:
        if self.confused and self.rng.random() < self.recover_prob:
            self.confused = False
        color = task_color(obs["task"])
        if self.confused:
            color = next(c for c in COLORS if c != color)
        target = locate_target(obs["images"]["image"], color)
        xy = np.zeros(2) if target is None else (target - obs["state"][:2]) / self.max_speed
        xy = xy / max(1.0, float(np.linalg.norm(xy)))
        return pad_action(xy + self.noise * self.rng.standard_normal(2))


@dataclass
class RandomPolicy:
    """Uniform random (dx, dy) in [-1, 1]^2."""

    seed: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, obs: Observation) -> np.ndarray:
        return pad_action(self.rng.uniform(-1.0, 1.0, size=2))


def reach_expert(config: ReachConfig = ReachConfig()) -> ScriptedPolicy:
    """The task's scripted expert: straight for the named target, no noise, never confused."""
    return ScriptedPolicy(max_speed=config.max_speed)


def heading(env: ReachEnv, action: np.ndarray) -> float:
    """Cosine between ``action``'s (dx, dy) and the way from the agent to the named target: 1
    heads straight for it; a policy that ignores the scene averages ~0 (0 for a zero action).
    A step metric of the closed loop (``recap.envs.rollout.run_episodes``' ``step_metrics``)."""
    way = env.layout.targets[env.layout.color] - env.agent
    move = np.asarray(action, np.float64)[:2]
    norm = float(np.linalg.norm(way) * np.linalg.norm(move))
    return float(way @ move / norm) if norm > 0 else 0.0
