"""π0.5 weights from and to local directories, in the openpi PyTorch and LeRobot layouts, strictly.

openpi (``PI0Pytorch(pi05=True)``, written with safetensors ``save_model``): one
``model.safetensors`` whose keys are exactly ``Pi05Policy``'s state-dict keys
(``paligemma_with_expert.paligemma.model.{vision_tower.vision_model, multi_modal_projector.linear,
language_model}.…``, ``paligemma_with_expert.gemma_expert.model.{layers.i, norm}.…`` with
``input_layernorm.dense`` / ``post_attention_layernorm.dense`` adaptive norms, ``action_in_proj``,
``action_out_proj``, ``time_mlp_in``, ``time_mlp_out``), plus two vocabulary heads that flow
matching never reads:

- ``paligemma_with_expert.paligemma.lm_head.weight`` is tied to
  ``…language_model.embed_tokens.weight``; ``save_model`` keeps one name per tied tensor (this
  one), so the embedding key is usually absent and is read from ``lm_head`` then.
- ``paligemma_with_expert.gemma_expert.lm_head.weight`` [vocab, expert width], the expert's unused
  LM head, is dropped.

LeRobot (``PI05Policy``) stores the same keys under ``model.``. Anything else missing or
unexpected is a one-line ``RecapError`` naming the first keys and the count. Saving mirrors the
files: the embedding under ``lm_head`` and a zero expert head, so openpi's strict
``safetensors.torch.load_model`` and LeRobot's strict load accept them; ``recap_pi05.json`` keeps
the exact ``Pi05Config`` and ``config.json`` the fields openpi/LeRobot read. openpi's training
checkpoints (``<step>/model.safetensors``, no config file) load with the caller's sizes.

Normalization statistics travel with the weights: openpi keeps them in
``assets/<asset_id>/norm_stats.json`` inside the checkpoint directory (``{"norm_stats":
{"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}``), LeRobot in
``policy_preprocessor_step_<i>_normalizer_processor.safetensors`` (flat keys
``observation.state.q01``, ``action.q99``, ...). ``find_norm_stats`` / ``read_norm_stats`` read
either; ``write_norm_stats`` writes openpi's file (recap's exported policies carry it); they live
in ``recap.processing.norm_stats`` (with the processor, below data and models), re-exported here.

The files themselves (names, layouts, the strict check, the writer) are ``recap.models.pi05_files``;
``read_config`` / ``load_pi05`` / ``count_parameters`` build a ``Pi05Policy`` and live in
``recap.models.pi05`` (its ``pi05_policy`` loads through them). This module gathers all of it, so
callers import the checkpoint API from one place.
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
