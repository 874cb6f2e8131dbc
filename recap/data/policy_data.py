"""Step 4 training data: frames, action chunks and advantage-conditioned prompts (LeRobot).

``PolicyDataset`` mixes datasets like ``ValueDataset`` (same virtual index, ``mixing`` and
weights). Per item: uint8 frames resized to the model's image size in camera slots (base, left
wrist, right wrist), the next ``action_horizon`` actions quantile-normalized to [-1, 1] and
zero-padded to ``action_dim`` (``action_mask`` False past the episode's end and on padded dims),
and the π0.5 prompt (``conditioning.pi05_prompt``: the task, the advantage text, and with
``state_in_prompt`` the normalized state binned into the text, as openpi).

Conditioning (SPEC "Step 4"): labels come from ``meta/advantages_{tag}.parquet`` by
(episode_index, frame_index); a frame without a label is a one-line error naming the file and the
frame. ``paper``: every frame gets its label's text, dropped to the plain prompt with probability
0.3; ``positive_only_conditional`` (RLinf): positives get the positive text except with
probability 0.1, negatives never; ``none``: the plain prompt (behaviour cloning, the baseline).
The dropout is drawn once per virtual item from ``seed`` (``draw_conditional``), so it depends
only on (seed, index): a resumed run, or another epoch, sees the same prompts.

Quantile statistics (q01/q99 per dimension, ``conditioning.quantile_stats``) are merged over the
training datasets (min of q01, max of q99) so one map serves every dataset and inference.
Each distinct prompt is tokenized once (a per-process cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import gin
import numpy as np
import torch
from torch.utils.data import Dataset

import recap.models.pi05  # noqa: F401  (registers pi05_policy: gin/policy.gin wires both)
from recap.core import columns as C
from recap.data.conditioning import (
    MODES,
    QuantileStats,
    advantage_prompt,
    dataset_labels,
    draw_conditional,
    normalize_quantile,
    pad_last,
    pi05_prompt,
    quantile_stats,
)
from recap.data.datasets import MIXING, NUM_SLOTS, _virtual_index
from recap.data.lerobot import KeyMap, LocalDataset, detect_key_map
from recap.data.loader import FrameDataset, pass_through
from recap.data.specs import DatasetSpec, split_specs
from recap.data.transforms import load_tokenizer, resize_frames
from recap.errors import DatasetError, RecapError, located

NONE = "none"  # conditioning mode of the behaviour-cloning baseline
CONDITIONING = (*MODES, NONE)


@dataclass
class _Source:
    """One dataset: its frames (with action chunks), task texts and per-row labels."""

    spec: DatasetSpec
    frames: FrameDataset
    tasks: np.ndarray  # object[rows] task text of each row
    labels: np.ndarray  # bool[rows] (all True when unconditioned)


def merged_stats(sources: list[tuple[LocalDataset, KeyMap]]) -> dict[str, QuantileStats]:
    """``{"state", "action"}`` quantiles over datasets: min of q01s, max of q99s per dim."""
    out = {}
    for name in ("state", "action"):
        parts = []
        for dataset, key_map in sources:
            key = key_map.state if name == "state" else key_map.action
            parts.append(quantile_stats(dataset, [key])[key])
        dims = {len(p.q01) for p in parts}
        if len(dims) > 1:
            roots = [str(dataset.root) for dataset, _ in sources]
            raise DatasetError(f"{name}: datasets {roots} have {sorted(dims)} dims; mix only "
                               "datasets of one robot (same state/action size)")  # fmt: skip
        out[name] = QuantileStats(
            np.min([p.q01 for p in parts], 0), np.max([p.q99 for p in parts], 0)
        )
    return out


def training_stats(specs: list[DatasetSpec]) -> dict[str, QuantileStats]:
    """``merged_stats`` of the training datasets from their metadata (or state/action columns),
    without building their frames, labels and prompts (what an eval split needs)."""
    sources = []
    for spec in specs:
        dataset = LocalDataset(spec.root)
        sources.append((dataset, detect_key_map(dataset.features, dataset.root)))
    return merged_stats(sources)


class PolicyDataset(Dataset):
    """Frames + normalized action chunks + advantage-conditioned π0.5 prompts.

    Args:
        specs: the datasets (``recap.data.specs``), each with a ``weight``.
        advantages_tag: tag of the Step 3 sidecars (unused when ``conditioning="none"``).
        tokenizer: a Hugging Face tokenizer (``transforms.load_tokenizer``).
        image_size: model image size; frames are resized (with padding), kept uint8.
        action_horizon / action_dim: the model's chunk length and padded action size.
        conditioning: ``paper``, ``positive_only_conditional`` or ``none``.
        dropout: probability of the plain prompt (default: 0.3 paper, 0.1 RLinf).
        stats: normalization statistics (default: merged over ``specs``; pass the training
            ones for eval sets).
    """

    def __init__(
        self,
        specs: list[DatasetSpec],
        advantages_tag: str,
        tokenizer,
        image_size: int,
        action_horizon: int,
        action_dim: int = 32,
        conditioning: str = "paper",
        dropout: float | None = None,
        state_in_prompt: bool = True,
        max_length: int = 200,
        key_maps: dict[str, KeyMap] | None = None,
        mixing: str = "proportional",
        seed: int = 0,
        stats: dict[str, QuantileStats] | None = None,
    ):
        if conditioning not in CONDITIONING:
            raise RecapError(f"policy_data.conditioning: {conditioning!r} is not one of "
                             f"{list(CONDITIONING)}")  # fmt: skip
        if mixing not in MIXING:
            raise RecapError(f"policy_data.mixing: {mixing!r} is not one of {list(MIXING)}")
        self.tokenizer, self.image_size, self.max_length = tokenizer, image_size, max_length
        self.action_dim, self.state_in_prompt = action_dim, state_in_prompt
        self.action_horizon = action_horizon
        self.conditioning = conditioning
        self.sources = [self._source(s, advantages_tag, (key_maps or {}).get(s.name),
                                     action_horizon) for s in specs]  # fmt: skip
        self.stats = stats or merged_stats([(s.frames.dataset, s.frames.key_map)
                                            for s in self.sources])  # fmt: skip
        self.source_of, self.row_of = _virtual_index(
            [len(s.frames) for s in self.sources], [s.spec.weight for s in self.sources], mixing,
            seed,
        )  # fmt: skip
        labels = np.concatenate([s.labels[self.row_of[self.source_of == i]]
                                 for i, s in enumerate(self.sources)])  # fmt: skip
        self.labels = labels  # source_of is sorted, so this is in virtual-item order
        self.conditional = self._draw(conditioning, dropout, seed)
        self._cache: dict[str, list[int]] = {}

    def _source(self, spec: DatasetSpec, tag: str, key_map: KeyMap | None, horizon: int):
        frames = FrameDataset(spec.root, key_map=key_map, action_horizon=horizon)
        if len(frames.key_map.cameras) > NUM_SLOTS:
            message = f"{len(frames.key_map.cameras)} cameras; the policy has {NUM_SLOTS} slots"
            raise DatasetError(located(spec.root, message + ", trim the key map"))
        tasks = frames.dataset.task_texts(frames.columns[C.TASK_INDEX])
        ep, fr = frames.columns[C.EPISODE_INDEX], frames.columns[C.FRAME_INDEX]
        if self.conditioning == NONE:
            labels = np.ones(len(ep), dtype=bool)
        else:
            labels = dataset_labels(spec.root, tag, ep, fr)
        return _Source(spec, frames, tasks, labels)

    def _draw(self, mode: str, dropout: float | None, seed: int) -> np.ndarray:
        """bool[items]: which items carry the advantage text (fixed per (seed, index))."""
        if mode == NONE:
            return np.zeros(len(self.labels), dtype=bool)
        generator = torch.Generator().manual_seed(int(seed))
        return draw_conditional(self.labels, mode, dropout, generator).numpy()

    def __len__(self) -> int:
        return int(self.source_of.shape[0])

    def __getitems__(self, indices) -> dict:
        idx = np.asarray(indices, dtype=np.int64)
        src, rows, n = self.source_of[idx], self.row_of[idx], idx.shape[0]
        size = self.image_size
        frames = torch.zeros(n, NUM_SLOTS, size, size, 3, dtype=torch.uint8)
        masks = torch.zeros(n, NUM_SLOTS, dtype=torch.bool)
        horizon = self.action_horizon
        actions = torch.zeros(n, horizon, self.action_dim)
        action_mask = torch.zeros(n, horizon, self.action_dim, dtype=torch.bool)
        texts: list[str] = [""] * n
        for s in np.unique(src).tolist():  # one batched fetch per dataset in the batch
            sel = np.flatnonzero(src == s)
            source = self.sources[s]
            batch = source.frames.__getitems__(rows[sel])
            for slot, camera in enumerate(source.frames.key_map.cameras):
                frames[sel, slot] = resize_frames(batch["images"][camera], self.image_size)
                masks[sel, slot] = True
            chunk, dims = self.normalize(batch["action"], "action")
            actions[sel], action_mask[sel] = chunk, batch["action_mask"][..., None] & dims
            state = normalize_quantile(batch["state"].numpy(), self.stats["state"])
            for j, i in enumerate(sel.tolist()):
                label = bool(self.labels[idx[i]]) if self.conditional[idx[i]] else None
                texts[i] = self.prompt(source.tasks[rows[i]], label, state[j])
        ids, mask = self.tokenize(texts)
        out = {"frames": frames, "image_masks": masks, "input_ids": ids, "attention_mask": mask,
               "actions": actions, "action_mask": action_mask,
               "source": torch.from_numpy(src), "row": torch.from_numpy(rows)}  # fmt: skip
        if self.conditioning != NONE:  # per-branch metrics; behaviour cloning has one branch
            out["conditional"] = torch.from_numpy(self.conditional[idx].copy())
        return out

    def __getitem__(self, index: int) -> dict:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    collate = staticmethod(pass_through)  # __getitems__ already returns a batch

    def prompt(self, task: str, label: bool | None, state: np.ndarray | None) -> str:
        """The π0.5 text of one frame: task (+ advantage text) (+ binned normalized state)."""
        return pi05_prompt(advantage_prompt(task, label), state if self.state_in_prompt else None)

    def normalize(self, x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x normalized to [-1, 1] and padded to action_dim, dim mask bool[action_dim])``."""
        return pad_last(normalize_quantile(x.float(), self.stats[name]), self.action_dim)

    def tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids int64[n, L], mask bool[n, L])`` with L the longest prompt; each distinct text
        is tokenized once per process."""
        from recap.data.transforms import tokenize_prompts

        new = sorted({t for t in texts if t not in self._cache})
        if new:
            ids, mask = tokenize_prompts(self.tokenizer, new, self.max_length)
            self._cache.update(
                {t: ids[k, : int(mask[k].sum())].tolist() for k, t in enumerate(new)}
            )
        seqs = [self._cache[t] for t in texts]
        length = max([len(s) for s in seqs] + [1])
        ids = torch.zeros(len(seqs), length, dtype=torch.long)
        mask = torch.zeros(len(seqs), length, dtype=torch.bool)
        for k, seq in enumerate(seqs):
            ids[k, : len(seq)], mask[k, : len(seq)] = torch.tensor(seq, dtype=torch.long), True
        return ids, mask


@gin.configurable
def policy_data(
    split: str = "train",
    datasets: list[dict] = gin.REQUIRED,
    eval_datasets: list[dict] | None = None,
    data_root: str = "",
    advantages_tag: str = "",
    tokenizer_path: str = gin.REQUIRED,
    image_size: int = 224,
    action_horizon: int = 50,
    action_dim: int = 32,
    conditioning: str = "paper",
    dropout: float | None = None,
    state_in_prompt: bool = True,
    max_length: int = 200,
    mixing: str = "proportional",
    seed: int = 0,
) -> PolicyDataset:
    """Gin builder of the policy's train (``split="train"``) or eval data; eval sets use the
    training datasets' normalization statistics. ``action_horizon`` must equal the model's."""
    train_specs, specs = split_specs("policy_data", split, datasets, eval_datasets, data_root)
    args = dict(tokenizer=load_tokenizer(tokenizer_path), image_size=image_size,
                action_horizon=action_horizon, action_dim=action_dim, conditioning=conditioning,
                dropout=dropout, state_in_prompt=state_in_prompt, max_length=max_length,
                mixing=mixing, seed=seed)  # fmt: skip
    stats = None if split == "train" else training_stats(train_specs)  # not a whole train set
    return PolicyDataset(specs, advantages_tag, stats=stats, **args)
