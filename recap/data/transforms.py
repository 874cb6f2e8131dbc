"""Compatibility alias: the transforms live in :mod:`recap.processing.transforms` (below both the
data and the models, so that the processors which use them sit where both can reach them)."""

from recap.processing.transforms import *  # noqa: F401,F403
from recap.processing.transforms import (  # noqa: F401  (names `import *` does not carry)
    BRIGHTNESS,
    CONTRAST,
    CROP_SCALE,
    GRAY_WEIGHTS,
    IMAGE_SIZE,
    MAX_ROTATION_DEG,
    MAX_TOKENS,
    NUM_CAMERAS,
    SATURATION,
)
