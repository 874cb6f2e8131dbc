"""A trained π0.5 policy as a chunk policy for :mod:`recap.envs.rollout`.

:class:`ChunkAdapter` is ``recap.steps.evaluate_policy.PolicyAdapter`` (the same batch, the same
classifier-free guidance at ``beta``, the same unnormalization with the run's statistics) that
returns the whole sampled chunk, float32[B, action_horizon, D], so ``replan_steps`` of it are
executed before the next call; ``load_run`` (``evaluate_policy``'s) loads a trained run.
"""

from __future__ import annotations

import numpy as np

from recap.steps.evaluate_policy import PolicyAdapter, load_run

__all__ = ["ChunkAdapter", "load_run"]


class ChunkAdapter(PolicyAdapter):
    """``policy(batched observations) -> float32[B, H, D]``: the unnormalized action chunk."""

    def __call__(self, obs: dict) -> np.ndarray:
        return self.chunk(obs).astype(np.float32)
