"""Write real LeRobot datasets (codebase v2.1 and v3.0) from in-memory episodes, without lerobot.

The layout, parquet schemas, ``meta/`` files and ``info.json`` fields follow what LeRobot itself
writes (see ``shared/fixtures``): v2.1 has one parquet and one mp4 per episode plus
``episodes.jsonl`` / ``tasks.jsonl`` / ``episodes_stats.jsonl``; v3.0 has many episodes per
``data/chunk-XXX/file-XXX.parquet``, ``meta/episodes/chunk-000/file-000.parquet``,
``meta/tasks.parquet``, ``meta/stats.json`` and one mp4 per camera for all episodes. Cameras are
``dtype: image`` (PNG bytes in a parquet struct {bytes, path}) or ``dtype: video`` (PyAV-encoded
mp4, yuv420p, no B-frames, a keyframe at least every ``gop`` frames and at every episode start).

Unlike LeRobot, a v3.0 episode may be split across two data files when ``max_frames_per_file`` is
set and ``split_episodes`` is true (LeRobot only rotates files at episode boundaries); its
``data/file_index`` is then the file holding its first frame. Readers that locate frames by the
global ``index`` (``dataset_from_index`` .. ``dataset_to_index``) are unaffected.

The whole dataset is written to a temporary sibling directory and renamed into place, so an
interrupted write leaves nothing half-written. Output is deterministic: parquet files carry no
timestamps, PNGs are encoded here with zlib, and the video encoder runs single-threaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recap.errors import RecapError

V21, V30 = "v2.1", "v3.0"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V30_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V30_EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
# codec -> (name in info.json, default crf, default preset)
CODECS = {"libx264": ("h264", 18, "medium"), "libsvtav1": ("av1", 30, 12)}


@dataclass
class Episode:
    """One recorded episode of T frames.

    images: camera name (``"image"``, ``"wrist_image"``) -> uint8[T, H, W, 3];
    state: float32[T, S]; action: float32[T, A]; task: its language instruction;
    success: the episode outcome (written as ``is_success`` on every frame);
    flags: extra boolean per-frame columns, name -> bool[T] (e.g. ``is_correction``: frames an
    expert controlled); every episode of a dataset names the same ones (none by default).
    """

    images: dict[str, np.ndarray]
    state: np.ndarray
    action: np.ndarray
    task: str
    success: bool
    flags: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.state.shape[0])


@dataclass(frozen=True)
class WriterConfig:
    """How to write a dataset.

    version: ``"v2.1"`` or ``"v3.0"``; naming: ``"lerobot"`` (``observation.images.<cam>``,
    ``observation.state``, ``action``) or ``"libero"`` (``<cam>``, ``state``, ``actions``);
    image_dtype: ``"video"`` (mp4) or ``"image"`` (PNG in parquet); codec: ``libx264`` or
    ``libsvtav1``; crf / preset default per codec; max_frames_per_file: v3.0 data-file size.
    """

    version: str = V30
    naming: str = "lerobot"
    image_dtype: str = "video"
    fps: int = 10
    codec: str = "libx264"
    gop: int = 2
    crf: int | None = None
    preset: str | int | None = None
    max_frames_per_file: int | None = None
    split_episodes: bool = True
    chunks_size: int = 1000
    robot_type: str = "reach2d"
    state_names: tuple[str, ...] | None = None
    action_names: tuple[str, ...] | None = None

    def validate(self) -> None:
        """Raise ``RecapError`` naming the bad field."""
        choices = {"version": (V21, V30), "naming": ("lerobot", "libero")}
        choices["image_dtype"] = ("video", "image")
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise RecapError(
                    f"WriterConfig.{name}={getattr(self, name)!r}; use one of {allowed}"
                )
        if self.max_frames_per_file is not None and self.max_frames_per_file < 1:
            raise RecapError("WriterConfig.max_frames_per_file must be >= 1 or None")
        codec_settings(self.codec, self.crf, self.preset)


def column_names(naming: str, cameras: Iterable[str]) -> dict[str, str]:
    """Parquet/feature name of ``state``, ``action`` and each camera under a naming style."""
    if naming == "libero":
        names = {"state": "state", "action": "actions"}
        return names | {cam: cam for cam in cameras}
    names = {"state": "observation.state", "action": "action"}
    return names | {cam: f"observation.images.{cam}" for cam in cameras}


@contextlib.contextmanager
def atomic_directory(root: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``root``; on success rename it to ``root``, else delete it."""
    root = Path(root)
    if root.exists() and not overwrite:
        raise FileExistsError(f"{root}: already exists; pass overwrite=True to replace it")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".tmp", dir=root.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if root.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".old", dir=root.parent))
            os.replace(root, trash / root.name)
            os.replace(tmp, root)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_lerobot_dataset(
    root: str | Path,
    episodes: Iterable[Episode],
    config: WriterConfig = WriterConfig(),
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``episodes`` (streamed, one at a time) as a LeRobot dataset at ``root``.

    Returns ``{"path", "version", "episodes", "frames", "successes", "tasks"}``.
    """
    config.validate()
    root = Path(root)
    with atomic_directory(root, overwrite) as tmp:
        writer = _Writer(tmp, config)
        for episode in episodes:
            writer.add(episode)
        if writer.num_episodes == 0:
            raise RecapError(f"{root}: no episodes to write")
        writer.finish()
    return {
        "path": str(root),
        "version": config.version,
        "episodes": writer.num_episodes,
        "frames": writer.num_frames,
        "successes": writer.num_successes,
        "tasks": list(writer.tasks),
    }


# ---- media: PNG and mp4 -------------------------------------------------------------------


def encode_png(image: np.ndarray) -> bytes:
    """Lossless, deterministic PNG (8-bit RGB, ``Sub`` filter, zlib level 6) of uint8[H, W, 3]."""
    height, width, _ = image.shape
    rows = image.reshape(height, width * 3).astype(np.int16)
    sub = (rows - np.pad(rows, ((0, 0), (3, 0)))[:, : width * 3]).astype(np.uint8)
    raw = np.concatenate([np.ones((height, 1), np.uint8), sub], axis=1).tobytes()

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def codec_settings(codec: str, crf: int | None, preset: str | int | None) -> tuple[str, int, Any]:
    """(name written to info.json, crf, preset) for a PyAV encoder name, with per-codec defaults."""
    if codec not in CODECS:
        raise RecapError(f"WriterConfig.codec={codec!r}; use one of {sorted(CODECS)}")
    name, default_crf, default_preset = CODECS[codec]
    return name, default_crf if crf is None else crf, default_preset if preset is None else preset


class VideoEncoder:
    """Appends uint8[T, H, W, 3] RGB frames to one mp4 (yuv420p, no B-frames, single thread).

    Frame i of the file has pts i / fps; the first frame of every ``add`` call is a keyframe.
    """

    def __init__(self, path: Path, fps: int, codec: str, gop: int, crf: int | None, preset: Any):
        import av  # PyAV is only needed when videos are written

        _, crf, preset = codec_settings(codec, crf, preset)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(path), mode="w", format="mp4")
        self.stream = None
        self.codec, self.fps, self.gop = codec, fps, gop
        self.options = {"crf": str(crf), "preset": str(preset)}
        if codec == "libx264":
            self.options["forced-idr"] = "1"
        self.num_frames = 0

    def _open_stream(self, height: int, width: int) -> None:
        stream = self.container.add_stream(self.codec, rate=self.fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = self.gop
        stream.codec_context.max_b_frames = 0
        stream.codec_context.thread_count = 1
        stream.options = self.options
        self.stream = stream

    def add(self, frames: np.ndarray) -> None:
        """Encode uint8[T, H, W, 3] frames after those already added."""
        import av

        if self.stream is None:
            self._open_stream(frames.shape[1], frames.shape[2])
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts, frame.time_base = self.num_frames, Fraction(1, self.fps)
            if i == 0:
                frame.pict_type = av.video.frame.PictureType.I
            self.container.mux(self.stream.encode(frame))
            self.num_frames += 1

    def close(self) -> None:
        """Flush the encoder and finish the mp4."""
        if self.stream is not None:
            self.container.mux(self.stream.encode(None))
        self.container.close()

    def __enter__(self) -> VideoEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- statistics, as LeRobot stores them -----------------------------------------------------


def feature_stats(values: np.ndarray, image: bool, quantiles: bool) -> dict[str, np.ndarray]:
    """min / max / mean / std / count (and q01..q99 when ``quantiles``) of one episode's feature.

    values: uint8[T, H, W, C] when ``image`` (scaled to [0, 1], stats per channel of shape
    [C, 1, 1]), else [T] or [T, D] (stats of shape [1] or [D]; min/max keep the input dtype).
    Quantiles use numpy's default linear interpolation.
    """
    if image:
        return _image_stats(values, quantiles)
    x = values.reshape(len(values), -1)
    xf = x.astype(np.float64)
    stats = {"min": x.min(axis=0), "max": x.max(axis=0), "mean": xf.mean(axis=0)}
    stats["std"] = xf.std(axis=0)
    if quantiles:
        stats |= {name: np.quantile(xf, q, axis=0) for name, q in QUANTILES.items()}
    return stats | {"count": np.array([len(values)], np.int64)}


def _image_stats(frames: np.ndarray, quantiles: bool) -> dict[str, np.ndarray]:
    """Stats of uint8[T, H, W, C] from per-channel 256-bin histograms (exact, and fast)."""
    channels = frames.shape[-1]
    flat = frames.reshape(-1, channels)
    hist = np.stack([np.bincount(flat[:, c], minlength=256) for c in range(channels)])
    levels, n = np.arange(256, dtype=np.float64), flat.shape[0]
    mean = hist @ levels / n
    std = np.sqrt((hist * (levels[None, :] - mean[:, None]) ** 2).sum(axis=1) / n)
    nonzero = hist > 0
    lo, hi = nonzero.argmax(axis=1), 255 - nonzero[:, ::-1].argmax(axis=1)
    stats = {"min": lo.astype(np.float64), "max": hi.astype(np.float64), "mean": mean, "std": std}
    if quantiles:
        cumulative = np.cumsum(hist, axis=1)
        for name, q in QUANTILES.items():
            pos = q * (n - 1)
            below, above = (
                np.array([np.searchsorted(cumulative[c], k, side="right") for c in range(channels)])
                for k in (np.floor(pos), np.ceil(pos))
            )
            stats[name] = below + (above - below) * (pos - np.floor(pos))
    stats = {name: (value / 255.0).reshape(channels, 1, 1) for name, value in stats.items()}
    return stats | {"count": np.array([len(frames)], np.int64)}


def aggregate_stats(
    episodes: list[dict[str, dict[str, np.ndarray]]],
) -> dict[str, dict[str, np.ndarray]]:
    """Dataset stats from per-episode ones: pooled mean/std, extreme min/max, weighted quantiles."""
    out = {}
    for key in episodes[0]:
        per = [ep[key] for ep in episodes]
        counts = np.array([s["count"][0] for s in per], np.float64)
        weights = (counts / counts.sum()).reshape(-1, *[1] * per[0]["mean"].ndim)
        means = np.stack([s["mean"] for s in per])
        mean = (weights * means).sum(axis=0)
        var = (weights * (np.stack([s["std"] for s in per]) ** 2 + (means - mean) ** 2)).sum(axis=0)
        stats = {"min": np.min([s["min"] for s in per], axis=0)}
        stats |= {"max": np.max([s["max"] for s in per], axis=0), "mean": mean, "std": np.sqrt(var)}
        stats["count"] = np.array([int(counts.sum())], np.int64)
        for name in QUANTILES:
            if name in per[0]:
                stats[name] = (weights * np.stack([s[name] for s in per])).sum(axis=0)
        out[key] = stats
    return out


def stats_to_json(stats: dict[str, dict[str, np.ndarray]], floats: bool) -> dict[str, Any]:
    """Nested lists; ``floats`` casts all but ``count`` to float (v3.0), else keeps dtypes."""
    return {
        key: {
            name: (value.astype(np.float64) if floats and name != "count" else value).tolist()
            for name, value in per_stat.items()
        }
        for key, per_stat in stats.items()
    }


# ---- the writer ----------------------------------------------------------------------------


def _json_dump(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=4) + "\n")


def _jsonl_dump(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


class _Writer:
    """Accumulates metadata while streaming episodes to parquet / mp4 under ``root``."""

    def __init__(self, root: Path, config: WriterConfig):
        self.root, self.cfg = root, config
        self.v30 = config.version == V30
        self.tasks: dict[str, int] = {}
        self.episode_rows: list[dict[str, Any]] = []
        self.episode_stats: list[dict[str, dict[str, np.ndarray]]] = []
        self.num_episodes = self.num_frames = self.num_successes = 0
        self.features: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, str] = {}
        self.cameras: list[str] = []
        self.flags: list[str] = []  # Episode.flags names, fixed by the first episode
        self.schema: pa.Schema | None = None
        self.videos: dict[str, VideoEncoder] = {}
        self.data_writer: pq.ParquetWriter | None = None
        self.chunk = self.file = self.file_rows = 0

    # ---- features and schema, fixed by the first episode ----
    def _init_features(self, ep: Episode) -> None:
        cfg = self.cfg
        self.cameras = list(ep.images)
        self.keys = column_names(cfg.naming, self.cameras)
        hw_names = ["height", "width", "channels" if self.v30 else "channel"]
        for cam in self.cameras:
            height, width = ep.images[cam].shape[1:3]
            feat: dict[str, Any] = {"dtype": cfg.image_dtype, "shape": [height, width, 3]}
            feat["names"] = hw_names
            if cfg.image_dtype == "video":
                feat["info"] = self._video_info(height, width)
            self.features[self.keys[cam]] = feat
        for part, names, width in (
            ("state", cfg.state_names, ep.state.shape[1]),
            ("action", cfg.action_names, ep.action.shape[1]),
        ):
            key = self.keys[part]
            names = list(names) if names else [f"{part}_{i}" for i in range(width)]
            self.features[key] = {"dtype": "float32", "shape": [width], "names": names}
        for name, dtype in [("is_success", "bool"), ("done", "bool"), ("timestamp", "float32")]:
            self.features[name] = {"dtype": dtype, "shape": [1], "names": None}
        self.flags = list(ep.flags)
        for name in self.flags:
            if name in self.features or name in INDEX_COLUMNS:
                raise RecapError(f"Episode.flags: {name!r} is already a column; rename the flag")
            self.features[name] = {"dtype": "bool", "shape": [1], "names": None}
        for name in INDEX_COLUMNS[1:]:
            self.features[name] = {"dtype": "int64", "shape": [1], "names": None}
        self.schema = self._schema()

    def _video_info(self, height: int, width: int) -> dict[str, Any]:
        cfg = self.cfg
        info: dict[str, Any] = {"video.height": height, "video.width": width}
        name, crf, preset = codec_settings(cfg.codec, cfg.crf, cfg.preset)
        info |= {"video.codec": name, "video.pix_fmt": "yuv420p"}
        if not self.v30:
            info["video.is_depth_map"] = False
        info |= {"video.fps": cfg.fps, "video.channels": 3, "has_audio": False}
        if self.v30:
            info |= {"video.g": cfg.gop, "video.crf": crf}
            info |= {"video.preset": preset, "video.fast_decode": 0}
            info |= {"video.video_backend": "pyav", "video.extra_options": {}}
            info["is_depth_map"] = False
        return info

    def _schema(self) -> pa.Schema:
        fields, hf = [], {}
        list_type = "List" if self.v30 else "Sequence"
        for key, feat in self.features.items():
            if feat["dtype"] == "video":
                continue
            if feat["dtype"] == "image":
                fields.append(
                    pa.field(key, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
                )
                hf[key] = {"_type": "Image"}
            elif key in (self.keys["state"], self.keys["action"]):
                fields.append(pa.field(key, pa.list_(pa.float32(), feat["shape"][0])))
                value = {"dtype": "float32", "_type": "Value"}
                hf[key] = {"feature": value, "length": feat["shape"][0], "_type": list_type}
            else:
                dtype = {"bool": pa.bool_(), "float32": pa.float32(), "int64": pa.int64()}
                fields.append(pa.field(key, dtype[feat["dtype"]]))
                hf[key] = {"dtype": feat["dtype"], "_type": "Value"}
        meta = {"huggingface": json.dumps({"info": {"features": hf}})}
        return pa.schema(fields, metadata=meta)

    # ---- per episode ----
    def add(self, ep: Episode) -> None:
        """Write one episode's frames (parquet rows, video frames) and record its metadata."""
        if not self.features:
            self._init_features(ep)
        if sorted(ep.flags) != sorted(self.flags):
            raise RecapError(
                f"episode {self.num_episodes}: Episode.flags {sorted(ep.flags)}; "
                f"every episode must have the first one's, {sorted(self.flags)}"
            )
        lengths = {len(ep.state), len(ep.action), *(len(v) for v in ep.images.values())}
        lengths |= {len(v) for v in ep.flags.values()}
        if sorted(ep.images) != sorted(self.cameras) or len(lengths) != 1 or not len(ep):
            raise RecapError(
                f"episode {self.num_episodes}: cameras {sorted(ep.images)} (expected "
                f"{self.cameras}) and state/action/image/flag lengths {sorted(lengths)} must agree"
            )
        ep_index, length = self.num_episodes, len(ep)
        task_index = self.tasks.setdefault(ep.task, len(self.tasks))
        table = self._frame_table(ep, ep_index, task_index)
        row: dict[str, Any] = {"episode_index": ep_index, "tasks": [ep.task], "length": length}
        if self.v30:
            row |= self._write_v30(ep, table)
        else:
            self._write_v21(ep, table, ep_index)
        self.episode_rows.append(row)
        self.episode_stats.append(self._stats(ep, table))
        self.num_episodes += 1
        self.num_frames += length
        self.num_successes += int(bool(ep.success))

    def _frame_table(self, ep: Episode, ep_index: int, task_index: int) -> pa.Table:
        length, cfg = len(ep), self.cfg
        frame_index = np.arange(length, dtype=np.int64)
        columns: dict[str, pa.Array] = {}
        if cfg.image_dtype == "image":
            sep = "-" if self.v30 else "_"
            paths = pa.array([f"frame{sep}{i:06d}.png" for i in range(length)], pa.string())
            for cam in self.cameras:
                data = pa.array([encode_png(img) for img in ep.images[cam]], pa.binary())
                columns[self.keys[cam]] = pa.StructArray.from_arrays(
                    [data, paths], ["bytes", "path"]
                )
        for part, values in (("state", ep.state), ("action", ep.action)):
            flat = pa.array(np.asarray(values, np.float32).reshape(-1))
            columns[self.keys[part]] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        columns["is_success"] = pa.array(np.full(length, bool(ep.success)))
        columns["done"] = pa.array(frame_index == length - 1)
        for name in self.flags:
            columns[name] = pa.array(np.asarray(ep.flags[name], dtype=bool).reshape(length))
        columns["timestamp"] = pa.array((frame_index / cfg.fps).astype(np.float32))
        columns["frame_index"] = pa.array(frame_index)
        columns["episode_index"] = pa.array(np.full(length, ep_index, np.int64))
        columns["index"] = pa.array(self.num_frames + frame_index)
        columns["task_index"] = pa.array(np.full(length, task_index, np.int64))
        return pa.table(columns, schema=self.schema)

    def _stats(self, ep: Episode, table: pa.Table) -> dict[str, dict[str, np.ndarray]]:
        camera_of = {self.keys[cam]: cam for cam in self.cameras}
        stats = {}
        for key in self.features:
            if key in camera_of:
                stats[key] = feature_stats(ep.images[camera_of[key]], True, self.v30)
                continue
            column = table.column(key).combine_chunks()
            if pa.types.is_fixed_size_list(column.type):
                values = column.flatten().to_numpy().reshape(len(column), -1)
            else:
                values = column.to_numpy(zero_copy_only=False)
            stats[key] = feature_stats(values, False, self.v30)
        return stats

    def _write_v21(self, ep: Episode, table: pa.Table, ep_index: int) -> None:
        chunk = ep_index // self.cfg.chunks_size
        path = self.root / V21_DATA_PATH.format(episode_chunk=chunk, episode_index=ep_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        if self.cfg.image_dtype == "video":
            for cam in self.cameras:
                rel = V21_VIDEO_PATH.format(
                    episode_chunk=chunk, video_key=self.keys[cam], episode_index=ep_index
                )
                with self._encoder(self.root / rel) as encoder:
                    encoder.add(ep.images[cam])

    def _encoder(self, path: Path) -> VideoEncoder:
        cfg = self.cfg
        return VideoEncoder(path, cfg.fps, cfg.codec, cfg.gop, cfg.crf, cfg.preset)

    def _write_v30(self, ep: Episode, table: pa.Table) -> dict[str, Any]:
        row = self._write_v30_data(table)
        start = self.num_frames
        if self.cfg.image_dtype == "video":
            for cam in self.cameras:
                key = self.keys[cam]
                if key not in self.videos:
                    rel = V30_VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
                    self.videos[key] = self._encoder(self.root / rel)
                self.videos[key].add(ep.images[cam])
                row |= {f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": 0}
                row[f"videos/{key}/from_timestamp"] = start / self.cfg.fps
                row[f"videos/{key}/to_timestamp"] = (start + len(ep)) / self.cfg.fps
        return row

    def _write_v30_data(self, table: pa.Table) -> dict[str, Any]:
        """Append ``table`` to the current data file(s), rotating at ``max_frames_per_file``."""
        limit, length, offset = self.cfg.max_frames_per_file, table.num_rows, 0
        start_file: tuple[int, int] | None = None
        while offset < length:
            if limit is not None and self.data_writer is not None:
                full = self.file_rows >= limit
                if full or (not self.cfg.split_episodes and self.file_rows + length > limit):
                    self._next_data_file()
            if self.data_writer is None:
                path = self.root / V30_DATA_PATH.format(
                    chunk_index=self.chunk, file_index=self.file
                )
                path.parent.mkdir(parents=True, exist_ok=True)
                self.data_writer = pq.ParquetWriter(path, self.schema)
            take = length - offset
            if limit is not None and self.cfg.split_episodes:
                take = min(take, limit - self.file_rows)
            self.data_writer.write_table(table.slice(offset, take))
            start_file = start_file or (self.chunk, self.file)
            offset, self.file_rows = offset + take, self.file_rows + take
        start = self.num_frames
        return {
            "data/chunk_index": start_file[0],
            "data/file_index": start_file[1],
            "dataset_from_index": start,
            "dataset_to_index": start + length,
        }

    def _next_data_file(self) -> None:
        self.data_writer.close()
        self.data_writer, self.file_rows = None, 0
        self.file += 1
        if self.file == self.cfg.chunks_size:
            self.chunk, self.file = self.chunk + 1, 0

    # ---- metadata ----
    def finish(self) -> None:
        """Close open files and write ``meta/``."""
        if self.data_writer is not None:
            self.data_writer.close()
        for encoder in self.videos.values():
            encoder.close()
        tasks = [{"task_index": i, "task": t} for t, i in self.tasks.items()]
        if self.v30:
            self._finish_v30(tasks)
        else:
            _jsonl_dump(tasks, self.root / "meta/tasks.jsonl")
            _jsonl_dump(self.episode_rows, self.root / "meta/episodes.jsonl")
            stats_rows = [
                {"episode_index": i, "stats": stats_to_json(s, floats=False)}
                for i, s in enumerate(self.episode_stats)
            ]
            _jsonl_dump(stats_rows, self.root / "meta/episodes_stats.jsonl")
        _json_dump(self._info(), self.root / "meta/info.json")

    def _finish_v30(self, tasks: list[dict[str, Any]]) -> None:
        meta = self.root / "meta"
        rows = []
        for row, stats in zip(self.episode_rows, self.episode_stats, strict=True):
            row = dict(row)
            for key, per_stat in stats_to_json(stats, floats=True).items():
                row |= {f"stats/{key}/{name}": value for name, value in per_stat.items()}
            row |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
            rows.append(row)
        (meta / "episodes/chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), self.root / V30_EPISODES_PATH)
        pq.write_table(_tasks_table(tasks), meta / "tasks.parquet")
        aggregated = aggregate_stats(self.episode_stats)
        _json_dump(stats_to_json(aggregated, floats=True), meta / "stats.json")

    def _info(self) -> dict[str, Any]:
        cfg, n = self.cfg, self.num_episodes
        video = cfg.image_dtype == "video"
        common = {"total_episodes": n, "total_frames": self.num_frames}
        common["total_tasks"] = len(self.tasks)
        if self.v30:
            info: dict[str, Any] = {"codebase_version": V30, "fps": cfg.fps}
            info |= {"features": self.features} | common
            info |= {"chunks_size": cfg.chunks_size, "data_files_size_in_mb": 100}
            info |= {"video_files_size_in_mb": 200, "data_path": V30_DATA_PATH}
            info |= {"video_path": V30_VIDEO_PATH if video else None}
            return info | {"robot_type": cfg.robot_type, "splits": {"train": f"0:{n}"}}
        info = {"codebase_version": V21, "robot_type": cfg.robot_type} | common
        info["total_videos"] = n * len(self.cameras) if video else 0
        info["total_chunks"] = (n + cfg.chunks_size - 1) // cfg.chunks_size
        info |= {"chunks_size": cfg.chunks_size, "fps": cfg.fps, "splits": {"train": f"0:{n}"}}
        info |= {"data_path": V21_DATA_PATH, "video_path": V21_VIDEO_PATH if video else None}
        return info | {"features": self.features}


def _tasks_table(tasks: list[dict[str, Any]]) -> pa.Table:
    """``meta/tasks.parquet`` as LeRobot writes it: pandas metadata makes ``task`` the index."""
    table = pa.Table.from_pylist(
        tasks, schema=pa.schema([("task_index", pa.int64()), ("task", pa.string())])
    )
    columns = [
        {
            "name": name,
            "field_name": name,
            "pandas_type": ptype,
            "numpy_type": ntype,
            "metadata": None,
        }
        for name, ptype, ntype in (("task_index", "int64", "int64"), ("task", "unicode", "object"))
    ]
    pandas = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": columns,
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.3.3",
    }
    return table.replace_schema_metadata({"pandas": json.dumps(pandas)})
