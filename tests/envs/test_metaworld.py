"""recap.envs.metaworld against the real Meta-World 3.1.1 (MuJoCo 3.3.0, OSMesa on a CPU).

The tests that run the simulator skip with one line when the ``metaworld`` extra or the GL
library is missing (``make test-metaworld`` installs the extra; CI installs both); the
missing-dependency errors are simulated and always run. Renders are the slow part on a CPU, so the
tests read images only where they check them.
"""

import importlib.util
import json
import os
from ctypes.util import find_library
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import recap.envs.metaworld as mw
from recap.data.lerobot import LocalDataset
from recap.envs import Env, batched, episode_outcomes
from recap.envs.metaworld import (
    ACTION_NAMES,
    STATE_NAMES,
    MetaWorldEnv,
    MetaWorldExpert,
    generate_episodes,
    load_metaworld,
    write_metaworld_datasets,
)
from recap.errors import RecapError
from tests.helpers import tree_hashes

GL = os.environ.get("MUJOCO_GL", "osmesa")
MISSING = (
    "the metaworld extra is not installed (make test-metaworld)"
    if importlib.util.find_spec("metaworld") is None
    else "libOSMesa is missing (apt-get install -y libosmesa6)"
    if GL == "osmesa" and find_library("OSMesa") is None
    else None
)
needs_metaworld = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


def assert_same_dataset(ours: Path, theirs: Path) -> None:
    """Every file byte for byte but the videos, whose decoded frames agree to within 4 levels on
    average: alone these tests write identical bytes, but in the whole suite's long-lived
    process the in-process renders came out 1.3-1.7 levels off the fresh processes' on average
    (at most 27, 16-px frames) while states and actions stayed bit-equal; some process state an
    earlier test leaves changes OSMesa's rasterization (cause not found). A wrong or black
    frame is tens of levels off."""
    videos = ("videos/",)
    assert tree_hashes(ours, videos) == tree_hashes(theirs, videos)
    with LocalDataset(ours) as a, LocalDataset(theirs) as b:
        rows = np.arange(a.num_frames)
        assert a.camera_keys == b.camera_keys and a.num_frames == b.num_frames
        for camera in a.camera_keys:
            diff = np.abs(a.frames(camera, rows).astype(int) - b.frames(camera, rows).astype(int))
            assert diff.mean() < 4.0, f"{camera}: mean {diff.mean():.3f}, max {diff.max()}"


def test_missing_package_is_one_line(monkeypatch):
    absent = SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: None))
    monkeypatch.setattr(mw, "importlib", absent)
    message = ("Meta-World: the 'metaworld' module is not installed; pip install "
               "'recap[metaworld]' (metaworld==3.1.1, mujoco==3.3.0)")  # fmt: skip
    with pytest.raises(RecapError) as err:
        load_metaworld()
    assert str(err.value) == message
    with pytest.raises(RecapError) as err:
        MetaWorldEnv("reach-v3")
    assert str(err.value) == message


def test_missing_osmesa_is_one_line(monkeypatch):
    present = SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: object()))
    monkeypatch.setattr(mw, "importlib", present)
    monkeypatch.setattr(mw, "find_library", lambda name: None)
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    with pytest.raises(RecapError) as err:
        load_metaworld()
    assert str(err.value) == (
        "Meta-World: MUJOCO_GL=osmesa needs the OSMesa library (libOSMesa.so); apt-get install "
        "-y libosmesa6, or set MUJOCO_GL=egl on a GPU machine"
    )


@needs_metaworld
def test_renderer_failure_is_one_line(monkeypatch):
    real = load_metaworld()

    def no_context(*args, **kwargs):
        raise RuntimeError("The MUJOCO_GL environment variable is set to 'egl'\nmore detail")

    monkeypatch.setenv("MUJOCO_GL", "egl")
    backend = SimpleNamespace(**vars(real) | {"mujoco": SimpleNamespace(Renderer=no_context)})
    with pytest.raises(RecapError) as err:
        MetaWorldEnv("reach-v3", backend=backend)
    assert str(err.value) == (
        "Meta-World: MuJoCo cannot render with MUJOCO_GL=egl (The MUJOCO_GL environment "
        "variable is set to 'egl'); apt-get install -y libosmesa6 and set MUJOCO_GL=osmesa, "
        "or MUJOCO_GL=egl on a GPU machine"
    )


@needs_metaworld
def test_bad_arguments_are_one_line():
    with pytest.raises(RecapError, match=r"^MetaWorldEnv.env_name: 'reach-v2' is not a "):
        MetaWorldEnv("reach-v2")
    with pytest.raises(RecapError) as err:
        MetaWorldEnv("reach-v3", cameras={"image": "front"})
    assert str(err.value) == (
        "MetaWorldEnv.cameras['image']: 'front' is not a Meta-World camera; use one of "
        "['corner', 'corner2', 'corner3', 'corner4', 'topview', 'behindGripper', 'gripperPOV']"
    )


@needs_metaworld
def test_observation_shapes_dtypes_and_spec():
    env = MetaWorldEnv("pick-place-v3", cameras={"image": "corner", "wrist_image": "gripperPOV"},
                       image_size=32, max_steps=7)  # fmt: skip
    assert isinstance(env, Env)
    obs = env.reset(0)
    assert sorted(obs) == ["images", "state", "task"]
    assert list(obs["images"]) == ["image", "wrist_image"]
    for image in obs["images"].values():
        assert image.shape == (32, 32, 3) and image.dtype == np.uint8
        assert 0 < image.mean() < 255  # a scene, not a blank buffer
    assert not np.array_equal(obs["images"]["image"], obs["images"]["wrist_image"])
    assert obs["state"].shape == (39,) and obs["state"].dtype == np.float32
    assert obs["task"] == "pick place"
    spec = env.spec
    assert (spec.cameras, spec.fps, spec.max_steps, spec.robot_type) == (
        ("image", "wrist_image"), 80, 7, "sawyer")  # fmt: skip
    assert spec.state_names == STATE_NAMES and len(STATE_NAMES) == 39
    assert STATE_NAMES[:4] == ("hand_x", "hand_y", "hand_z", "gripper")
    assert STATE_NAMES[-3:] == ("goal_x", "goal_y", "goal_z")
    assert spec.action_names == ACTION_NAMES == ("dx", "dy", "dz", "gripper")
    env.close()


@needs_metaworld
def test_seeded_resets_are_reproducible():
    env = MetaWorldEnv("reach-v3", image_size=32)
    first = env.reset(3)
    goal, hand = [-0.0772656, 0.8391228, 0.1791850], [0.0045842, 0.6013881, 0.1951435]
    assert first["state"][-3:].tolist() == pytest.approx(goal, abs=1e-6)
    assert first["state"][:3].tolist() == pytest.approx(hand, abs=1e-6)
    for _ in range(3):
        moved, _, _ = env.step(np.array([1.0, 0.0, 0.0, 0.0]))
    assert not np.array_equal(moved["state"], first["state"])
    again = env.reset(3)
    assert np.array_equal(again["state"], first["state"])
    assert np.array_equal(again["images"]["image"], first["images"]["image"])
    other = MetaWorldEnv("reach-v3", image_size=32).reset(3)  # another instance, same seed
    assert np.array_equal(other["state"], first["state"])
    assert np.array_equal(other["images"]["image"], first["images"]["image"])
    assert not np.allclose(env.reset(4)["state"][-3:], first["state"][-3:])  # another goal
    shaded = MetaWorldEnv("reach-v3", image_size=32, shadows=True).reset(3)
    assert np.array_equal(shaded["state"], first["state"])
    assert not np.array_equal(shaded["images"]["image"], first["images"]["image"])


@needs_metaworld
def test_a_freed_environment_leaves_the_others_frames_alone():
    import gc

    keep = MetaWorldEnv("reach-v3", image_size=16)
    before = keep.reset(7)["images"]["image"]
    other = MetaWorldEnv("reach-v3", image_size=16)
    other.reset(7)
    keep.render("image")  # keep's GL context is the current one when other goes
    del other
    gc.collect()
    assert np.array_equal(keep.reset(7)["images"]["image"], before)
    closed = MetaWorldEnv("reach-v3", image_size=16)
    closed.reset(7)
    keep.render("image")
    closed.close()
    closed.close()  # idempotent
    assert np.array_equal(keep.reset(7)["images"]["image"], before)


@needs_metaworld
def test_scripted_expert_solves_reach():
    env = MetaWorldEnv("reach-v3", lazy_images=True)  # the expert reads the state: no renders
    expert = MetaWorldExpert("reach-v3")
    obs, done, steps = env.reset(0), False, 0
    start = obs["state"][:3]
    while not done:
        obs, success, done = env.step(expert(obs))
        steps += 1
    assert success is True and steps == 46
    assert obs["state"][:3].tolist() == pytest.approx([0.0787178, 0.8337611, 0.0724226], abs=1e-6)
    goal = obs["state"][-3:]  # the hand went to it (Meta-World measures from the fingertips)
    assert np.linalg.norm(start - goal) > 0.25 and np.linalg.norm(obs["state"][:3] - goal) < 0.06


@needs_metaworld
def test_episode_limit_and_lazy_images():
    env = MetaWorldEnv("reach-v3", max_steps=3, lazy_images=True, image_size=16)
    obs = env.reset(0)
    results = [env.step(np.zeros(4))[1:] for _ in range(3)]
    assert results == [(False, False), (False, False), (False, True)]
    with pytest.raises(RecapError) as err:
        obs["images"]["image"]
    assert str(err.value) == (
        "MetaWorldEnv: the 'image' image of an earlier observation was never read; with "
        "lazy_images=True read an observation's images before the next step or reset"
    )
    fresh = env.reset(0)
    eager = MetaWorldEnv("reach-v3", image_size=16).reset(0)
    assert np.array_equal(fresh["images"]["image"], eager["images"]["image"])


@needs_metaworld
def test_closed_loop_outcomes_through_the_protocol():
    expert = MetaWorldExpert("reach-v3", noise=0.0)
    factory = lambda: MetaWorldEnv("reach-v3", max_steps=36, image_size=16)  # noqa: E731
    won = episode_outcomes(batched(expert), factory, num_episodes=2, seed=8, num_envs=2)
    assert won.tolist() == [True, False]  # the expert needs 36 steps on seed 8, 38 on seed 9


@needs_metaworld
def test_demonstrations_and_rollouts_round_trip(tmp_path):
    summary = write_metaworld_datasets(tmp_path, "reach-v3", demo_episodes=1,
                                       rollout_episodes=2, seed=0, rollout_max_steps=6,
                                       image_size=16)  # fmt: skip
    assert {k: (v["episodes"], v["successes"], v["written"]) for k, v in summary.items()} == {
        "sft": (1, 1, True), "rollout": (2, 0, True)}  # fmt: skip
    assert summary["sft"]["frames"] == 45 and summary["rollout"]["frames"] == 12
    with LocalDataset(tmp_path / "sft") as sft, LocalDataset(tmp_path / "rollout") as rollout:
        assert (sft.version, sft.fps, sft.num_episodes, sft.num_frames) == ("v3.0", 80.0, 1, 45)
        assert sft.tasks == {0: "reach"} and rollout.num_episodes == 2
        assert sft.features["observation.state"]["names"] == list(STATE_NAMES)
        table = sft.read_columns(["observation.state", "action", "is_success"])
        state = np.stack(table.column("observation.state").to_numpy(zero_copy_only=False))
        action = np.stack(table.column("action").to_numpy(zero_copy_only=False))
        assert table.column("is_success").to_pylist() == [True] * 45
        frames = sft.frames("observation.images.image", np.array([0, 44]))
        assert frames.shape == (2, 16, 16, 3) and frames.dtype == np.uint8
    # the same episode regenerated without rendering: the recorded states and actions
    env = MetaWorldEnv("reach-v3", image_size=16, lazy_images=True)
    expert = MetaWorldExpert("reach-v3", noise=mw.DEMO_NOISE, seed=0)
    obs, done, states, actions = env.reset(0), False, [], []
    expert.reset(0)
    while not done:
        states.append(obs["state"])
        actions.append(expert(obs))
        obs, _, done = env.step(actions[-1])
    assert np.array_equal(state, np.stack(states)) and np.array_equal(action, np.stack(actions))
    again = write_metaworld_datasets(tmp_path, "reach-v3", demo_episodes=1, rollout_episodes=2)
    assert [v["written"] for v in again.values()] == [False, False]  # kept, not rewritten
    parallel = write_metaworld_datasets(tmp_path / "parallel", "reach-v3", demo_episodes=1,
                                        rollout_episodes=2, seed=0, rollout_max_steps=6,
                                        image_size=16, workers=2)  # fmt: skip
    assert parallel["sft"] | {"path": ""} == summary["sft"] | {"path": ""}
    for name in ("sft", "rollout"):  # two processes write what one does
        assert_same_dataset(tmp_path / "parallel" / name, tmp_path / name)


@needs_metaworld
def test_demonstrations_stop_with_one_line_when_the_expert_fails():
    env = MetaWorldEnv("reach-v3", max_steps=2, lazy_images=True)
    with pytest.raises(RecapError) as err:
        list(generate_episodes(env, 2, seed=0, successes_only=True, max_tries=2))
    assert str(err.value) == (
        "generate_episodes: only 0 of 2 reach-v3 episodes succeeded in 2 tries (noise=0.0); "
        "lower the noise or raise max_steps"
    )


SHARDED = """
import json, sys
from pathlib import Path

import numpy as np

from recap.engine import distributed
from recap.envs import ActionDrift, batched, collect, evaluate
from recap.envs.metaworld import MetaWorldEnv, MetaWorldExpert

out = Path(sys.argv[-1])  # the launcher adds --local_rank first
distributed.init()
rank = distributed.rank()
expert = MetaWorldExpert("reach-v3")
evaluation = evaluate(lambda beta: batched(expert), lambda: MetaWorldEnv("reach-v3", max_steps=37,
                      image_size=16), 4, seed=7, betas=(1.0,), num_envs=2, sharded=True)
(out / f"evaluate.rank{rank}.json").write_text(json.dumps(evaluation))
summary = collect(lambda obs: np.zeros((len(obs["task"]), 4)),
                  lambda: MetaWorldEnv("reach-v3", max_steps=6, image_size=16), 3, 7,
                  out / "sharded", expert=expert, drift=ActionDrift(0.5), takeover_steps=2,
                  num_envs=2, sharded=True)
(out / f"collect.rank{rank}.json").write_text(json.dumps(summary))
distributed.shutdown()
"""


@needs_metaworld
def test_sharded_evaluation_and_collection_match_the_unsharded_run(tmp_path):
    """Two real ranks (``deepspeed --num_gpus 2`` on the CPU) each run their share of the
    episodes; the merged outcomes and the collected dataset are the unsharded run's."""
    import subprocess

    from recap.envs import ActionDrift, collect, evaluate
    from recap.ports import free_port
    from tests.helpers import deepspeed_local, launch_env

    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    cmd = [*deepspeed_local(2, free_port()), str(script), str(tmp_path)]
    done = subprocess.run(cmd, cwd=tmp_path, env=launch_env(tmp_path), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    expert = MetaWorldExpert("reach-v3")
    factory = lambda: MetaWorldEnv("reach-v3", max_steps=37, image_size=16)  # noqa: E731
    alone = evaluate(lambda beta: batched(expert), factory, 4, seed=7, num_envs=2)
    assert alone["outcomes"] == {"beta_1": [1, 1, 0, 0]}  # 37, 36, 38 and 49 expert steps
    for rank in (0, 1):
        assert json.loads((tmp_path / f"evaluate.rank{rank}.json").read_text()) == alone

    summary = collect(lambda obs: np.zeros((len(obs["task"]), 4)),
                      lambda: MetaWorldEnv("reach-v3", max_steps=6, image_size=16), 3, 7,
                      tmp_path / "alone", expert=expert, drift=ActionDrift(0.5),
                      takeover_steps=2, num_envs=2)  # fmt: skip
    assert (summary["episodes"], summary["frames"], summary["successes"]) == (3, 18, 0)
    assert summary["corrections"] > 0
    for rank in (0, 1):
        merged = json.loads((tmp_path / f"collect.rank{rank}.json").read_text())
        assert merged | {"path": ""} == summary | {"path": ""}
    assert_same_dataset(tmp_path / "sharded", tmp_path / "alone")
    assert not (tmp_path / ".sharded.shards").exists()


def test_shards_split_the_episodes_round_robin(monkeypatch):
    from recap.envs import ReachEnv
    from recap.envs.reach import reach_expert
    from recap.envs.rollout import run_episodes, shard, world

    assert [shard(5, r, 2) for r in (0, 1)] == [[0, 2, 4], [1, 3]]
    assert [shard(2, r, 3) for r in (0, 1, 2)] == [[0], [1], []]
    with pytest.raises(ValueError, match=r"^shard: rank 2 of world_size 2; need 0 <= rank <"):
        shard(4, 2, 2)
    policy = batched(reach_expert())
    full = {r.index: (r.success, r.steps) for r in run_episodes(policy, ReachEnv, 5, seed=3)}
    odd = {r.index: (r.success, r.steps)
           for r in run_episodes(policy, ReachEnv, 5, seed=3, indices=shard(5, 1, 2))}  # fmt: skip
    assert sorted(odd) == [1, 3] and odd == {k: full[k] for k in (1, 3)}
    assert world(False) == (0, 1) and world(True) == (0, 1)  # no launcher: one rank
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError) as err:
        world(True)
    assert str(err.value) == (
        "sharded=True under a launcher: call recap.engine.distributed.init() first, so the "
        "ranks can merge their episodes"
    )


@needs_metaworld
def test_one_tokenizer_covers_every_task_the_state_bins_and_the_labels(tmp_path):
    """``write_metaworld_tokenizer``: every v3 task's prompt, openpi's state text and the
    advantage label encode without an unknown word, within the vocabulary ``gin/metaworld``
    binds (384); an existing tokenizer is kept."""
    from transformers import AutoTokenizer

    path = mw.write_metaworld_tokenizer(tmp_path / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    assert len(tokenizer) == 315
    names = sorted(mw.load_metaworld().environments)
    assert len(names) == 50 and "pick-place-v3" in names
    for name in names:
        text = f"Task: {mw.task_text(name)}, State: 0 17 255;\nAction: Advantage: negative"
        assert tokenizer.unk_token_id not in tokenizer(text).input_ids, name
    before = (path / "tokenizer.json").stat().st_mtime_ns
    assert mw.write_metaworld_tokenizer(path) == path
    assert (path / "tokenizer.json").stat().st_mtime_ns == before
