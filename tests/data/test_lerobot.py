"""LocalDataset against datasets written by the real LeRobot library (tests/fixtures/lerobot)."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recap.data import video as video_module
from recap.data.lerobot import (
    LEROBOT_KEYS,
    LIBERO_KEYS,
    SUPPORTED_VERSIONS,
    KeyMap,
    LocalDataset,
    detect_key_map,
)
from recap.errors import DatasetError
from tests.helpers import FIXTURES

NAMES = ("libero_like_v30_images", "libero_like_v30_video", "rlinf_like_v21_video")
LIBERO_TASKS = {0: "put the black bowl on the plate", 1: "open the top drawer of the cabinet"}
EXPECTED = {
    "libero_like_v30_images": ("v3.0", [9, 12, 7, 15, 10, 13], LEROBOT_KEYS, LIBERO_TASKS),
    "libero_like_v30_video": ("v3.0", [9, 12, 7, 15, 10, 13], LEROBOT_KEYS, LIBERO_TASKS),
    "rlinf_like_v21_video": (
        "v2.1",
        [11, 8, 14, 7, 10, 12, 9],
        LIBERO_KEYS,
        {
            0: "pick up the alphabet soup and place it in the basket",
            1: "turn on the stove",
            2: "put the cream cheese in the bowl",
        },
    ),
}
SCALARS = ("episode_index", "frame_index", "index", "timestamp", "task_index", "is_success", "done")
V21 = "rlinf_like_v21_video"


def fixture_path(name: str) -> Path:
    return FIXTURES / name


@pytest.fixture(scope="module")
def reference():
    cache: dict[str, dict[str, np.ndarray]] = {}

    def load(name: str) -> dict[str, np.ndarray]:
        if name not in cache:
            with np.load(fixture_path(f"{name}.reference.npz")) as z:
                cache[name] = {k: z[k] for k in z.files}
        return cache[name]

    return load


def copy_fixture(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(fixture_path(name), dst)
    return dst


def as_numpy(column: pa.ChunkedArray) -> np.ndarray:
    array = column.combine_chunks()
    if pa.types.is_fixed_size_list(array.type):
        return array.flatten().to_numpy().reshape(len(array), array.type.list_size)
    return array.to_numpy(zero_copy_only=False)


# ---- metadata and columns ---------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_metadata(name):
    version, lengths, keys, tasks = EXPECTED[name]
    with LocalDataset(fixture_path(name)) as ds:
        assert (ds.version, ds.fps, ds.name) == (version, 10.0, name)
        assert ds.camera_keys == keys.cameras
        assert detect_key_map(ds.features) == keys
        assert ds.tasks == tasks
        assert ds.episodes.column("episode_index").to_pylist() == list(range(len(lengths)))
        assert ds.episodes.column("length").to_pylist() == lengths
        assert ds.episodes.schema.field("length").type == pa.int64()
        assert (ds.num_episodes, ds.num_frames) == (len(lengths), sum(lengths))
        assert all(p.is_file() and p.suffix == ".parquet" for p in ds.data_files)
        assert len(ds.data_files) == (1 if version == "v3.0" else len(lengths))
        assert ds.has_column(keys.state) and ds.has_column("is_success")
        assert not ds.has_column("reward")


def test_v3_episodes_keep_offsets_and_drop_stats():
    with LocalDataset(fixture_path("libero_like_v30_video")) as ds:
        names = ds.episodes.column_names
        assert "dataset_from_index" in names
        assert "videos/observation.images.wrist_image/from_timestamp" in names
        assert not [n for n in names if n.startswith("stats/")]
        assert ds.episodes.column("dataset_from_index").to_pylist() == [0, 9, 21, 28, 43, 53]


@pytest.mark.parametrize("name", NAMES)
def test_columns_match_lerobot_reader(name, reference):
    ref = reference(name)
    keys = EXPECTED[name][2]
    columns = [*SCALARS, keys.state, keys.action]
    with LocalDataset(fixture_path(name)) as ds:
        table = ds.read_columns(columns)
        assert table.column_names == columns
        for column in columns:
            np.testing.assert_array_equal(as_numpy(table.column(column)), ref[column])
        texts = ds.task_texts(as_numpy(table.column("task_index")))
        assert texts.dtype == object
        assert texts.tolist() == ref["task"].tolist()


def test_read_columns_returns_only_requested_columns():
    with LocalDataset(fixture_path("libero_like_v30_images")) as ds:
        table = ds.read_columns(["done", "index"])
    assert table.column_names == ["done", "index"]
    assert table.column("index").to_pylist() == list(range(66))
    assert np.flatnonzero(as_numpy(table.column("done"))).tolist() == [8, 20, 27, 42, 52, 65]


def test_v20_reads_like_v21(tmp_path, reference):
    root = copy_fixture(V21, tmp_path)
    info = json.loads((root / "meta" / "info.json").read_text())
    (root / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v2.0"}))
    ref = reference(V21)
    with LocalDataset(root) as ds:
        assert ds.version == "v2.0" and SUPPORTED_VERSIONS == ("v2.0", "v2.1", "v3.0")
        np.testing.assert_array_equal(as_numpy(ds.read_columns(["state"]).column(0)), ref["state"])
        np.testing.assert_array_equal(ds.frames("image", np.arange(71)), ref["image"])


# ---- frames -----------------------------------------------------------------------------------


def camera_cases():
    return [(n, k) for n in NAMES for k in EXPECTED[n][2].cameras]


@pytest.mark.parametrize(("name", "key"), camera_cases())
def test_frames_equal_lerobot_decoded_frames(name, key, reference):
    ref = reference(name)
    with LocalDataset(fixture_path(name)) as ds:
        frames = ds.frames(key, np.arange(ds.num_frames))
    assert frames.dtype == np.uint8 and frames.shape == (ds.num_frames, 32, 32, 3)
    np.testing.assert_array_equal(frames, ref[key])
    if name == "libero_like_v30_images":  # PNG is lossless: also equal to what was written
        np.testing.assert_array_equal(frames, ref[f"{key}__original"])


@pytest.mark.parametrize(("name", "key"), camera_cases())
def test_shuffled_and_single_frame_access_gives_same_frames(name, key, reference):
    ref = reference(name)[key]
    n = len(ref)
    perm = np.random.default_rng(0).permutation(n)
    with LocalDataset(fixture_path(name)) as ds:
        np.testing.assert_array_equal(ds.frames(key, perm), ref[perm])
        one_by_one = np.concatenate([ds.frames(key, [i]) for i in perm])
        np.testing.assert_array_equal(one_by_one, ref[perm])
        repeats = np.array([5, 5, n - 1, 0, n - 1, 3])
        np.testing.assert_array_equal(ds.frames(key, repeats), ref[repeats])
        np.testing.assert_array_equal(ds.frames(key, np.arange(n)[::-1]), ref[::-1])
        assert ds.frames(key, np.array([], dtype=np.int64)).shape == (0, 32, 32, 3)


@pytest.mark.parametrize("name", ["libero_like_v30_video", V21])
def test_sequential_access_reuses_open_decoders_without_seeking(name, reference, monkeypatch):
    opened: list[str] = []
    real_open = video_module.av.open

    def counting_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(video_module.av, "open", counting_open)
    key = EXPECTED[name][2].cameras[1]
    ref = reference(name)[key]
    with LocalDataset(fixture_path(name)) as ds:
        got = np.concatenate(
            [ds.frames(key, np.arange(s, min(s + 4, len(ref)))) for s in range(0, len(ref), 4)]
        )
        files = list(ds._videos._files.values())
        assert [v.seeks for v in files] == [1] * len(files)  # only the first access seeks
    np.testing.assert_array_equal(got, ref)
    assert len(opened) == len(set(opened)) == (1 if name.startswith("libero") else 7)


@pytest.mark.parametrize("name", ["libero_like_v30_video", V21])
def test_frames_without_a_container_index(name, reference, monkeypatch):
    """Without keyframe positions the reader falls back to a distance rule; frames stay exact."""
    monkeypatch.setattr(video_module, "_keyframe_pts", lambda stream: np.empty(0, np.int64))
    key = EXPECTED[name][2].cameras[0]
    ref = reference(name)[key]
    perm = np.random.default_rng(2).permutation(len(ref))
    with LocalDataset(fixture_path(name)) as ds:
        np.testing.assert_array_equal(ds.frames(key, np.arange(len(ref))), ref)
        singles = np.concatenate([ds.frames(key, [i]) for i in perm])
    np.testing.assert_array_equal(singles, ref[perm])


def test_h264_with_b_frames_random_access(tmp_path):
    """Re-encode the v2.1 videos as H.264 with B-frames (pts != dts) and compare random access
    against a plain sequential decode of the same files."""
    root = copy_fixture(V21, tmp_path)
    for mp4 in sorted(root.glob("videos/chunk-000/*/*.mp4")):
        frames = [f.to_ndarray(format="rgb24") for f in av.open(str(mp4)).decode(video=0)]
        with av.open(str(mp4), "w") as out:
            stream = out.add_stream("libx264", rate=10)
            stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
            stream.options = {"g": "4", "bf": "2", "crf": "20"}
            for i, rgb in enumerate(frames):
                frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
                frame.pts = i
                out.mux(stream.encode(frame))
            out.mux(stream.encode())
    sequential = np.concatenate(
        [
            np.stack([f.to_ndarray(format="rgb24") for f in av.open(str(p)).decode(video=0)])
            for p in sorted(root.glob("videos/chunk-000/wrist_image/*.mp4"))
        ]
    )
    assert av.open(str(mp4)).streams.video[0].codec_context.name == "h264"
    perm = np.random.default_rng(1).permutation(71)
    with LocalDataset(root) as ds:
        np.testing.assert_array_equal(ds.frames("wrist_image", perm), sequential[perm])
        singles = np.concatenate([ds.frames("wrist_image", [i]) for i in perm])
        np.testing.assert_array_equal(singles, sequential[perm])


def test_dataset_survives_close_and_pickle(reference):
    ref = reference("libero_like_v30_video")["observation.images.image"]
    ds = LocalDataset(fixture_path("libero_like_v30_video"))
    with ds:
        first = ds.frames("observation.images.image", [3, 40])
    assert len(ds._videos) == 0  # closed by the context manager
    np.testing.assert_array_equal(first, ref[[3, 40]])
    np.testing.assert_array_equal(ds.frames("observation.images.image", [7]), ref[[7]])
    clone = pickle.loads(pickle.dumps(ds))  # e.g. a DataLoader worker started with spawn
    np.testing.assert_array_equal(clone.frames("observation.images.image", [65, 0]), ref[[65, 0]])
    ds.close()
    clone.close()


# ---- offline and read-only --------------------------------------------------------------------


def test_reads_all_fixtures_with_network_blocked(monkeypatch, reference):
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for name in NAMES:
        ref = reference(name)
        keys = EXPECTED[name][2]
        with LocalDataset(fixture_path(name)) as ds:
            table = ds.read_columns(["index", keys.action])
            np.testing.assert_array_equal(as_numpy(table.column(keys.action)), ref[keys.action])
            assert ds.task_texts(np.array([0]))[0] == EXPECTED[name][3][0]
            for key in keys.cameras:
                np.testing.assert_array_equal(ds.frames(key, [0, 9, 20]), ref[key][[0, 9, 20]])


def test_module_imports_no_hub_library():
    code = (
        "import sys, recap.data.lerobot; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lerobot', 'huggingface_hub', 'datasets', 'requests', 'urllib3', 'httpx')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, _sha(p))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_reading_never_modifies_the_dataset():
    for name in NAMES:
        root = fixture_path(name)
        before = snapshot(root)
        with LocalDataset(root) as ds:
            ds.read_columns(list(SCALARS))
            ds.validate_frames()
            _ = ds.tasks, ds.episodes
            for key in ds.camera_keys:
                ds.frames(key, np.arange(ds.num_frames)[::-1])
        assert snapshot(root) == before


# ---- key maps ---------------------------------------------------------------------------------


def test_key_map_constants():
    assert LIBERO_KEYS == KeyMap(("image", "wrist_image"), "state", "actions")
    assert LEROBOT_KEYS == KeyMap(
        ("observation.images.image", "observation.images.wrist_image"),
        "observation.state",
        "action",
    )


def test_detect_key_map_orders_cameras_base_then_left_then_right():
    video = {"dtype": "video"}
    features = {
        "observation.images.right_wrist": video,
        "observation.state": {"dtype": "float32"},
        "observation.images.left_wrist": {"dtype": "image"},
        "observation.images.base": video,
        "action": {"dtype": "float32"},
        "timestamp": {"dtype": "float32"},
    }
    assert detect_key_map(features) == KeyMap(
        (
            "observation.images.base",
            "observation.images.left_wrist",
            "observation.images.right_wrist",
        ),
        "observation.state",
        "action",
    )


def test_detect_key_map_without_state_names_the_problem():
    with pytest.raises(DatasetError) as err:
        detect_key_map({"cam": {"dtype": "video"}, "action": {"dtype": "float32"}}, "/d/info.json")
    assert str(err.value) == (
        "/d/info.json: features: cannot detect camera/state/action keys (need image or video "
        "features, 'observation.state' or 'state', 'action' or 'actions'; found cam, action); "
        'name them in the dataset\'s gin entry ("cameras", "state_key", "action_key")'
    )


# ---- bad input --------------------------------------------------------------------------------


def error_of(fn, *args) -> str:
    with pytest.raises(DatasetError) as err:
        fn(*args)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_info_json(tmp_path):
    (tmp_path / "meta").mkdir()
    message = error_of(LocalDataset, tmp_path)
    assert message.startswith(f"{tmp_path}/meta/info.json: file not found; point the dataset root")


def test_unknown_codebase_version(tmp_path):
    root = copy_fixture(V21, tmp_path)
    info = json.loads((root / "meta" / "info.json").read_text())
    (root / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v9.9"}))
    assert error_of(LocalDataset, root) == (
        f"{root}/meta/info.json: codebase_version 'v9.9' is not supported; "
        "use a LeRobot dataset of version v2.0, v2.1 or v3.0"
    )


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "parquet file is empty (0 bytes); restore it from the source dataset"),
        (b"not a parquet file at all" * 40, "not a readable parquet file ("),
    ],
)
def test_corrupt_or_empty_parquet_names_the_file(tmp_path, content, fragment):
    root = copy_fixture(V21, tmp_path)
    bad = root / "data" / "chunk-000" / "episode_000003.parquet"
    bad.write_bytes(content)
    ds = LocalDataset(root)
    message = error_of(ds.read_columns, ["episode_index"])
    assert message.startswith(f"{bad}: {fragment}")


def test_truncated_parquet_names_the_file(tmp_path):
    root = copy_fixture("libero_like_v30_images", tmp_path)
    bad = root / "data" / "chunk-000" / "file-000.parquet"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    message = error_of(LocalDataset(root).read_columns, ["index"])
    assert message.startswith(f"{bad}: not a readable parquet file (")


def test_missing_column_lists_what_exists():
    ds = LocalDataset(fixture_path(V21))
    message = error_of(ds.read_columns, ["episode_index", "reward"])
    first = fixture_path(V21) / "data" / "chunk-000" / "episode_000000.parquet"
    assert message == (
        f"{first}: column 'reward' not found; available columns: state, actions, is_success, "
        "done, timestamp, frame_index, episode_index, index, task_index; "
        "fix the column name or the dataset's gin entry"
    )


def test_unknown_camera_and_out_of_range_rows():
    ds = LocalDataset(fixture_path("libero_like_v30_video"))
    info = fixture_path("libero_like_v30_video") / "meta" / "info.json"
    assert error_of(ds.frames, "image", [0]) == (
        f"{info}: features: camera 'image' not found; cameras are observation.images.image, "
        'observation.images.wrist_image; fix "cameras" in the dataset\'s gin entry'
    )
    message = error_of(ds.frames, "observation.images.image", [3, 66])
    assert message.endswith("/data: row 66 is out of range [0, 66)")


def test_unknown_task_index():
    ds = LocalDataset(fixture_path("libero_like_v30_images"))
    message = error_of(ds.task_texts, np.array([0, 1, 5]))
    assert message.endswith(
        "meta/tasks.parquet: task_index 5 has no task text; add it to the tasks file"
    )


@pytest.mark.parametrize(
    ("name", "video", "rows", "frame"),
    [
        (V21, "videos/chunk-000/image/episode_000002.mp4", [0, 20], "'image', episode 2 frame 1"),
        (
            "libero_like_v30_video",
            "videos/observation.images.image/chunk-000/file-000.mp4",
            [1],
            "'observation.images.image', episode 0 frame 1",
        ),
    ],
)
def test_missing_video_names_the_expected_path(tmp_path, name, video, rows, frame):
    root = copy_fixture(name, tmp_path)
    (root / video).unlink()
    key = EXPECTED[name][2].cameras[0]
    message = error_of(LocalDataset(root).frames, key, rows)
    assert message == (
        f"{root / video}: camera {frame}: video file not found; restore it from the source dataset"
    )


def test_timestamp_past_the_video_end(tmp_path):
    root = copy_fixture(V21, tmp_path)
    path = root / "data" / "chunk-000" / "episode_000001.parquet"
    table = pq.read_table(path)
    shifted = pa.array(table.column("timestamp").to_numpy() + np.float32(5.0))
    pq.write_table(
        table.set_column(table.schema.get_field_index("timestamp"), "timestamp", shifted), path
    )
    message = error_of(LocalDataset(root).frames, "image", [11])
    assert message == (
        f"{root}/videos/chunk-000/image/episode_000001.mp4: camera 'image', episode 1 frame 0: "
        "no frame at timestamp 5.0000s "
        "(tolerance 0.0500s); the video does not match the parquet timestamps, re-encode it or "
        "restore the dataset"
    )


def rewrite_episode_2(root: Path, rows: list[int]) -> Path:
    path = root / "data" / "chunk-000" / "episode_000002.parquet"
    pq.write_table(pq.read_table(path).take(rows), path)
    return path


def test_duplicate_frame_rows_are_reported(tmp_path):
    root = copy_fixture(V21, tmp_path)
    path = rewrite_episode_2(root, [0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 11, 12, 13])
    ds = LocalDataset(root)
    expected = (
        f"{path}: episode_index/frame_index: duplicate row (episode_index=2, frame_index=5); "
        "remove the extra rows or re-export the dataset"
    )
    assert error_of(ds.validate_frames) == expected
    assert error_of(ds.read_columns, ["frame_index", "episode_index", "index"]) == expected
    assert ds.read_columns(["frame_index"]).num_rows == 72  # no check without episode_index


def test_frame_index_gap_is_reported(tmp_path):
    root = copy_fixture(V21, tmp_path)
    path = rewrite_episode_2(root, [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13])
    assert error_of(LocalDataset(root).validate_frames) == (
        f"{path}: frame_index: episode 2 has frame 6 where frame 5 was expected (a gap); "
        "frames are missing, restore them or drop the episode"
    )


def test_v30_file_holding_only_an_episode_tail_is_read(tmp_path):
    from recap.data.lerobot_writer import Episode, WriterConfig, write_lerobot_dataset

    def episode(n):
        return Episode({}, np.zeros((n, 8), np.float32), np.zeros((n, 7), np.float32), "t", True)

    root = tmp_path / "split"
    write_lerobot_dataset(root, [episode(20), episode(33)], WriterConfig(max_frames_per_file=46))
    ds = LocalDataset(root)
    # episode 1 starts in file-000 and ends in file-001; no episode starts in file-001
    assert [p.name for p in ds.data_files] == ["file-000.parquet", "file-001.parquet"]
    assert ds.num_frames == 53
    table = ds.read_columns(["episode_index", "frame_index"])
    assert table.column("frame_index").to_pylist() == list(range(20)) + list(range(33))
