"""``recap-serve --record DIR``: every connection's episode written as a LeRobot v3.0 dataset.

Each finished episode becomes one complete LeRobot v3.0 dataset ``DIR/episode_NNNNNN`` (one
episode; cameras as mp4, the writer's ``recap.data.lerobot_writer``), written under
``DIR/.staging`` and renamed into place, so a reader never sees half an episode and a kill -9 of
the server loses only the episodes in progress. A restart with the same ``DIR`` appends (the next
number after the highest there) and clears the staging leftovers; ``DIR/.lock`` keeps a second
server out. The names are the server's own: nothing a client sends becomes a path.
``recorded_episodes(DIR)`` lists the finished episodes (the datasets recap's readers and
``recap-iterate`` take).

A frame per request, as the client sent it: each camera of ``ServeSpec.image_keys`` (uint8
[H, W, 3], channels-first turned to channels-last; the camera is the key's last part, ``image``,
``wrist_image``), the state (``state_key``, float32), the prompt (the episode's task: its first
frame's), and as the frame's action the first action of the chunk the server replied. Optional
request keys (stock openpi clients never send them; a server that does not record ignores them,
as it ignores any unknown key):

- ``intervention: True`` with ``action: float[A]``: a human controlled this step; ``action`` (what
  was executed) is the frame's action and the frame's ``is_correction`` is true;
- ``executed_action: float[A]``: the action actually executed after the previous request (it
  replaces that frame's action, e.g. a client executing a later row of the chunk);
- ``episode_end: True`` (with ``success``: bool, optional ``executed_action``): ends the episode;
  this request carries no observation and gets ``{"episode_end": True, "episode": NAME or None,
  "frames": N}`` instead of actions. The next request starts a new episode.

An episode whose connection closes without ``episode_end`` is written too, with success false
(``meta/recap_record.json`` says ``"outcome": "not reported"``). Beside each dataset,
``meta/recap_chunks.npy`` holds every frame's replied chunk (float32[T, H, A]) and
``meta/recap_record.json`` the policy served and the outcome.

Caps: an episode longer than ``max_frames``, or one that would take the directory past
``max_bytes`` (raw frames in memory count against it too), is dropped with one log line; the
connection keeps being served (its frames are not recorded until ``episode_end``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recap.core.thresholds import IS_CORRECTION
from recap.data.lerobot_writer import V30, Episode, WriterConfig, write_lerobot_dataset
from recap.errors import RecapError
from recap.serve.wire import lookup as _lookup

log = logging.getLogger("recap.serve")

GIB = 2**30
EPISODE_END, SUCCESS, INTERVENTION = "episode_end", "success", "intervention"
ACTION, EXECUTED = "action", "executed_action"
RECORD_KEYS = (EPISODE_END, SUCCESS, INTERVENTION, ACTION, EXECUTED)
EPISODE_NAME = re.compile(r"^episode_(\d{6,})$")
STAGING, LOCK = ".staging", ".lock"
CHUNKS_FILE, RECORD_FILE = "recap_chunks.npy", "recap_record.json"


class RecordError(ValueError):
    """A recording key the server refuses; ``str()`` starts with the key."""


def recorded_episodes(root: str | os.PathLike) -> list[Path]:
    """The finished episode datasets under ``root``, in episode order."""
    root = Path(root)
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := EPISODE_NAME.match(p.name))]
    return [p for _, p in sorted(found) if (p / "meta" / "info.json").is_file()]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def flag(obs: dict, key: str) -> bool:
    value = obs.get(key)
    if value is None:
        return False
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, bool):
        raise RecordError(f"{key}: expected true or false, got {type(value).__name__}")
    return value


def _action(obs: dict, key: str, dim: int) -> np.ndarray:
    value = obs.get(key)
    if (
        not isinstance(value, np.ndarray)
        or value.dtype.kind not in "fiu"
        or value.shape != (dim,)
        or not np.isfinite(value).all()
    ):
        shown = f"{value.dtype} {list(value.shape)}" if isinstance(value, np.ndarray) else (
            "nothing" if value is None else type(value).__name__)  # fmt: skip
        raise RecordError(f"{key}: expected finite float[{dim}], got {shown}")
    return value.astype(np.float32)


@dataclass
class RecordConfig:
    """Where and how much to record (``recap-serve --record DIR --record-max-gib G
    --record-max-frames N --record-fps F``)."""

    root: Path
    max_bytes: int = 10 * GIB
    max_frames: int = 5000
    fps: int = 10
    codec: str = "libx264"
    preset: str = "veryfast"  # the encoder runs beside the model: cheap, crf 18 all the same
    robot_type: str = "recap-serve"


@dataclass
class EpisodeBuffer:
    """One connection's episode in progress (frames as sent, in memory)."""

    recorder: Recorder
    peer: str
    images: dict[str, list[np.ndarray]] = field(default_factory=dict)
    state: list[np.ndarray] = field(default_factory=list)
    action: list[np.ndarray] = field(default_factory=list)
    chunks: list[np.ndarray] = field(default_factory=list)
    correction: list[bool] = field(default_factory=list)
    task: str | None = None
    raw_bytes: int = 0
    dropped: str | None = None  # why the episode is no longer recorded

    def __len__(self) -> int:
        return len(self.state)

    def check(self, obs: dict, action_dim: int) -> None:
        """Validate the recording keys of one decoded request (``RecordError``)."""
        flag(obs, EPISODE_END)
        flag(obs, SUCCESS)
        if flag(obs, INTERVENTION):
            _action(obs, ACTION, action_dim)
        if obs.get(EXECUTED) is not None:
            _action(obs, EXECUTED, action_dim)

    def add(self, obs: dict, chunk: np.ndarray) -> None:
        """Record one answered request (checked by ``check``); a frame that breaks a cap drops
        the episode with one log line."""
        if self.dropped is not None:
            return
        spec, recorder = self.recorder.spec, self.recorder
        if obs.get(EXECUTED) is not None and self.action:
            self.action[-1] = _action(obs, EXECUTED, chunk.shape[-1])
        if len(self) >= recorder.config.max_frames:
            return self.drop(f"more than {recorder.config.max_frames} frames (--record-max-frames)")
        state = _lookup(obs, spec.state_key)
        if not isinstance(state, np.ndarray) or state.ndim != 1:
            return self.drop(f"{spec.state_key} missing: nothing to record as the state")
        frame = {}
        for key in spec.image_keys:
            image = _lookup(obs, key)
            if image.shape[-1] != 3 and image.shape[0] == 3:
                image = image.transpose(1, 2, 0)
            frame[key.rsplit("/", 1)[-1]] = np.ascontiguousarray(image)
        if self.state:
            first = {c: v[0].shape for c, v in self.images.items()}
            now = {c: v.shape for c, v in frame.items()}
            if first != now or state.shape != self.state[0].shape:
                return self.drop("a camera or the state changed shape within the episode")
        size = sum(v.nbytes for v in frame.values()) + state.nbytes + chunk.nbytes
        if not recorder.reserve(size):
            return self.drop(
                f"the recording would exceed {recorder.config.max_bytes / GIB:g} GiB "
                "(--record-max-gib)"
            )
        self.raw_bytes += size
        for camera, image in frame.items():
            self.images.setdefault(camera, []).append(image)
        self.state.append(state.astype(np.float32))
        self.chunks.append(np.asarray(chunk, np.float32))
        intervention = flag(obs, INTERVENTION)
        self.action.append(
            _action(obs, ACTION, chunk.shape[-1]) if intervention else self.chunks[-1][0].copy()
        )
        self.correction.append(intervention)
        if self.task is None:
            self.task = str(_lookup(obs, spec.prompt_key))

    def drop(self, why: str) -> None:
        log.warning("recording: episode of %s dropped after %d frames: %s; serving goes on",
                    self.peer, len(self), why)  # fmt: skip
        self.dropped = why
        self._free()

    def _free(self) -> None:
        self.recorder.release(self.raw_bytes)
        self.raw_bytes = 0
        self.images, self.state, self.action, self.chunks, self.correction = {}, [], [], [], []

    def end(self, success: bool | None, executed: np.ndarray | None = None) -> str | None:
        """Write the episode (blocking: call in a worker thread); its name, or None when
        nothing was written (empty or dropped)."""
        if executed is not None and self.action and self.dropped is None:
            self.action[-1] = executed
        try:
            if self.dropped is not None or not self.state:
                return None
            episode = Episode(
                images={c: np.stack(v) for c, v in self.images.items()},
                state=np.stack(self.state),
                action=np.stack(self.action),
                task=self.task or "",
                success=bool(success),
                flags={IS_CORRECTION: np.array(self.correction, dtype=bool)},
            )
            record = {"outcome": "not reported" if success is None else "reported",
                      "success": bool(success), "frames": len(self),
                      "corrections": int(sum(self.correction))}  # fmt: skip
            return self.recorder.write(episode, np.stack(self.chunks), record)
        except Exception as exc:  # the recording never takes the server down
            log.warning("recording: episode of %s dropped after %d frames: %s: %s", self.peer,
                        len(self), type(exc).__name__, exc)  # fmt: skip
            return None
        finally:
            self._free()
            self.dropped = None
            self.task = None


def check_free(root: str | Path) -> None:
    """One line when ``root`` is not a directory or another server records into it (its lock
    is held): ``recap-serve`` asks before the model loads. Creates nothing."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise RecapError(f"--record: {root} is not a directory; pass a directory")
    if not (root / LOCK).is_file():
        return
    with open(root / LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RecapError(f"--record: {root} is being recorded into by another recap-serve "
                             f"({root / LOCK}); pass another directory") from None  # fmt: skip
        fcntl.flock(handle, fcntl.LOCK_UN)


class Recorder:
    """The recording directory of one server (see the module docstring)."""

    def __init__(self, config: RecordConfig, spec, info: dict | None = None):
        self.config, self.spec, self.info = config, spec, dict(info or {})
        root = Path(config.root)
        if root.exists() and not root.is_dir():
            raise RecapError(f"--record: {root} is not a directory; pass a directory")
        root.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(root / LOCK, "a")  # noqa: SIM115  (held while serving)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise RecapError(f"--record: {root} is being recorded into by another recap-serve "
                             f"({root / LOCK}); pass another directory") from None  # fmt: skip
        shutil.rmtree(root / STAGING, ignore_errors=True)  # episodes a kill left unfinished
        self.root = root
        existing = [int(m.group(1)) for p in root.iterdir() if (m := EPISODE_NAME.match(p.name))]
        self._next = max(existing, default=-1) + 1
        self._used = _size(root)
        self._mutex = threading.Lock()
        self.written: list[str] = []
        log.info("recording into %s: %d episodes there, %.3f GiB of %g GiB", root,
                 len(existing), self._used / GIB, config.max_bytes / GIB)  # fmt: skip

    @staticmethod
    def lower_priority() -> None:
        """Run the calling (writer) thread at nice 10, so encoding yields the CPU to the model
        (Linux: a thread's priority is its own)."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):  # not Linux, or not permitted: same priority
            pass

    def start(self, peer: str) -> EpisodeBuffer:
        return EpisodeBuffer(self, peer)

    def reserve(self, size: int) -> bool:
        with self._mutex:
            if self._used + size > self.config.max_bytes:
                return False
            self._used += size
            return True

    def release(self, size: int) -> None:
        with self._mutex:
            self._used -= size

    def write(self, episode: Episode, chunks: np.ndarray, record: dict) -> str:
        with self._mutex:
            index = self._next
            self._next += 1
        name = f"episode_{index:06d}"
        staged = self.root / STAGING / name
        writer = WriterConfig(V30, "lerobot", "video", self.config.fps, codec=self.config.codec,
                              preset=self.config.preset,
                              robot_type=self.config.robot_type)  # fmt: skip
        write_lerobot_dataset(staged, [episode], writer, overwrite=True)
        np.save(staged / "meta" / CHUNKS_FILE, chunks)
        record = {"episode": name, **record, "server": self.info}
        (staged / "meta" / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
        os.replace(staged, self.root / name)
        size = _size(self.root / name)
        with self._mutex:
            self._used += size
        self.written.append(name)
        log.info("recorded %s: %d frames, %d corrections, success %s", name, len(episode),
                 record["corrections"], record["success"])  # fmt: skip
        return name

    def close(self) -> None:
        self._lock_file.close()
