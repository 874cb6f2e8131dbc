"""Step 2 training data: frames of several LeRobot datasets with normalized return targets.

``ValueDataset`` mixes datasets with weights through a fixed virtual index (built once, seeded,
with no Python loop over rows): ``proportional`` mixing keeps each dataset's share equal to its
frames times its weight; ``balanced`` gives every dataset the same share per unit weight (small
datasets repeat). Targets are the Step 1 returns normalized with the one shared map
(``recap.core.normalize``) over the *training* datasets' range, for eval sets too.

A batch (one ``__getitems__`` call per DataLoader worker) holds uint8 frames resized to the model's
image size in camera slots (base, left wrist, right wrist; a missing camera is a zero image with
mask False), prompt tokens cut to the longest prompt of the batch, and targets. The model turns
frames into floats and augments them on its device.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import Dataset

from recap.configurable import REQUIRED, check_given, configurable
from recap.core import columns as C
from recap.core.frames import align_to_frames
from recap.core.normalize import ReturnRange, normalize_returns
from recap.data.lerobot import KeyMap, spec_key_map
from recap.data.loader import FrameDataset, pass_through
from recap.data.sidecars import read_returns, write_atomic
from recap.data.specs import DatasetSpec, SplitDataConfig
from recap.errors import DatasetError, RecapError, located
from recap.processing.cameras import NUM_CAMERAS
from recap.processing.transforms import RESIZE_ANTIALIAS, load_tokenizer
from recap.processing.value import ValueProcessor

MIXING = ("proportional", "balanced")


# Older value runs (and RLinf imports, for older readers) carry their training return range in
# return_range.json; runs now carry it in processor.json (``ValueProcessor.return_range``).
RANGE_FILE = "return_range.json"


def training_return_range(specs: list[DatasetSpec], tag: str) -> ReturnRange:
    """Global return range of the training datasets (docs/spec.md §3: min of mins, max of maxes)."""
    ranges = []
    for spec in specs:
        _, stats = read_returns(spec.root, tag)
        ranges.append(ReturnRange(stats["return_min"], stats["return_max"]))
    return ReturnRange.union(ranges)


def write_return_range(run_dir: str | os.PathLike, rng: ReturnRange, datasets: list[str]) -> Path:
    """``{run_dir}/return_range.json``: the range the value model's targets were normalized
    with, which Step 3 must use to read its outputs back as returns (atomically)."""
    path = Path(run_dir) / RANGE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"return_min": rng.return_min, "return_max": rng.return_max,
                       "datasets": datasets})  # fmt: skip
    write_atomic({path: lambda tmp: tmp.write_text(text + "\n")})
    return path


def read_return_range(directory: str | os.PathLike) -> tuple[ReturnRange, Path] | None:
    """The range a value run recorded (``write_return_range``), or None (older runs, imports)."""
    path = Path(directory) / RANGE_FILE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
        return ReturnRange(float(saved["return_min"]), float(saved["return_max"])), path
    except (ValueError, KeyError, TypeError) as exc:
        raise RecapError(f"{path}: unreadable ({exc}); delete it and pass "
                         "compute_advantages.return_range = (min, max)") from exc  # fmt: skip


@dataclass
class _Source:
    """One dataset: its frames, per-row target and per-row prompt code (into the shared list)."""

    spec: DatasetSpec
    frames: FrameDataset
    target: np.ndarray
    prompt_code: np.ndarray


class ValueDataset(Dataset):
    """Frames + ``Task: {task}.`` tokens + normalized return targets of several datasets.

    Args:
        specs: the datasets (``recap.data.specs``), each with a ``weight``.
        returns_tag: tag of the Step 1 sidecars to read.
        return_range: the training range (``training_return_range``), shared with eval sets.
        tokenizer: a Hugging Face tokenizer (``transforms.load_tokenizer``).
        image_size: model image size; frames are resized (with padding) to it, kept uint8.
        key_maps: per dataset name, camera/state/action keys (default: detected).
        mixing: ``proportional`` or ``balanced`` (see module docstring).
        max_length: token columns of a prompt (BOS included); a task whose prompt takes more is
            refused here, in one line naming ``max_length_binding`` (the binding that set it).
    """

    def __init__(
        self,
        specs: list[DatasetSpec],
        returns_tag: str,
        return_range: ReturnRange,
        tokenizer,
        image_size: int,
        max_length: int = 200,
        key_maps: dict[str, KeyMap] | None = None,
        mixing: str = "proportional",
        seed: int = 0,
        resize: str = RESIZE_ANTIALIAS,
        tokenizer_path: str | None = None,
        max_length_binding: str = "value_data.max_length",
    ):
        if mixing not in MIXING:
            raise RecapError(f"value_data.mixing: {mixing!r} is not one of {list(MIXING)}")
        self.image_size, self.return_range = image_size, return_range
        prompts: list[str] = []
        self.sources = [
            self._source(spec, returns_tag, (key_maps or {}).get(spec.name), prompts)
            for spec in specs
        ]
        self.prompts = prompts
        path = tokenizer_path or getattr(tokenizer, "path", None) or getattr(
            tokenizer, "name_or_path", "")  # fmt: skip
        self.processor = ValueProcessor(
            str(path), (return_range.return_min, return_range.return_max), image_size, resize,
            self.sources[0].frames.key_map.cameras if self.sources else (), NUM_CAMERAS,
            max_length,
        )  # fmt: skip
        longest, prompt = ValueProcessor.longest_prompt(tokenizer, prompts)
        if longest > max_length:  # before anything trains or labels: a cut prompt loses words
            raise RecapError(f"{max_length_binding} = {max_length}: the prompt {prompt!r} takes "
                             f"{longest} tokens (BOS included); bind {max_length_binding} = "
                             f"{longest} or more")  # fmt: skip
        self.prompt_ids, self.prompt_mask = self.processor.tokenize(tokenizer, prompts)
        self.source_of, self.row_of = _virtual_index(
            [len(s.frames) for s in self.sources], [s.spec.weight for s in self.sources], mixing,
            seed,
        )  # fmt: skip

    def _source(self, spec: DatasetSpec, tag: str, key_map: KeyMap | None, prompts: list[str]):
        key_map = key_map or spec_key_map(spec)  # gin's, else detected
        frames = FrameDataset(spec.root, key_map=key_map)
        if len(frames.key_map.cameras) > NUM_CAMERAS:
            cams = len(frames.key_map.cameras)
            message = (f"{cams} cameras; the value model has {NUM_CAMERAS} slots; name three with "
                       "\"cameras\" in the dataset's gin entry")  # fmt: skip
            raise DatasetError(located(spec.root, message))
        sidecar, _ = read_returns(spec.root, tag)
        keys = pa.table({C.EPISODE_INDEX: frames.columns[C.EPISODE_INDEX],
                         C.FRAME_INDEX: frames.columns[C.FRAME_INDEX]})  # fmt: skip
        try:
            joined = align_to_frames(keys, sidecar, [C.RETURN, C.PROMPT], "returns sidecar")
        except RecapError as exc:
            raise DatasetError(located(spec.root / "meta", exc.message)) from exc
        r = self.return_range
        target = normalize_returns(joined.column(C.RETURN).to_numpy(), r.offset, r.scale)
        encoded = pc.dictionary_encode(joined.column(C.PROMPT)).combine_chunks()
        first = len(prompts)
        prompts.extend(ValueProcessor.prompt(t) for t in encoded.dictionary.to_pylist())
        code = encoded.indices.to_numpy().astype(np.int64) + first
        return _Source(spec, frames, target.astype(np.float32), code)

    def __len__(self) -> int:
        return int(self.source_of.shape[0])

    def __getitems__(self, indices) -> dict:
        idx = np.asarray(indices, dtype=np.int64)
        src, rows = self.source_of[idx], self.row_of[idx]
        n = idx.shape[0]
        frames = torch.zeros(n, NUM_CAMERAS, self.image_size, self.image_size, 3, dtype=torch.uint8)
        masks = torch.zeros(n, NUM_CAMERAS, dtype=torch.bool)
        target = np.empty(n, dtype=np.float32)
        code = np.empty(n, dtype=np.int64)
        for s in np.unique(src).tolist():  # one batched fetch per dataset in the batch
            sel = np.flatnonzero(src == s)
            source = self.sources[s]
            batch = source.frames.__getitems__(rows[sel])
            cameras = source.frames.key_map.cameras
            frames[sel], masks[sel] = self.processor.pack(batch["images"], cameras)
            target[sel] = source.target[rows[sel]]
            code[sel] = source.prompt_code[rows[sel]]
        length = max(int(self.prompt_mask[code].sum(1).max()), 1) if n else 1
        return {
            "frames": frames,
            "image_masks": masks,
            "input_ids": self.prompt_ids[code, :length],
            "attention_mask": self.prompt_mask[code, :length],
            "target": torch.from_numpy(target),
            "source": torch.from_numpy(src),
            "row": torch.from_numpy(rows),
        }

    def __getitem__(self, index: int) -> dict:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    collate = staticmethod(pass_through)  # __getitems__ already returns a batch

    def episode_keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per virtual item: (dataset index, episode_index, frame_index), for pictures."""
        episode = np.empty(len(self), dtype=np.int64)
        frame = np.empty(len(self), dtype=np.int64)
        for s, source in enumerate(self.sources):
            sel = self.source_of == s
            episode[sel] = source.frames.columns[C.EPISODE_INDEX][self.row_of[sel]]
            frame[sel] = source.frames.columns[C.FRAME_INDEX][self.row_of[sel]]
        return self.source_of, episode, frame

    def eval_figures(self, outputs: dict[str, torch.Tensor]) -> dict:
        """A PNG-ready figure of predicted vs target value along a few eval episodes."""
        from recap.viz import value_curves

        return {"value_curves": value_curves(self, outputs)}


def _virtual_index(
    sizes: list[int], weights: list[float], mixing: str, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(source int64[m], row int64[m]) of the mixture: each source's count is its weight times its
    size (proportional) or times the largest size (balanced); whole passes plus a seeded
    sample without replacement for the fraction. Sorted by (source, row) for decode locality."""
    rng = np.random.default_rng(seed)
    base = max(sizes) if mixing == "balanced" else None
    sources, rows = [], []
    for s, (size, weight) in enumerate(zip(sizes, weights)):
        if weight < 0 or size == 0:
            raise RecapError(f"datasets[{s}]: weight {weight} / {size} frames; need weight >= 0")
        count = int(round(weight * (base if base is not None else size)))
        full, rest = divmod(count, size)
        picked = np.concatenate([np.tile(np.arange(size), full),
                                 np.sort(rng.choice(size, rest, replace=False))])  # fmt: skip
        sources.append(np.full(picked.shape[0], s, dtype=np.int64))
        rows.append(picked.astype(np.int64))
    return np.concatenate(sources), np.concatenate(rows)


@configurable("value_data")
@dataclass(frozen=True)
class ValueDataConfig(SplitDataConfig):
    """The value model's train (``split="train"``) or eval data (gin ``value_data.*``);
    ``build()`` makes the ``ValueDataset``.

    Both splits normalize targets with the training datasets' return range; it travels in the
    dataset's ``ValueProcessor``, which ``train`` writes beside the weights (``processor.json``)
    and Step 3 reads back. In gin (``train`` builds what ``data_fn`` returns)::

        train.data_fn = @value_data
        train.eval_data_fn = @eval/value_data
        eval/value_data.split = "eval"
    """

    returns_tag: str = ""
    tokenizer_path: str = REQUIRED
    image_size: int = 224
    max_length: int = 200
    mixing: str = "proportional"
    seed: int = 0

    def __post_init__(self):
        check_given(self)

    def build(self) -> ValueDataset:
        """The dataset of ``split``, every file read and checked."""
        train_specs, specs = self.split_specs()
        return_range = training_return_range(train_specs, self.returns_tag)
        return ValueDataset(
            specs, self.returns_tag, return_range, load_tokenizer(self.tokenizer_path),
            self.image_size, self.max_length, mixing=self.mixing, seed=self.seed,
        )  # fmt: skip
