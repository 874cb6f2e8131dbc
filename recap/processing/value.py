"""``ValueProcessor``: everything between a frame and the value model's tensors, and its V scale.

Saved as ``processor.json`` (``kind: "value"``) beside the value model's weights by the training
run and by ``recap-import rlinf-value``; Step 2's data and Step 3 read the same fields:

- images: camera slots (``cameras`` in slot order, else ``slot_order``) resized to
  ``image_size`` with ``resize``: ``antialias`` for recap's own runs, ``bilinear`` (no
  antialiasing) for RLinf's value models, whose preprocessing does not antialias;
- prompt: ``"Task: {cleaned task}."`` tokenized with BOS, at most ``max_length`` tokens (a longer
  one is an error, never cut: the data refuses a short ``max_length`` before training);
- values: ``return_range`` is the range the training targets were normalized with (Step 3
  normalizes its returns with the same map; None when unknown, e.g. an import without
  ``--return-range``: Step 3 then uses its datasets' range); the model's ``num_bins`` atoms span
  ``[v_min, v_max]``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from recap.errors import RecapError
from recap.processing.cameras import NUM_CAMERAS, slot_order
from recap.processing.pi05 import (
    PROCESSOR_FILE,
    _absolute,
    _check_fields,
    _relative,
    read_processor_json,
    write_processor,
)
from recap.processing.transforms import (
    RESIZE_ANTIALIAS,
    build_prompt,
    check_resize,
    pack_cameras,
    tokenize_prompts,
)

VALUE_KIND = "value"


@dataclasses.dataclass(frozen=True)
class ValueProcessor:
    """The transform that feeds one value model (see the module docstring)."""

    tokenizer: str
    return_range: tuple[float, float] | None
    image_size: int = 224
    resize: str = RESIZE_ANTIALIAS
    cameras: tuple[str, ...] = ()
    num_slots: int = NUM_CAMERAS
    max_length: int = 200
    num_bins: int = 201
    v_min: float = -1.0
    v_max: float = 0.0

    def __post_init__(self):
        check_resize(self.resize)
        object.__setattr__(self, "cameras", tuple(self.cameras))
        if self.return_range is not None:
            low, high = (float(v) for v in self.return_range)
            object.__setattr__(self, "return_range", (low, high))
            if not low < high:
                raise RecapError(f"processor: return_range ({low}, {high}) needs min < max")
        if len(self.cameras) > self.num_slots:
            raise RecapError(f"processor: {len(self.cameras)} cameras {self.cameras} but the "
                             f"value model has {self.num_slots} slots")  # fmt: skip

    def replace(self, **changes) -> ValueProcessor:
        return dataclasses.replace(self, **changes)

    def for_model(self, config) -> ValueProcessor:
        """This processor with the model's (a ``ValueConfig``) bins and value range."""
        if config is None:
            return self
        bins, low, high = int(config.num_bins), float(config.v_min), float(config.v_max)
        return dataclasses.replace(self, num_bins=bins, v_min=low, v_max=high)

    def pack(
        self, images: Mapping[str, np.ndarray | torch.Tensor | None],
        cameras: Sequence[str] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """``(uint8[N, num_slots, S, S, 3], bool[N, num_slots])`` with this model's resize."""
        if cameras is None:
            cameras = list(self.cameras) if self.cameras and set(images) <= set(self.cameras) \
                else slot_order(images)  # fmt: skip
        return pack_cameras(images, self.image_size, cameras, self.num_slots, self.resize)

    @staticmethod
    def prompt(task: str) -> str:
        """The value model's prompt, ``"Task: {cleaned task}."``."""
        return build_prompt(task)

    def tokenize(self, tokenizer, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """BOS + each prompt's tokens in ``max_length`` columns; a longer prompt is a
        ``RecapError`` (``transforms.tokenize_prompts``), never cut."""
        return tokenize_prompts(tokenizer, prompts, self.max_length)

    @staticmethod
    def longest_prompt(tokenizer, prompts: Sequence[str]) -> tuple[int, str]:
        """``(tokens, prompt)``: the most tokens one of ``prompts`` takes (BOS included), and
        that prompt; ``(0, "")`` for none."""
        unique = sorted(set(prompts))
        if not unique:
            return 0, ""
        ids = tokenizer(unique, add_special_tokens=False)["input_ids"]
        return max((len(tokens) + 1, prompt) for tokens, prompt in zip(ids, unique))

    def to_json(self, directory: str | os.PathLike | None = None) -> dict:
        out: dict = {"kind": VALUE_KIND}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            out[field.name] = list(value) if isinstance(value, tuple) else value
        if directory is not None:
            out["tokenizer"] = _relative(self.tokenizer, directory)
        return out

    @classmethod
    def from_json(cls, raw: dict, where: str = PROCESSOR_FILE,
                  directory: str | os.PathLike | None = None) -> ValueProcessor:  # fmt: skip
        fields = _check_fields(cls, raw, VALUE_KIND, where)
        fields["cameras"] = tuple(fields.get("cameras", ()))
        if fields["return_range"] is not None:
            fields["return_range"] = tuple(fields["return_range"])
        if directory is not None:
            fields["tokenizer"] = _absolute(fields["tokenizer"], directory)
        try:
            return cls(**fields)
        except (RecapError, TypeError, ValueError) as exc:
            raise RecapError(f"{where}: {exc}") from None

    def save(self, directory: str | os.PathLike) -> Path:
        return write_processor(directory, self.to_json(directory))


def read_value_processor(directory: str | os.PathLike) -> ValueProcessor | None:
    """The value processor saved in ``directory``, None when it has none (older runs)."""
    raw = read_processor_json(directory)
    if raw is None:
        return None
    return ValueProcessor.from_json(raw, str(Path(directory) / PROCESSOR_FILE), directory)
