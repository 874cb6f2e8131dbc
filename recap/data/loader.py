"""Training-frame loading: camera frames + state + action chunks of a LeRobot dataset, batched.

Video-heavy training is input-bound, so the loader is built around how frames are decoded:

- Each DataLoader worker owns its ``LocalDataset`` (the parent's is pickled without decoders), and
  its decoders stay open across batches: no file or decoder is reopened per item.
- A batch is fetched at once (``__getitems__``): per camera, one ``LocalDataset.frames`` call that
  sorts the batch's frames by file and time, seeks to the keyframe at or before each target and
  decodes forward only to it (single-threaded decoders; workers give the parallelism).
- Frames stay uint8 (``uint8[B, H, W, 3]`` tensors) until the model's transforms need floats.
- The DataLoader is the engine's one loader (``recap.engine.loader``: ``batch_loader``, and
  ``make_loader`` for shuffled or in-order passes over a ``FrameDataset``); in-order passes give
  each worker its own contiguous block of rows, so every frame is decoded once, with no seeks.

Per-row columns (state, action, indices) are read once, vectorized, when the dataset is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import Dataset

from recap.core import columns as C
from recap.data.lerobot import KeyMap, LocalDataset, detect_key_map
from recap.errors import DatasetError, located


def fixed_width(column: pa.ChunkedArray, where: object, name: str) -> np.ndarray:
    """float32[n, D] from a list / fixed-size-list column (or float32[n, 1] from a scalar one)."""
    n = len(column)
    if not (pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type)):
        return column.to_numpy().astype(np.float32).reshape(n, 1)
    flat = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.float32)
    if n and flat.size % n:
        raise DatasetError(located(where, f"column {name!r}: rows have different lengths"))
    return flat.reshape(n, flat.size // n if n else 0)


class FrameError(DatasetError):
    """A frame that cannot be read (truncated or short video, missing camera file, bad image),
    raised by ``FrameDataset``. It keeps its one line across a DataLoader worker: torch re-raises
    a worker's exception in the main process as ``type(exc)(text)`` where ``text`` is the
    worker's formatted traceback, whose last line is ``module.FrameError: <the line>``."""

    def __init__(self, message: str):
        text = str(message)
        if "Original Traceback" in text:  # rebuilt by torch from a worker's traceback
            lines = [line for line in text.splitlines() if line.strip()]
            text = lines[-1].partition(": ")[2] or lines[-1]
        super().__init__(text)


def pass_through(batch: dict) -> dict:
    """Collate function for datasets whose ``__getitems__`` already returns a batch."""
    return batch


class FrameDataset(Dataset):
    """Items of one LeRobot dataset for training: frames, state, action chunk, extra columns.

    Args:
        root: the dataset directory.
        key_map: camera/state/action keys; detected from ``meta/info.json`` when None.
        action_horizon: H future actions per item (t .. t+H-1, within the episode; past its end
            the last action repeats and ``action_mask`` is False).
        extra: per-row arrays (in the dataset's row order) added to every batch, e.g. targets.
        rows: the rows this dataset serves (default: all), e.g. a split.
    A batch (``__getitems__``) is a dict of tensors: ``images`` {camera: uint8[B, H, W, 3]},
    ``state`` float32[B, S], ``action`` float32[B, H, A], ``action_mask`` bool[B, H],
    ``episode_index`` / ``frame_index`` / ``task_index`` / ``row`` int64[B], and each extra.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        key_map: KeyMap | None = None,
        action_horizon: int = 1,
        extra: Mapping[str, np.ndarray] | None = None,
        rows: np.ndarray | None = None,
    ):
        self.dataset = LocalDataset(root)
        self.key_map = key_map or detect_key_map(self.dataset.features, self.dataset.root)
        self._check_cameras()
        km, ds = self.key_map, self.dataset
        table = ds.read_columns(
            [C.EPISODE_INDEX, C.FRAME_INDEX, C.TASK_INDEX, km.state, km.action], check_frames=False
        )
        episodes = ds.check_frames(table)
        self.columns = {
            C.EPISODE_INDEX: table.column(C.EPISODE_INDEX).to_numpy().astype(np.int64),
            C.FRAME_INDEX: table.column(C.FRAME_INDEX).to_numpy().astype(np.int64),
            C.TASK_INDEX: table.column(C.TASK_INDEX).to_numpy().astype(np.int64),
            "state": fixed_width(table.column(km.state), ds.root, km.state),
        }
        action = fixed_width(table.column(km.action), ds.root, km.action)
        self._chunk_rows, self._chunk_mask = action_chunks(episodes, action_horizon)
        self._action = action
        for name, values in (extra or {}).items():
            values = np.asarray(values)
            if values.shape[0] != ds.num_frames:
                raise DatasetError(
                    f"extra column {name!r}: {values.shape[0]} rows for {ds.num_frames} frames"
                )
            self.columns[name] = values
        self.rows = np.arange(ds.num_frames, dtype=np.int64) if rows is None else np.asarray(rows)

    def _check_cameras(self) -> None:
        missing = [c for c in self.key_map.cameras if c and c not in self.dataset.camera_keys]
        if missing:
            raise DatasetError(
                located(
                    self.dataset.root / "meta" / "info.json",
                    f"features: camera {missing[0]!r} not in the dataset (cameras: "
                    f'{", ".join(self.dataset.camera_keys) or "none"}); fix "cameras" in the '
                    "dataset's gin entry",
                )
            )

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def __getitems__(self, indices: Sequence[int]) -> dict:
        rows = self.rows[np.asarray(indices, dtype=np.int64)]
        try:
            images = {cam: self.dataset.frames(cam, rows) for cam in self.key_map.cameras if cam}
        except DatasetError as exc:  # one line, also from a DataLoader worker
            raise FrameError(exc.message) from None
        batch = {
            "images": {cam: torch.from_numpy(v) for cam, v in images.items()},
            "action": torch.from_numpy(self._action[self._chunk_rows[rows]]),
            "action_mask": torch.from_numpy(self._chunk_mask[rows]),
            "row": torch.from_numpy(rows),
        }
        for name, values in self.columns.items():
            batch[name] = torch.from_numpy(np.ascontiguousarray(values[rows]))
        return batch

    collate = staticmethod(pass_through)  # __getitems__ already returns a batch

    def __getitem__(self, index: int) -> dict:
        batch = self.__getitems__([index])
        return {
            k: ({c: v[0] for c, v in b.items()} if k == "images" else b[0])
            for k, b in batch.items()
        }

    def close(self) -> None:
        self.dataset.close()


def action_chunks(episodes, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of each row's next ``horizon`` actions, clipped to its episode, and their validity.

    Returns int64[n, H] rows (in the dataset's row order) and bool[n, H] mask (False past the
    episode's end, where the episode's last row repeats).
    """
    if horizon < 1:
        raise DatasetError(f"action_horizon: {horizon} must be >= 1")
    pos = np.arange(episodes.num_frames, dtype=np.int64)[:, None] + np.arange(horizon)[None, :]
    end = episodes.end_of[:, None]
    mask_sorted = pos < end
    rows_sorted = episodes.order[np.minimum(pos, end - 1)]
    rows = np.empty_like(rows_sorted)
    mask = np.empty_like(mask_sorted)
    rows[episodes.order] = rows_sorted
    mask[episodes.order] = mask_sorted
    return rows, mask
