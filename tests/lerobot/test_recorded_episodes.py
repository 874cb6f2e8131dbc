"""``recap-serve --record``'s episodes open with LeRobot 0.6.1's ``LeRobotDataset`` and hold what
recap's reader reads (numbers exactly; video frames as decoded by both, equal)."""

from dataclasses import dataclass

import numpy as np

from recap.serve.record import RecordConfig, Recorder, recorded_episodes
from tests.lerobot.lerobot_helpers import (
    mismatches,
    read_with_lerobot,
    read_with_recap,
    smooth_frames,
)


@dataclass
class Spec:
    image_keys: tuple = ("observation/image", "observation/wrist_image")
    state_key: str = "observation/state"
    prompt_key: str = "prompt"


def test_a_recorded_episode_opens_with_lerobot(tmp_path):
    recorder = Recorder(RecordConfig(tmp_path / "rec"), Spec())
    rng = np.random.default_rng(0)
    base, wrist = smooth_frames(rng, 5, 32, 48), smooth_frames(rng, 5, 32, 48)
    episode = recorder.start("robot")
    for t in range(5):
        obs = {"observation/image": base[t], "observation/wrist_image": wrist[t],
               "observation/state": rng.normal(size=4).astype(np.float32), "prompt": "pick it",
               "intervention": t == 2, "action": np.full(3, t, np.float32)}  # fmt: skip
        episode.check(obs, 3)
        episode.add(obs, rng.normal(size=(2, 3)).astype(np.float32))
    assert episode.end(True) == "episode_000000"
    recorder.close()
    (path,) = recorded_episodes(tmp_path / "rec")
    theirs, dataset = read_with_lerobot("recap/recorded", path)
    ours = read_with_recap(path)
    cameras = ("observation.images.image", "observation.images.wrist_image")
    assert mismatches(ours, theirs, skip=("task", *cameras)) == []
    for camera, sent in zip(cameras, (base, wrist), strict=True):
        loss = np.abs(theirs[camera].astype(np.int16) - sent.astype(np.int16)).mean((1, 2, 3))
        assert theirs[camera].shape == (5, 32, 48, 3) and loss.max() < 8.0  # libx264 crf 18
    assert theirs["is_correction"].tolist() == [False, False, True, False, False]
    assert theirs["action"][2].tolist() == [2.0, 2.0, 2.0]
    assert set(theirs["task"]) == {"pick it"}
    assert dataset.meta.total_episodes == 1
