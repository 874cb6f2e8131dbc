"""The camera slot rule, written once: which camera of a dataset or a request fills which slot.

The value model and the policy take ``NUM_CAMERAS`` image slots: base, left wrist, right wrist.
Detected key maps (``recap.data.lerobot.detect_key_map``), evaluation, collection and serving all
order cameras with ``slot_order``; an explicit key map (or a processor's ``cameras``) names the
slots itself. No torch here: planning reads it without loading a model.
"""

from __future__ import annotations

from collections.abc import Iterable

NUM_CAMERAS = 3  # camera slots of the value model and the policy: base, left wrist, right wrist


def is_wrist(camera: str) -> bool:
    """Wrist cameras are those whose key names a wrist (``wrist_image``, ``left_wrist_0_rgb``)."""
    return "wrist" in camera.lower()


def slot_order(cameras: Iterable[str]) -> list[str]:
    """Camera keys in slot order, THE rule (detected key maps, evaluation and serving all use
    it): base cameras first, then wrist cameras (``is_wrist``), left before right (a key naming
    ``right``), otherwise in the order given: ``["wrist_image", "image"]`` ->
    ``["image", "wrist_image"]``; ``["cam_right_wrist", "cam_left_wrist", "cam_high"]`` ->
    ``["cam_high", "cam_left_wrist", "cam_right_wrist"]``."""
    return sorted(cameras, key=lambda k: (is_wrist(k), "right" in k.lower()))
