"""``Pi05Processor``: everything between a raw frame or observation and π0.5 tensors, and back.

A policy is its weights **plus** this processor, saved together as ``processor.json`` beside
``model.safetensors`` (openpi keeps ``assets/*/norm_stats.json`` there, LeRobot its processor
files). Training (``recap.data.policy_data``), closed-loop evaluation, collection and
``recap-serve`` all call the same methods, so they cannot disagree on how a camera, a state or a
prompt becomes a tensor:

- cameras: ``pack`` puts images into the model's slots (``cameras`` in slot order, else the one
  rule ``recap.processing.cameras.slot_order``), resized with ``resize`` to ``image_size``;
- state and actions: quantile-normalized with their statistics **and** the formula they were
  trained with (``normalization``: openpi's or LeRobot's, ``recap.processing.normalize``);
  actions padded to ``action_dim``, chunks of ``action_horizon``, unnormalized on the way out;
- prompts: ``conditioned_prompt`` in ``prompt_style`` with the binned state when
  ``state_in_prompt`` and the label at ``label_position``, tokenized with ``tokenizer``
  (BOS + each segment, at most ``max_length`` tokens);
- ``state_names``: the training data's state feature names (what the state means);
- guidance: which prompt branches a request at strength ``beta`` needs (``guidance_branches``,
  the rule ``Pi05Policy.sample_actions`` applies), refused where the ``conditioning`` never
  trained that prompt; ``num_steps`` Euler steps.

``to_json`` / ``from_json`` round-trip every field; a missing or unknown field is one line naming
it. The tokenizer is stored as a path, relative to the processor's directory when it lies inside.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from recap.errors import RecapError
from recap.processing.cameras import NUM_CAMERAS, slot_order
from recap.processing.normalize import (
    FORMULAS,
    OPENPI_FORMULA,
    QuantileStats,
    check_formula,
    normalize_quantile,
    pad_last,
    unnormalize_quantile,
)
from recap.processing.prompts import (
    CONDITIONING,
    LABEL_IN_TASK,
    OPENPI,
    PLAIN,
    POSITIVE_ONLY,
    STATE_BINS,
    Prompt,
    check_label_position,
    check_style,
    conditioned_prompt,
)
from recap.processing.transforms import RESIZE_ANTIALIAS, check_resize, pack_cameras

PROCESSOR_FILE = "processor.json"
PI05_KIND = "pi05"
# Guidance (RLinf's ``guidance_type``): the prompt whose velocity is contrasted with the plain one.
POSITIVE, NEGATIVE, NO_GUIDE = "positive", "negative", "no_guide"
GUIDANCE = (POSITIVE, NEGATIVE, NO_GUIDE)
PLAIN_BRANCH = "plain"
# branch -> the batch keys of its prompt, and the label its prompt carries
BRANCH_KEYS = {POSITIVE: ("input_ids", "attention_mask"),
               NEGATIVE: ("neg_input_ids", "neg_attention_mask"),
               PLAIN_BRANCH: ("uncond_input_ids", "uncond_attention_mask")}  # fmt: skip
BRANCH_LABEL = {POSITIVE: True, NEGATIVE: False, PLAIN_BRANCH: None}


def check_guidance(guidance: str, conditioning: str | None = None, where: str = "guidance") -> str:
    """``guidance`` if it is one of ``GUIDANCE`` and the ``conditioning`` trained its prompt."""
    if guidance not in GUIDANCE:
        raise RecapError(f"{where}: {guidance!r} is not one of {list(GUIDANCE)}")
    if guidance == NEGATIVE and conditioning == POSITIVE_ONLY:
        raise RecapError(f"{where}: 'negative' is refused for a policy trained with "
                         f"{POSITIVE_ONLY} (it never saw the negative prompt); use 'positive' "
                         "or 'no_guide'")  # fmt: skip
    return guidance


def guidance_branches(beta: float, guidance: str = POSITIVE, conditioning: str | None = None):
    """The prompt branches whose velocities are combined, v = v_plain + beta (v_guide - v_plain):
    ``("plain",)`` for beta 0, ``no_guide`` or a behaviour-cloning policy (one prompt), the
    guide alone for beta 1, else ``(guide, "plain")``."""
    check_guidance(guidance, conditioning)
    if conditioning in PLAIN or guidance == NO_GUIDE or beta == 0.0:
        return (PLAIN_BRANCH,)
    return (guidance,) if beta == 1.0 else (guidance, PLAIN_BRANCH)


def _stats_json(stats: QuantileStats | None):
    return None if stats is None else stats.to_json()


@dataclasses.dataclass(frozen=True, eq=False)
class Pi05Processor:
    """The transform that feeds one π0.5 policy (see the module docstring for each field)."""

    tokenizer: str
    action_horizon: int
    state_stats: QuantileStats
    action_stats: QuantileStats
    action_dim: int = 32
    normalization: str = OPENPI_FORMULA
    conditioning: str = "paper"
    prompt_style: str = OPENPI
    state_in_prompt: bool = True
    label_position: str = LABEL_IN_TASK
    guidance: str = POSITIVE
    num_steps: int = 10
    image_size: int = 224
    resize: str = RESIZE_ANTIALIAS
    cameras: tuple[str, ...] = ()
    num_slots: int = NUM_CAMERAS
    max_length: int = 200
    vocab_size: int | None = None
    state_names: tuple[str, ...] = ()

    def __post_init__(self):
        if self.conditioning not in CONDITIONING:
            raise RecapError(f"processor: conditioning {self.conditioning!r} is not one of "
                             f"{list(CONDITIONING)}")  # fmt: skip
        check_formula(self.normalization)
        check_style(self.prompt_style)
        check_label_position(self.label_position)
        check_guidance(self.guidance, self.conditioning, "processor: guidance")
        check_resize(self.resize)
        object.__setattr__(self, "cameras", tuple(self.cameras))
        object.__setattr__(self, "state_names", tuple(self.state_names))
        if len(self.cameras) > self.num_slots:
            raise RecapError(f"processor: {len(self.cameras)} cameras {self.cameras} but the "
                             f"model has {self.num_slots} slots; name at most "
                             f"{self.num_slots}")  # fmt: skip
        for name in ("action_horizon", "num_steps", "image_size", "max_length", "action_dim"):
            if int(getattr(self, name)) < 1:
                raise RecapError(f"processor: {name} = {getattr(self, name)} must be >= 1")
        if len(self.action_stats) > self.action_dim:
            raise RecapError(f"processor: {len(self.action_stats)} action dims exceed the "
                             f"model's {self.action_dim}; use the policy's own "
                             "statistics")  # fmt: skip
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_tokenizer", None)
        object.__setattr__(self, "_cache", {})

    def __getstate__(self) -> dict:
        """Pickled (data-loader workers) without its lock; the loaded tokenizer and the
        prompt cache travel with it."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "_lock", threading.Lock())

    # ---- sizes ----------------------------------------------------------------------------

    @property
    def state_dim(self) -> int:
        return len(self.state_stats)

    @property
    def robot_action_dim(self) -> int:
        """The robot's action dims (the statistics'), before padding to ``action_dim``."""
        return len(self.action_stats)

    @property
    def plain_only(self) -> bool:
        """A behaviour-cloning policy: one prompt, served and evaluated at beta 1."""
        return self.conditioning in PLAIN

    def replace(self, **changes) -> Pi05Processor:
        return dataclasses.replace(self, **changes)

    def for_model(self, config) -> Pi05Processor:
        """This processor with what only the model (a ``Pi05Config``) knows: its sampling
        steps and vocabulary (checked against the tokenizer when it is loaded)."""
        if config is None:
            return self
        done = self.replace(num_steps=int(config.num_steps),
                            vocab_size=int(config.text["vocab_size"]))  # fmt: skip
        return done.use_tokenizer(self._tokenizer) if self._tokenizer is not None else done

    # ---- text -----------------------------------------------------------------------------

    def load_tokenizer(self):
        """The tokenizer object (loaded once; ``transforms.load_tokenizer``); its vocabulary is
        checked against ``vocab_size`` and it must define BOS."""
        with self._lock:
            if self._tokenizer is None:
                from recap.processing.transforms import load_tokenizer

                tokenizer = load_tokenizer(self.tokenizer)
                if tokenizer.bos_token_id is None:
                    raise RecapError(f"{self.tokenizer}: tokenizer has no BOS token; use the "
                                     "policy's own tokenizer")  # fmt: skip
                if self.vocab_size is not None and len(tokenizer) > self.vocab_size:
                    raise RecapError(f"{self.tokenizer}: vocabulary {len(tokenizer):,} exceeds "
                                     f"the model's {self.vocab_size:,}; use the policy's own "
                                     "tokenizer")  # fmt: skip
                object.__setattr__(self, "_tokenizer", tokenizer)
            return self._tokenizer

    def use_tokenizer(self, tokenizer) -> Pi05Processor:
        """This processor with an already loaded ``tokenizer`` object (tests, training)."""
        object.__setattr__(self, "_tokenizer", tokenizer)
        return self

    def prompt(self, task: str, label: bool | None, state: np.ndarray | None) -> Prompt:
        """The π0.5 prompt of one frame: ``task`` (+ ``label``'s advantage text at
        ``label_position``) (+ the binned normalized ``state`` when ``state_in_prompt``)."""
        state = state if self.state_in_prompt else None
        return conditioned_prompt(task, label, state, self.prompt_style, self.label_position)

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        """BOS + each segment's ids, untruncated; each distinct prompt encoded once."""
        tokens = self._cache.get(prompt)
        if tokens is None:
            tokens = self._cache[prompt] = self._encode(prompt)
        return tokens

    def _encode(self, prompt: Prompt) -> list[int]:
        tokenizer = self.load_tokenizer()
        with self._lock:
            ids = tokenizer(list(prompt), add_special_tokens=False)["input_ids"]
        return [tokenizer.bos_token_id, *(t for part in ids for t in part)]

    def tokenize(self, prompts: Sequence[Prompt]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids int64[n, L], mask bool[n, L])``: each prompt's tokens right-padded with 0 to the
        longest, L >= 1. A prompt longer than ``max_length`` is a ``RecapError``: cutting it
        would cut the advantage label or the action cue the policy was trained to read (training
        checks every prompt its data can make up front: ``longest_prompt``)."""
        from recap.processing.transforms import pad_token_rows

        rows = [self.prompt_tokens(prompt) for prompt in prompts]
        for prompt, tokens in zip(prompts, rows):
            if len(tokens) > self.max_length:
                raise RecapError(f"prompt {''.join(prompt)!r}: {len(tokens)} tokens, more than "
                                 f"the policy's max_length {self.max_length} "
                                 "(policy_data.max_length); train with a longer max_length or "
                                 "shorten the task text")  # fmt: skip
        return pad_token_rows(rows)

    def longest_prompt(self, tasks: Iterable[str]) -> tuple[int, str]:
        """``(tokens, task)``: the most tokens a prompt of one of ``tasks`` can take, and that
        task. Every label counts (positive, negative and none; none only for the plain modes),
        and with the state in the prompt every dimension at its longest bin text (the
        bin whose all-dimensions prompt is longest: -1 below the statistics' range, 0..255
        inside; bins are space-separated, so each dimension's text is tokenized on its own): the
        bound no frame, rollout or request of these tasks can exceed."""
        tasks = sorted(set(tasks))
        if not tasks:
            return 0, ""
        labels = (None,) if self.plain_only else (None, True, False)
        state = None
        if self.state_in_prompt:
            width = {}
            for v in range(-1, STATE_BINS):  # the normalized value at the centre of bin v
                value = -2.0 if v < 0 else -1.0 + (v + 0.5) * 2.0 / STATE_BINS
                row = np.full(self.state_dim, value)
                width[len(self._encode(self.prompt(tasks[0], None, row)))] = row
            state = width[max(width)]
        need = {task: max(len(self._encode(self.prompt(task, label, state)))
                          for label in labels) for task in tasks}  # fmt: skip
        task = max(tasks, key=lambda t: need[t])
        return need[task], task

    # ---- state, actions -------------------------------------------------------------------

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """float64[..., D]: the state in the model's [-1, 1] quantile space (float64, so the
        prompt's bins fall where openpi's / LeRobot's do)."""
        state = np.asarray(state, dtype=np.float64)
        if state.shape[-1] != self.state_dim:
            raise RecapError(f"state: {state.shape[-1]} dims, the policy's statistics "
                             f"{self.state_dim}")  # fmt: skip
        return normalize_quantile(state, self.state_stats, self.normalization)

    def normalize_actions(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(float32[..., action_dim] normalized and zero-padded, dim mask bool[action_dim])``
        (computed in float64, as openpi)."""
        normalized = normalize_quantile(actions.double(), self.action_stats, self.normalization)
        return pad_last(normalized.float(), self.action_dim)

    def unnormalize_actions(self, chunk: torch.Tensor | np.ndarray) -> np.ndarray:
        """float64[..., robot action dims]: a sampled (normalized, padded) chunk in the robot's
        units."""
        if torch.is_tensor(chunk):
            chunk = chunk.double().cpu().numpy()
        return unnormalize_quantile(np.asarray(chunk, np.float64), self.action_stats,
                                    self.normalization)  # fmt: skip

    # ---- images ---------------------------------------------------------------------------

    def slot_cameras(self, available: Sequence[str]) -> list[str]:
        """The camera of each slot for observations with cameras ``available``: ``cameras``
        when every available camera is one of them (slots by position, a missing one masked),
        else the one rule, ``slot_order``."""
        if self.cameras and set(available) <= set(self.cameras):
            return list(self.cameras)
        return slot_order(available)

    def pack(
        self, images: Mapping[str, np.ndarray | torch.Tensor | None],
        cameras: Sequence[str] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """``(uint8[N, num_slots, S, S, 3], bool[N, num_slots])`` of camera key -> uint8[N, H,
        W, 3]; ``cameras``: the key of each slot (a dataset's key map), else ``slot_cameras``."""
        cameras = self.slot_cameras(list(images)) if cameras is None else cameras
        return pack_cameras(images, self.image_size, cameras, self.num_slots, self.resize)

    # ---- batches --------------------------------------------------------------------------

    def branches(self, beta: float, guidance: str | None = None) -> tuple[str, ...]:
        """The prompt branches a request at ``beta`` needs (``guidance_branches``)."""
        return guidance_branches(beta, guidance or self.guidance, self.conditioning)

    def check_beta(self, beta: float) -> float:
        """``beta`` as sampled: 1 for a behaviour-cloning policy (nothing to contrast)."""
        return 1.0 if self.plain_only else float(beta)

    def branch_prompts(
        self, task: str, state: np.ndarray | None, branches: Sequence[str]
    ) -> dict[str, Prompt]:
        """The prompt of each branch for one frame (normalized ``state``): the label its branch
        carries (``BRANCH_LABEL``), none for a behaviour-cloning policy."""
        return {b: self.prompt(task, None if self.plain_only else BRANCH_LABEL[b], state)
                for b in branches}  # fmt: skip

    def prompt_batch(
        self, tasks: Sequence[str], states: np.ndarray | None, branches: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """The token keys of ``branches`` (``BRANCH_KEYS``) for tasks and normalized states."""
        rows = [None] * len(tasks) if states is None else list(states)
        per_frame = [self.branch_prompts(t, s, branches) for t, s in zip(tasks, rows)]
        batch = {}
        for branch in branches:
            ids, mask = self.tokenize([prompts[branch] for prompts in per_frame])
            batch[BRANCH_KEYS[branch][0]], batch[BRANCH_KEYS[branch][1]] = ids, mask
        return batch

    def sample(
        self, model, batch: Mapping[str, torch.Tensor], noise: torch.Tensor, beta: float,
        num_steps: int | None = None, guidance: str | None = None,
    ) -> np.ndarray:  # fmt: skip
        """float64[B, H, robot action dims]: ``model.sample_actions`` on a batch of
        ``obs_to_batch`` (or the server's), guided as this processor's policy was trained
        (``no_guide`` for one prompt), unnormalized."""
        guidance = NO_GUIDE if self.plain_only else (guidance or self.guidance)
        positive_only = self.conditioning == POSITIVE_ONLY
        with torch.no_grad():
            chunk = model.sample_actions(
                dict(batch), noise, beta, num_steps or self.num_steps, guidance=guidance,
                positive_only=positive_only,
            )  # fmt: skip
        return self.unnormalize_actions(chunk)

    def obs_to_batch(
        self,
        observations: Mapping,
        beta: float = 1.0,
        guidance: str | None = None,
        branches: Sequence[str] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The ``sample_actions`` batch of batched observations ``{"images": {camera:
        uint8[B, H, W, 3]}, "state": float[B, D] (optional without state_in_prompt), "task":
        [str] * B}``: camera slots, and the prompts of ``branches`` (default: those ``beta``
        and ``guidance`` need)."""
        frames, masks = self.pack(observations["images"])
        state = observations.get("state")
        normalized = None if state is None else self.normalize_state(state)
        if normalized is None and self.state_in_prompt:
            raise RecapError(f"observation: no state; this policy reads its {self.state_dim}-dim "
                             "state in the prompt")  # fmt: skip
        branches = branches or self.branches(beta, guidance)
        tasks = list(observations["task"])
        return {"frames": frames, "image_masks": masks,
                **self.prompt_batch(tasks, normalized, branches)}  # fmt: skip

    def check_model(self, config) -> None:
        """One-line error when the model's horizon, action size or vocabulary (a
        ``Pi05Config``) is not this processor's."""
        if config.action_horizon != self.action_horizon:
            raise RecapError(f"processor: action_horizon {self.action_horizon}, the model's "
                             f"{config.action_horizon}; set policy_data.action_horizon to the "
                             "model's")  # fmt: skip
        if config.action_dim != self.action_dim:
            raise RecapError(f"processor: action_dim {self.action_dim}, the model's "
                             f"{config.action_dim}")  # fmt: skip

    # ---- files ----------------------------------------------------------------------------

    def to_json(self, directory: str | os.PathLike | None = None) -> dict:
        """Every field as JSON (``kind`` first); the tokenizer path relative to ``directory``
        when it lies inside it."""
        out: dict = {"kind": PI05_KIND}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, QuantileStats):
                value = _stats_json(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[field.name] = value
        if directory is not None:
            out["tokenizer"] = _relative(self.tokenizer, directory)
        return out

    @classmethod
    def from_json(cls, raw: dict, where: str = PROCESSOR_FILE,
                  directory: str | os.PathLike | None = None) -> Pi05Processor:  # fmt: skip
        """The processor of ``to_json`` output; a missing or unknown field, or another kind,
        is one line naming it and ``where``."""
        fields = _check_fields(cls, raw, PI05_KIND, where)
        for name in ("state_stats", "action_stats"):
            fields[name] = QuantileStats.from_json(fields[name], f"{where}: {name}")
        fields["cameras"] = tuple(fields.get("cameras", ()))
        fields["state_names"] = tuple(fields.get("state_names", ()))
        if directory is not None:
            fields["tokenizer"] = _absolute(fields["tokenizer"], directory)
        try:
            return cls(**fields)
        except RecapError as exc:
            raise RecapError(f"{where}: {exc}") from None

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``directory/processor.json`` atomically; returns its path."""
        return write_processor(directory, self.to_json(directory))

    def __eq__(self, other) -> bool:
        return isinstance(other, Pi05Processor) and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]


def _relative(path: str, directory: str | os.PathLike) -> str:
    """``path`` as stored in ``directory``'s processor.json: relative to ``directory`` when it
    lies inside (the directory moves with it), else absolute (a path relative to the working
    directory, e.g. ``demo_data/tokenizer``, would be read back relative to ``directory``)."""
    if not path:
        return path
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path(directory).resolve()))
    except ValueError:
        return str(path) if Path(path).is_absolute() else str(resolved)


def _absolute(path: str, directory: str | os.PathLike) -> str:
    return str(Path(directory) / path) if not Path(path).is_absolute() else path


def _check_fields(cls, raw: dict, kind: str, where: str) -> dict:
    """The constructor fields of ``raw`` (a ``to_json`` dict of ``kind``): one line for another
    kind, an unknown field or a missing required one."""
    if not isinstance(raw, dict):
        raise RecapError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("kind") != kind:
        raise RecapError(f"{where}: kind {raw.get('kind')!r}, expected {kind!r}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(known) - {"kind"})
    if unknown:
        raise RecapError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(known)}")
    required = [name for name, f in known.items() if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]  # fmt: skip
    missing = [name for name in required if name not in raw]
    if missing:
        raise RecapError(f"{where}: missing field {missing[0]!r} (required: "
                         f"{', '.join(required)})")  # fmt: skip
    return {k: v for k, v in raw.items() if k != "kind"}


def write_processor(directory: str | os.PathLike, content: dict) -> Path:
    """``directory/processor.json`` of ``content``, atomically (temporary file, ``os.replace``)."""
    path = Path(directory) / PROCESSOR_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(content, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_processor_json(directory: str | os.PathLike) -> dict | None:
    """The parsed ``directory/processor.json``, None when absent; invalid JSON is one line."""
    path = Path(directory) / PROCESSOR_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise RecapError(f"{path}: not valid JSON ({exc}); re-export the model") from exc


def read_policy_processor(directory: str | os.PathLike) -> Pi05Processor | None:
    """The π0.5 processor saved in ``directory``, None when it has none."""
    raw = read_processor_json(directory)
    if raw is None:
        return None
    return Pi05Processor.from_json(raw, str(Path(directory) / PROCESSOR_FILE), directory)


__all__ = ["FORMULAS", "GUIDANCE", "PROCESSOR_FILE", "Pi05Processor", "guidance_branches"]
