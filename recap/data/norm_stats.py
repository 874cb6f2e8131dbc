"""Compatibility alias: normalization statistics files live in :mod:`recap.processing.norm_stats`
(they travel with a policy's processor)."""

from recap.processing.norm_stats import *  # noqa: F401,F403
from recap.processing.norm_stats import (  # noqa: F401
    ASSETS_DIR,
    LEROBOT_NORMALIZER,
    LEROBOT_STATS_KEYS,
    MOMENTS,
    NORM_STATS_FILE,
    OPENPI_STATS_KEYS,
    find_norm_stats,
    norm_stats_path,
    read_norm_stats,
    write_norm_stats,
)
