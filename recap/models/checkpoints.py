"""The π0.5 checkpoint API in one import: π0.5 weights from and to local directories (openpi's
PyTorch layout, LeRobot's) and the normalization statistics that travel with them.

Each piece has one home, re-exported here so callers import the API from one place:

- the files (names, key layouts, the strict state-dict check, the writer, the named variants):
  ``recap.models.pi05_files`` (its docstring describes both layouts);
- ``read_config`` / ``load_pi05`` / ``count_parameters``, which build a ``Pi05Policy``:
  ``recap.models.pi05``; sizes a ``config.json`` cannot name come from the weights
  (``recap.models.pi05_sizes``);
- the statistics (openpi's ``assets/<asset_id>/norm_stats.json``, LeRobot's normalizer
  safetensors): ``recap.processing.norm_stats``.
"""

from __future__ import annotations

from recap.models.pi05 import count_parameters, load_pi05, read_config  # noqa: F401
from recap.models.pi05_files import (  # noqa: F401
    CONFIG_FILE,
    EMBED_KEY,
    EXPERT_LM_HEAD_KEY,
    GEMMA_300M,
    LAYOUTS,
    LEROBOT,
    LEROBOT_PREFIX,
    LM_HEAD_KEY,
    NAMED_VARIANTS,
    OPENPI,
    PALIGEMMA_2B,
    RECAP_CONFIG_FILE,
    VARIANTS,
    WEIGHTS_FILE,
    check_layout,
    detect_layout,
    file_key,
    file_state,
    foreign_config,
    load_strict,
    partitioned,
    save_pi05,
    state_to_file,
    steps_hint,
    to_model_keys,
    variant_fields,
    write_pi05_files,
)
from recap.processing.norm_stats import (  # noqa: F401  (re-exported: checkpoints carry them)
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
