"""Frame decoding with PyAV: PNG bytes from parquet and mp4 (AV1 / H.264) random access.

Decoded frames are converted to RGB as ``frame.to_ndarray(format="rgb24")`` does: the same
conversion LeRobot's pyav backend uses, so frames equal what LeRobot's reader returns, bit for bit.
One ``VideoReformatter`` per process does it: a frame's own reformatter builds a new swscale
context for every frame of a freshly opened file, which cost 4x the conversion itself.

Video random access keeps each file's container open (a small LRU in ``VideoCache``). To reach a
frame it seeks to the keyframe at or before the target and decodes forward; a request for a later
frame of the same file continues decoding without seeking unless a keyframe lies in between.
Frames are matched by presentation time within half a frame period.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from pathlib import Path

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from recap.errors import DatasetError, located

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_MAGIC = b"\xff\xd8"
_REFORMATTER: tuple[int, VideoReformatter] | None = None  # (pid, it): not shared over fork


def rgb24(frame: av.VideoFrame) -> np.ndarray:
    """uint8[H, W, 3] of a decoded frame, as ``frame.to_ndarray(format="rgb24")``."""
    global _REFORMATTER
    if _REFORMATTER is None or _REFORMATTER[0] != os.getpid():
        _REFORMATTER = (os.getpid(), VideoReformatter())
    return _REFORMATTER[1].reformat(frame, format="rgb24").to_ndarray()


def decode_image(data: bytes, where: str) -> np.ndarray:
    """uint8[H, W, 3] RGB pixels of one encoded image (PNG, or JPEG) stored in a parquet cell.

    A fresh decoder per image: FFmpeg's PNG decoder keeps state across packets, so reusing one
    context returns wrong pixels for every image after the first.
    """
    codec = "png" if data[:8] == _PNG_MAGIC else "mjpeg" if data[:2] == _JPEG_MAGIC else None
    if codec is None:
        raise DatasetError(
            located(where, "image bytes are neither PNG nor JPEG; re-export the dataset")
        )
    try:
        frames = av.CodecContext.create(codec, "r").decode(av.Packet(data))
    except av.FFmpegError as exc:
        raise DatasetError(
            located(where, f"cannot decode {codec} image ({exc}); re-export the dataset")
        ) from exc
    if not frames:
        raise DatasetError(located(where, f"empty {codec} image; re-export the dataset"))
    return rgb24(frames[0])


class VideoFile:
    """One open mp4 with a forward-decoding cursor; ``frame_at(t)`` returns uint8[H, W, 3]."""

    def __init__(self, path: Path, tolerance_s: float):
        if not path.is_file():
            raise DatasetError(
                located(path, "video file not found; restore it from the source dataset")
            )
        try:
            self.container = av.open(str(path), mode="r")
            self.stream = self.container.streams.video[0]
            # One thread: random access decodes 1-2 frames after each seek, where frame threads
            # only add latency; parallelism comes from DataLoader workers, one decoder each.
            self.stream.codec_context.thread_count = 1
        except (av.FFmpegError, IndexError) as exc:
            raise DatasetError(
                located(path, f"cannot open video ({exc}); restore it from the source dataset")
            ) from exc
        self.path = path
        self.tolerance_s = tolerance_s
        self.time_base = float(self.stream.time_base)
        self._keyframes = _keyframe_pts(self.stream)  # decode timestamps, in time_base units
        self.seeks = 0  # number of seeks so far (sequential access should not add any)
        self._frames = None  # decode iterator; yields the frames after self._cur
        self._cur = None  # last decoded frame (an av.VideoFrame) and its time in seconds
        self._cur_time = -math.inf
        self._cur_rgb: np.ndarray | None = None

    def frame_at(self, t: float) -> np.ndarray:
        """The frame whose presentation time is within ``tolerance_s`` of ``t`` seconds."""
        lo, hi = t - self.tolerance_s, t + self.tolerance_s
        try:
            if self._must_seek(lo, hi):
                self._seek(lo, hi)
            while self._cur_time < lo and self._advance():
                pass
            if not lo <= self._cur_time <= hi:
                raise self._missing(t)
            if self._cur_rgb is None:
                self._cur_rgb = rgb24(self._cur)
        except (av.FFmpegError, ValueError, RuntimeError) as exc:
            if isinstance(exc, DatasetError):
                raise
            self._frames, self._cur, self._cur_time = None, None, -math.inf  # seek next time
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DatasetError(
                located(
                    self.path,
                    f"cannot decode the frame at timestamp {t:.4f}s ({reason}); the video is "
                    "truncated or corrupt, restore it from the source dataset",
                )
            ) from exc
        return self._cur_rgb

    def _advance(self) -> bool:
        """Decode the next frame into the cursor; False at the end of the stream."""
        for frame in self._frames:
            if frame.pts is not None:
                self._cur, self._cur_time, self._cur_rgb = frame, frame.pts * self.time_base, None
                return True
        self._frames = None
        return False

    def _seek(self, lo: float, hi: float) -> None:
        """Put the cursor on a keyframe presented at or before the target window [lo, hi].

        FFmpeg seeks (and mp4 indexes) by decode time; with B-frames a keyframe is presented
        after frames decoded before it, so a seek can land past the target: then step back one
        keyframe and retry.
        """
        target = math.floor(hi / self.time_base)  # the target itself when it is a keyframe
        floor = self.stream.start_time or 0
        for _ in range(64):
            self.container.seek(target, stream=self.stream, backward=True, any_frame=False)
            self.seeks += 1
            self._frames = self.container.decode(self.stream)
            self._cur, self._cur_time, self._cur_rgb = None, -math.inf, None
            if not self._advance() or self._cur_time <= hi:
                return
            if self._keyframes.size:
                k = np.searchsorted(self._keyframes, target, side="right") - 1
                if k < 1:
                    return
                target = int(self._keyframes[k - 1])
            else:
                if target <= floor:
                    return
                target = max(floor, target - 2 * (self._cur.pts - target) - 1)

    def _missing(self, t: float) -> DatasetError:
        return DatasetError(
            located(
                self.path,
                f"no frame at timestamp {t:.4f}s (tolerance {self.tolerance_s:.4f}s); the video "
                "does not match the parquet timestamps, re-encode it or restore the dataset",
            )
        )

    def _must_seek(self, lo: float, hi: float) -> bool:
        """Seek unless the cursor is on the target, or before it with no keyframe between the
        cursor's next frame and the target (decoding forward is then as cheap as it gets)."""
        if self._cur is not None and lo <= self._cur_time <= lo + 2 * self.tolerance_s:
            return False
        if self._frames is None or self._cur_time > lo:
            return True
        if self._keyframes.size:
            k = np.searchsorted(self._keyframes, hi / self.time_base, side="right") - 1
            # seek only when it skips frames: a keyframe more than one frame past the cursor
            next_frame = self._cur_time + 3 * self.tolerance_s
            return k >= 0 and self._keyframes[k] * self.time_base > next_frame
        return lo - self._cur_time > 32 * self.tolerance_s  # no index: seek if ~16 frames ahead

    def close(self) -> None:
        self._frames = None
        self.container.close()


def _keyframe_pts(stream) -> np.ndarray:
    """Sorted keyframe timestamps (decode time) from the container index (free for mp4)."""
    entries = getattr(stream, "index_entries", None)
    if not entries:
        return np.empty(0, dtype=np.int64)
    pts = np.array([e.timestamp for e in entries if e.is_keyframe], dtype=np.int64)
    return np.sort(pts)


class VideoCache:
    """LRU of open ``VideoFile``s; safe across ``fork`` (a child process reopens its own)."""

    def __init__(self, max_open: int = 16):
        self.max_open = max_open
        self._files: OrderedDict[tuple[Path, float], VideoFile] = OrderedDict()
        self._pid = os.getpid()

    def get(self, path: Path, tolerance_s: float) -> VideoFile:
        if self._pid != os.getpid():  # inherited from a parent: never share FFmpeg state
            self._files = OrderedDict()
            self._pid = os.getpid()
        key = (path, tolerance_s)
        video = self._files.get(key)
        if video is None:
            video = self._files[key] = VideoFile(path, tolerance_s)
            while len(self._files) > self.max_open:
                self._files.popitem(last=False)[1].close()
        self._files.move_to_end(key)
        return video

    def close(self) -> None:
        if self._pid == os.getpid():
            for video in self._files.values():
                video.close()
        self._files = OrderedDict()

    def __len__(self) -> int:
        return len(self._files)
