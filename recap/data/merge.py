"""Merge LeRobot v3.0 datasets into one: ``merge_datasets(sources, out)``.

``recap-serve --record DIR`` writes one dataset per episode (``DIR/episode_NNNNNN``: one atomic
dataset per finished episode, so a kill -9 loses only the episode in progress). Steps 1-4 take
a list of datasets, but a list of 500 one-episode datasets costs 500 of everything per step:
500 dataset entries in every step's bindings and fingerprint, 500 returns and 500 advantages
sidecars per round, 500 datasets opened (info, episodes, tasks, footers) by every reader and
data-loader worker. ``recap-iterate`` therefore merges a round's recordings into one dataset
first (``recap.workflow.iterate``: ``iterate.recorded``), a cost paid once per round that is
mostly file copies, and the pipeline then sees one dataset of 500 episodes.

The merge re-indexes, it does not re-encode:

- episodes are numbered in source order (``episode_index``, global ``index``), tasks are the
  union in order of first appearance (``task_index`` remapped);
- each source's data rows are rewritten into ``data/chunk-*/file-*.parquet`` with the new
  indices, a new file started at an episode boundary once the current one holds
  ``info.data_files_size_in_mb`` (frames' in-memory size);
- each source video file is copied byte for byte under a new file index of its camera (one
  episode's ``from_timestamp`` / ``to_timestamp`` within its file are unchanged), so decoded
  frames are exactly the sources';
- ``meta/episodes`` keeps each episode's stats and points at the new data and video files,
  ``meta/stats.json`` is the count-weighted aggregate of the sources' (``aggregate_stats``),
  ``meta/info.json`` the first source's with the new totals, ``meta/recap_merge.json`` lists
  the sources (path, episodes, the new index of their first episode, and a recording's
  ``meta/recap_record.json`` when present). Sidecars beside the sources are not carried.

Sources must agree on the features (names, dtypes, shapes; the video encoding settings of a
camera may differ), ``fps`` and ``codebase_version`` v3.0: otherwise one line naming the
source's ``meta/info.json``, the field and the fix, and nothing is written. Sources are only
read; the output is written to a temporary sibling and renamed into place.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recap.data.lerobot import LocalDataset
from recap.data.lerobot_writer import (
    V30,
    V30_DATA_PATH,
    V30_EPISODES_PATH,
    V30_VIDEO_PATH,
    _tasks_table,
    aggregate_stats,
    atomic_directory,
    stats_to_json,
)
from recap.errors import RecapError

MERGE_FILE = "recap_merge.json"
RECORD_FILE = "recap_record.json"  # recap.serve.record writes it (data never imports serve)
_VIDEO_INFO = "info"  # a camera feature's encoding settings: may differ between sources


def _features_key(features: dict) -> dict:
    """The features as they must agree between sources (names, dtypes, shapes)."""
    return {k: {n: v for n, v in f.items() if n != _VIDEO_INFO} for k, f in features.items()}


def _file(chunks_size: int, index: int) -> tuple[int, int]:
    return divmod(index, chunks_size)


def _check(sources: Sequence[LocalDataset]) -> None:
    first = sources[0]
    for ds in sources:
        info = ds.root / "meta" / "info.json"
        if ds.version != V30:
            raise RecapError(f"{info}: codebase_version {ds.version!r}; merge takes LeRobot "
                             "v3.0 datasets only (convert it first)")  # fmt: skip
        if ds.fps != first.fps:
            raise RecapError(f"{info}: fps {ds.fps:g} differs from {first.root}'s {first.fps:g}; "
                             "merge datasets recorded at one rate")  # fmt: skip
        mine, theirs = _features_key(ds.features), _features_key(first.features)
        if mine != theirs:
            diff = sorted(set(mine) ^ set(theirs)) or sorted(
                k for k in mine if mine[k] != theirs[k])  # fmt: skip
            raise RecapError(f"{info}: features differ from {first.root}'s ({', '.join(diff)}); "
                             "merge datasets with the same columns, dtypes and shapes")  # fmt: skip


def _stats(path: Path) -> dict[str, dict[str, np.ndarray]]:
    raw = json.loads(path.read_text())
    return {k: {n: np.asarray(v) for n, v in s.items()} for k, s in raw.items()}


def merge_datasets(
    sources: Sequence[str | Path],
    out: str | Path,
    overwrite: bool = False,
    extra: dict[str, object] | None = None,
) -> dict:
    """Merge the LeRobot v3.0 datasets ``sources`` (in order) into one at ``out`` (module
    docstring); ``extra``: files (path inside the dataset -> a JSON value) written into it
    before it appears. Returns ``{"path", "episodes", "frames", "tasks", "sources"}``."""
    if not sources:
        raise RecapError(f"{out}: no datasets to merge")
    out = Path(out)
    datasets = [LocalDataset(s) for s in sources]
    try:
        _check(datasets)
        with atomic_directory(out, overwrite) as tmp:
            summary = _Merge(tmp, datasets).run()
            for name, value in (extra or {}).items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_text(json.dumps(value, indent=2) + "\n")
    finally:
        for ds in datasets:
            ds.close()
    return {"path": str(out), **summary}


class _Merge:
    def __init__(self, root: Path, sources: list[LocalDataset]):
        self.root, self.sources = root, sources
        info = sources[0].info
        self.chunks_size = int(info.get("chunks_size", 1000))
        self.file_limit = int(info.get("data_files_size_in_mb", 100)) * 2**20
        self.videos = [k for k, f in sources[0].features.items() if f.get("dtype") == "video"]
        self.tasks: dict[str, int] = {}
        self.data_writer: pq.ParquetWriter | None = None
        self.data_file = self.data_bytes = 0
        self.video_files = dict.fromkeys(self.videos, 0)

    def run(self) -> dict:
        episode_rows, stats, listed = [], [], []
        episodes = frames = 0
        for ds in self.sources:
            eps = self._episodes_with_stats(ds)
            task_map = self._task_map(ds)
            data_at = self._copy_data(ds, episodes, frames, task_map)
            video_at = self._copy_videos(ds)
            rows = eps.to_pylist()  # sorted by episode_index: new index = episodes + position
            for position, row in enumerate(rows):
                data_row = data_at[row["episode_index"]]
                row["episode_index"] = episodes + position
                row["data/chunk_index"], row["data/file_index"] = data_row
                row["dataset_from_index"] += frames
                row["dataset_to_index"] += frames
                for key in self.videos:
                    at = (row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"])
                    new = video_at[key][at]
                    row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"] = new
                row["meta/episodes/chunk_index"] = row["meta/episodes/file_index"] = 0
            episode_rows.extend(rows)
            stats.append(_stats(ds.root / "meta" / "stats.json"))
            record = ds.root / "meta" / RECORD_FILE
            listed.append({"path": str(ds.root), "episodes": ds.num_episodes,
                           "first_episode": episodes,
                           **({"record": json.loads(record.read_text())}
                              if record.is_file() else {})})  # fmt: skip
            episodes += ds.num_episodes
            frames += ds.num_frames
        if self.data_writer is not None:
            self.data_writer.close()
        meta = self.root / "meta"
        (self.root / V30_EPISODES_PATH).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(episode_rows), self.root / V30_EPISODES_PATH)
        tasks = [{"task_index": i, "task": t} for t, i in self.tasks.items()]
        pq.write_table(_tasks_table(tasks), meta / "tasks.parquet")
        merged = stats_to_json(aggregate_stats(stats), floats=True)
        (meta / "stats.json").write_text(json.dumps(merged, indent=4) + "\n")
        info = dict(self.sources[0].info)
        info |= {"total_episodes": episodes, "total_frames": frames,
                 "total_tasks": len(self.tasks), "splits": {"train": f"0:{episodes}"},
                 "data_path": V30_DATA_PATH,
                 "video_path": V30_VIDEO_PATH if self.videos else None}  # fmt: skip
        (meta / "info.json").write_text(json.dumps(info, indent=4) + "\n")
        (meta / MERGE_FILE).write_text(json.dumps({"sources": listed}, indent=2) + "\n")
        return {"episodes": episodes, "frames": frames, "tasks": list(self.tasks),
                "sources": len(self.sources)}  # fmt: skip

    def _episodes_with_stats(self, ds: LocalDataset) -> pa.Table:
        """meta/episodes with the per-episode ``stats/*`` columns (``ds.episodes`` skips them)."""
        tables = [pq.read_table(p) for p in sorted(ds.root.glob("meta/episodes/chunk-*/*.parquet"))]
        return pa.concat_tables(tables, promote_options="default").sort_by("episode_index")

    def _task_map(self, ds: LocalDataset) -> np.ndarray:
        """old task_index -> new (int64 array indexed by the old index)."""
        tasks = ds.tasks
        remap = np.full(max(tasks, default=-1) + 1, -1, np.int64)
        for old, text in tasks.items():
            remap[old] = self.tasks.setdefault(text, len(self.tasks))
        return remap

    def _copy_data(
        self, ds: LocalDataset, episodes: int, frames: int, task_map: np.ndarray
    ) -> dict[int, tuple[int, int]]:
        """Rewrite the source's rows with the new indices; old episode -> (chunk, file) of its
        first row in the output."""
        where: dict[int, tuple[int, int]] = {}
        old_ids = ds.episodes.column("episode_index").to_numpy()
        for path in ds.data_files:
            table = pq.read_table(path)
            if table.num_rows == 0:
                continue
            episode = table.column("episode_index").to_numpy()
            new_episode = episodes + np.searchsorted(old_ids, episode)
            starts_episode = int(episode[0]) not in where
            if (
                self.data_writer is not None
                and starts_episode
                and (self.data_bytes >= self.file_limit)
            ):
                self.data_writer.close()
                self.data_writer, self.data_file, self.data_bytes = None, self.data_file + 1, 0
            if self.data_writer is None:
                chunk, file = _file(self.chunks_size, self.data_file)
                out = self.root / V30_DATA_PATH.format(chunk_index=chunk, file_index=file)
                out.parent.mkdir(parents=True, exist_ok=True)
                self.data_writer = pq.ParquetWriter(out, table.schema)
            names = table.column_names
            for name, values in (
                ("episode_index", new_episode),
                ("index", table.column("index").to_numpy() + frames),
                ("task_index", task_map[table.column("task_index").to_numpy()]),
            ):
                table = table.set_column(names.index(name), name, pa.array(values, pa.int64()))
            self.data_writer.write_table(table.cast(self.data_writer.schema))
            self.data_bytes += table.nbytes
            here = _file(self.chunks_size, self.data_file)
            for e in np.unique(episode).tolist():
                where.setdefault(e, here)
        return where

    def _copy_videos(self, ds: LocalDataset) -> dict[str, dict[tuple[int, int], tuple[int, int]]]:
        """Copy each video file of the source under its camera's next file index; per camera,
        old (chunk, file) -> new."""
        eps = ds.episodes
        moved: dict[str, dict[tuple[int, int], tuple[int, int]]] = {}
        for key in self.videos:
            pairs = zip(eps.column(f"videos/{key}/chunk_index").to_pylist(),
                        eps.column(f"videos/{key}/file_index").to_pylist())  # fmt: skip
            moved[key] = {}
            for old in sorted(set(pairs)):
                new = _file(self.chunks_size, self.video_files[key])
                self.video_files[key] += 1
                source = ds._video_path(key, old[0] * 1_000_000 + old[1])
                target = self.root / V30_VIDEO_PATH.format(
                    video_key=key, chunk_index=new[0], file_index=new[1]
                )
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                moved[key][old] = new
        return moved
