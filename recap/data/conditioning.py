"""Advantage conditioning for the Step 4 policy: prompts, label dropout, labels, quantile stats.

Prompts (SPEC "Step 4"): conditional ``"{task}\\nAdvantage: positive"`` (or ``negative``),
unconditional = the plain task. Which frames get the text (``draw_conditional``, one uniform per
frame from a ``torch.Generator``, so a seed reproduces it):

- ``paper``: every frame gets its label's text; dropped (unconditional) with probability
  ``prob`` (default 0.3).
- ``positive_only_conditional`` (RLinf): positives get the positive text except with probability
  ``prob`` (default ``unconditional_prob`` 0.1); negatives always get the plain task.

π0.5 then writes the task (``clean_prompt``: stripped, ``_`` and newlines to spaces, as openpi,
so RLinf's ``"{task}\\nAdvantage: positive"`` reads ``"{task} Advantage: positive"``) and, with a
state, its 256 bins (``discretize_state``) into one text, in a named style (``pi05_prompt``):

- ``openpi`` (``PaligemmaTokenizer``): with state ``"Task: {cleaned}, State: {bins};\\nAction: "``
  tokenized with BOS; without state (``discrete_state_input=False``, pi05_libero) the cleaned task
  with BOS, then ``"\\n"`` tokenized on its own.
- ``lerobot`` (``Pi05PrepareStateTokenizerProcessorStep``): ``"Task: {cleaned}, State:
  {bins};\\nAction: "`` or ``"Task: {cleaned};\\nAction: "``, with BOS.

A prompt is a tuple of segments: its ids are BOS followed by each segment's ids, every segment
encoded on its own (``transforms.tokenize_prompts``). ``policy_prompts`` builds the training
texts, ``inference_prompts`` the conditional/unconditional pair for guided sampling;
``pad_last`` pads actions/states to 32 dims.

Labels: the boolean ``advantage`` column of ``meta/advantages_{tag}.parquet`` joined to frames by
(episode_index, frame_index) (``lookup_labels``). Normalization, exactly openpi's (not clipped):
x -> (x - q01) / (q99 - q01 + 1e-6) * 2 - 1 and back, with per-dimension quantiles from
``meta/stats.json`` (LeRobot v3.0 writes q01/q99), computed from the data columns when absent
(``quantile_stats``), or from a checkpoint's ``norm_stats.json`` (``recap.data.norm_stats``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from recap.core import columns as C
from recap.errors import RecapError

POSITIVE_TEXT = "Advantage: positive"
NEGATIVE_TEXT = "Advantage: negative"
PAPER = "paper"
POSITIVE_ONLY = "positive_only_conditional"
MODES = (PAPER, POSITIVE_ONLY)
DEFAULT_PROB = {PAPER: 0.3, POSITIVE_ONLY: 0.1}
STATE_BINS = 256
QUANTILE_EPS = 1e-6
OPENPI, LEROBOT = "openpi", "lerobot"
PROMPT_STYLES = (OPENPI, LEROBOT)
# Where the advantage text goes: in the task text (RLinf and openpi: before the state when the
# state is in the prompt) or right before the final "Action: " (after the state).
LABEL_IN_TASK, LABEL_BEFORE_ACTION = "task", "action"
LABEL_POSITIONS = (LABEL_IN_TASK, LABEL_BEFORE_ACTION)
ACTION_CUE = "Action: "
Prompt = tuple[str, ...]  # segments, each tokenized on its own after one BOS


def advantage_prompt(task: str, label: bool | None) -> str:
    """``"{task}\\nAdvantage: positive"`` (True), ``...negative`` (False), ``task`` (None)."""
    if label is None:
        return task
    return f"{task}\n{POSITIVE_TEXT if label else NEGATIVE_TEXT}"


def draw_conditional(
    labels: np.ndarray | torch.Tensor,
    mode: str = PAPER,
    prob: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """bool[N]: which frames get their label's text. u ~ U[0, 1) per frame; ``paper``:
    u >= prob; ``positive_only_conditional``: label & (u >= prob). ``prob`` defaults to the
    mode's (0.3 / 0.1)."""
    if mode not in MODES:
        raise RecapError(f"conditioning mode {mode!r} is not one of {MODES}")
    prob = DEFAULT_PROB[mode] if prob is None else float(prob)
    if not 0.0 <= prob <= 1.0:
        raise RecapError(f"conditioning: dropout probability {prob} not in [0, 1]")
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.bool)
    keep = torch.rand(labels.shape, generator=generator) >= prob
    return keep if mode == PAPER else keep & labels


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed for epoch ``epoch`` of a run seeded ``seed`` (``numpy.SeedSequence``), so
    each epoch's dropout draw is independent of the others and reproducible."""
    return int(np.random.SeedSequence([int(seed), int(epoch)]).generate_state(2, np.uint64)[0] >> 1)


def condition_tasks(
    tasks: Sequence[str],
    labels: np.ndarray | torch.Tensor,
    mode: str = PAPER,
    prob: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[list[str], torch.Tensor]:
    """``(task texts, conditional bool[N])``: ``advantage_prompt(task, label)`` where
    ``draw_conditional`` keeps the text, else the plain task."""
    conditional = draw_conditional(labels, mode, prob, generator)
    flags = np.asarray(labels, dtype=bool).tolist()
    texts = [advantage_prompt(t, lab if c else None)
             for t, lab, c in zip(tasks, flags, conditional.tolist())]  # fmt: skip
    return texts, conditional


def discretize_state(state: np.ndarray) -> np.ndarray:
    """int64[..., D] bin of each normalized state value: digitize over linspace(-1, 1, 257)[:-1]
    minus 1, i.e. 0..255 on [-1, 1] (openpi)."""
    bins = np.linspace(-1.0, 1.0, STATE_BINS + 1)[:-1]
    return np.digitize(np.asarray(state, dtype=np.float64), bins).astype(np.int64) - 1


def clean_prompt(task: str) -> str:
    """openpi's (and LeRobot's) cleaning: stripped, ``_`` and newlines to spaces."""
    return task.strip().replace("_", " ").replace("\n", " ")


def check_style(style: str) -> str:
    if style not in PROMPT_STYLES:
        raise RecapError(f"policy_data.prompt_style: {style!r} is not one of {list(PROMPT_STYLES)}")
    return style


def pi05_prompt(task: str, state: np.ndarray | None = None, style: str = OPENPI) -> Prompt:
    """The π0.5 prompt segments of ``task`` (``state`` float[D] normalized, or None): with state
    ``("Task: {cleaned}, State: {bins};\\nAction: ",)`` in both styles; without, openpi
    ``(cleaned, "\\n")`` and lerobot ``("Task: {cleaned};\\nAction: ",)``."""
    check_style(style)
    cleaned = clean_prompt(task)
    if state is not None:
        digits = " ".join(str(int(s)) for s in discretize_state(state))
        return (f"Task: {cleaned}, State: {digits};\nAction: ",)
    if style == OPENPI:
        return (cleaned, "\n")
    return (f"Task: {cleaned};\nAction: ",)


def check_label_position(position: str) -> str:
    if position not in LABEL_POSITIONS:
        raise RecapError(f"policy_data.label_position: {position!r} is not one of "
                         f"{list(LABEL_POSITIONS)}")  # fmt: skip
    return position


def conditioned_prompt(
    task: str,
    label: bool | None,
    state: np.ndarray | None = None,
    style: str = OPENPI,
    position: str = LABEL_IN_TASK,
) -> Prompt:
    """The π0.5 prompt of ``task`` with ``label``'s advantage text (None: the plain prompt).
    ``position="task"``: ``pi05_prompt(advantage_prompt(task, label), state, style)``, as RLinf
    and openpi build it (with the state in the prompt the label precedes the state);
    ``"action"``: the plain prompt with ``"Advantage: positive\n"`` inserted before its final
    ``"Action: "`` (after the state); a prompt without that cue (openpi style without state,
    whose task text already ends the prompt) takes the label in the task text as ``"task"``."""
    check_label_position(position)
    if label is None:
        return pi05_prompt(task, state, style)
    plain = pi05_prompt(task, state, style)
    if position == LABEL_IN_TASK or not plain[-1].endswith(ACTION_CUE):
        return pi05_prompt(advantage_prompt(task, label), state, style)
    text = POSITIVE_TEXT if label else NEGATIVE_TEXT
    return (*plain[:-1], plain[-1][: -len(ACTION_CUE)] + f"{text}\n{ACTION_CUE}")


def policy_prompts(
    tasks: Sequence[str],
    states: np.ndarray | None,
    labels: np.ndarray | torch.Tensor,
    mode: str = PAPER,
    prob: float | None = None,
    generator: torch.Generator | None = None,
    style: str = OPENPI,
) -> tuple[list[Prompt], torch.Tensor]:
    """Training prompts ``(prompts, conditional bool[N])``: ``pi05_prompt`` of the
    ``condition_tasks`` texts with each frame's normalized state float[N, D] (or no state)."""
    texts, conditional = condition_tasks(tasks, labels, mode, prob, generator)
    rows = [None] * len(texts) if states is None else list(np.asarray(states))
    return [pi05_prompt(t, s, style) for t, s in zip(texts, rows)], conditional


def inference_prompts(
    tasks: Sequence[str], states: np.ndarray | None, style: str = OPENPI
) -> tuple[list[Prompt], list[Prompt]]:
    """``(conditional, unconditional)`` prompts for guided sampling: the positive text, and the
    plain task (``sample_actions`` batch keys ``input_ids`` / ``uncond_input_ids``)."""
    rows = [None] * len(tasks) if states is None else list(np.asarray(states))
    positive = [pi05_prompt(advantage_prompt(t, True), s, style) for t, s in zip(tasks, rows)]
    return positive, [pi05_prompt(t, s, style) for t, s in zip(tasks, rows)]


def pad_last(x: np.ndarray | torch.Tensor, size: int = 32):
    """``(x zero-padded to [..., size], mask bool[size])`` (True on the original D dims)."""
    dim = x.shape[-1]
    if dim > size:
        raise RecapError(f"feature of {dim} dims exceeds the model's {size}; raise action_dim")
    mask = np.arange(size) < dim
    if torch.is_tensor(x):
        return torch.nn.functional.pad(x, (0, size - dim)), torch.from_numpy(mask)
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - dim)]), mask


def lookup_labels(
    episode_index: np.ndarray, frame_index: np.ndarray, table: pa.Table, source: object
) -> np.ndarray:
    """bool[N] ``advantage`` of each frame from ``table`` (episode_index, frame_index,
    advantage; extra rows allowed). A frame without a row, or a duplicate row, is a one-line
    error naming ``source`` (the advantages file) and the first such frame."""
    for name in (C.EPISODE_INDEX, C.FRAME_INDEX, C.ADVANTAGE):
        if name not in table.column_names:
            raise RecapError(f"{source}: column {name!r} missing (have {table.column_names}); "
                             "recompute the advantages (Step 3)")  # fmt: skip
    t_ep = table.column(C.EPISODE_INDEX).to_numpy().astype(np.int64)
    t_fr = table.column(C.FRAME_INDEX).to_numpy().astype(np.int64)
    ep, fr = np.asarray(episode_index, np.int64), np.asarray(frame_index, np.int64)
    width = int(max(fr.max(initial=0), t_fr.max(initial=0))) + 1
    keys, wanted = t_ep * width + t_fr, ep * width + fr
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    if np.any(sorted_keys[1:] == sorted_keys[:-1]):
        i = order[int(np.argmax(sorted_keys[1:] == sorted_keys[:-1]))]
        raise RecapError(f"{source}: duplicate row for (episode_index={t_ep[i]}, "
                         f"frame_index={t_fr[i]}); recompute the advantages")  # fmt: skip
    pos = np.minimum(np.searchsorted(sorted_keys, wanted), max(len(keys) - 1, 0))
    found = sorted_keys[pos] == wanted if len(keys) else np.zeros(len(wanted), dtype=bool)
    if not found.all():
        i = int(np.argmin(found))
        raise RecapError(f"{source}: no advantage label for (episode_index={ep[i]}, "
                         f"frame_index={fr[i]}) ({int((~found).sum())} of {len(wanted)} frames "
                         "unlabeled); recompute the advantages for this dataset or pick its "
                         "tag")  # fmt: skip
    labels = table.column(C.ADVANTAGE).to_numpy(zero_copy_only=False)
    if labels.dtype == object:
        raise RecapError(f"{source}: column 'advantage' has nulls; recompute the advantages")
    return labels.astype(bool)[order[pos]]


def dataset_labels(
    root: str | os.PathLike, tag: str, episode_index: np.ndarray, frame_index: np.ndarray
) -> np.ndarray:
    """bool[N] labels of the given frames (all of a dataset's) from
    ``{root}/meta/advantages_{tag}.parquet``; ``advantage`` is read by value (bool or exactly
    0/1, ``read_advantages``), and rows for frames the dataset lacks are an error."""
    from recap.data.sidecars import ADVANTAGES, read_advantages, sidecar_path

    needed = (C.EPISODE_INDEX, C.FRAME_INDEX, C.ADVANTAGE)  # RLinf's narrow files have these
    table, _ = read_advantages(root, tag, needed)
    path = sidecar_path(root, ADVANTAGES, tag)
    labels = lookup_labels(episode_index, frame_index, table, path)
    extra = table.num_rows - len(labels)  # every frame found once, no duplicate rows
    if extra > 0:
        raise RecapError(
            f"{path}: {extra} rows match no frame of the dataset (computed from other data); "
            "recompute the advantages (Step 3) for this dataset"
        )
    return labels


@dataclass(frozen=True)
class QuantileStats:
    """Per-dimension 1% and 99% quantiles float64[D] of one feature, with its mean and standard
    deviation when known (openpi's ``norm_stats.json`` requires them; π0.5 reads only q01/q99)."""

    q01: np.ndarray
    q99: np.ndarray
    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.q01)

    def first(self, dim: int) -> QuantileStats:
        """The stats of the first ``dim`` dimensions (openpi normalizes with ``q01[:D]``)."""
        cut = [None if v is None else np.asarray(v)[:dim] for v in (self.mean, self.std)]
        return QuantileStats(np.asarray(self.q01)[:dim], np.asarray(self.q99)[:dim], *cut)


def normalize_quantile(x: np.ndarray | torch.Tensor, stats: QuantileStats):
    """(x - q01) / (q99 - q01 + 1e-6) * 2 - 1 over the last dim [..., D], not clipped (openpi's
    ``Normalize(use_quantiles=True)``, LeRobot's QUANTILES): values outside [q01, q99] map
    outside [-1, 1]."""
    q01, q99 = _as(stats.q01, x), _as(stats.q99, x)
    return (x - q01) / (q99 - q01 + QUANTILE_EPS) * 2.0 - 1.0


def unnormalize_quantile(y: np.ndarray | torch.Tensor, stats: QuantileStats):
    """Inverse on the first D dims of y [..., >= D]: (y + 1) / 2 * (q99 - q01 + 1e-6) + q01;
    padded dims beyond D are dropped."""
    dim = len(stats.q01)
    y = y[..., :dim]
    q01, q99 = _as(stats.q01, y), _as(stats.q99, y)
    return (y + 1.0) / 2.0 * (q99 - q01 + QUANTILE_EPS) + q01


def _as(values: np.ndarray, like):
    """The stats as ``like``'s kind: a tensor of its dtype, or a float64 array (numpy inputs are
    normalized in float64, as openpi's float32 data against its float64 statistics, so the state
    bins fall where openpi's do)."""
    if torch.is_tensor(like):
        return torch.as_tensor(values, dtype=like.dtype, device=like.device)
    return np.asarray(values, dtype=np.float64)


def quantile_stats(dataset, keys: Sequence[str]) -> dict[str, QuantileStats]:
    """q01/q99 of each feature in ``keys`` for a ``LocalDataset``: from ``meta/stats.json`` when
    it has them, else computed (linear interpolation) from the data columns."""
    path = Path(dataset.root) / "meta" / "stats.json"
    stats = _read_stats(path)
    out, missing = {}, []
    for key in keys:
        entry = stats.get(key, {})
        if "q01" in entry and "q99" in entry:
            moments = [np.asarray(entry[m], float) if m in entry else None for m in ("mean", "std")]
            out[key] = QuantileStats(
                np.asarray(entry["q01"], float), np.asarray(entry["q99"], float), *moments
            )
        else:
            missing.append(key)
    if missing:
        table = dataset.read_columns(missing, check_frames=False)
        for key in missing:
            values = np.stack(table.column(key).to_numpy(zero_copy_only=False)).astype(float)
            values = values.reshape(len(values), -1)
            q01, q99 = np.quantile(values, [0.01, 0.99], axis=0)
            out[key] = QuantileStats(q01, q99, values.mean(0), values.std(0))
    return out


def _read_stats(path: os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise RecapError(f"{path}: not valid JSON ({exc}); fix or delete it") from exc
