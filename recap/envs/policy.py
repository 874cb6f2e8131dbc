"""A trained π0.5 policy as a chunk policy for :mod:`recap.envs.rollout`.

:class:`ChunkAdapter` is ``recap.steps.evaluate_policy.PolicyAdapter`` (the same batch, the same
classifier-free guidance at ``beta``, the same unnormalization with the run's statistics) that
returns the whole sampled chunk, float32[B, action_horizon, D], so ``replan_steps`` of it are
executed before the next call; ``load_run`` (``evaluate_policy``'s) loads a trained run.
"""

from __future__ import annotations

import numpy as np
import torch

from recap.data.conditioning import unnormalize_quantile
from recap.steps.evaluate_policy import PolicyAdapter, load_run

__all__ = ["ChunkAdapter", "load_run"]


class ChunkAdapter(PolicyAdapter):
    """``policy(batched observations) -> float32[B, H, D]``: the unnormalized action chunk."""

    def __call__(self, obs: dict) -> np.ndarray:
        batch = self.batch(obs)
        config = self.model.config
        shape = (batch["frames"].shape[0], config.action_horizon, config.action_dim)
        noise = torch.randn(shape, generator=self.generator)
        positive_only = self.data.conditioning == "positive_only_conditional"
        with torch.no_grad():
            chunk = self.model.sample_actions(batch, noise, self.beta, self.num_steps,
                                              guidance=self.guidance,
                                              positive_only=positive_only)  # fmt: skip
        actions = unnormalize_quantile(chunk.double().numpy(), self.data.stats["action"])
        return actions.astype(np.float32)
