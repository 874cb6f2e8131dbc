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


def is_right(camera: str) -> bool:
    """A wrist camera whose key names the right side (``cam_right_wrist``)."""
    return is_wrist(camera) and "right" in camera.lower()


def slot_order(cameras: Iterable[str]) -> list[str]:
    """Camera keys in slot order, THE rule (detected key maps, evaluation and serving all use
    it): base cameras first, then wrist cameras (``is_wrist``), left before right (a key naming
    ``right``), otherwise in the order given: ``["wrist_image", "image"]`` ->
    ``["image", "wrist_image"]``; ``["cam_right_wrist", "cam_left_wrist", "cam_high"]`` ->
    ``["cam_high", "cam_left_wrist", "cam_right_wrist"]``. A right wrist camera keeps its role
    when no left one is there: one base camera and right wrists leave the left-wrist slot
    empty (``""``, masked): ``["cam_high", "cam_right_wrist"]`` -> ``["cam_high", "",
    "cam_right_wrist"]``."""
    ordered = sorted(cameras, key=lambda k: (is_wrist(k), is_right(k)))
    bases = [k for k in ordered if not is_wrist(k)]
    rights = [k for k in ordered if is_right(k)]
    if len(bases) == 1 and rights and len(bases) + len(rights) == len(ordered):
        return [bases[0], "", *rights]
    return ordered
