"""A trained π0.5 policy as a chunk policy for :mod:`recap.envs.rollout`.

:class:`ChunkAdapter` is ``recap.steps.evaluate_policy.PolicyAdapter`` (the same batch, the same
classifier-free guidance at ``beta``, the same unnormalization with the run's statistics) that
returns the whole sampled chunk, float32[B, action_horizon, D], so ``replan_steps`` of it are
executed before the next call. :func:`load_run` loads a trained run as ``evaluate_policy`` does.
"""

from __future__ import annotations

from pathlib import Path

import gin
import numpy as np
import torch

from recap.data.conditioning import unnormalize_quantile
from recap.data.policy_data import PolicyDataset, describe_stats, policy_data, run_stats
from recap.models.pi05 import Pi05Policy, pi05_policy
from recap.steps.evaluate_policy import PolicyAdapter, load_policy


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


def load_run(run_dir: str | Path | None = None) -> tuple[Pi05Policy, PolicyDataset, Path]:
    """A trained Step 4 policy as ``evaluate_policy`` loads it, under the parsed gin config:
    ``pi05_policy()`` with the run's exported weights, ``policy_data()`` with the statistics the
    run exported (else its own, and one line says which); ``run_dir`` defaults to
    ``train.run_dir``."""
    run = Path(run_dir if run_dir is not None else gin.query_parameter("train.run_dir"))
    model, data = load_policy(pi05_policy, run), policy_data(export_stats=False)
    stats, path = run_stats(run)
    if stats is not None:
        data.stats = {name: stats[name].first(len(data.stats[name])) for name in data.stats}
    print(describe_stats(data.stats, str(path) if path else "policy_data (the run exported "
                         "none)"), flush=True)  # fmt: skip
    data.check_model(model)
    return model, data, run
