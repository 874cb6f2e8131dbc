"""The demo's LeRobot datasets of the reaching task (sft, rollout, eval) and its tokenizer.

Episodes are recorded through the one closed loop (``recap.envs.rollout.run_episodes``); each
episode's environment seed, policy seed and policy choice come from a ``SeedSequence`` spawned per
attempt, so a dataset's bytes depend only on its seed stream.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recap.data.lerobot_writer import V21, V30, Episode, WriterConfig, write_lerobot_dataset
from recap.envs.base import batched, reset_policy
from recap.envs.reach.task import (
    ACTION_NAMES,
    COLORS,
    Layout,
    Policy,
    RandomPolicy,
    ReachConfig,
    ReachEnv,
    ScriptedPolicy,
    task_text,
)
from recap.envs.rollout import run_episodes
from recap.errors import RecapError

# (name, weight, ScriptedPolicy keyword arguments, or None for RandomPolicy)
PolicyMix = tuple[tuple[str, float, dict[str, float] | None], ...]
EXPERT_MIX: PolicyMix = (("expert", 1.0, {"noise": 0.1}),)
ROLLOUT_MIX: PolicyMix = (
    ("noisy", 0.40, {"noise": 0.5}),
    ("confused", 0.30, {"confusion": 1.0, "noise": 0.2}),  # heads for the wrong target
    ("random", 0.30, None),
)


def record_episode(env: ReachEnv, policy: Policy, seed: int | Layout) -> Episode:
    """Run one closed-loop episode of ``policy`` (one observation -> action; its ``reset()``
    called first) from ``env.reset(seed)`` through the one loop (``recap.envs.rollout``); frame t
    holds obs_t and the action taken at it."""
    reset_policy(policy)
    result = next(run_episodes(batched(policy), [env], 1, seed=seed, record=True))
    return replace(result.episode, flags={})  # no corrections: the demo data has no such column


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
        episode = record_episode(ReachEnv(config), policy, int(env_seed))
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
