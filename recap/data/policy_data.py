"""Step 4 training data: frames, action chunks and advantage-conditioned prompts (LeRobot).

``PolicyDataset`` mixes datasets like ``ValueDataset`` (same virtual index, ``mixing`` and
weights). Per item: uint8 frames resized to the model's image size in camera slots (base, left
wrist, right wrist), the next ``action_horizon`` actions quantile-normalized (q01/q99 -> -1/1,
unclipped) and zero-padded to ``action_dim`` (``action_mask`` False past the episode's end and on
padded dims), and the π0.5 prompt (``conditioning.pi05_prompt``: the task, the advantage text,
and with ``state_in_prompt`` the normalized state binned into the text) in ``prompt_style``
``openpi`` or ``lerobot``, whose token ids are those systems' own for the same task, state and
advantage text.

Conditioning (docs/spec.md §6): labels come from ``meta/advantages_{tag}.parquet`` by
(episode_index, frame_index); a frame without a label is a one-line error naming the file and the
frame. ``paper``: every frame gets its label's text, dropped to the plain prompt with probability
0.3; ``positive_only_conditional`` (RLinf): positives get the positive text except with
probability 0.1, negatives never; ``none``: the plain prompt (behaviour cloning, the baseline);
``filtered``: the positive frames only, with the plain prompt (filtered behaviour cloning, a
control of the validity benchmark).
The dropout is drawn afresh for every use of a frame, as in the paper's CFG training and RLinf (a
uniform per sample): the training sampler hands out *use indices* ``epoch * len + item``
(``redraws_per_epoch``), and epoch ``e``'s draw (``draw_conditional`` over all items) comes from
``(seed, e)`` only, so a resumed run sees the same prompts and every positive frame is seen with
and without its text over a run. ``seed`` defaults to ``train.seed``, so a seed study that
changes the training seed changes the dropout and the mixture too.

Normalization is openpi's quantile map, unclipped. Its statistics (``norm_stats``): ``checkpoint``
reads the ones the fine-tuned checkpoint carries (openpi ``assets/<asset_id>/norm_stats.json``,
LeRobot's normalizer file, ``recap.data.norm_stats.find_norm_stats``), ``data`` merges them over the
training datasets (``conditioning.quantile_stats``: min of q01, max of q99, pooled mean/std), and
``auto`` takes the checkpoint's when it has them, else the data's; one line says which. The
training split writes the statistics it uses into ``{train.run_dir}/assets/<asset_id>/
norm_stats.json`` (rank 0, atomically) beside the exported weights, as openpi's checkpoints carry
them. Each distinct prompt is tokenized once (a per-process cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from recap import logs
from recap.configurable import REQUIRED, bound, check_given, configurable
from recap.core import columns as C
from recap.data.conditioning import dataset_labels, draw_conditional, epoch_seed, quantile_stats
from recap.data.datasets import MIXING, _virtual_index
from recap.data.lerobot import KeyMap, LocalDataset, spec_key_map
from recap.data.loader import FrameDataset, pass_through
from recap.data.specs import DatasetSpec, SplitDataConfig
from recap.errors import DatasetError, RecapError, located
from recap.processing.cameras import NUM_CAMERAS
from recap.processing.normalize import LEROBOT_FORMULA, OPENPI_FORMULA, QuantileStats
from recap.processing.pi05 import Pi05Processor
from recap.processing.prompts import (  # noqa: F401  (CONDITIONING, PLAIN: re-exported)
    CONDITIONING,
    FILTERED,
    LABEL_IN_TASK,
    NONE,
    OPENPI,
    PLAIN,
    Prompt,
    check_label_position,
    check_style,
)
from recap.processing.transforms import load_tokenizer

CHECKPOINT, DATA, AUTO = "checkpoint", "data", "auto"
NORM_STATS = (CHECKPOINT, DATA, AUTO)
DEFAULT_ASSET_ID = "recap"  # the asset id of exported stats when policy_data.asset_id is None

log = logs.get(__name__)


@dataclass
class _Source:
    """One dataset: its frames (with action chunks), task texts and per-row labels."""

    spec: DatasetSpec
    frames: FrameDataset
    tasks: np.ndarray  # object[rows] task text of each row
    labels: np.ndarray  # bool[rows] (all True when unconditioned)


def merged_stats(sources: list[tuple[LocalDataset, KeyMap]]) -> dict[str, QuantileStats]:
    """``{"state", "action"}`` statistics over datasets: min of q01s, max of q99s per dim; mean
    and std pooled over all frames (each dataset weighted by its frame count)."""
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
        mean = std = None
        if all(p.mean is not None and p.std is not None for p in parts):
            w = np.array([float(dataset.num_frames) for dataset, _ in sources])[:, None]
            w = w / w.sum()
            means, stds = np.stack([p.mean for p in parts]), np.stack([p.std for p in parts])
            mean = (w * means).sum(0)
            std = np.sqrt((w * (stds**2 + (means - mean) ** 2)).sum(0))
        out[name] = QuantileStats(
            np.min([p.q01 for p in parts], 0), np.max([p.q99 for p in parts], 0), mean, std
        )
    return out


def training_stats(specs: list[DatasetSpec]) -> dict[str, QuantileStats]:
    """``merged_stats`` of the training datasets from their metadata (or state/action columns),
    without building their frames, labels and prompts (what an eval split needs)."""
    sources = []
    for spec in specs:
        dataset = LocalDataset(spec.root)
        sources.append((dataset, spec_key_map(spec, dataset.info)))
    return merged_stats(sources)


def resolve_stats(
    norm_stats: str,
    checkpoint: str | None,
    asset_id: str | None,
    specs: list[DatasetSpec],
) -> tuple[dict[str, QuantileStats], str]:
    """``(statistics, where they came from)`` for ``norm_stats`` ``checkpoint`` / ``data`` /
    ``auto`` (see the module docstring); checkpoint statistics are cut to the data's dims (as
    openpi's ``q01[..., :D]``), and fewer dims than the data's are a one-line error."""
    if norm_stats not in NORM_STATS:
        raise RecapError(f"policy_data.norm_stats: {norm_stats!r} is not one of "
                         f"{list(NORM_STATS)}")  # fmt: skip
    found = None
    if norm_stats != DATA:
        from recap.data.norm_stats import find_norm_stats

        if checkpoint is None and norm_stats == CHECKPOINT:
            raise RecapError("policy_data.norm_stats = \"checkpoint\" but policy_data.checkpoint "
                             "is None; bind it (the pi05_policy.checkpoint directory)")  # fmt: skip
        found = find_norm_stats(checkpoint, asset_id) if checkpoint is not None else None
        if found is None and norm_stats == CHECKPOINT:
            where = f"assets/{asset_id or '*'}/norm_stats.json"
            raise RecapError(f"{checkpoint}: no {where} or LeRobot normalizer file; use "
                             "policy_data.norm_stats = \"data\" or \"auto\"")  # fmt: skip
    if found is None:
        roots = ", ".join(s.name for s in specs)
        return training_stats(specs), f"the training data ({roots})"
    from recap.data.norm_stats import read_norm_stats

    stats, dims = read_norm_stats(found), data_dims(specs)
    for name, dim in dims.items():
        if len(stats[name]) < dim:
            raise RecapError(f"{found}: {name} statistics have {len(stats[name])} dims, the data "
                             f"{dim}; use policy_data.norm_stats = \"data\"")  # fmt: skip
        stats[name] = stats[name].first(dim)
    return stats, str(found)


def data_dims(specs: list[DatasetSpec]) -> dict[str, int]:
    """``{"state", "action"}`` sizes of the first dataset's features (info.json shapes)."""
    dataset = LocalDataset(specs[0].root)
    key_map = spec_key_map(specs[0], dataset.info)
    shape = {name: dataset.features[key].get("shape", [1])
             for name, key in (("state", key_map.state), ("action", key_map.action))}  # fmt: skip
    return {name: int(np.prod(s)) for name, s in shape.items()}


def describe_stats(stats: dict[str, QuantileStats], source: str) -> str:
    """The one-line report: where the statistics come from and their sizes."""
    return (f"policy_data: normalization statistics from {source} (state {len(stats['state'])} "
            f"dims, actions {len(stats['action'])} dims)")  # fmt: skip


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
            ones for eval sets, or a checkpoint's: ``resolve_stats``).
        prompt_style: ``openpi`` or ``lerobot`` (``conditioning.pi05_prompt``).
        label_position: ``task`` (the advantage text in the task text, RLinf's and openpi's
            prompt) or ``action`` (right before the final ``Action:``, after the state;
            ``conditioning.conditioned_prompt``).
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
        prompt_style: str = OPENPI,
        label_position: str = LABEL_IN_TASK,
        tokenizer_path: str | None = None,
        normalization: str = OPENPI_FORMULA,
    ):
        if conditioning not in CONDITIONING:
            raise RecapError(f"policy_data.conditioning: {conditioning!r} is not one of "
                             f"{list(CONDITIONING)}")  # fmt: skip
        if mixing not in MIXING:
            raise RecapError(f"policy_data.mixing: {mixing!r} is not one of {list(MIXING)}")
        self.tokenizer, self.image_size, self.max_length = tokenizer, image_size, max_length
        self.action_dim, self.state_in_prompt = action_dim, state_in_prompt
        self.prompt_style = check_style(prompt_style)
        self.label_position = check_label_position(label_position)
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
        if conditioning == FILTERED:  # a control (bench/recap_vs_bc.py): imitate positives only
            if not labels.any():
                raise RecapError(f"policy_data.conditioning {FILTERED!r}: advantages tag "
                                 f"{advantages_tag!r} labels no frame positive")  # fmt: skip
            self.source_of, self.row_of, labels = (
                self.source_of[labels], self.row_of[labels], labels[labels])  # fmt: skip
        self.labels = labels  # source_of is sorted, so this is in virtual-item order
        self.dropout, self.seed = dropout, int(seed)
        self._draws: dict[int, np.ndarray] = {}
        self.conditional = self.conditional_in(0)  # epoch 0 (evaluation uses plain indices)
        path = tokenizer_path or getattr(tokenizer, "path", None) or getattr(
            tokenizer, "name_or_path", "")  # fmt: skip
        self.processor = Pi05Processor(
            tokenizer=str(path), action_horizon=action_horizon, state_stats=self.stats["state"],
            action_stats=self.stats["action"], action_dim=action_dim, normalization=normalization,
            conditioning=conditioning, prompt_style=self.prompt_style,
            state_in_prompt=state_in_prompt, label_position=self.label_position,
            image_size=image_size, cameras=self.sources[0].frames.key_map.cameras,
            max_length=max_length, state_names=self._state_names(),
        ).use_tokenizer(tokenizer)  # fmt: skip
        need, task = self.processor.longest_prompt(t for s in self.sources for t in set(s.tasks))
        if need > max_length:  # a cut prompt loses the label or the action cue: refuse up front
            raise RecapError(f"policy_data.max_length = {max_length}: the prompts of task "
                             f"{task!r} take up to {need} tokens (BOS, task"
                             f"{', state' if state_in_prompt else ''}"
                             f"{', label' if conditioning not in PLAIN else ''}); bind "
                             f"policy_data.max_length = {need} or more")  # fmt: skip

    def _state_names(self) -> tuple[str, ...]:
        """The state feature's names in the first dataset's info.json (empty when unnamed)."""
        frames = self.sources[0].frames
        names = frames.dataset.features.get(frames.key_map.state, {}).get("names") or ()
        return tuple(str(n) for n in names) if isinstance(names, list | tuple) else ()

    def _source(self, spec: DatasetSpec, tag: str, key_map: KeyMap | None, horizon: int):
        key_map = key_map or spec_key_map(spec, max_dim=self.action_dim)  # gin's, else detected
        frames = FrameDataset(spec.root, key_map=key_map, action_horizon=horizon)
        if len(frames.key_map.cameras) > NUM_CAMERAS:
            message = (f"{len(frames.key_map.cameras)} cameras; the policy has {NUM_CAMERAS} "
                       "slots; name three with \"cameras\" in the dataset's gin entry")  # fmt: skip
            raise DatasetError(located(spec.root, message))
        tasks = frames.dataset.task_texts(frames.columns[C.TASK_INDEX])
        ep, fr = frames.columns[C.EPISODE_INDEX], frames.columns[C.FRAME_INDEX]
        if self.conditioning == NONE:
            labels = np.ones(len(ep), dtype=bool)
        else:
            labels = dataset_labels(spec.root, tag, ep, fr)
        return _Source(spec, frames, tasks, labels)

    redraws_per_epoch = True  # the training sampler passes use indices (epoch * len + item)
    # openpi asset name under which ``train`` writes the statistics beside the weights (None: not)
    export_asset: str | None = None

    def conditional_in(self, epoch: int) -> np.ndarray:
        """bool[items]: which items carry the advantage text in ``epoch`` (seeded by
        ``(seed, epoch)``; epoch 0 by ``seed`` alone). The last two epochs are kept."""
        if self.conditioning in PLAIN:
            return np.zeros(len(self.labels), dtype=bool)
        if epoch not in self._draws:
            seed = self.seed if epoch == 0 else epoch_seed(self.seed, epoch)
            generator = torch.Generator().manual_seed(seed)
            draw = draw_conditional(self.labels, self.conditioning, self.dropout, generator)
            self._draws = {e: d for e, d in self._draws.items() if e == epoch - 1}
            self._draws[epoch] = draw.numpy()
        return self._draws[epoch]

    def __len__(self) -> int:
        return int(self.source_of.shape[0])

    def check_model(self, model) -> None:
        """One-line ``RecapError`` when the tokenizer's ids do not fit the model's vocabulary
        (e.g. Gemma3's 262,144-token tokenizer with π0.5's 257,152 embeddings) or the action
        horizons differ: caught before training, not as an index error deep in a forward."""
        vocab = int(model.config.text["vocab_size"])
        size = len(self.tokenizer)
        if size > vocab:
            where = getattr(self.tokenizer, "path", None) or getattr(
                self.tokenizer, "name_or_path", "policy_data.tokenizer_path"
            )
            raise RecapError(f"{where}: tokenizer vocabulary {size:,} exceeds the model's "
                             f"{vocab:,} (pi05_policy.text vocab_size, or the checkpoint's); use "
                             "the checkpoint's own tokenizer (PaliGemma's "
                             "paligemma_tokenizer.model for π0.5: 257,152)")  # fmt: skip
        if model.config.action_horizon != self.action_horizon:
            raise RecapError(f"policy_data.action_horizon {self.action_horizon} != "
                             f"pi05_policy.action_horizon {model.config.action_horizon}; "
                             "bind both the same")  # fmt: skip

    def __getitems__(self, indices) -> dict:
        """A batch of items; an index ``epoch * len + item`` is ``item`` with that epoch's
        dropout draw (``redraws_per_epoch``)."""
        use = np.asarray(indices, dtype=np.int64)
        epochs, idx = np.divmod(use, len(self))
        conditional = np.zeros(idx.shape[0], dtype=bool)
        for epoch in np.unique(epochs).tolist():
            at = epochs == epoch
            conditional[at] = self.conditional_in(epoch)[idx[at]]
        src, rows, n = self.source_of[idx], self.row_of[idx], idx.shape[0]
        size, processor = self.image_size, self.processor
        frames = torch.zeros(n, NUM_CAMERAS, size, size, 3, dtype=torch.uint8)
        masks = torch.zeros(n, NUM_CAMERAS, dtype=torch.bool)
        horizon = self.action_horizon
        actions = torch.zeros(n, horizon, self.action_dim)
        action_mask = torch.zeros(n, horizon, self.action_dim, dtype=torch.bool)
        texts: list[Prompt] = [("",)] * n
        for s in np.unique(src).tolist():  # one batched fetch per dataset in the batch
            sel = np.flatnonzero(src == s)
            source = self.sources[s]
            batch = source.frames.__getitems__(rows[sel])
            frames[sel], masks[sel] = processor.pack(batch["images"], source.frames.key_map.cameras)
            chunk, dims = processor.normalize_actions(batch["action"])
            actions[sel], action_mask[sel] = chunk, batch["action_mask"][..., None] & dims
            state = processor.normalize_state(batch["state"].numpy())
            for j, i in enumerate(sel.tolist()):
                label = bool(self.labels[idx[i]]) if conditional[i] else None
                texts[i] = processor.prompt(source.tasks[rows[i]], label, state[j])
        ids, mask = processor.tokenize(texts)
        out = {"frames": frames, "image_masks": masks, "input_ids": ids, "attention_mask": mask,
               "actions": actions, "action_mask": action_mask,
               "source": torch.from_numpy(src), "row": torch.from_numpy(rows)}  # fmt: skip
        if self.conditioning not in PLAIN:  # per-branch metrics; behaviour cloning has one
            out["conditional"] = torch.from_numpy(conditional)
        return out

    def __getitem__(self, index: int) -> dict:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    collate = staticmethod(pass_through)  # __getitems__ already returns a batch

    def prompt(self, task: str, label: bool | None, state: np.ndarray | None) -> Prompt:
        """The π0.5 prompt of one frame (``Pi05Processor.prompt``)."""
        return self.processor.prompt(task, label, state)

    def tokenize(self, texts: list[Prompt]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids int64[n, L], mask bool[n, L])`` (``Pi05Processor.tokenize``)."""
        return self.processor.tokenize(texts)


@configurable("policy_data")
@dataclass(frozen=True)
class PolicyDataConfig(SplitDataConfig):
    """The policy's train (``split="train"``) or eval data (gin ``policy_data.*``); ``build()``
    makes the ``PolicyDataset`` (``train`` builds what ``train.data_fn = @policy_data`` returns).

    Both splits use the statistics of ``resolve_stats`` (``checkpoint``: the directory
    ``pi05_policy.checkpoint`` loads; ``asset_id``: its ``assets/<asset_id>``, any single one
    when None); the train split prints where they come from and, with ``export_stats``, names
    the asset (``export_asset``: ``asset_id or "recap"``) under which ``train`` writes them
    beside the weights, as openpi's ``assets/<asset>/norm_stats.json``.
    ``action_horizon`` must equal the model's. ``seed`` (label dropout and mixture) defaults to
    ``train.seed``. ``normalization``: the quantile formula (``recap.processing.normalize``);
    None: LeRobot's for statistics read from a LeRobot checkpoint's normalizer file, else
    openpi's. The train split's processor is written beside the weights by ``train``."""

    advantages_tag: str = ""
    tokenizer_path: str = REQUIRED
    image_size: int = 224
    action_horizon: int = 50
    action_dim: int = 32
    conditioning: str = "paper"
    dropout: float | None = None
    state_in_prompt: bool = True
    prompt_style: str = OPENPI
    label_position: str = LABEL_IN_TASK
    max_length: int = 200
    mixing: str = "proportional"
    seed: int | None = None
    norm_stats: str = AUTO
    checkpoint: str | None = None
    asset_id: str | None = None
    export_stats: bool = True
    normalization: str | None = None

    def __post_init__(self):
        check_given(self)
        check_style(self.prompt_style)
        check_label_position(self.label_position)

    def build(self) -> PolicyDataset:
        """The dataset of ``split``, every file read and checked."""
        c = self
        seed = int(bound("train.seed", 0)) if c.seed is None else c.seed
        train_specs, specs = c.split_specs()
        stats, source = resolve_stats(c.norm_stats, c.checkpoint, c.asset_id, train_specs)
        normalization = c.normalization
        if normalization is None:
            normalization = LEROBOT_FORMULA if source.endswith(".safetensors") else OPENPI_FORMULA
        args = dict(tokenizer=load_tokenizer(c.tokenizer_path), image_size=c.image_size,
                    action_horizon=c.action_horizon, action_dim=c.action_dim,
                    conditioning=c.conditioning, dropout=c.dropout,
                    state_in_prompt=c.state_in_prompt, max_length=c.max_length,
                    mixing=c.mixing, seed=seed, prompt_style=c.prompt_style,
                    label_position=c.label_position, tokenizer_path=c.tokenizer_path,
                    normalization=normalization)  # fmt: skip
        data = PolicyDataset(specs, c.advantages_tag, stats=stats, **args)
        if c.split == "train" and c.export_stats:  # ``train`` writes them beside the weights
            data.export_asset = c.asset_id or DEFAULT_ASSET_ID
        if c.split == "train" and logs.is_main():
            log.info(describe_stats(stats, source))
        return data


def run_stats(run_dir: str | Path, asset_id: str | None = None):
    """``(stats, path)`` a training run exported (``{run_dir}/assets/*/norm_stats.json``), or
    ``(None, None)`` when it has none (runs from before the export)."""
    from recap.data.norm_stats import find_norm_stats, read_norm_stats

    found = find_norm_stats(run_dir, asset_id or DEFAULT_ASSET_ID)
    found = found or find_norm_stats(run_dir, asset_id)
    return (read_norm_stats(found), found) if found is not None else (None, None)
