"""Small data transforms: prompts, tokenization, camera images and training augmentation.

Images: frames arrive as uint8[N, H, W, 3] (``LocalDataset.frames``). They are resized to
``size x size`` keeping the aspect ratio and padding with black (openpi / RLinf
``resize_with_pad``: nothing is cropped away or stretched), then mapped to float32 [-1, 1]
(``x / 127.5 - 1``), channels first. Training augmentation (openpi's, per image, every draw from
one ``torch.Generator`` so a seed reproduces it): non-wrist cameras get a random 95% crop and a
rotation in [-5, 5] degrees (one ``affine_grid`` + ``grid_sample``, black outside); all cameras
get brightness x[0.7, 1.3], contrast x[0.6, 1.4] and saturation x[0.5, 1.5] jitter. Eval: none.
Everything is vectorized over N; torchvision is not used. The models take cameras in fixed slots
(``NUM_CAMERAS``: base, left wrist, right wrist), as uint8 frames plus masks: ``pack_cameras``.
"""

from __future__ import annotations

import math
import os
import string
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from recap.errors import RecapError
from recap.processing.cameras import NUM_CAMERAS, is_wrist, slot_order  # noqa: F401  (one rule)

IMAGE_SIZE = 224
MAX_TOKENS = 200
CROP_SCALE = 0.95
MAX_ROTATION_DEG = 5.0
BRIGHTNESS, CONTRAST, SATURATION = (0.7, 1.3), (0.6, 1.4), (0.5, 1.5)
GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as torchvision
_TRAILING = string.punctuation.replace('"', "").replace("'", "") + string.whitespace


def clean_task(task: str) -> str:
    """Lower-case, ``_`` and newlines to spaces, whitespace collapsed, trailing punctuation
    (except quotes) stripped: ``"Pick_up the bowl!\\n"`` -> ``"pick up the bowl"``."""
    text = task.lower().replace("_", " ").replace("\n", " ")
    return " ".join(text.split()).rstrip(_TRAILING)


def build_prompt(task: str) -> str:
    """The value-model prompt ``"Task: {clean_task(task)}."``."""
    return f"Task: {clean_task(task)}."


class SentencePieceTokenizer:
    """A SentencePiece ``.model`` file (PaliGemma's ``paligemma_tokenizer.model``) behind the
    part of the Hugging Face tokenizer interface recap uses: ``bos_token_id``, ``pad_token_id``,
    ``eos_token_id``, ``unk_token_id``, ``len()`` and ``tokenizer(texts,
    add_special_tokens=...)["input_ids"]`` (special tokens: BOS first, as Gemma's).

    An adapter over ``sentencepiece.SentencePieceProcessor`` rather than a transformers
    tokenizer converted from the file: openpi encodes π0.5 prompts with SentencePiece itself, so
    the ids are openpi's by construction, while a converted tokenizer re-implements the model
    (normalization, whitespace and byte-fallback rules) and could differ on some text.
    Pickles as the model's bytes (DataLoader workers)."""

    def __init__(self, path: str | os.PathLike, model_proto: bytes | None = None):
        import sentencepiece

        self.path = Path(path)
        if model_proto is None:
            if not self.path.is_file():
                raise RecapError(f"{self.path}: tokenizer file not found; pass the local "
                                 "PaliGemma SentencePiece file (paligemma_tokenizer.model) or a "
                                 "model directory with tokenizer files")  # fmt: skip
            model_proto = self.path.read_bytes()
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model_proto)
        except (RuntimeError, OSError, ValueError) as exc:
            raise RecapError(f"{self.path}: not a SentencePiece model file ({type(exc).__name__});"
                             " pass PaliGemma's paligemma_tokenizer.model") from exc  # fmt: skip
        self.processor, self._proto = processor, model_proto

        def special(index: int) -> int | None:
            return index if index >= 0 else None

        self.bos_token_id = special(processor.bos_id())
        self.eos_token_id = special(processor.eos_id())
        self.pad_token_id = special(processor.pad_id())
        self.unk_token_id = special(processor.unk_id())

    def __len__(self) -> int:
        return int(self.processor.vocab_size())

    def __call__(
        self, texts: str | Sequence[str], add_special_tokens: bool = True
    ) -> dict[str, list]:
        """``{"input_ids": ids}``: a list of ids per text (one list for a single string)."""
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        ids = self.processor.encode(batch, add_bos=add_special_tokens and self.bos_token_id
                                    is not None)  # fmt: skip
        return {"input_ids": ids[0] if single else ids}

    def decode(self, ids: Sequence[int]) -> str:
        return self.processor.decode(list(ids))

    def __getstate__(self) -> dict:
        return {"path": str(self.path), "model_proto": self._proto}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["model_proto"])

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({str(self.path)!r}, vocab={len(self)})"


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer of a local model directory (``AutoTokenizer``, never the network), or of a
    SentencePiece ``.model`` file (``SentencePieceTokenizer``, e.g. PaliGemma's
    ``paligemma_tokenizer.model``)."""
    path = Path(path)
    if path.is_file() or (path.suffix == ".model" and not path.is_dir()):
        return SentencePieceTokenizer(path)
    from transformers import AutoTokenizer

    names = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if not any((path / n).is_file() for n in names):
        raise RecapError(
            f"{path}: no tokenizer ({' / '.join(names)}); pass the local Gemma3 model directory "
            "that holds its tokenizer files"
        )
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def tokenize_prompts(
    tokenizer, prompts: Sequence[str | Sequence[str]], max_length: int = MAX_TOKENS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids int64[B, max_length], mask bool[B, max_length])``: BOS + the prompt's tokens, right
    padded with the pad id (0 when the tokenizer has none). A prompt of more than ``max_length``
    tokens (BOS included) is a ``RecapError``, never cut: cutting drops task words the model
    would then never see.

    A prompt is a string or a tuple of segments (``conditioning.pi05_prompt``), each encoded on
    its own and concatenated after the one BOS: openpi's π0.5 prompt without state is
    ``encode(task, add_bos=True) + encode("\\n")``, which a single encode of ``task + "\\n"``
    need not equal."""
    bos = tokenizer.bos_token_id
    if bos is None:
        raise RecapError("tokenizer: no bos_token_id; use the Gemma3 tokenizer (it defines <bos>)")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    segments = [(p,) if isinstance(p, str) else tuple(p) for p in prompts]
    flat = sorted({seg for parts in segments for seg in parts})
    encoded = tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else []
    encoded = dict(zip(flat, encoded))
    ids = torch.full((len(segments), max_length), pad, dtype=torch.long)
    mask = torch.zeros((len(segments), max_length), dtype=torch.bool)
    for row, parts in enumerate(segments):
        tokens = [t for seg in parts for t in encoded[seg]]
        seq = [bos, *tokens]
        if len(seq) > max_length:
            raise RecapError(f"prompt {''.join(parts)!r}: {len(seq)} tokens (BOS included), more "
                             f"than max_length {max_length}")  # fmt: skip
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = True
    return ids, mask


def pad_token_rows(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids int64[n, L], mask bool[n, L])`` of token rows right-padded with 0 to the longest
    (L >= 1)."""
    length = max([len(r) for r in rows] + [1])
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for k, row in enumerate(rows):
        ids[k, : len(row)], mask[k, : len(row)] = torch.tensor(row, dtype=torch.long), True
    return ids, mask


def to_unit_images(frames: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8[N, H, W, 3] -> float32[N, 3, H, W] in [0, 1]."""
    frames = torch.as_tensor(np.asarray(frames) if not torch.is_tensor(frames) else frames)
    return frames.permute(0, 3, 1, 2).float() / 255.0


RESIZE_ANTIALIAS, RESIZE_BILINEAR = "antialias", "bilinear"
# How images are resized to the model's size: bilinear with antialiasing (openpi's PyTorch
# ``resize_with_pad``, recap's training default) or plain bilinear (RLinf's value preprocessing).
RESIZE_RULES = (RESIZE_ANTIALIAS, RESIZE_BILINEAR)


def check_resize(rule: str) -> str:
    if rule not in RESIZE_RULES:
        raise RecapError(f"resize: {rule!r} is not one of {list(RESIZE_RULES)}")
    return rule


def resize_with_pad(
    images: torch.Tensor, size: int = IMAGE_SIZE, resize: str = RESIZE_ANTIALIAS
) -> torch.Tensor:
    """float[N, 3, H, W] -> float[N, 3, size, size]: bilinear resize of the longer side to
    ``size`` (antialiased for ``resize="antialias"``, not for ``"bilinear"``), centred, padded
    with 0 (black in [0, 1]); unchanged when already ``size x size``."""
    height, width = images.shape[-2:]
    if (height, width) == (size, size):
        return images
    ratio = max(width / size, height / size)
    new_h, new_w = int(height / ratio), int(width / ratio)
    resized = F.interpolate(images, size=(new_h, new_w), mode="bilinear", align_corners=False,
                            antialias=check_resize(resize) == RESIZE_ANTIALIAS)  # fmt: skip
    resized = resized.clamp(0.0, 1.0)
    top, left = (size - new_h) // 2, (size - new_w) // 2
    return F.pad(resized, (left, size - new_w - left, top, size - new_h - top), value=0.0)


def resize_frames(
    images: torch.Tensor | np.ndarray, size: int, resize: str = RESIZE_ANTIALIAS
) -> torch.Tensor:
    """uint8[N, H, W, 3] -> uint8[N, size, size, 3]: ``resize_with_pad`` kept in uint8 (loaders
    ship uint8; a no-op when the frames already have the model's size)."""
    images = torch.as_tensor(images)
    if images.shape[1:3] == (size, size):
        return images
    unit = resize_with_pad(to_unit_images(images), size, resize)
    return (unit * 255.0).round().to(torch.uint8).permute(0, 2, 3, 1)


def _uniform(
    n: int, low: float, high: float, generator: torch.Generator | None, like: torch.Tensor
) -> torch.Tensor:
    """float[n] U[low, high] drawn on the CPU (seeded ``generator`` or the global RNG), then
    moved to ``like``'s device and dtype."""
    draw = low + (high - low) * torch.rand(n, generator=generator)
    return draw.to(device=like.device, dtype=like.dtype)


def augment_geometry(
    images: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """float[N, 3, H, W] in [0, 1]: a random ``CROP_SCALE`` crop (resized back) rotated by
    U[-5, 5] degrees, per image; pixels from outside the image are black."""
    n, _, height, width = images.shape
    angle = _uniform(n, -MAX_ROTATION_DEG, MAX_ROTATION_DEG, generator, images) * math.pi / 180
    shift = _uniform(2 * n, -(1 - CROP_SCALE), 1 - CROP_SCALE, generator, images).view(n, 2)
    cos, sin = angle.cos(), angle.sin()
    theta = torch.stack(
        [
            torch.stack([cos, -sin * height / width, shift[:, 0]], dim=1),
            torch.stack([sin * width / height, cos, shift[:, 1]], dim=1),
        ],
        dim=1,
    )
    theta[:, :, :2] *= CROP_SCALE
    grid = F.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def augment_color(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """float[N, 3, H, W] in [0, 1]: brightness, contrast (around the mean gray), saturation
    (around each pixel's gray) jitter with per-image factors; clamped to [0, 1] after each."""
    n = images.shape[0]
    weights = torch.tensor(GRAY_WEIGHTS, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
    factors = [_uniform(n, *r, generator, images).view(n, 1, 1, 1) for r in (BRIGHTNESS, CONTRAST,
                                                                     SATURATION)]  # fmt: skip
    images = (images * factors[0]).clamp(0.0, 1.0)
    mean = (images * weights).sum(dim=1, keepdim=True).mean(dim=(2, 3), keepdim=True)
    images = ((images - mean) * factors[1] + mean).clamp(0.0, 1.0)
    gray = (images * weights).sum(dim=1, keepdim=True)
    return ((images - gray) * factors[2] + gray).clamp(0.0, 1.0)


def prepare_images(
    frames: np.ndarray | torch.Tensor,
    size: int = IMAGE_SIZE,
    train: bool = False,
    wrist: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """uint8[N, H, W, 3] -> float32[N, 3, size, size] in [-1, 1], augmented when ``train``
    (geometry only for non-``wrist`` cameras)."""
    images = resize_with_pad(to_unit_images(frames), size)
    if train:
        if not wrist:
            images = augment_geometry(images, generator)
        images = augment_color(images, generator)
    return images * 2.0 - 1.0


def _slot_frames(
    frames: Mapping[str, np.ndarray | torch.Tensor | None], cameras: Sequence[str], num_slots: int
) -> tuple[list[np.ndarray | torch.Tensor | None], int]:
    """Per slot the frames of its camera (None where missing), and N: the checks of both
    packings (too many cameras, none present, unequal batch sizes)."""
    if len(cameras) > num_slots:
        raise RecapError(f"key map: {len(cameras)} cameras {tuple(cameras)} but the model has "
                         f"{num_slots} slots; drop cameras from the key map")  # fmt: skip
    present = [frames.get(k) for k in cameras]
    sizes = {k: len(f) for k, f in zip(cameras, present, strict=True) if f is not None}
    if not sizes:
        raise RecapError(f"frames: none of the cameras {tuple(cameras)} present; check the key map")
    if len(set(sizes.values())) > 1:
        raise RecapError(f"frames: cameras hold different numbers of frames {sizes}")
    return present, next(iter(sizes.values()))


def pack_cameras(
    frames_by_camera: Mapping[str, np.ndarray | torch.Tensor | None],
    image_size: int,
    cameras: Sequence[str] | None = None,
    num_slots: int = NUM_CAMERAS,
    resize: str = RESIZE_ANTIALIAS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The models' camera slots of a batch: ``(uint8[N, num_slots, S, S, 3], bool[N, num_slots])``.

    ``frames_by_camera``: camera key -> uint8[N, H, W, 3] (numpy or torch), or None when missing.
    ``cameras``: the camera of each slot, in slot order (``KeyMap.cameras``, a server's image
    keys); default: the keys of ``frames_by_camera`` in ``slot_order`` (base first, then wrist
    cameras). Frames are resized to ``S = image_size`` (``resize_frames``: aspect ratio kept,
    black padding, a no-op at S x S; ``resize``: the rule, ``RESIZE_RULES``). A slot without a
    camera, or whose frames are missing or None, is zeros with mask False. Every loader, the
    evaluation and the server pack this way.
    """
    cameras = slot_order(frames_by_camera) if cameras is None else cameras
    present, n = _slot_frames(frames_by_camera, cameras, num_slots)
    slots = torch.zeros(n, num_slots, image_size, image_size, 3, dtype=torch.uint8)
    masks = torch.zeros(n, num_slots, dtype=torch.bool)
    for slot, camera_frames in enumerate(present):
        if camera_frames is not None:
            slots[:, slot] = resize_frames(camera_frames, image_size, resize)
            masks[:, slot] = True
    return slots, masks


def camera_images(
    frames: Mapping[str, np.ndarray | torch.Tensor | None],
    cameras: Sequence[str],
    size: int = IMAGE_SIZE,
    num_slots: int = NUM_CAMERAS,
    train: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images float32[N, num_slots, 3, size, size], masks bool[N, num_slots])``: the slots of
    ``pack_cameras`` as model images, resized in float (no uint8 round trip) and augmented per
    camera when ``train`` (geometry on non-wrist cameras).

    ``cameras``: keys in slot order (``KeyMap.cameras``: base, left wrist, right wrist); a slot
    without a camera, or whose frames are missing/None, is a zero image with mask False.
    """
    present, n = _slot_frames(frames, cameras, num_slots)
    images = torch.zeros(n, num_slots, 3, size, size)
    masks = torch.zeros(n, num_slots, dtype=torch.bool)
    for slot, (key, slot_frames) in enumerate(zip(cameras, present)):
        if slot_frames is not None:
            images[:, slot] = prepare_images(slot_frames, size, train, is_wrist(key), generator)
            masks[:, slot] = True
    return images, masks


def write_word_tokenizer(
    directory: str | os.PathLike, texts: Sequence[str], extra: Sequence[str] = ()
) -> Path:
    """Save a word-level tokenizer covering ``texts`` (lower-cased, split on whitespace and
    punctuation) the way Hugging Face saves tokenizers, with Gemma's special ids (pad 0, eos 1,
    bos 2, unk 3). For the embedded demo and tests, where no Gemma tokenizer can be downloaded;
    load it back with ``load_tokenizer``. The words of ``extra`` texts that ``texts`` lacks get
    the ids after: ``texts``' words keep the ids they have without ``extra``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<eos>", "<bos>", "<unk>"]
    splitter = pre_tokenizers.Whitespace()
    words = sorted({w for t in texts for w, _ in splitter.pre_tokenize_str(t.lower())})
    more = {w for t in extra for w, _ in splitter.pre_tokenize_str(t.lower())} - set(words)
    words += sorted(more)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(special + words)}, "<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = splitter
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>",
    )  # fmt: skip
    fast.save_pretrained(str(directory))
    return Path(directory)


def frames_to_images(frames: torch.Tensor, train: bool) -> torch.Tensor:
    """uint8[B, C, S, S, 3] camera slots -> float32[B, C, 3, S, S] in [-1, 1] on the frames'
    device; ``train``: the augmentation of docs/spec.md §6 and openpi (95% crop + ±5° rotation
    on slot 0, the base camera; colour jitter on every slot; slots 1-2 are wrist cameras). The
    value model and the policy both call this on their device, so loaders ship uint8."""
    batch, cams = frames.shape[:2]
    unit = frames.flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
    if train:
        unit = unit.view(batch, cams, *unit.shape[1:])
        base = augment_geometry(unit[:, 0])
        unit = augment_color(torch.cat([base[:, None], unit[:, 1:]], dim=1).flatten(0, 1))
    return (unit * 2.0 - 1.0).view(batch, cams, *unit.shape[1:])
