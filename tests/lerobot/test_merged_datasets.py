"""``recap.data.merge``'s output (what ``recap-iterate --recorded`` trains on) opens with LeRobot
0.6.1's ``LeRobotDataset`` and holds what recap's reader reads: two ``recap-serve --record``
episodes merged into one dataset, numbers exactly, video frames as decoded by both equal."""

from dataclasses import dataclass

import numpy as np

from recap.data.merge import merge_datasets
from recap.serve.record import RecordConfig, Recorder, recorded_episodes
from tests.lerobot.lerobot_helpers import (
    mismatches,
    read_with_lerobot,
    read_with_recap,
    smooth_frames,
)

CAMERAS = ("observation.images.image", "observation.images.wrist_image")


@dataclass
class Spec:
    image_keys: tuple = ("observation/image", "observation/wrist_image")
    state_key: str = "observation/state"
    prompt_key: str = "prompt"


def test_merged_recordings_open_with_lerobot(tmp_path):
    recorder = Recorder(RecordConfig(tmp_path / "rec"), Spec())
    rng = np.random.default_rng(0)
    for length, task in ((5, "pick it"), (4, "place it")):
        base, wrist = smooth_frames(rng, length, 32, 48), smooth_frames(rng, length, 32, 48)
        episode = recorder.start("robot")
        for t in range(length):
            obs = {"observation/image": base[t], "observation/wrist_image": wrist[t],
                   "observation/state": rng.normal(size=4).astype(np.float32), "prompt": task,
                   "intervention": t == 1, "action": np.full(3, t, np.float32)}  # fmt: skip
            episode.check(obs, 3)
            episode.add(obs, rng.normal(size=(2, 3)).astype(np.float32))
        episode.end(length == 5)
    recorder.close()
    sources = recorded_episodes(tmp_path / "rec")
    merge_datasets(sources, tmp_path / "merged")
    theirs, dataset = read_with_lerobot("recap/merged", tmp_path / "merged")
    ours = read_with_recap(tmp_path / "merged")
    assert mismatches(ours, theirs, skip=("task", *CAMERAS)) == []
    assert dataset.meta.total_episodes == 2 and len(dataset) == 9
    assert theirs["episode_index"].tolist() == [0] * 5 + [1] * 4
    assert theirs["index"].tolist() == list(range(9))
    assert theirs["is_correction"].nonzero()[0].tolist() == [1, 6]
    assert list(theirs["task"]) == ["pick it"] * 5 + ["place it"] * 4
    for camera in CAMERAS:  # the merged video files are the sources' bytes: frames as theirs
        parts = [read_with_lerobot("recap/one", s)[0][camera] for s in sources]
        np.testing.assert_array_equal(theirs[camera], np.concatenate(parts))
