"""A tiny rendered 2-D reaching task, its scripted policies, and demo LeRobot datasets of it.

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
so :func:`evaluate` runs them, or any learned policy, in closed loop.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recap.data.lerobot_writer import V21, V30, Episode, WriterConfig, write_lerobot_dataset
from recap.errors import RecapError

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
    """The reaching task with a stepping API: ``reset() -> obs``, ``step(a) -> (obs, done, ok)``.

    Episode layouts are drawn in sequence from ``np.random.default_rng(seed)``; dynamics are
    deterministic.
    """

    def __init__(self, seed: int = 0, config: ReachConfig = ReachConfig()):
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.layout: Layout | None = None

    def reset(self, layout: Layout | None = None) -> Observation:
        """Start an episode (at ``layout``, else a freshly sampled one); returns its first obs."""
        self.layout = layout if layout is not None else sample_layout(self.rng, self.config)
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
        """Apply float[>=2] ``action`` (clipped to [-1, 1]); returns (obs, done, success)."""
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
        return self.observe(), self.done, self.success


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


def reset_policy(policy: Policy) -> None:
    """``policy.reset()`` when it has one (a controller starting an episode)."""
    reset = getattr(policy, "reset", None)
    if callable(reset):
        reset()


def evaluate(
    policy: Policy, num_episodes: int, seed: int = 0, config: ReachConfig = ReachConfig()
) -> float:
    """Closed-loop success rate of ``policy(obs) -> float[7]`` over ``num_episodes`` episodes.

    ``policy.reset()`` is called at each episode start when it exists. Layouts come from
    ``ReachEnv(seed)``, so a seed fixes the episodes (the same as :func:`evaluate_batch`'s).
    """
    env, successes = ReachEnv(seed, config), 0
    for _ in range(num_episodes):
        obs, done, success = env.reset(), False, False
        reset_policy(policy)
        while not done:
            obs, done, success = env.step(policy(obs))
        successes += success
    return successes / max(num_episodes, 1)


def evaluate_batch(
    policy: Callable[[Observation], np.ndarray],
    num_episodes: int,
    seed: int = 0,
    batch_size: int = 32,
    config: ReachConfig = ReachConfig(),
) -> float:
    """Like :func:`evaluate` for a batched policy, running ``batch_size`` episodes in lockstep.

    ``policy`` gets ``{"images": {cam: uint8[B,S,S,3]}, "state": float32[B,8], "task": list[str]}``
    for the B running episodes and returns float[B, >=2].
    """
    outcomes = episode_outcomes(policy, num_episodes, seed, batch_size, config)
    return float(outcomes.sum()) / max(num_episodes, 1)


def episode_outcomes(
    policy: Callable[[Observation], np.ndarray],
    num_episodes: int,
    seed: int = 0,
    batch_size: int = 32,
    config: ReachConfig = ReachConfig(),
    headings: list[float] | None = None,
) -> np.ndarray:
    """bool[num_episodes]: success of each seeded episode (layout k of ``ReachEnv(seed)`` at
    position k, so two policies' outcomes pair episode by episode), batched as
    :func:`evaluate_batch`. ``headings``: a list that receives :func:`heading` of every step."""
    successes = np.zeros(num_episodes, dtype=bool)
    layouts = seeded_layouts(num_episodes, seed, config)
    for start in range(0, num_episodes, batch_size):
        batch = layouts[start : start + batch_size]
        envs = [ReachEnv(0, config) for _ in batch]
        obs = [env.reset(layout) for env, layout in zip(envs, batch, strict=True)]
        live = list(range(len(envs)))
        while live:
            actions = np.asarray(policy(stack_observations([obs[i] for i in live])))
            for i, action in zip(list(live), actions, strict=True):
                if headings is not None:
                    headings.append(heading(envs[i], action))
                obs[i], done, success = envs[i].step(action)
                if done:
                    live.remove(i)
                    successes[start + i] = success
    return successes


def heading(env: ReachEnv, action: np.ndarray) -> float:
    """Cosine between ``action``'s (dx, dy) and the way from the agent to the named target: 1
    heads straight for it; a policy that ignores the scene averages ~0 (0 for a zero action)."""
    way = env.layout.targets[env.layout.color] - env.agent
    move = np.asarray(action, np.float64)[:2]
    norm = float(np.linalg.norm(way) * np.linalg.norm(move))
    return float(way @ move / norm) if norm > 0 else 0.0


def seeded_layouts(count: int, seed: int, config: ReachConfig = ReachConfig()) -> list[Layout]:
    """The first ``count`` episode layouts of ``ReachEnv(seed)``: the evaluation's episodes."""
    rng = ReachEnv(seed, config).rng
    return [sample_layout(rng, config) for _ in range(count)]


def stack_observations(observations: Sequence[Observation]) -> Observation:
    """Batch observations (this task's or any ``recap.envs`` env's): images uint8[B,H,W,3] per
    camera, state float32[B,S], task list."""
    cams = observations[0]["images"]
    return {
        "images": {c: np.stack([o["images"][c] for o in observations]) for c in cams},
        "state": np.stack([np.asarray(o["state"], np.float32) for o in observations]),
        "task": [o["task"] for o in observations],
    }


# ---- recorded episodes and the demo datasets --------------------------------------------------

# (name, weight, ScriptedPolicy keyword arguments, or None for RandomPolicy)
PolicyMix = tuple[tuple[str, float, dict[str, float] | None], ...]
EXPERT_MIX: PolicyMix = (("expert", 1.0, {"noise": 0.1}),)
ROLLOUT_MIX: PolicyMix = (
    ("noisy", 0.40, {"noise": 0.5}),
    ("confused", 0.30, {"confusion": 1.0, "noise": 0.2}),  # heads for the wrong target
    ("random", 0.30, None),
)


def record_episode(env: ReachEnv, policy: Policy, layout: Layout | None = None) -> Episode:
    """Run one closed-loop episode; frame t holds obs_t and the action taken at it."""
    obs, done, success = env.reset(layout), False, False
    reset_policy(policy)
    images: dict[str, list[np.ndarray]] = {cam: [] for cam in obs["images"]}
    states, actions, task = [], [], obs["task"]
    while not done:
        for cam, image in obs["images"].items():
            images[cam].append(image)
        states.append(obs["state"])
        actions.append(pad_action(np.asarray(policy(obs), np.float64)[:2]))
        obs, done, success = env.step(actions[-1])
    return Episode(
        images={cam: np.stack(frames) for cam, frames in images.items()},
        state=np.stack(states),
        action=np.stack(actions),
        task=task,
        success=success,
    )


def generate_episodes(
    num_episodes: int,
    seed: int | Sequence[int],
    mix: PolicyMix = EXPERT_MIX,
    config: ReachConfig = ReachConfig(),
    successes_only: bool = False,
) -> Iterator[Episode]:
    """Yield ``num_episodes`` episodes, each from a policy drawn from ``mix``; deterministic.

    With ``successes_only`` failed episodes are dropped and replaced (for demonstrations).
    """
    weights = np.array([w for _, w, _ in mix], np.float64)
    sequence, made = np.random.SeedSequence(seed), 0
    for attempt in itertools.count():
        if made == num_episodes:
            return
        if attempt >= 20 * num_episodes + 20:
            raise RecapError(
                f"generate_episodes: only {made} of {num_episodes} episodes succeeded in "
                f"{attempt} tries; raise max_steps or use a stronger policy mix"
            )
        env_seed, policy_seed, choice_seed = sequence.spawn(1)[0].generate_state(3)
        pick = np.random.default_rng(choice_seed).choice(len(mix), p=weights / weights.sum())
        kwargs = mix[pick][2]
        policy: Policy = (
            RandomPolicy(seed=int(policy_seed))
            if kwargs is None
            else ScriptedPolicy(seed=int(policy_seed), max_speed=config.max_speed, **kwargs)
        )
        episode = record_episode(ReachEnv(int(env_seed), config), policy)
        if episode.success or not successes_only:
            made += 1
            yield episode


@dataclass(frozen=True)
class DemoDataset:
    """One demo dataset: its type (``sft`` / ``rollout``), policy mix and on-disk format."""

    name: str
    type: str
    mix: PolicyMix
    writer: WriterConfig
    stream: int  # seed stream, so the datasets never share episodes


def demo_datasets(fps: int = 10, max_frames_per_file: int = 500) -> tuple[DemoDataset, ...]:
    """sft: v2.1, libero names, video; rollout: v3.0, LeRobot names, video, episodes spanning
    data files; eval (held out): v3.0, LeRobot names, PNG images in parquet."""
    return (
        DemoDataset("sft", "sft", EXPERT_MIX, WriterConfig(V21, "libero", "video", fps), 0),
        DemoDataset(
            "rollout",
            "rollout",
            ROLLOUT_MIX,
            WriterConfig(V30, "lerobot", "video", fps, max_frames_per_file=max_frames_per_file),
            1,
        ),
        DemoDataset("eval", "rollout", ROLLOUT_MIX, WriterConfig(V30, "lerobot", "image", fps), 2),
    )


def write_demo_datasets(
    root: str | Path,
    seed: int = 0,
    sft_episodes: int = 300,
    rollout_episodes: int = 300,
    eval_episodes: int = 60,
    max_steps: int = 40,
    max_frames_per_file: int = 500,
    force: bool = False,
    state_targets: bool = False,
    workers: int = 1,
) -> dict[str, dict[str, Any]]:
    """Write ``root/{sft,rollout,eval}`` (existing ones are kept unless ``force``);
    ``state_targets``: ``ReachConfig.state_targets``; ``workers`` > 1 writes the datasets in
    that many processes (each dataset's bytes depend only on its seed stream, so the files are
    the same as one process writes).

    Returns name -> {"path", "type", "version", "episodes", "successes", "frames", "written"}.
    """
    config = ReachConfig(max_steps=max_steps, state_targets=state_targets)
    sizes = {"sft": sft_episodes, "rollout": rollout_episodes, "eval": eval_episodes}
    jobs = []
    for spec in demo_datasets(config.fps, max_frames_per_file):
        path = Path(root) / spec.name
        if force or not path.exists():
            jobs.append((path, spec, sizes[spec.name], seed, config, force))
    if workers > 1 and len(jobs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("spawn")  # no forked torch / video-codec state
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            list(pool.map(_write_demo_dataset, *zip(*jobs, strict=True)))
    else:
        for job in jobs:
            _write_demo_dataset(*job)
    written = {job[1].name for job in jobs}
    return {
        spec.name: {"type": spec.type, **summarize_dataset(Path(root) / spec.name),
                    "written": spec.name in written}
        for spec in demo_datasets(config.fps, max_frames_per_file)
    }  # fmt: skip


def _write_demo_dataset(
    path: Path, spec: DemoDataset, episodes: int, seed: int, config: ReachConfig, force: bool
) -> None:
    writer = replace(spec.writer, state_names=config.state_names, action_names=ACTION_NAMES)
    stream = generate_episodes(
        episodes,
        seed=[seed, spec.stream],
        mix=spec.mix,
        config=config,
        successes_only=spec.type == "sft",
    )
    write_lerobot_dataset(path, stream, writer, overwrite=force)


def summarize_dataset(root: str | Path) -> dict[str, Any]:
    """{"path", "version", "episodes", "successes", "frames"} of a written dataset on disk."""
    root = Path(root)
    info = json.loads((root / "meta/info.json").read_text())
    files = sorted((root / "data").glob("*/*.parquet"))
    table = pa.concat_tables(pq.read_table(f, columns=["is_success", "done"]) for f in files)
    last = table.column("done").to_numpy(zero_copy_only=False)
    successes = int(table.column("is_success").to_numpy(zero_copy_only=False)[last].sum())
    return {
        "path": str(root),
        "version": info["codebase_version"],
        "episodes": int(info["total_episodes"]),
        "successes": successes,
        "frames": int(info["total_frames"]),
    }


DEMO_PROMPT_WORDS = ("Task:", ".", "Advantage:", "positive", "negative")


def write_demo_tokenizer(root: str | Path, force: bool = False, state_bins: bool = False) -> Path:
    """A word-level tokenizer for the demo's prompts at ``{root}/tokenizer`` (kept if present):
    the task texts plus the value prompt ``Task: ....`` and the advantage text; ``state_bins``:
    also openpi's state text (``State: 0 ... 255;`` ``Action:``), one word per bin, for
    ``policy_data.state_in_prompt``, with ids after the plain tokenizer's (whose ids stay: the
    value model's prompts encode as without them)."""
    from recap.data.transforms import write_word_tokenizer

    path = Path(root) / "tokenizer"
    if (path / "tokenizer.json").is_file() and not force:
        return path
    texts = [task_text(c) for c in COLORS] + [" ".join(DEMO_PROMPT_WORDS)]
    extra = ["State: ; Action: ,", " ".join(str(b) for b in range(256))] if state_bins else []
    return write_word_tokenizer(path, texts, extra)  # the plain words keep their ids
