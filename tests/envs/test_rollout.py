"""recap.envs: the protocol on the reaching task, chunked closed loops, collection, corrections."""

import json

import numpy as np
import pyarrow as pa
import pytest

from recap.core import columns as C
from recap.core.advantages import VALUE, add_advantages
from recap.core.normalize import ReturnRange
from recap.core.thresholds import IS_CORRECTION, LabelOptions
from recap.data.lerobot import LEROBOT_KEYS, LocalDataset, detect_key_map
from recap.data.lerobot_writer import Episode, WriterConfig, write_lerobot_dataset
from recap.data.specs import DatasetSpec
from recap.envs import (
    ActionDrift,
    EnvSpec,
    ReachEnv,
    batched,
    collect,
    evaluate,
    reach_expert,
    run_episodes,
)
from recap.envs.reach import ReachConfig, ScriptedPolicy
from recap.envs.rollout import COLLECT_FILE
from recap.errors import RecapError
from recap.steps.relabel import frame_columns

CONFIG = ReachConfig(image_size=16, max_steps=30)


def confused(seed=0):
    """Heads for the wrong target and never recovers: fails unless corrected."""
    policy = ScriptedPolicy(confusion=1.0, seed=seed, max_speed=CONFIG.max_speed)
    policy.reset()  # draws the confusion (probability 1); it lasts, recover_prob is 0
    return policy


def test_reach_task_follows_the_protocol():
    env = ReachEnv(CONFIG)
    first = env.reset(3)
    assert sorted(first["images"]) == ["image", "wrist_image"]
    assert first["images"]["image"].shape == (16, 16, 3) and first["state"].shape == (8,)
    np.testing.assert_array_equal(env.reset(3)["state"], first["state"])  # the seed fixes it
    assert not np.array_equal(env.reset(4)["state"], first["state"])
    expert, obs = reach_expert(CONFIG), env.reset(3)
    steps = []
    while True:
        obs, success, done = env.step(expert(obs))  # (obs, success, done): the order
        steps.append((success, done))
        if done:
            break
    assert steps[-1] == (True, True) and all(s == (False, False) for s in steps[:-1])
    assert env.spec == EnvSpec(("image", "wrist_image"), CONFIG.state_names,
                               ("dx", "dy", "pad_2", "pad_3", "pad_4", "pad_5", "pad_6"),
                               10, 30, "reach2d")  # fmt: skip


class CountingEnv:
    """Episode of ``length`` steps; records the first action entry of every step."""

    def __init__(self, length=7):
        self.length, self.log = length, {}
        self.spec = EnvSpec(("image",), ("s",), ("a",), 10, length, "stub")

    def obs(self):
        image = np.full((2, 2, 3), self.t, np.uint8)
        return {"images": {"image": image}, "state": np.array([self.seed], np.float32),
                "task": "count"}  # fmt: skip

    def reset(self, seed):
        self.seed, self.t = seed, 0
        self.log[seed] = []
        return self.obs()

    def step(self, action):
        self.log[self.seed].append(float(action[0]))
        self.t += 1
        return self.obs(), self.seed % 2 == 0, self.t >= self.length


class ChunkPolicy:
    """Chunk h of call c is 100 * c + h; records each call's batch (the episodes' seeds)."""

    def __init__(self, horizon=4):
        self.horizon, self.calls = horizon, []

    def __call__(self, obs):
        c = len(self.calls)
        self.calls.append(obs["state"][:, 0].astype(int).tolist())
        chunk = 100.0 * c + np.arange(self.horizon, dtype=np.float32)
        return np.tile(chunk[None, :, None], (len(obs["task"]), 1, 1))


def test_replan_steps_executes_the_first_actions_of_each_chunk():
    env, policy = CountingEnv(7), ChunkPolicy(4)
    results = list(run_episodes(policy, [env], 1, seed=10, replan_steps=3))
    assert env.log[10] == [0, 1, 2, 100, 101, 102, 200]  # 3 of each chunk, 7 steps
    assert policy.calls == [[10], [10], [10]]
    assert [(r.index, r.success, r.steps, r.corrections) for r in results] == [(0, True, 7, 0)]


def test_environments_run_in_lockstep_and_take_the_next_episode():
    envs, policy = [CountingEnv(3), CountingEnv(3)], ChunkPolicy(1)
    results = list(run_episodes(policy, envs, 3, seed=5, replan_steps=1))
    # seeds 5, 6 together; then episode 2 (seed 7) alone on the first free environment
    assert policy.calls == [[5, 6]] * 3 + [[7]] * 3
    assert sorted((r.index, r.success) for r in results) == [(0, False), (1, True), (2, False)]
    assert envs[0].log == {5: [0, 100, 200], 7: [300, 400, 500]}


def test_a_chunk_shorter_than_replan_steps_is_executed_whole_then_replanned():
    env, policy = CountingEnv(5), ChunkPolicy(2)
    list(run_episodes(policy, [env], 1, seed=0, replan_steps=5))
    assert env.log[0] == [0, 1, 100, 101, 200]


def test_bad_policy_output_and_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match=r"^policy: returned shape \(1,\) for 1 observations"):
        list(run_episodes(lambda obs: np.zeros(1), [CountingEnv()], 1))
    with pytest.raises(ValueError, match="^replan_steps=0: execute at least one action"):
        list(run_episodes(ChunkPolicy(), [CountingEnv()], 1, replan_steps=0))
    env = CountingEnv()
    with pytest.raises(ValueError, match=r"^envs: the same environment twice \(entries 0 and 1\)"):
        list(run_episodes(ChunkPolicy(), [env, env], 2))


def test_evaluate_per_beta_on_the_same_seeded_episodes():
    policies = {1.0: batched(reach_expert(CONFIG)), 2.0: batched(confused())}
    out = evaluate(policies.__getitem__, lambda: ReachEnv(CONFIG), 4, seed=0,
                   betas=(1.0, 2.0), replan_steps=2, num_envs=3)  # fmt: skip
    assert out["success"] == {"beta_1": 1.0, "beta_2": 0.0}
    assert out["outcomes"] == {"beta_1": [1, 1, 1, 1], "beta_2": [0, 0, 0, 0]}
    assert (out["num_episodes"], out["seed"], out["replan_steps"]) == (4, 0, 2)


def _read(root):
    with LocalDataset(root) as ds:
        table = ds.read_columns([C.EPISODE_INDEX, C.FRAME_INDEX, "is_success", IS_CORRECTION,
                                 "action", "observation.state"],
                                flags=["is_success", IS_CORRECTION])  # fmt: skip
        images = ds.frames("observation.images.image", np.arange(ds.num_frames))
        return table, images, ds.info, detect_key_map(ds.features)


def test_collect_with_an_expert_writes_corrections_that_read_back(tmp_path):
    expert = reach_expert(CONFIG)
    kwargs = dict(expert=expert, drift=ActionDrift(1.0, dims=2), takeover_steps=4, num_envs=2)
    summary = collect(batched(confused()), lambda: ReachEnv(CONFIG), 3, 7, tmp_path / "ds",
                      image_dtype="image", record={"policy": "confused"}, **kwargs)  # fmt: skip
    # the confused agent alone never succeeds; corrected it always does
    assert (summary["episodes"], summary["successes"], summary["version"]) == (3, 3, "v3.0")
    recorded = sorted(run_episodes(batched(confused()), lambda: ReachEnv(CONFIG), 3, 7,
                                   record=True, **kwargs), key=lambda r: r.index)  # fmt: skip
    table, images, info, keys = _read(tmp_path / "ds")
    assert keys == LEROBOT_KEYS == ReachEnv(CONFIG).spec.key_map()  # what the policy data reads
    assert info["features"][IS_CORRECTION]["dtype"] == "bool"
    episodes = [r.episode for r in recorded]
    flags = np.concatenate([e.flags[IS_CORRECTION] for e in episodes])
    np.testing.assert_array_equal(table.column(IS_CORRECTION).to_numpy(zero_copy_only=False),
                                  flags)  # fmt: skip
    assert summary["corrections"] == int(flags.sum()) == sum(r.corrections for r in recorded)
    assert 0 < flags.sum() < len(flags) and summary["corrected_episodes"] == 3
    assert table.column(C.EPISODE_INDEX).to_pylist() == sum(
        ([k] * len(e) for k, e in enumerate(episodes)), []
    )
    np.testing.assert_array_equal(table.column("is_success").to_numpy(zero_copy_only=False),
                                  np.ones(len(flags), bool))  # fmt: skip
    actions = np.stack(table.column("action").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(actions, np.concatenate([e.action for e in episodes]))
    np.testing.assert_array_equal(images, np.concatenate([e.images["image"] for e in episodes]))
    # a corrected frame executed the expert's action at its observation
    frame = int(np.flatnonzero(flags)[0])
    env = ReachEnv(CONFIG)
    obs = env.reset(7)
    for a in actions[:frame]:
        obs, _, _ = env.step(a)
    np.testing.assert_allclose(actions[frame], expert(obs), atol=1e-7)
    record = json.loads((tmp_path / "ds" / COLLECT_FILE).read_text())
    assert record == {"seed": 7, "num_episodes": 3, "replan_steps": 1, "expert": True,
                      "takeover_steps": 4, "successes": 3, "corrections": int(flags.sum()),
                      "corrected_episodes": 3, "policy": "confused"}  # fmt: skip


def test_collect_without_an_expert_marks_no_correction(tmp_path):
    summary = collect(batched(confused()), [ReachEnv(CONFIG)], 2, 0, tmp_path / "ds",
                      image_dtype="video")  # fmt: skip
    assert (summary["successes"], summary["corrections"], summary["frames"]) == (0, 0, 60)
    table, images, _, _ = _read(tmp_path / "ds")
    assert table.column(IS_CORRECTION).to_pylist() == [False] * 60 and images.shape[0] == 60
    with pytest.raises(FileExistsError):  # a new dataset each time, never merged into one
        collect(batched(confused()), [ReachEnv(CONFIG)], 1, 0, tmp_path / "ds")


def test_writer_flags_must_agree_across_episodes(tmp_path):
    def ep(flags):
        n = 2
        return Episode({}, np.zeros((n, 1), np.float32), np.zeros((n, 1), np.float32), "t",
                       True, flags)  # fmt: skip

    with pytest.raises(RecapError, match=r"^episode 1: Episode.flags \[\]; every episode must"):
        write_lerobot_dataset(tmp_path / "a", [ep({"x": [1, 0]}), ep({})], WriterConfig())
    with pytest.raises(RecapError, match="^Episode.flags: 'done' is already a column; rename"):
        write_lerobot_dataset(tmp_path / "b", [ep({"done": [1, 0]})], WriterConfig())
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _step3_table(frames: pa.Table) -> pa.Table:
    """Step 1/2 columns made up for the frames: reward -1 per step, return, a falling value."""
    frame = frames.column(C.FRAME_INDEX).to_numpy()
    episode = frames.column(C.EPISODE_INDEX).to_numpy()
    length = np.array([np.sum(episode == e) for e in episode])
    returns = -(length - 1 - frame).astype(np.float64)
    value = np.cos(np.arange(len(frame)) * 0.7) * 0.4 - 0.5  # not monotone: labels vary
    return (
        frames.append_column(C.REWARD, pa.array(np.full(len(frame), -1.0)))
        .append_column(C.RETURN, pa.array(returns))
        .append_column(VALUE, pa.array(value))
    )


def test_step3_forces_collected_corrections_positive(tmp_path):
    collect(
        batched(confused()),
        [ReachEnv(CONFIG)],
        2,
        7,
        tmp_path / "ds",
        image_dtype="image",
        expert=reach_expert(CONFIG),
        drift=ActionDrift(1.0, dims=2),
        takeover_steps=3,
    )
    spec = DatasetSpec("ds", tmp_path / "ds")
    frames = frame_columns(spec, IS_CORRECTION, False)  # what Step 3 and relabel read
    assert frames.column_names == [C.EPISODE_INDEX, C.FRAME_INDEX, IS_CORRECTION]
    table = _step3_table(frames)
    kwargs = dict(return_range=ReturnRange(-40.0, 0.0), lookahead=3, gamma=1.0,
                  dataset_name="ds")  # fmt: skip
    forced = add_advantages(table, labels=LabelOptions(0.3), **kwargs)
    plain = add_advantages(table, labels=LabelOptions(0.3, correction_column=None), **kwargs)
    flags = frames.column(IS_CORRECTION).to_numpy(zero_copy_only=False)
    new = forced.column(C.ADVANTAGE).to_numpy(zero_copy_only=False)
    base = plain.column(C.ADVANTAGE).to_numpy(zero_copy_only=False)
    assert new[flags].all() and not base[flags].all()  # some correction was negative before
    np.testing.assert_array_equal(new[~flags], base[~flags])  # no other label moves
    # without the column, the default options label exactly as with corrections off
    bare = table.drop_columns([IS_CORRECTION])
    default = add_advantages(bare, labels=LabelOptions(0.3), **kwargs)
    np.testing.assert_array_equal(default.column(C.ADVANTAGE).to_numpy(zero_copy_only=False),
                                  base)  # fmt: skip
