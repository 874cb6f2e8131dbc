"""The demo's reaching task (``recap.envs.reach``) and the LeRobot writer, read back through
LocalDataset."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recap.data.lerobot import LocalDataset
from recap.data.lerobot_writer import (
    Episode,
    WriterConfig,
    aggregate_stats,
    encode_png,
    feature_stats,
    write_lerobot_dataset,
)
from recap.data.transforms import load_tokenizer
from recap.envs.base import batched
from recap.envs.reach import (
    ACTION_NAMES,
    ROLLOUT_MIX,
    STATE_NAMES,
    Layout,
    RandomPolicy,
    ReachConfig,
    ReachEnv,
    ScriptedPolicy,
    generate_episodes,
    heading,
    locate_target,
    sample_layout,
    write_demo_datasets,
    write_demo_tokenizer,
)
from recap.envs.rollout import episode_outcomes, run_outcomes
from recap.errors import RecapError

SHORT = ReachConfig(max_steps=12)  # tiny episodes for the writer tests
KEYS = {
    "lerobot": ("observation.images.image", "observation.images.wrist_image", "observation.state"),
    "libero": ("image", "wrist_image", "state"),
}
ACTION_KEY = {"lerobot": "action", "libero": "actions"}
FORMATS = [
    ("v2.1", "libero", "video"),
    ("v2.1", "lerobot", "image"),
    ("v3.0", "lerobot", "video"),
    ("v3.0", "libero", "image"),
]


def tiny_episodes(n: int = 4, seed: int = 0) -> list[Episode]:
    return list(generate_episodes(n, seed, ROLLOUT_MIX, SHORT))


def all_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def episodes() -> list[Episode]:
    return tiny_episodes()


@pytest.fixture(scope="module", params=FORMATS, ids=["-".join(f) for f in FORMATS])
def written(request, tmp_path_factory, episodes):
    version, naming, dtype = request.param
    root = tmp_path_factory.mktemp("ds") / "ds"
    config = WriterConfig(
        version, naming, dtype, state_names=STATE_NAMES, action_names=ACTION_NAMES
    )
    summary = write_lerobot_dataset(root, episodes, config)
    return root, config, summary


# ---- the task -------------------------------------------------------------------------------


def test_observation_layout_and_dynamics():
    env = ReachEnv()
    obs = env.reset(3)
    assert obs["images"]["image"].shape == (64, 64, 3) and obs["images"]["image"].dtype == np.uint8
    assert obs["images"]["wrist_image"].shape == (64, 64, 3)
    assert obs["state"].dtype == np.float32 and obs["state"].shape == (8,)
    assert obs["task"] in ("reach the red target", "reach the blue target")
    np.testing.assert_array_equal(obs["state"][:2], env.agent.astype(np.float32))
    assert (obs["images"]["wrist_image"][31:33, 31:33] == 255).all()  # agent at the wrist centre
    x0 = env.agent.copy()
    obs, success, done = env.step(np.array([5.0, -0.5, 0, 0, 0, 0, 0]))  # clipped to (1, -0.5)
    np.testing.assert_allclose(env.agent, np.clip(x0 + [0.04, -0.02], 0, 1))
    np.testing.assert_allclose(obs["state"][2:], [1.0, -0.5, 0, 0, 0, 0], atol=1e-7)
    steps = 1
    while not done:
        obs, success, done = env.step(np.zeros(7))
        steps += 1
    assert (steps, success) == (40, False)
    with pytest.raises(RuntimeError):
        env.step(np.zeros(7))
    # reset(seed) is the layout of default_rng(seed); reset(Layout) starts there
    layout = sample_layout(np.random.default_rng(3))
    np.testing.assert_array_equal(env.reset(3)["state"], env.reset(layout)["state"])
    targets = {"red": np.array([0.52, 0.5]), "blue": np.array([0.1, 0.1])}
    again = env.reset(Layout(np.array([0.5, 0.5]), targets, "red"))
    assert again["task"] == "reach the red target"
    assert env.step(np.zeros(7))[1:] == (True, True)  # within success_radius: success and done


def test_state_targets_carry_each_targets_offset_from_the_agent(tmp_path):
    config = ReachConfig(state_targets=True)
    env = ReachEnv(config)
    obs = env.reset(3)
    red, blue = env.layout.targets["red"], env.layout.targets["blue"]
    np.testing.assert_allclose(obs["state"][4:], [*(red - env.agent), *(blue - env.agent)],
                               atol=1e-7)  # fmt: skip
    plain = ReachEnv().reset(3)
    np.testing.assert_array_equal(plain["state"][:2], obs["state"][:2])
    np.testing.assert_array_equal(plain["state"][4:], np.zeros(4, np.float32))
    for key in plain["images"]:  # the cameras show the same scene
        np.testing.assert_array_equal(plain["images"][key], obs["images"][key])
    obs, _, _ = env.step(np.array([1.0, 0.0, 0, 0, 0, 0, 0]))
    np.testing.assert_allclose(obs["state"][4:6], red - env.agent, atol=1e-7)
    np.testing.assert_array_equal(obs["state"][2:4], [0.0, 0.0])  # no velocity: nothing to copy
    assert config.state_names[2:] == ("pad_2", "pad_3", "red_dx", "red_dy", "blue_dx", "blue_dy")
    assert ReachConfig().state_names[4:] == ("pad_4", "pad_5", "pad_6", "pad_7")
    out = write_demo_datasets(tmp_path, seed=1, sft_episodes=2, rollout_episodes=2,
                              eval_episodes=1, max_steps=12, state_targets=True)  # fmt: skip
    ds = LocalDataset(out["rollout"]["path"])
    assert ds.info["features"]["observation.state"]["names"][4:] == list(config.state_names[4:])
    state = np.asarray(ds.read_columns(["observation.state"]).column(0)[0].as_py())
    assert np.abs(state[4:]).max() > 0.1  # offsets, not padding
    tokenizer = load_tokenizer(write_demo_tokenizer(tmp_path, state_bins=True))
    ids = tokenizer("Task: reach the red target, State: 0 17 255;\nAction: ")["input_ids"]
    assert 3 not in ids and len(ids) == 15  # no <unk>: a word per bin and per punctuation
    plain = load_tokenizer(write_demo_tokenizer(tmp_path / "plain"))
    text = "Task: reach the blue target. Advantage: negative"
    assert tokenizer(text)["input_ids"] == plain(text)["input_ids"]  # the value model's ids stay
    assert max(plain(text)["input_ids"]) < 32 and len(tokenizer) == len(plain) + 260 == 275


def test_trail_shows_the_path_brighter_when_recent():
    env = ReachEnv()
    obs = env.reset(2)
    assert not np.isin(obs["images"]["image"], [80, 120, 160, 200]).all(-1).any()  # no trail yet
    for _ in range(4):
        obs, _, _ = env.step(np.array([1.0, 0.0]))  # 0.04 to the right per step
    image, shades = obs["images"]["image"], [80, 120, 160, 200]  # oldest to newest
    assert len(env.path) == 4
    seen = 0
    for position, shade in zip(env.path, shades, strict=True):
        if np.linalg.norm(position - env.agent) > env.config.agent_radius + 2 / 64:
            col, row = (np.asarray(position) * 64).astype(int)
            assert (image[row, col] == shade).all()  # grey, brighter the more recent
            seen += 1
    assert seen >= 2  # the newest dots may lie under the agent's disc
    for color, pos in env.layout.targets.items():  # the trail never reads as a target
        assert np.abs(locate_target(image, color) - pos).max() < 1 / 64
    plain = ReachEnv(ReachConfig(trail_radius=0.0))
    obs = plain.reset(2)
    for _ in range(4):
        obs, _, _ = plain.step(np.array([1.0, 0.0]))
    assert not np.isin(obs["images"]["image"], shades).all(-1).any()


def test_locate_target_within_a_pixel():
    env = ReachEnv()
    for seed in range(5, 15):
        obs = env.reset(seed)
        for color, pos in env.layout.targets.items():
            assert np.abs(locate_target(obs["images"]["image"], color) - pos).max() < 1 / 64


def confused_policy() -> ScriptedPolicy:
    """Always heads for the other target (confusion 1, no recovery; drawn at its reset)."""
    policy = ScriptedPolicy(confusion=1.0)
    policy.reset()
    return policy


def test_closed_loop_expert_is_perfect_and_random_is_poor():
    def rate(policy, n):
        return float(episode_outcomes(batched(policy), ReachEnv, n, seed=11).mean())

    assert rate(ScriptedPolicy(), 40) == 1.0
    assert rate(RandomPolicy(seed=1), 40) <= 0.15
    assert rate(confused_policy(), 20) <= 0.1  # the other target: language matters


def test_heading_is_a_step_metric_of_the_loop_one_for_the_expert_near_zero_for_random():
    rates = {}
    for name, policy in (("expert", ScriptedPolicy()), ("random", RandomPolicy(seed=1)),
                         ("confused", confused_policy())):  # fmt: skip
        run = run_outcomes(batched(policy), ReachEnv, 8, seed=11, num_envs=8)
        assert list(run.metrics) == ["heading"]  # the env's own step metric, by default
        rates[name] = (round(float(run.success.mean()), 2), round(run.metric_mean("heading"), 2))
    assert rates["expert"] == (1.0, 1.0)
    assert rates["random"][0] <= 0.15 and abs(rates["random"][1]) < 0.1
    assert rates["confused"][0] == 0.0 and rates["confused"][1] < 0.5  # the other target's way
    env = ReachEnv()
    env.reset(3)
    way = env.layout.targets[env.layout.color] - env.agent
    assert heading(env, np.array([*way, 0, 0, 0, 0, 0])) == pytest.approx(1.0)
    assert heading(env, np.array([*-way, 0, 0, 0, 0, 0])) == pytest.approx(-1.0)
    assert heading(env, np.zeros(7)) == 0.0
    # the metric's mean is over every step of every episode: one episode by hand
    env, steps = ReachEnv(ReachConfig(max_steps=5)), []
    obs, done = env.reset(11), False
    while not done:
        action = np.array([0.3, -1.0, 0, 0, 0, 0, 0], np.float32)
        steps.append(heading(env, action))
        obs, _, done = env.step(action)
    run = run_outcomes(lambda b: np.tile([0.3, -1.0, 0, 0, 0, 0, 0], (len(b["task"]), 1)),
                       lambda: ReachEnv(ReachConfig(max_steps=5)), 1, seed=11)  # fmt: skip
    assert run.metric_mean("heading") == pytest.approx(np.mean(steps), abs=1e-12)
    assert run.steps.tolist() == [len(steps)] == [5]


def test_outcomes_are_the_same_whatever_the_batch():
    expert = batched(ScriptedPolicy(noise=0.0))
    # with a short time limit the expert fails far targets: same episodes, same failures
    short = ReachConfig(max_steps=8)
    outcomes = episode_outcomes(expert, lambda: ReachEnv(short), 24, seed=4, num_envs=5)
    assert outcomes.dtype == bool and outcomes.shape == (24,) and 0.2 < outcomes.mean() < 0.9
    for num_envs in (1, 7):  # per episode, in seed order: the same whatever the batch size
        again = episode_outcomes(expert, lambda: ReachEnv(short), 24, seed=4, num_envs=num_envs)
        np.testing.assert_array_equal(outcomes, again)


def test_rollout_mix_success_fraction_and_expert_demos():
    rollouts = list(generate_episodes(80, seed=[0, 1], mix=ROLLOUT_MIX))
    rate = np.mean([ep.success for ep in rollouts])
    assert 0.35 <= rate <= 0.65
    assert max(len(ep) for ep in rollouts) <= 40 and min(len(ep) for ep in rollouts) >= 2
    demos = list(generate_episodes(10, seed=[0, 0], successes_only=True))
    assert all(ep.success for ep in demos) and len(demos) == 10


def test_generation_is_deterministic():
    a, b, c = tiny_episodes(seed=7), tiny_episodes(seed=7), tiny_episodes(seed=8)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.images["image"], y.images["image"])
        np.testing.assert_array_equal(x.action, y.action)
        assert (x.task, x.success) == (y.task, y.success)
    assert any(len(x) != len(y) or not np.array_equal(x.state, y.state) for x, y in zip(a, c))


# ---- media and stats --------------------------------------------------------------------------


def test_png_is_lossless_for_ffmpeg():
    image = np.random.default_rng(0).integers(0, 256, (20, 36, 3), dtype=np.uint8)
    data = encode_png(image)
    decoded = av.CodecContext.create("png", "r").decode(av.Packet(data))[0]
    np.testing.assert_array_equal(decoded.to_ndarray(format="rgb24"), image)
    assert encode_png(image) == data


def test_stats_match_numpy_and_pool_exactly():
    frames = np.random.default_rng(1).integers(0, 256, (6, 5, 4, 3), dtype=np.uint8)
    stats = feature_stats(frames, image=True, quantiles=True)
    flat = frames.reshape(-1, 3) / 255.0
    np.testing.assert_allclose(stats["mean"].ravel(), flat.mean(0), atol=1e-12)
    np.testing.assert_allclose(stats["q10"].ravel(), np.quantile(flat, 0.1, axis=0), atol=1e-12)
    assert stats["min"].shape == (3, 1, 1) and stats["count"].tolist() == [6]
    values = np.random.default_rng(2).normal(size=(10, 2))
    parts = [feature_stats(values[:3], False, False), feature_stats(values[3:], False, False)]
    pooled = aggregate_stats([{"x": p} for p in parts])["x"]
    np.testing.assert_allclose(pooled["mean"], values.mean(0))
    np.testing.assert_allclose(pooled["std"], values.std(0))
    assert pooled["count"].tolist() == [10]


# ---- written datasets ---------------------------------------------------------------------------


def test_info_json(written, episodes):
    root, config, summary = written
    info = json.loads((root / "meta/info.json").read_text())
    n, frames = len(episodes), sum(len(e) for e in episodes)
    assert info["codebase_version"] == config.version and info["fps"] == 10
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (
        n,
        frames,
        len({e.task for e in episodes}),
    )
    assert info["splits"] == {"train": f"0:{n}"} and info["chunks_size"] == 1000
    image, wrist, state = KEYS[config.naming]
    feats = info["features"]
    assert feats[image]["dtype"] == config.image_dtype and feats[wrist]["shape"] == [64, 64, 3]
    assert feats[state] == {"dtype": "float32", "shape": [8], "names": list(STATE_NAMES)}
    assert feats[ACTION_KEY[config.naming]]["shape"] == [7]
    for name, dtype in [("is_success", "bool"), ("done", "bool"), ("timestamp", "float32")]:
        assert feats[name] == {"dtype": dtype, "shape": [1], "names": None}
    assert feats["index"]["dtype"] == feats["task_index"]["dtype"] == "int64"
    video = config.image_dtype == "video"
    if video:
        assert feats[image]["info"]["video.codec"] == "h264"
        assert feats[image]["info"]["video.pix_fmt"] == "yuv420p"
    if config.version == "v2.1":
        assert (
            info["data_path"]
            == "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
        )
        assert info["total_videos"] == (2 * n if video else 0) and info["total_chunks"] == 1
        assert (info["video_path"] is not None) == video
    else:
        assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
        expected = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
        assert info["video_path"] == (expected if video else None)
    assert summary["episodes"] == n and summary["frames"] == frames
    assert summary["successes"] == sum(e.success for e in episodes)


def test_parquet_schema(written):
    root, config, _ = written
    path = sorted((root / "data").glob("*/*.parquet"))[0]
    schema = pq.read_schema(path)
    image, _, state = KEYS[config.naming]
    assert schema.field(state).type == pa.list_(pa.float32(), 8)
    assert schema.field(ACTION_KEY[config.naming]).type == pa.list_(pa.float32(), 7)
    for name, dtype in [("is_success", pa.bool_()), ("done", pa.bool_())]:
        assert schema.field(name).type == dtype
    assert schema.field("timestamp").type == pa.float32()
    for name in ("frame_index", "episode_index", "index", "task_index"):
        assert schema.field(name).type == pa.int64()
    hf = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
    assert hf[state]["_type"] == ("Sequence" if config.version == "v2.1" else "List")
    if config.image_dtype == "image":
        assert schema.field(image).type == pa.struct(
            [("bytes", pa.binary()), ("path", pa.string())]
        )
        assert hf[image] == {"_type": "Image"}
    else:
        assert image not in schema.names


def test_round_trip_through_reader(written, episodes):
    root, config, _ = written
    ds = LocalDataset(root)
    image, wrist, state = KEYS[config.naming]
    action = ACTION_KEY[config.naming]
    assert ds.version == config.version and ds.num_frames == sum(len(e) for e in episodes)
    table = ds.read_columns([state, action, "episode_index", "frame_index", "index", "timestamp"])
    lengths = [len(e) for e in episodes]
    np.testing.assert_array_equal(table["index"].to_numpy(), np.arange(sum(lengths)))
    expected_frame = np.concatenate([np.arange(n) for n in lengths])
    np.testing.assert_array_equal(table["frame_index"].to_numpy(), expected_frame)
    np.testing.assert_array_equal(table["timestamp"].to_numpy(), (expected_frame / 10).astype("f4"))
    states = np.stack(table[state].to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(states, np.concatenate([e.state for e in episodes]))
    actions = np.stack(table[action].to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(actions, np.concatenate([e.action for e in episodes]))
    outcome = ds.read_columns(["is_success", "done", "task_index"])
    last = np.cumsum(lengths) - 1
    np.testing.assert_array_equal(np.flatnonzero(outcome["done"].to_numpy(False)), last)
    success = outcome["is_success"].to_numpy(False)
    assert success[last].tolist() == [e.success for e in episodes]
    assert success.tolist() == np.repeat([e.success for e in episodes], lengths).tolist()
    texts = ds.task_texts(outcome["task_index"].to_numpy())
    assert texts[last].tolist() == [e.task for e in episodes]
    rows = np.arange(ds.num_frames)
    for key, cam in ((image, "image"), (wrist, "wrist_image")):
        got = ds.frames(key, rows).astype(np.int16)
        want = np.concatenate([e.images[cam] for e in episodes])
        if config.image_dtype == "image":
            np.testing.assert_array_equal(got, want)
        else:
            assert np.abs(got - want).mean() < 10
    ds.close()


def test_meta_files(written, episodes):
    root, config, _ = written
    meta = root / "meta"
    if config.version == "v2.1":
        rows = [json.loads(line) for line in (meta / "episodes.jsonl").read_text().splitlines()]
        assert rows[1] == {
            "episode_index": 1,
            "tasks": [episodes[1].task],
            "length": len(episodes[1]),
        }
        tasks = [json.loads(line) for line in (meta / "tasks.jsonl").read_text().splitlines()]
        assert tasks[0] == {"task_index": 0, "task": episodes[0].task}
        stats = [
            json.loads(line) for line in (meta / "episodes_stats.jsonl").read_text().splitlines()
        ]
        assert stats[0]["stats"]["done"]["max"] == [True] and stats[0]["stats"]["index"]["min"] == [
            0
        ]
        assert np.array(stats[0]["stats"][KEYS[config.naming][0]]["mean"]).shape == (3, 1, 1)
        return
    eps = pq.read_table(meta / "episodes/chunk-000/file-000.parquet")
    assert eps["dataset_to_index"].to_pylist() == np.cumsum([len(e) for e in episodes]).tolist()
    assert eps["tasks"].to_pylist()[0] == [episodes[0].task]
    assert (
        "stats/observation.state/q99" in eps.column_names or "stats/state/q99" in eps.column_names
    )
    if config.image_dtype == "video":
        key = KEYS[config.naming][0]
        from_ts = eps[f"videos/{key}/from_timestamp"].to_pylist()
        assert (
            from_ts[1] == len(episodes[0]) / 10
            and eps[f"videos/{key}/to_timestamp"][0].as_py() == from_ts[1]
        )
    tasks = pq.read_table(meta / "tasks.parquet")
    assert tasks.column_names == ["task_index", "task"]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]
    stats = json.loads((meta / "stats.json").read_text())
    assert stats["index"]["count"] == [sum(len(e) for e in episodes)]
    assert stats["index"]["max"] == [sum(len(e) for e in episodes) - 1.0]


def test_v30_episodes_span_data_files(tmp_path, episodes):
    lengths = [len(e) for e in episodes]
    limit = lengths[0] + lengths[1] // 2  # episode 1 straddles file 0 and file 1
    config = WriterConfig("v3.0", image_dtype="image", max_frames_per_file=limit)
    write_lerobot_dataset(tmp_path / "ds", episodes, config)
    files = sorted((tmp_path / "ds/data").glob("*/*.parquet"))
    assert len(files) >= 2 and pq.read_metadata(files[0]).num_rows == limit
    per_file = [set(pq.read_table(f, columns=["episode_index"])[0].to_pylist()) for f in files]
    assert 1 in per_file[0] and 1 in per_file[1]
    eps = pq.read_table(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet")
    assert eps["data/file_index"].to_pylist()[:3] == [0, 0, 1]
    ds = LocalDataset(tmp_path / "ds")
    rows = np.arange(lengths[0], lengths[0] + lengths[1])  # all of episode 1, across both files
    np.testing.assert_array_equal(
        ds.frames("observation.images.image", rows), episodes[1].images["image"]
    )
    aligned = WriterConfig(
        "v3.0", image_dtype="image", max_frames_per_file=limit, split_episodes=False
    )
    write_lerobot_dataset(tmp_path / "aligned", episodes, aligned)
    files = sorted((tmp_path / "aligned/data").glob("*/*.parquet"))
    per_file = [set(pq.read_table(f, columns=["episode_index"])[0].to_pylist()) for f in files]
    assert sum(len(s) for s in per_file) == len(episodes)  # no episode in two files


def test_same_seed_same_bytes(tmp_path):
    for version, dtype in (("v3.0", "video"), ("v2.1", "image")):
        config = WriterConfig(version, image_dtype=dtype, max_frames_per_file=15)
        roots = [tmp_path / f"{version}-{dtype}-{i}" for i in range(3)]
        for root, seed in zip(roots, (5, 5, 6), strict=True):
            write_lerobot_dataset(root, tiny_episodes(3, seed), config)
        same, other = all_files(roots[0]), all_files(roots[1])
        assert same == other and any(name.endswith(".parquet") for name in same)
        different = all_files(roots[2])
        changed = [n for n in same if n.endswith(".parquet") and same[n] != different.get(n)]
        assert changed


def test_writes_are_atomic(tmp_path, episodes):
    root = tmp_path / "ds"
    write_lerobot_dataset(root, episodes[:1], WriterConfig(image_dtype="image"))
    before = all_files(root)
    with pytest.raises(FileExistsError):
        write_lerobot_dataset(root, episodes, WriterConfig(image_dtype="image"))

    def failing():
        yield episodes[0]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_lerobot_dataset(root, failing(), WriterConfig(), overwrite=True)
    with pytest.raises(KeyboardInterrupt):
        write_lerobot_dataset(tmp_path / "new", failing(), WriterConfig())
    assert all_files(root) == before and sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    with pytest.raises(RecapError, match="version"):
        write_lerobot_dataset(tmp_path / "x", episodes, WriterConfig(version="v9"))


def test_write_demo_datasets_and_script(tmp_path, capsys):
    sizes = dict(sft_episodes=3, rollout_episodes=5, eval_episodes=3, max_steps=12)
    out = write_demo_datasets(tmp_path, seed=1, max_frames_per_file=20, **sizes)
    assert {k: (v["type"], v["version"], v["episodes"]) for k, v in out.items()} == {
        "sft": ("sft", "v2.1", 3),
        "rollout": ("rollout", "v3.0", 5),
        "eval": ("rollout", "v3.0", 3),
    }
    assert out["sft"]["successes"] == 3 and all(v["written"] for v in out.values())
    assert len(list((tmp_path / "rollout/data/chunk-000").glob("*.parquet"))) >= 2
    for row in out.values():
        ds = LocalDataset(row["path"])
        assert ds.num_frames == row["frames"] and ds.num_episodes == row["episodes"]
    again = write_demo_datasets(tmp_path, seed=1, max_frames_per_file=20, **sizes)
    assert not any(v["written"] for v in again.values())
    assert {k: v["frames"] for k, v in again.items()} == {k: v["frames"] for k, v in out.items()}

    from scripts.make_demo_data import main

    flags = ["--sft-episodes", "2", "--rollout-episodes", "3", "--eval-episodes", "2"]
    assert main(["--out", str(tmp_path), *flags, "--force", "--max-steps", "12"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["tokenizer", "sft", "rollout", "eval"]
    lines = lines[1:]
    assert "written" in lines[0] and "episodes=2" in lines[0] and "successes=2" in lines[0]


def test_demo_datasets_written_in_parallel_are_the_same_bytes(tmp_path):
    sizes = dict(sft_episodes=2, rollout_episodes=3, eval_episodes=2, max_steps=12)
    one = write_demo_datasets(tmp_path / "one", seed=3, max_frames_per_file=20, **sizes)
    three = write_demo_datasets(tmp_path / "three", seed=3, max_frames_per_file=20, workers=3,
                                **sizes)  # fmt: skip
    assert {k: v["frames"] for k, v in one.items()} == {k: v["frames"] for k, v in three.items()}

    def contents(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    first, second = contents(tmp_path / "one"), contents(tmp_path / "three")
    assert len(first) >= 10 and first == second
