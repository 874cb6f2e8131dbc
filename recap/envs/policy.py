"""A trained π0.5 policy as a chunk policy for :mod:`recap.envs.rollout`.

:class:`ChunkAdapter` (``recap.loading``) is the evaluation's ``PolicyAdapter`` (the policy's
processor builds the batch, classifier-free guidance at ``beta``, the processor unnormalizes)
returning the whole sampled chunk, float32[B, action_horizon, D], so ``replan_steps`` of it are
executed before the next call; ``load_run`` (``recap.loading``) loads a trained run from its
directory.
"""

from __future__ import annotations

from recap.loading import ChunkAdapter, load_run

__all__ = ["ChunkAdapter", "load_run"]
