"""Prompts, tokenization, image resize/pad, augmentation and camera slots: literal tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recap.data import transforms as T
from recap.data.lerobot import LIBERO_KEYS
from recap.errors import RecapError
from tests.models import save_tiny_tokenizer


@pytest.mark.parametrize(
    ("task", "prompt"),
    [
        ("pick up the bowl", "Task: pick up the bowl."),
        ("Pick_up the BOWL.", "Task: pick up the bowl."),
        ("put it\non the plate!!", "Task: put it on the plate."),
        ("  open   the\n\ndrawer ; ", "Task: open the drawer."),
        ("turn_on_the_stove?", "Task: turn on the stove."),
        ('say "hi"', 'Task: say "hi".'),
        ("pick 3.5 cm", "Task: pick 3.5 cm."),
    ],
)
def test_build_prompt(task, prompt):
    assert T.build_prompt(task) == prompt


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return T.load_tokenizer(save_tiny_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.mark.parametrize(
    ("prompt", "max_length", "ids", "length"),
    [
        # <bos>=2 task=4 :=5 .=6 pick=7 up=8 the=9 bowl=10, pad 0
        ("Task: pick up the bowl.", 10, [2, 4, 5, 7, 8, 9, 10, 6, 0, 0], 8),
        ("Task: .", 5, [2, 4, 5, 6, 0], 4),
    ],
)
def test_tokenize_prompts(tokenizer, prompt, max_length, ids, length):
    out_ids, mask = T.tokenize_prompts(tokenizer, [prompt, "Task: ."], max_length)
    assert out_ids.dtype == torch.int64 and mask.dtype == torch.bool
    assert out_ids[0].tolist() == ids
    assert mask[0].tolist() == [True] * length + [False] * (max_length - length)


def test_a_prompt_longer_than_max_length_is_refused_not_cut(tokenizer):
    with pytest.raises(RecapError) as err:  # 8 tokens with BOS: 4 columns would drop "up the bowl."
        T.tokenize_prompts(tokenizer, ["Task: .", "Task: pick up the bowl."], 4)
    assert str(err.value) == ("prompt 'Task: pick up the bowl.': 8 tokens (BOS included), more "
                              "than max_length 4")  # fmt: skip
    ids, mask = T.tokenize_prompts(tokenizer, ["Task: pick up the bowl."], 8)  # exactly enough
    assert ids[0].tolist() == [2, 4, 5, 7, 8, 9, 10, 6] and bool(mask.all())


def test_load_tokenizer_error_names_the_directory(tmp_path):
    with pytest.raises(RecapError, match=f"{tmp_path}: no tokenizer"):
        T.load_tokenizer(tmp_path)


def test_resize_with_pad_keeps_aspect_and_pads_black():
    frame = np.array([[[0, 51, 255], [255, 255, 255], [51, 51, 51], [0, 0, 0]]] * 2, np.uint8)
    out = T.prepare_images(frame[None], size=4)  # [1, 2, 4, 3] -> [1, 3, 4, 4]
    assert out.shape == (1, 3, 4, 4) and out.dtype == torch.float32
    assert torch.equal(out[0, :, [0, 3]], torch.full((3, 2, 4), -1.0))  # padded rows: black
    assert torch.allclose(out[0, :, 1, 0], torch.tensor([-1.0, -0.6, 1.0]))  # x / 127.5 - 1
    assert torch.equal(out[0, :, 1], out[0, :, 2])
    same = T.prepare_images(np.full((1, 8, 8, 3), 255, np.uint8), size=8)
    assert torch.equal(same, torch.ones(1, 3, 8, 8))
    down = T.prepare_images(np.full((2, 16, 8, 3), 255, np.uint8), size=4)
    assert torch.equal(down[:, :, :, 1:3], torch.ones(2, 3, 4, 2))
    assert torch.equal(down[:, :, :, [0, 3]], -torch.ones(2, 3, 4, 2))


def ramp(n: int = 2, size: int = 16) -> np.ndarray:
    """uint8[n, size, size, 3]: every row the same left-to-right ramp (colored)."""
    row = np.linspace(20, 235, size).astype(np.uint8)
    image = np.stack([row, row[::-1], np.full_like(row, 128)], axis=-1)[None].repeat(size, 0)
    return np.repeat(image[None], n, axis=0)


def augment(seed: int, wrist: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return T.prepare_images(ramp(), size=16, train=True, wrist=wrist, generator=g)


def test_augmentation_is_deterministic_per_seed_and_off_at_eval():
    assert torch.equal(augment(0), augment(0))
    assert not torch.equal(augment(0), augment(1))
    first, second = augment(0)
    assert not torch.equal(first, second)  # per-image draws
    assert augment(0).min() >= -1 and augment(0).max() <= 1
    assert torch.equal(T.prepare_images(ramp(), 16), T.prepare_images(ramp(), 16, train=False))


def test_wrist_cameras_get_color_jitter_only():
    wrist, base = augment(3, wrist=True), augment(3, wrist=False)
    plain = T.prepare_images(ramp(), 16)
    assert not torch.allclose(wrist, plain)  # jittered
    assert torch.equal(wrist, wrist[:, :, :1].expand_as(wrist))  # rows stay identical
    assert not torch.allclose(base, base[:, :, :1].expand_as(base), atol=1e-3)  # rotated


def test_color_jitter_keeps_gray_gray_and_scales_brightness():
    gray = torch.full((1, 3, 4, 4), 0.5)
    out = T.augment_color(gray, torch.Generator().manual_seed(0))
    assert torch.allclose(out, out[:, :1].expand_as(out))
    assert torch.allclose(out, out[..., :1, :1].expand_as(out))


def test_camera_images_slots_and_masks():
    frames = {"image": ramp(2, 8), "wrist_image": None}
    images, masks = T.camera_images(frames, LIBERO_KEYS.cameras, size=8)
    assert images.shape == (2, 3, 3, 8, 8) and masks.tolist() == [[True, False, False]] * 2
    assert torch.equal(images[:, 0], T.prepare_images(ramp(2, 8), 8))
    assert torch.equal(images[:, 1:], torch.zeros(2, 2, 3, 8, 8))
    both, masks = T.camera_images({**frames, "wrist_image": ramp(2, 8)}, LIBERO_KEYS.cameras, 8)
    assert masks.tolist() == [[True, True, False]] * 2
    with pytest.raises(RecapError, match="none of the cameras"):
        T.camera_images({}, LIBERO_KEYS.cameras, size=8)
    with pytest.raises(RecapError, match="4 cameras"):
        T.camera_images(frames, ("a", "b", "c", "d"), size=8)


def solid(values: list[int], height: int, width: int) -> np.ndarray:
    """uint8[len(values), height, width, 3]: frame i filled with values[i]."""
    return (
        np.array(values, dtype=np.uint8)[:, None, None, None]
        .repeat(height, 1)
        .repeat(width, 2)
        .repeat(3, 3)
    )


def test_slot_order_puts_base_cameras_first():
    cams = ["left_wrist_0_rgb", "base_0_rgb", "right_wrist_0_rgb"]
    assert T.slot_order(cams) == ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
    assert T.slot_order(["wrist_image", "image"]) == ["image", "wrist_image"]


def test_pack_cameras_base_and_wrist():
    base, wrist = solid([10, 11], 8, 8), solid([200, 201], 8, 8)
    # given wrist first and without a slot order: base first, then the wrist, then an empty slot
    slots, masks = T.pack_cameras({"wrist_image": wrist, "image": torch.from_numpy(base)}, 8)
    assert slots.dtype == torch.uint8 and slots.shape == (2, T.NUM_CAMERAS, 8, 8, 3)
    assert masks.dtype == torch.bool and masks.tolist() == [[True, True, False]] * 2
    assert torch.equal(slots[:, 0], torch.from_numpy(base))
    assert torch.equal(slots[:, 1], torch.from_numpy(wrist))
    assert not slots[:, 2].any()
    # an explicit slot order (a key map's) is kept as given
    swapped, _ = T.pack_cameras({"image": base, "wrist_image": wrist}, 8, ("wrist_image", "image"))
    assert torch.equal(swapped[:, 0], torch.from_numpy(wrist))
    assert torch.equal(swapped[:, 1], torch.from_numpy(base))


def test_pack_cameras_missing_camera_is_a_zero_slot_masked_out():
    wrist = solid([7], 8, 8)
    slots, masks = T.pack_cameras({"wrist_image": wrist}, 8, LIBERO_KEYS.cameras)
    assert masks.tolist() == [[False, True, False]]
    assert not slots[:, 0].any() and not slots[:, 2].any()
    assert torch.equal(slots[:, 1], torch.from_numpy(wrist))
    slots, masks = T.pack_cameras({"image": solid([9], 8, 8), "wrist_image": None}, 8)
    assert masks.tolist() == [[True, False, False]]
    assert (slots[:, 0] == 9).all() and not slots[:, 1:].any()


def test_pack_cameras_resizes_with_pad():
    wide = solid([200], 4, 8)  # H 4, W 8 -> 8 x 8: the image in rows 2-5, black above and below
    slots, masks = T.pack_cameras({"image": wide}, 8)
    expected = np.zeros((8, 8, 3), np.uint8)
    expected[2:6] = 200
    assert masks.tolist() == [[True, False, False]]
    assert torch.equal(slots[0, 0], torch.from_numpy(expected))
    big = ramp(2, 16)  # 16 x 16 -> 8 x 8: resize_frames, bit for bit
    slots, _ = T.pack_cameras({"image": big, "wrist_image": big}, 8)
    assert torch.equal(slots[:, 0], T.resize_frames(big, 8))
    assert torch.equal(slots[:, 1], T.resize_frames(big, 8))


def test_pack_cameras_errors():
    one = solid([1], 8, 8)
    with pytest.raises(RecapError, match="4 cameras"):
        T.pack_cameras({k: one for k in "abcd"}, 8)
    with pytest.raises(RecapError, match="none of the cameras"):
        T.pack_cameras({"image": None}, 8)
    with pytest.raises(RecapError, match="different numbers of frames"):
        T.pack_cameras({"image": one, "wrist_image": solid([1, 2], 8, 8)}, 8)
