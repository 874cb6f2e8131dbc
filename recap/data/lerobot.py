"""Offline reader of local LeRobot datasets (codebase v2.0, v2.1, v3.0) with pyarrow and PyAV.

Nothing here imports ``lerobot`` or ``huggingface_hub`` or opens a socket: every path is a local
file under the dataset root, and nothing is ever written there.

Layouts (``meta/info.json`` gives the ``data_path`` / ``video_path`` templates):

- v2.x: ``data/chunk-XXX/episode_XXXXXX.parquet``, ``meta/episodes.jsonl``, ``meta/tasks.jsonl``,
  ``videos/chunk-XXX/<key>/episode_XXXXXX.mp4`` (a frame sits at its ``timestamp``).
- v3.0: ``data/chunk-XXX/file-XXX.parquet``, ``meta/episodes/chunk-XXX/file-XXX.parquet``,
  ``meta/tasks.parquet``, ``videos/<key>/chunk-XXX/file-XXX.mp4`` holding many episodes (a frame
  sits at the episode's ``videos/<key>/from_timestamp`` + its ``timestamp``).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from recap import logs
from recap.core import columns as C
from recap.core.columns import ColumnValueError, as_flags, as_index
from recap.core.episodes import Episodes, FrameIndexError, find_episodes
from recap.data.specs import SLOT_ROLES, DatasetSpec
from recap.data.video import VideoCache, decode_image
from recap.errors import DatasetError, located
from recap.processing.cameras import NUM_CAMERAS, is_wrist, slot_order

log = logs.get(__name__)

SUPPORTED_VERSIONS = ("v2.0", "v2.1", "v3.0")
CAMERA_DTYPES = ("image", "video")
_V2_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
_V3_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"


@dataclass(frozen=True)
class KeyMap:
    """Feature keys: cameras in slot order (base, left wrist, right wrist; ``""`` leaves a slot
    empty), state, action."""

    cameras: tuple[str, ...]
    state: str
    action: str


STATE_KEYS = ("observation.state", "state")  # detected state keys, in preference order
ACTION_KEYS = ("action", "actions")
LIBERO_KEYS = KeyMap(cameras=("image", "wrist_image"), state="state", action="actions")
LEROBOT_KEYS = KeyMap(
    cameras=("observation.images.image", "observation.images.wrist_image"),
    state="observation.state",
    action="action",
)


def detect_key_map(features: Mapping[str, dict], where: object = "meta/info.json") -> KeyMap:
    """The key map of an info.json ``features`` dict: a known style, else guessed from dtypes.

    Guessing orders cameras base first, then wrist cameras (left before right), keeping info.json
    order otherwise; the state is ``observation.state`` or ``state``, the action ``action`` or
    ``actions``.
    """
    for known in (LEROBOT_KEYS, LIBERO_KEYS):
        if all(k in features for k in (*known.cameras, known.state, known.action)):
            return known
    cams = [k for k, f in features.items() if f.get("dtype") in CAMERA_DTYPES]
    cams = slot_order(cams)  # the one camera rule (recap.processing.transforms)
    state = next((k for k in STATE_KEYS if k in features), None)
    action = next((k for k in ACTION_KEYS if k in features), None)
    if not cams or state is None or action is None:
        raise DatasetError(
            located(
                where,
                "features: cannot detect camera/state/action keys (need image or video features, "
                "'observation.state' or 'state', 'action' or 'actions'; found "
                f"{', '.join(features)}); name them in the dataset's gin entry "
                '("cameras", "state_key", "action_key")',
            )
        )
    return KeyMap(cameras=tuple(cams), state=state, action=action)


MAX_DIM = 32  # π0.5's padded state/action width (openpi's action_dim)
_SHOWN: set[tuple] = set()  # key maps already printed by this process (once per dataset)


def feature_dims(features: Mapping[str, dict], key: str) -> int:
    """The flat size of feature ``key`` (the product of its info.json ``shape``)."""
    return int(np.prod(features[key].get("shape") or [1]))


def spec_key_map(
    spec: DatasetSpec,
    info: Mapping | None = None,
    max_dim: int | None = None,
    slots: int = NUM_CAMERAS,
    show: bool = True,
) -> KeyMap:
    """The key map of dataset entry ``spec``: its ``cameras`` / ``state_key`` / ``action_key``
    where bound, detected (``detect_key_map``) otherwise. One-line ``DatasetError`` for a key the
    dataset lacks (listing its keys), more cameras than ``slots`` (naming them and the binding
    that picks three) and, with ``max_dim``, a state or action wider than it. ``show``: print the
    chosen map with its slot roles, once per dataset and process (rank 0)."""
    info_path = Path(spec.root) / "meta" / "info.json"
    if info is None:
        info = LocalDataset(spec.root).info
    features: dict = info.get("features") or {}
    binding = spec.binding or f"the entry of dataset {spec.name!r}"
    bound = {"cameras": spec.cameras is not None, "state": spec.state_key is not None,
             "action": spec.action_key is not None}  # fmt: skip
    for field, key in (("state_key", spec.state_key), ("action_key", spec.action_key),
                       *(("cameras", c) for c in spec.cameras or () if c)):  # fmt: skip
        if key is not None and key not in features:
            raise DatasetError(
                located(
                    info_path,
                    f"{field} {key!r} ({binding}) is not a feature "
                    f"of this dataset; its keys: {', '.join(features)}",
                )
            )
    for key in spec.cameras or ():
        if key and features[key].get("dtype") not in CAMERA_DTYPES:
            raise DatasetError(
                located(
                    info_path,
                    f"cameras {key!r} ({binding}) is a "
                    f"{features[key].get('dtype')} feature, not a camera; "
                    f"its cameras: {', '.join(_cameras(features)) or 'none'}",
                )
            )
    try:
        detected = detect_key_map(features, info_path)
    except DatasetError:
        detected = None
    cams = tuple(spec.cameras) if bound["cameras"] else (
        detected.cameras if detected else tuple(slot_order(_cameras(features))))  # fmt: skip
    state = spec.state_key or (detected.state if detected else _first(features, STATE_KEYS))
    action = spec.action_key or (detected.action if detected else _first(features, ACTION_KEYS))
    if not cams or state is None or action is None:
        detect_key_map(features, info_path)  # its one-line error names what is missing
    key_map = KeyMap(cams, state, action)
    if len(key_map.cameras) > slots:
        cams = key_map.cameras
        bases = [c for c in cams if not is_wrist(c)]
        wrists = [c for c in cams if is_wrist(c)]
        pick = list(dict.fromkeys([*bases[:1], *wrists[:2], *cams]))[:slots]
        example = ", ".join(f'"{c}"' for c in pick)
        raise DatasetError(located(info_path, f"{len(cams)} cameras ({', '.join(cams)}) for the "
                                   f"model's {slots} slots ({', '.join(SLOT_ROLES[:slots])}); "
                                   f"pick {slots} with \"cameras\" in {binding}, e.g. "
                                   f"\"cameras\": [{example}]"))  # fmt: skip
    if max_dim is not None:
        for name, key in (("state", key_map.state), ("action", key_map.action)):
            dim = feature_dims(features, key)
            if dim > max_dim:
                raise DatasetError(located(info_path, f"{name} {key!r} has {dim} dims; the model "
                                           f"takes at most {max_dim} (padded, never cut); bind "
                                           f"\"{name}_key\" in {binding} to a feature of at "
                                           f"most {max_dim} dims"))  # fmt: skip
    if show:
        show_key_map(spec, key_map, features, bound)
    return key_map


def frames_of(seconds: float, specs: Sequence[DatasetSpec], what: str) -> int | dict[str, int]:
    """A duration in frames at each dataset's rate (``round(seconds * fps)``, at least 1): one
    int when every dataset gives the same, else ``{dataset name: frames}`` (a mixture of
    rates). ``what`` names the binding in the one-line error for a duration <= 0."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise DatasetError(f"{what}: {seconds!r} must be a duration in seconds > 0")
    frames = {}
    for spec in specs:
        fps = LocalDataset(spec.root).fps
        frames[spec.name] = max(1, int(round(float(seconds) * fps)))
    counts = set(frames.values())
    return counts.pop() if len(counts) == 1 else frames


def _first(features: Mapping[str, dict], keys: Sequence[str]) -> str | None:
    return next((k for k in keys if k in features), None)


def _cameras(features: Mapping[str, dict]) -> list[str]:
    return [k for k, f in features.items() if f.get("dtype") in CAMERA_DTYPES]


def describe_key_map(
    name: str, key_map: KeyMap, features: Mapping[str, dict], bound: Mapping[str, bool]
) -> str:
    """One line: the dataset's camera of each slot role, its state and action keys and sizes,
    each marked bound (from gin) or detected."""
    how = {k: "bound" if v else "detected" for k, v in bound.items()}
    slots = ", ".join(f"{role}={cam or '-'}"
                      for role, cam in zip(SLOT_ROLES, key_map.cameras))  # fmt: skip
    unused = [c for c in _cameras(features) if c not in key_map.cameras]
    rest = f"; unused cameras: {', '.join(unused)}" if unused else ""
    return (
        f"dataset {name}: cameras {slots} ({how['cameras']}){rest}; state "
        f"{key_map.state} [{feature_dims(features, key_map.state)}] ({how['state']}); action "
        f"{key_map.action} [{feature_dims(features, key_map.action)}] ({how['action']})"
    )


def show_key_map(spec: DatasetSpec, key_map: KeyMap, features, bound) -> None:
    """Log ``describe_key_map`` once per dataset root and map in this process (rank 0)."""
    seen = (str(spec.root), key_map)
    if seen in _SHOWN or not logs.is_main():
        return
    _SHOWN.add(seen)
    log.info(describe_key_map(spec.name, key_map, features, bound))


class LocalDataset:
    """A LeRobot dataset directory, read lazily; ``close()`` (or ``with``) frees video decoders."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().absolute()  # as given: errors name the user's path
        info_path = self.root / "meta" / "info.json"
        if not info_path.is_file():
            raise DatasetError(
                located(
                    info_path,
                    "file not found; point the dataset root at a LeRobot dataset folder "
                    "(the one holding meta/ and data/)",
                )
            )
        try:
            self.info: dict = json.loads(info_path.read_text())
        except (OSError, ValueError) as exc:
            msg = f"not valid JSON ({exc}); fix or restore it"
            raise DatasetError(located(info_path, msg)) from exc
        self.version = str(self.info.get("codebase_version"))
        if self.version not in SUPPORTED_VERSIONS:
            raise DatasetError(
                located(
                    info_path,
                    f"codebase_version {self.info.get('codebase_version')!r} is not supported; "
                    "use a LeRobot dataset of version v2.0, v2.1 or v3.0",
                )
            )
        for field, kind in (("fps", (int, float)), ("features", dict)):
            if not isinstance(self.info.get(field), kind):
                raise DatasetError(
                    located(info_path, f"field {field!r} is missing or invalid; restore info.json")
                )
        self.fps = float(self.info["fps"])
        self.features: dict = self.info["features"]
        self.name = self.root.name
        self.camera_keys = tuple(
            k for k, f in self.features.items() if f.get("dtype") in CAMERA_DTYPES
        )
        self._info_path = info_path
        self._videos = VideoCache()
        self._row_groups: OrderedDict[tuple[int, int, str], pa.Array] = OrderedDict()
        self._parquets: OrderedDict[int, tuple[pq.ParquetFile, np.ndarray]] = OrderedDict()
        self._first: pq.ParquetFile | None = None  # data file 0, its footer parsed once
        self._pid = os.getpid()

    # ---- metadata -------------------------------------------------------------------------

    @cached_property
    def tasks(self) -> dict[int, str]:
        """task_index -> task text, from meta/tasks.jsonl (v2) or meta/tasks.parquet (v3)."""
        if self.version == "v3.0":
            path = self.root / "meta" / "tasks.parquet"
            table = _read_parquet(path)
            text = next((c for c in ("task", "__index_level_0__") if c in table.column_names), None)
            need = ["task_index", text or "task"]
        else:
            path = self.root / "meta" / "tasks.jsonl"
            table = _read_jsonl(path)
            need = ["task_index", "task"]
        _require_columns(path, table.column_names, need)
        try:
            ids = as_index(table.column(need[0]), need[0]).tolist()
        except ColumnValueError as exc:
            raise DatasetError(located(path, exc.message)) from exc
        texts = table.column(need[1]).to_pylist()
        return dict(zip(ids, texts, strict=True))

    @cached_property
    def episodes(self) -> pa.Table:
        """One row per episode sorted by episode_index: episode_index, length (int64), tasks, and
        in v3.0 the data/video offset columns (per-episode ``stats/*`` columns are skipped)."""
        if self.version == "v3.0":
            folder = self.root / "meta" / "episodes"
            paths = sorted(folder.glob("chunk-*/file-*.parquet"))
            if not paths:
                raise DatasetError(
                    located(folder, "no chunk-XXX/file-XXX.parquet files; restore meta/episodes")
                )
            tables = []
            for path in paths:
                pf = _parquet_file(path)
                cols = [c for c in pf.schema_arrow.names if not c.startswith("stats/")]
                tables.append(_read_parquet(path, cols, pf))
            table, where = _concat(tables, folder), folder
        else:
            where = self.root / "meta" / "episodes.jsonl"
            table = _read_jsonl(where)
        _require_columns(where, table.column_names, ["episode_index", "length"])
        offsets = [c for c in table.column_names if c.endswith(("/chunk_index", "/file_index"))]
        for name in ("episode_index", "length", *offsets):
            i = table.column_names.index(name)
            try:
                values = as_index(table.column(name), name)
            except ColumnValueError as exc:
                raise DatasetError(located(where, exc.message)) from exc
            table = table.set_column(i, name, pa.array(values))
        return table.sort_by("episode_index")

    @property
    def num_episodes(self) -> int:
        return self.episodes.num_rows

    @property
    def num_frames(self) -> int:
        return int(self._file_offsets[-1])

    @cached_property
    def data_files(self) -> list[Path]:
        """Parquet data files in row order, from info.json's ``data_path`` and the episodes.

        v3.0 also takes every ``data/*/*.parquet`` on disk (as LeRobot does): an episode lists
        only the file holding its first frame, so a file holding only the tail of an episode
        would otherwise be missed.
        """
        eps = self.episodes
        if self.version == "v3.0":
            template = self.info.get("data_path") or _V3_DATA_PATH
            _require_columns(self.root / "meta" / "episodes", eps.column_names, _V3_FILE_COLUMNS)
            chunk = eps.column("data/chunk_index").to_numpy()
            file = eps.column("data/file_index").to_numpy()
            pairs = np.unique(np.stack([chunk, file], axis=1), axis=0)
            names = [template.format(chunk_index=c, file_index=f) for c, f in pairs.tolist()]
            on_disk = [p.relative_to(self.root).as_posix() for p in self.root.glob("data/*/*")]
            names = sorted(set(names) | {n for n in on_disk if n.endswith(".parquet")})
        else:
            template = self.info.get("data_path") or _V2_DATA_PATH
            size = int(self.info.get("chunks_size", 1000))
            names = [
                template.format(episode_chunk=e // size, episode_index=e)
                for e in eps.column("episode_index").to_pylist()
            ]
        paths = [self.root / n for n in names]
        for path in paths:
            if not path.is_file():
                raise DatasetError(
                    located(path, "data file not found (listed by meta/episodes); restore it")
                )
        return paths

    @cached_property
    def _file_offsets(self) -> np.ndarray:
        """int64[num_files + 1]: first global row of each data file (from parquet footers)."""
        rows = [self._data_file(f).metadata.num_rows for f in range(len(self.data_files))]
        return np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])

    @cached_property
    def _schema_names(self) -> list[str]:
        return self._data_file(0).schema_arrow.names if self.data_files else []

    def _data_file(self, f: int) -> pq.ParquetFile:
        """Data file ``f`` opened; the first stays open, so ``has_column`` and then
        ``read_columns`` parse its footer once (in v3.0 a footer of ~1 MB: a row group per
        episode)."""
        if f != 0:
            return _parquet_file(self.data_files[f])
        if self._pid != os.getpid():  # forked: do not share open files with the parent
            self._parquets, self._row_groups, self._pid = OrderedDict(), OrderedDict(), os.getpid()
            self._first = None
        if self._first is None:
            self._first = _parquet_file(self.data_files[0])
        return self._first

    def has_column(self, name: str) -> bool:
        """Whether the parquet data has column ``name`` (video cameras are not columns)."""
        return name in self._schema_names

    # ---- columns --------------------------------------------------------------------------

    def read_columns(
        self, columns: Sequence[str], check_frames: bool = True, flags: Sequence[str] = ()
    ) -> pa.Table:
        """Rows of all data files in file order, only ``columns``.

        Index columns (``columns.INDEX_COLUMNS``) come back int64 and the boolean-meaning
        columns named in ``flags`` (an outcome, a correction flag) bool, checked file by file
        (``columns.as_index`` / ``as_flags``): a value that breaks the meaning is a one-line
        DatasetError naming the data file, the column, the episode and frame, and the value.
        Requesting both episode_index and frame_index also checks them (``check_frames``) unless
        ``check_frames`` is False (a caller that runs ``check_frames`` itself to keep its result).
        """
        columns = list(columns)
        tables = []
        for f, path in enumerate(self.data_files):
            pf = self._data_file(f)
            _require_columns(path, pf.schema_arrow.names, columns)
            tables.append(_typed_columns(path, pf, _read_parquet(path, columns, pf), flags))
        table = _concat(tables, self.root / "data")
        if check_frames and "episode_index" in columns and "frame_index" in columns:
            self.check_frames(table)
        return table

    def validate_frames(self) -> None:
        """Raise DatasetError on duplicate (episode_index, frame_index) rows or frame_index gaps."""
        self.read_columns(["episode_index", "frame_index"])

    def check_frames(self, table: pa.Table) -> Episodes:
        """Episode layout of ``read_columns`` rows; duplicate or missing frames raise a
        DatasetError naming the data file that holds the offending row."""
        episode = table.column("episode_index").to_numpy()
        frame = table.column("frame_index").to_numpy()
        try:
            return find_episodes(episode, frame)
        except FrameIndexError as exc:
            f = np.searchsorted(self._file_offsets, exc.row, side="right") - 1
            raise DatasetError(located(self.data_files[f], exc.message)) from exc

    def check_layout(self, episodes: Episodes) -> None:
        """The data's episodes (``check_frames``) agree with meta/episodes (ids and lengths) and
        with info.json's ``total_episodes`` / ``total_frames`` (when present): a frame count
        that disagrees is a one-line DatasetError naming the metadata file and the field."""
        where = self.root / "meta" / ("episodes" if self.version == "v3.0" else "episodes.jsonl")
        meta_ids = self.episodes.column("episode_index").to_numpy()
        meta_len = self.episodes.column("length").to_numpy()
        same_ids = np.array_equal(meta_ids, episodes.episode_ids)  # the usual case: no sets
        only_meta = only_data = np.zeros(0, np.int64)
        if not same_ids:
            only_meta = np.setdiff1d(meta_ids, episodes.episode_ids)
            only_data = np.setdiff1d(episodes.episode_ids, meta_ids)
        if only_meta.size or only_data.size:
            e = int(only_meta[0]) if only_meta.size else int(only_data[0])
            said = "lists" if only_meta.size else "does not list"
            has = "has no frames in" if only_meta.size else "has frames in"
            raise DatasetError(
                located(
                    where,
                    f"episode_index: {said} episode {e}, which {has} the data files; restore "
                    "the metadata or the data (re-export the dataset)",
                )
            )
        said_len = (
            meta_len if same_ids else meta_len[np.searchsorted(meta_ids, episodes.episode_ids)]
        )
        bad = said_len != episodes.lengths
        if bad.any():
            i = int(np.argmax(bad))
            raise DatasetError(
                located(
                    where,
                    f"length: episode {int(episodes.episode_ids[i])} has length "
                    f"{int(said_len[i])} but the data files hold {int(episodes.lengths[i])} "
                    "frames of it; restore the metadata or the data (re-export the dataset)",
                )
            )
        counts = {"total_episodes": meta_ids.size, "total_frames": episodes.num_frames}
        for field, count in counts.items():
            total = self.info.get(field)
            if isinstance(total, int) and not isinstance(total, bool) and total != count:
                raise DatasetError(
                    located(
                        self._info_path,
                        f"{field} is {total} but the dataset holds {count}; fix {field} or "
                        "restore the missing files",
                    )
                )

    def task_texts(self, task_index: np.ndarray) -> np.ndarray:
        """object[n] task text of each task_index."""
        return self.task_text_array(task_index).to_numpy(zero_copy_only=False)

    def task_text_array(self, task_index: np.ndarray) -> pa.DictionaryArray:
        """string[n] task text of each task_index, dictionary-encoded (no per-row Python)."""
        task_index = np.asarray(task_index, dtype=np.int64)
        ids = np.array(sorted(self.tasks), dtype=np.int64)
        texts = pa.array([self.tasks[i] for i in ids.tolist()], pa.string())
        lut = np.full(int(ids.max(initial=-1)) + 2, -1, dtype=np.int32)  # last slot: unknown
        lut[ids] = np.arange(ids.size, dtype=np.int32)
        inside = task_index.size == 0 or (task_index.min() >= 0 and task_index.max() < lut.size - 1)
        if inside:  # the usual case: two reductions, no masks
            pos = lut[task_index]
        else:
            pos = lut[np.where((task_index >= 0) & (task_index < lut.size - 1), task_index, -1)]
        bad = pos < 0
        if bad.any():
            tasks_file = "tasks.parquet" if self.version == "v3.0" else "tasks.jsonl"
            raise DatasetError(
                located(
                    self.root / "meta" / tasks_file,
                    f"task_index {int(task_index[np.argmax(bad)])} has no task text; "
                    "add it to the tasks file",
                )
            )
        return pa.DictionaryArray.from_arrays(pa.array(pos), texts)

    # ---- frames ---------------------------------------------------------------------------

    def frames(self, key: str, rows: np.ndarray) -> np.ndarray:
        """uint8[n, H, W, 3] RGB frames of camera ``key`` at row positions ``rows`` (read_columns
        order, equal to the global ``index`` of LeRobot-written data), in the order given."""
        if key not in self.camera_keys:
            raise DatasetError(
                located(
                    self._info_path,
                    f"features: camera {key!r} not found; cameras are "
                    f'{", ".join(self.camera_keys) or "none"}; fix "cameras" in the '
                    "dataset's gin entry",
                )
            )
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        bad = (rows < 0) | (rows >= self.num_frames)
        if bad.any():
            raise DatasetError(
                located(
                    self.root / "data",
                    f"row {int(rows[np.argmax(bad)])} is out of range [0, {self.num_frames})",
                )
            )
        if self.features[key]["dtype"] == "image":
            images = self._image_frames(key, rows)
        else:
            images = self._video_frames(key, rows)
        if not images:
            h, w = self._frame_hw(key)
            return np.empty((0, h, w, 3), dtype=np.uint8)
        return np.stack(images)

    def _frame_hw(self, key: str) -> tuple[int, int]:
        shape, names = self.features[key].get("shape", []), self.features[key].get("names") or []
        if len(shape) == 3 and list(names)[:1] in (["channels"], ["channel"]):
            return int(shape[1]), int(shape[2])
        return (int(shape[0]), int(shape[1])) if len(shape) == 3 else (0, 0)

    def _image_frames(self, key: str, rows: np.ndarray) -> list[np.ndarray]:
        """Decode PNG cells, reading only the row groups that hold ``rows`` (small LRU)."""
        out: list[np.ndarray | None] = [None] * rows.size
        file_of = np.searchsorted(self._file_offsets, rows, side="right") - 1
        for f in np.unique(file_of).tolist():
            path = self.data_files[f]
            pf, starts = self._open_parquet(f)
            _require_columns(path, pf.schema_arrow.names, [key])
            sel = np.flatnonzero(file_of == f)
            local = rows[sel] - self._file_offsets[f]
            group = np.searchsorted(starts, local, side="right") - 1
            for g in np.unique(group).tolist():
                cells = self._row_group(pf, path, f, g, key)
                in_group = group == g
                targets = zip(
                    sel[in_group].tolist(), (local[in_group] - starts[g]).tolist(), strict=True
                )
                for i, r in targets:
                    data = cells[r].as_py()
                    if data is None:
                        raise DatasetError(
                            located(path, f"column {key!r}: row {r} has no image bytes")
                        )
                    out[i] = decode_image(data, f"{path} column {key!r}")
        return out

    def _open_parquet(self, f: int) -> tuple[pq.ParquetFile, np.ndarray]:
        """Data file ``f`` (kept open, LRU of 4) and the first local row of each row group."""
        if self._pid != os.getpid():  # forked: do not share open files with the parent
            self._parquets, self._row_groups, self._pid = OrderedDict(), OrderedDict(), os.getpid()
            self._first = None
        entry = self._parquets.get(f)
        if entry is None:
            pf = self._data_file(f)
            sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
            entry = self._parquets[f] = (pf, np.concatenate([[0], np.cumsum(sizes)]))
            while len(self._parquets) > 4:
                self._parquets.popitem(last=False)
        self._parquets.move_to_end(f)
        return entry

    def _row_group(self, pf: pq.ParquetFile, path: Path, f: int, g: int, key: str) -> pa.Array:
        cache_key = (f, g, key)
        cells = self._row_groups.get(cache_key)
        if cells is None:
            try:
                column = pf.read_row_group(g, columns=[key]).column(key).combine_chunks()
            except (pa.ArrowException, OSError) as exc:
                raise _unreadable(path, exc) from exc
            cells = self._row_groups[cache_key] = column.field("bytes")
            while len(self._row_groups) > 4:
                self._row_groups.popitem(last=False)
        self._row_groups.move_to_end(cache_key)
        return cells

    @cached_property
    def _episode_time(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t = self.read_columns(["episode_index", "frame_index", "timestamp"], check_frames=False)
        episode = t.column("episode_index").to_numpy().astype(np.int64)
        frame = t.column("frame_index").to_numpy().astype(np.int64)
        return episode, t.column("timestamp").to_numpy().astype(np.float64), frame

    def _video_frames(self, key: str, rows: np.ndarray) -> list[np.ndarray]:
        """Decode grouped by file in time order (decoding runs forward); return in row order."""
        episode, timestamp, frame = (a[rows] for a in self._episode_time)
        eps = self.episodes
        ep_ids = eps.column("episode_index").to_numpy()
        pos = np.searchsorted(ep_ids, episode)
        if np.any(pos >= ep_ids.size) or np.any(
            ep_ids[np.minimum(pos, ep_ids.size - 1)] != episode
        ):
            raise DatasetError(
                located(self.root / "meta", "episode_index in data is missing from meta/episodes")
            )
        if self.version == "v3.0":
            prefix = f"videos/{key}/"
            cols = [prefix + c for c in ("chunk_index", "file_index", "from_timestamp")]
            _require_columns(self.root / "meta" / "episodes", eps.column_names, cols)
            chunk, file, start = (eps.column(c).to_numpy()[pos] for c in cols)
            times = start.astype(np.float64) + timestamp
            file_id = chunk.astype(np.int64) * 1_000_000 + file
        else:
            times, file_id = timestamp, episode
        tolerance = 0.5 / self.fps
        out: list[np.ndarray | None] = [None] * rows.size
        if rows.size == 0:
            return out
        order = np.lexsort((times, file_id))
        bounds = np.flatnonzero(np.diff(file_id[order])) + 1
        for group in np.split(order, bounds):
            path = self._video_path(key, int(file_id[group[0]]))
            i = int(group[0])
            try:
                video = self._videos.get(path, tolerance)
                for i in group.tolist():
                    out[i] = video.frame_at(float(times[i]))
            except DatasetError as exc:  # name the frame: camera, episode, frame_index
                where = f"camera {key!r}, episode {episode[i]} frame {frame[i]}: "
                raise DatasetError(located(path, where + exc.message.partition(": ")[2])) from exc
        return out

    def _video_path(self, key: str, file_id: int) -> Path:
        if self.version == "v3.0":
            template = self.info.get("video_path") or (
                "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
            )
            chunk, file = divmod(file_id, 1_000_000)
            return self.root / template.format(video_key=key, chunk_index=chunk, file_index=file)
        template = self.info.get("video_path") or (
            "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        )
        size = int(self.info.get("chunks_size", 1000))
        name = template.format(episode_chunk=file_id // size, video_key=key, episode_index=file_id)
        return self.root / name

    # ---- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Close cached video decoders (the dataset stays usable; they reopen on demand)."""
        self._videos.close()
        self._row_groups.clear()
        self._parquets.clear()
        self._first = None

    def __enter__(self) -> LocalDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        """Pickle without open decoders (for DataLoader workers started with spawn)."""
        state = self.__dict__.copy()
        state["_videos"], state["_row_groups"], state["_parquets"], state["_first"] = (
            VideoCache(),
            OrderedDict(),
            OrderedDict(),
            None,
        )
        return state

    def __repr__(self) -> str:
        return f"LocalDataset({str(self.root)!r}, version={self.version!r})"


_V3_FILE_COLUMNS = ["data/chunk_index", "data/file_index"]


def _typed_columns(path: Path, pf: pq.ParquetFile, table: pa.Table, flags: Sequence[str]):
    """``table`` (one data file's rows) with index columns int64 and ``flags`` columns bool;
    int64 and bool columns without nulls pass through untouched (no copy)."""
    for i, name in enumerate(table.column_names):
        is_flag = name in flags
        if not is_flag and name not in C.INDEX_COLUMNS:
            continue
        column = table.column(i)
        want = pa.bool_() if is_flag else pa.int64()
        if column.type == want and column.null_count == 0:
            continue
        try:
            values = as_flags(column, name) if is_flag else as_index(column, name)
        except ColumnValueError as exc:
            where = _row_name(pf, table, exc.row, name)
            raise DatasetError(located(path, exc.describe(where))) from exc
        table = table.set_column(i, name, pa.array(values, want))
    return table


def _row_name(pf: pq.ParquetFile, table: pa.Table, row: int, bad: str) -> str:
    """'episode E frame F' of a data file's row (its own index columns), else 'row R'."""
    keys = [C.EPISODE_INDEX, C.FRAME_INDEX]
    if bad in keys or not all(k in pf.schema_arrow.names for k in keys):
        return f"row {row}"
    try:
        source = table if all(k in table.column_names for k in keys) else pf.read(columns=keys)
        episode, frame = (source.column(k)[row].as_py() for k in keys)
    except (pa.ArrowException, OSError):
        return f"row {row}"
    return f"episode {episode} frame {frame}"


def _parquet_file(path: Path) -> pq.ParquetFile:
    if not path.is_file():
        raise DatasetError(located(path, "file not found; restore it from the source dataset"))
    if path.stat().st_size == 0:
        raise DatasetError(
            located(path, "parquet file is empty (0 bytes); restore it from the source dataset")
        )
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from exc


def _read_parquet(
    path: Path, columns: Sequence[str] | None = None, pf: pq.ParquetFile | None = None
) -> pa.Table:
    pf = pf or _parquet_file(path)
    try:
        return pf.read(columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from exc


def _unreadable(path: Path, exc: Exception) -> DatasetError:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatasetError(
        located(path, f"not a readable parquet file ({reason}); restore it from the source dataset")
    )


def _read_jsonl(path: Path) -> pa.Table:
    if not path.is_file():
        raise DatasetError(located(path, "file not found; restore it from the source dataset"))
    try:
        return pajson.read_json(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(
            located(path, f"not valid JSON lines ({exc}); restore it from the source dataset")
        ) from exc


def _require_columns(path: object, available: Sequence[str], wanted: Sequence[str]) -> None:
    missing = [c for c in wanted if c not in available]
    if missing:
        raise DatasetError(
            located(
                path,
                f"column {missing[0]!r} not found; available columns: {', '.join(available)}; "
                "fix the column name or the dataset's gin entry",
            )
        )


def _concat(tables: list[pa.Table], where: Path) -> pa.Table:
    if not tables:
        raise DatasetError(located(where, "no parquet files; restore the dataset"))
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowException, ValueError) as exc:
        raise DatasetError(
            located(where, f"files have incompatible schemas ({exc}); re-export the dataset")
        ) from exc
