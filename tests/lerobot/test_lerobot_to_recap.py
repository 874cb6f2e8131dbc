"""LeRobot -> recap, generated live: LeRobot 0.6.1 writes v3.0 datasets shaped like real data and
recap's reader returns, for every frame, what LeRobot's own reader returns."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from recap.data.lerobot import LIBERO_KEYS, LocalDataset, detect_key_map
from tests.lerobot.lerobot_helpers import (
    mismatches,
    read_with_lerobot,
    read_with_recap,
    smooth_frames,
    write_with_lerobot,
)

LENGTHS = [4, 1, 6, 1, 5, 3]  # episodes of length 1 among them
TASKS = ["pick the red cube", "open the drawer"]


def _episodes(cameras: dict[str, tuple[int, int]], state: str, action: str, outcome: str):
    rng = np.random.default_rng(7)
    episodes = []
    for e, length in enumerate(LENGTHS):
        ep = {cam: smooth_frames(rng, length, h, w) for cam, (h, w) in cameras.items()}
        ep[state] = rng.normal(size=(length, 5)).astype(np.float32)
        ep[action] = rng.normal(size=(length, 4)).astype(np.float32)
        success = e % 3 != 2
        ep[outcome] = np.array([[success and t == length - 1] for t in range(length)])
        ep["task"] = TASKS[e % 2]
        episodes.append(ep)
    return episodes


def _features(cameras, dtypes, state, action, outcome):
    names = ["height", "width", "channels"]
    feats = {cam: {"dtype": dtypes[cam], "shape": [h, w, 3], "names": names}
             for cam, (h, w) in cameras.items()}  # fmt: skip
    feats[state] = {"dtype": "float32", "shape": [5], "names": [f"s{i}" for i in range(5)]}
    feats[action] = {"dtype": "float32", "shape": [4], "names": [f"a{i}" for i in range(4)]}
    return feats | {outcome: {"dtype": "bool", "shape": [1], "names": None}}


# Both naming conventions; several non-square cameras of different sizes, video and image;
# `next.success` as the only outcome (true on the last frame of a successful episode).
LEROBOT_NAMING = (
    {"observation.images.front": (36, 64), "observation.images.wrist": (20, 36),
     "observation.images.side": (16, 28)},
    {"observation.images.front": "video", "observation.images.wrist": "video",
     "observation.images.side": "image"},
    "observation.state", "action",
)  # fmt: skip
LIBERO_NAMING = (
    {"image": (30, 44), "wrist_image": (20, 36)},
    {"image": "video", "wrist_image": "image"},
    "state", "actions",
)  # fmt: skip


@pytest.fixture(scope="module", params=["lerobot_naming", "libero_naming"])
def written(request, tmp_path_factory):
    cameras, dtypes, state, action = {"lerobot_naming": LEROBOT_NAMING,
                                      "libero_naming": LIBERO_NAMING}[request.param]  # fmt: skip
    root = tmp_path_factory.mktemp(request.param) / "ds"
    repo_id = f"local/{request.param}"
    feats = _features(cameras, dtypes, state, action, "next.success")
    # data files rotate every ~episode, video files at other episodes, per camera (sizes differ)
    write_with_lerobot(root, repo_id, feats, _episodes(cameras, state, action, "next.success"),
                       data_mb=0.02, video_mb=0.004)  # fmt: skip
    return request.param, repo_id, root, cameras, state, action


def test_the_written_datasets_have_what_real_data_has(written):
    name, _, root, cameras, state, action = written
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and "is_success" not in info["features"]
    assert info["total_episodes"] == 6 and info["total_frames"] == sum(LENGTHS)
    episodes = pq.read_table(sorted((root / "meta/episodes").glob("*/*.parquet"))).to_pydict()
    assert episodes["length"] == LENGTHS
    data_files = episodes["data/file_index"]
    videos = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    video_files = {k: episodes[f"videos/{k}/file_index"] for k in videos}
    assert len(set(data_files)) > 1, f"data files not split: {data_files}"
    for key, files in video_files.items():
        assert len(set(files)) > 1, f"{key}: video files not split: {files}"
        assert files != data_files, f"{key}: video split at the data split {files}"
    if name == "lerobot_naming":
        front, wrist = (video_files[f"observation.images.{c}"] for c in ("front", "wrist"))
        assert front != wrist, f"cameras split at the same episodes: {front}"
    with LocalDataset(root) as ds:
        keys = detect_key_map(ds.features)
        assert keys.state == state and keys.action == action
        assert set(keys.cameras) == set(cameras)
        if name == "libero_naming":
            assert keys == LIBERO_KEYS


def test_recap_reads_what_lerobot_reads_for_every_frame(written):
    _, repo_id, root, cameras, state, action = written
    theirs, ds = read_with_lerobot(repo_id, root)
    ours = read_with_recap(root)
    assert len(ds) == sum(LENGTHS) == len(ours["index"])
    assert set(cameras) <= set(ours) and {state, action, "next.success"} <= set(ours)
    assert mismatches(ours, theirs) == []
    assert ours["index"].tolist() == list(range(sum(LENGTHS)))
    assert ours["next.success"].reshape(-1).sum() == 4  # episodes 0, 1, 3, 4 succeed
