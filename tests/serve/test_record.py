"""``recap-serve --record``: the reach environment driven through openpi-client (``RobotClient``)
with scripted interventions; the recorded LeRobot v3.0 episodes read back with recap's reader;
caps; kill -9 mid-episode and a restart that appends. The 20-episode recording and the
``recap-iterate`` round on it are in ``tests/test_iterate.py`` (this module's helpers)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from recap.data.conditioning import QuantileStats
from recap.data.lerobot import LocalDataset
from recap.envs.reach import ReachConfig, ReachEnv, reach_expert
from recap.models.checkpoints import write_norm_stats
from recap.processing.transforms import write_word_tokenizer
from recap.serve.client import RobotClient
from recap.serve.record import CHUNKS_FILE, RECORD_FILE, RecordConfig, recorded_episodes
from recap.serve.server import BackgroundServer, ServerConfig
from tests.models.test_pi05 import tiny_model
from tests.serve.conftest import wait_until

STATE, ACTION = "observation.state", "action"
CAMERAS = ("image", "wrist_image")
REACH = ReachConfig(max_steps=6)


def write_reach_policy(directory: Path) -> Path:
    """A tiny π0.5 for the reach task: state [8], actions [7] (model action dim 8)."""
    tiny_model(0, action_dim=8).save_pretrained(directory)
    stats = {"state": QuantileStats(-np.ones(8), np.ones(8)),
             "action": QuantileStats(-np.ones(7), np.ones(7))}  # fmt: skip
    write_norm_stats(directory, "reach", stats)
    texts = ["Task: reach the red blue target, State: ;\nAction: Advantage: positive negative"]
    write_word_tokenizer(directory, texts)
    return directory


@pytest.fixture(scope="module")
def reach_policy_dir(tmp_path_factory) -> Path:
    return write_reach_policy(tmp_path_factory.mktemp("reach_policy"))


@pytest.fixture(scope="module")
def reach_served(reach_policy_dir):
    from recap.serve.load import load_served

    return load_served(reach_policy_dir, beta=1.0, device="cpu")


def request(obs: dict) -> dict:
    return {"observation/image": obs["images"]["image"],
            "observation/wrist_image": obs["images"]["wrist_image"],
            "observation/state": obs["state"], "prompt": obs["task"]}  # fmt: skip


def drive(robot: RobotClient, seed: int, intervene: bool, end: bool = True) -> dict:
    """One reach episode; steps 1-2 of an intervened episode are the scripted expert's (the
    'human'). Returns what was sent and executed."""
    env, expert = ReachEnv(REACH), reach_expert(REACH)
    obs = env.reset(seed)
    sent = {"state": [], "action": [], "correction": [], "images": [], "chunks": []}
    done, success, t = False, False, 0
    while not done:
        req = request(obs)
        if intervene and t in (1, 2):
            action = expert(obs).astype(np.float32)
            reply = robot.intervene(req, action)
        else:
            reply = robot.infer(req)
            action = reply["actions"][0]
        sent["state"].append(obs["state"].copy())
        sent["images"].append({c: obs["images"][c].copy() for c in CAMERAS})
        sent["action"].append(np.asarray(action, np.float32))
        sent["correction"].append(intervene and t in (1, 2))
        sent["chunks"].append(reply["actions"])
        obs, success, done = env.step(action)
        t += 1
    sent["success"] = bool(success)
    sent["reply"] = robot.end_episode(success) if end else None
    return sent


def check_recorded(path: Path, sent: dict) -> None:
    """The recorded episode equals what was sent: state and actions exactly, images within the
    codec's tolerance, corrections and outcome flagged."""
    with LocalDataset(path) as ds:
        flags = ["is_correction", "is_success"]
        table = ds.read_columns([STATE, ACTION, "episode_index", "frame_index", *flags],
                                flags=flags)  # fmt: skip
        state = np.stack(table.column(STATE).to_numpy(zero_copy_only=False))
        action = np.stack(table.column(ACTION).to_numpy(zero_copy_only=False))
        np.testing.assert_array_equal(state, np.stack(sent["state"]))
        np.testing.assert_array_equal(action, np.stack(sent["action"]))
        assert table.column("is_correction").to_pylist() == sent["correction"]
        assert set(table.column("is_success").to_pylist()) == {sent["success"]}
        assert ds.tasks[0].startswith("reach the ")
        rows = np.arange(len(sent["state"]))
        for camera in CAMERAS:
            frames = ds.frames(f"observation.images.{camera}", rows).astype(np.int16)
            sent_frames = np.stack([f[camera] for f in sent["images"]]).astype(np.int16)
            assert frames.shape == sent_frames.shape
            assert np.abs(frames - sent_frames).mean() < 4.0  # libx264 crf 18, yuv420p
    chunks = np.load(path / "meta" / CHUNKS_FILE)
    np.testing.assert_array_equal(chunks, np.stack(sent["chunks"]))


def record_reach(served, directory: Path, count: int = 20) -> list[dict]:
    """``count`` reach episodes driven through ``RobotClient`` against a server recording into
    ``directory``, two steps of every third (seed % 3 == 1) the scripted expert's; what was
    sent, per episode."""
    config = ServerConfig(port=0, record=RecordConfig(directory, fps=REACH.fps))
    with BackgroundServer(served, config) as server:
        robot = RobotClient("127.0.0.1", server.port)
        assert robot.recording and robot.metadata["recording"] is True
        episodes = [drive(robot, seed, intervene=seed % 3 == 1) for seed in range(count)]
        robot.close()
    return episodes


def check_twenty(directory: Path, episodes: list[dict]) -> None:
    """The 20 episodes of ``record_reach`` read back as sent, 14 intervention frames."""
    paths = recorded_episodes(directory)
    assert [p.name for p in paths] == [f"episode_{i:06d}" for i in range(20)]
    for i, (path, sent) in enumerate(zip(paths, episodes, strict=True)):
        assert sent["reply"] == {"episode_end": True, "episode": path.name,
                                 "frames": len(sent["state"])}  # fmt: skip
        check_recorded(path, sent)
        record = (path / "meta" / RECORD_FILE).read_text()
        assert f'"corrections": {2 if i % 3 == 1 else 0}' in record
    assert sum(sum(e["correction"]) for e in episodes) == 2 * 7


# The 20 recorded episodes, then one recap-iterate round on them: tests/test_iterate.py
# (test_twenty_reach_episodes_with_interventions_are_recorded and the tests after it).


def test_a_stock_client_is_served_and_its_connection_recorded(reach_served, tmp_path):
    """openpi-client alone (no recording keys): the connection is the episode, written when it
    closes, outcome not reported."""
    config = ServerConfig(port=0, record=RecordConfig(tmp_path / "rec"))
    with BackgroundServer(reach_served, config) as server:
        policy = WebsocketClientPolicy("127.0.0.1", server.port)
        obs = ReachEnv(REACH).reset(3)
        replies = [policy.infer(request(obs))["actions"] for _ in range(3)]
        policy._ws.close()
        assert wait_until(lambda: len(recorded_episodes(tmp_path / "rec")) == 1)
    (path,) = recorded_episodes(tmp_path / "rec")
    assert '"outcome": "not reported"' in (path / "meta" / RECORD_FILE).read_text()
    with LocalDataset(path) as ds:
        table = ds.read_columns([ACTION, "is_correction"], flags=["is_correction"])
    action = np.stack(table.column(ACTION).to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(action, np.stack([r[0] for r in replies]))
    assert table.column("is_correction").to_pylist() == [False] * 3


def test_caps_drop_the_episode_with_one_line_and_serving_goes_on(reach_served, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="recap.serve")
    config = ServerConfig(port=0, record=RecordConfig(tmp_path / "rec", max_frames=4))
    with BackgroundServer(reach_served, config) as server:
        robot = RobotClient("127.0.0.1", server.port)
        long = drive(robot, 0, intervene=False)  # 6 frames: past the cap
        assert long["reply"] == {"episode_end": True, "episode": None, "frames": 0}
        assert len(long["chunks"]) == REACH.max_steps  # every request was answered
        env = ReachEnv(REACH)
        obs = env.reset(1)
        for _ in range(2):
            robot.infer(request(obs))
        assert robot.end_episode(True)["episode"] == "episode_000000"
        with pytest.raises(RuntimeError) as exc:  # a bad recording key: one line, then served
            robot.policy.infer(request(obs) | {"intervention": True})
        assert str(exc.value) == (
            "Error in inference server:\naction: expected finite float[7], got nothing"
        )
        assert robot.infer(request(obs))["actions"].shape == (4, 7)
        robot.close()
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(lines) == 1 and re.sub(r":\d+ ", ":PORT ", lines[0]) == (
        "recording: episode of 127.0.0.1:PORT dropped after 4 frames: more than 4 frames "
        "(--record-max-frames); serving goes on"
    )
    small = ServerConfig(port=0, record=RecordConfig(tmp_path / "tiny", max_bytes=50_000))
    with BackgroundServer(reach_served, small) as server:
        robot = RobotClient("127.0.0.1", server.port)
        assert drive(robot, 2, intervene=False)["reply"]["episode"] is None  # 64x64x3 x2 x6
        robot.close()
    assert recorded_episodes(tmp_path / "tiny") == []
    assert "would exceed 4.65661e-05 GiB (--record-max-gib)" in caplog.text


def tree_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(path.rglob("*")):
        if f.is_file():
            digest.update(str(f.relative_to(path)).encode() + f.read_bytes())
    return digest.hexdigest()


def start_server(policy_dir: Path, record: Path) -> tuple[subprocess.Popen, int]:
    """recap-serve --record in its own process; its port from the "listening" log line."""
    argv = [sys.executable, "-m", "recap.commands.serve", "--policy", str(policy_dir),
            "--port", "0", "--beta", "1", "--record", str(record)]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=os.environ | {"DS_ACCELERATOR": "cpu"})  # fmt: skip
    lines: list[str] = []
    # drained all along: a full pipe would block the server's logging
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()

    def listening() -> list[str]:
        return [line for line in list(lines) if "listening on ws://" in line]

    assert wait_until(lambda: process.poll() is not None or bool(listening()), 180), lines
    assert listening(), f"recap-serve exited {process.poll()}: {lines}"
    return process, int(listening()[0].rsplit(":", 1)[1])


def test_kill_9_mid_episode_keeps_the_finished_ones_and_a_restart_appends(reach_policy_dir,
                                                                          tmp_path):  # fmt: skip
    record = tmp_path / "rec"
    process, port = start_server(reach_policy_dir, record)
    try:
        robot = RobotClient("127.0.0.1", port)
        finished = [drive(robot, seed, intervene=seed == 1) for seed in range(2)]
        drive(robot, 2, intervene=True, end=False)  # in progress when the server dies
        digests = {p.name: tree_digest(p) for p in recorded_episodes(record)}
        assert sorted(digests) == ["episode_000000", "episode_000001"]
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        process.kill()
    assert [p.name for p in recorded_episodes(record)] == ["episode_000000", "episode_000001"]
    process, port = start_server(reach_policy_dir, record)  # same DIR: appends
    try:
        robot = RobotClient("127.0.0.1", port)
        again = drive(robot, 5, intervene=True)
        assert again["reply"]["episode"] == "episode_000002"
        robot.close()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    paths = recorded_episodes(record)
    assert [p.name for p in paths] == [f"episode_{i:06d}" for i in range(3)]
    assert {p.name: tree_digest(p) for p in paths[:2]} == digests  # untouched
    for path, sent in zip(paths, [*finished, again], strict=True):
        check_recorded(path, sent)
    assert not (record / ".staging").exists() or not any((record / ".staging").iterdir())
