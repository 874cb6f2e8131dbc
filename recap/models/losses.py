"""Losses as plain torch functions: unreduced (``float[B]``), so the engine decides the reduction.

Value model (Step 2): a categorical distribution over ``num_bins`` atoms evenly spaced on
``[v_min, v_max]`` (default 201 atoms on ``[-1, 0]``, spacing 0.005), trained with cross-entropy
against a two-hot target (C51-style projection of the scalar return onto its two nearest atoms).

Policy (Step 4): flow matching, MSE between the predicted velocity and u = noise - actions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NUM_BINS = 201
V_MIN = -1.0
V_MAX = 0.0


def value_atoms(
    num_bins: int = NUM_BINS,
    v_min: float = V_MIN,
    v_max: float = V_MAX,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """float32[num_bins]: the support ``linspace(v_min, v_max, num_bins)``."""
    return torch.linspace(v_min, v_max, num_bins, dtype=torch.float32, device=device)


def two_hot(
    y: torch.Tensor, num_bins: int = NUM_BINS, v_min: float = V_MIN, v_max: float = V_MAX
) -> torch.Tensor:
    """float32[B, num_bins] two-hot target of ``y`` float[B].

    y is clamped to [v_min, v_max]; b = (y - v_min) / delta with delta = (v_max - v_min) /
    (num_bins - 1); l = floor(b), u = ceil(b); mass (u - b) on l and (b - l) on u, and mass 1 on
    l when l == u. Example (defaults): y = -0.3023 -> b = 139.54 -> 0.46 on 139, 0.54 on 140.
    """
    delta = (v_max - v_min) / (num_bins - 1)
    b = ((y.float().clamp(v_min, v_max) - v_min) / delta).clamp(0, num_bins - 1)
    lower, upper = b.floor(), b.ceil()
    w_upper = b - lower
    w_lower = torch.where(upper == lower, torch.ones_like(b), upper - b)
    target = torch.zeros(*y.shape, num_bins, dtype=torch.float32, device=y.device)
    target.scatter_add_(-1, lower.long().unsqueeze(-1), w_lower.unsqueeze(-1))
    target.scatter_add_(-1, upper.long().unsqueeze(-1), w_upper.unsqueeze(-1))
    return target


def categorical_value_loss(
    logits: torch.Tensor, y: torch.Tensor, v_min: float = V_MIN, v_max: float = V_MAX
) -> torch.Tensor:
    """float32[B] cross-entropy of ``logits`` float[B, num_bins] against ``two_hot(y)``.

    loss = -sum_k target_k * log_softmax(logits)_k, computed in float32. Uniform logits give
    ln(num_bins) (ln 201 = 5.303) for any y.
    """
    target = two_hot(y, logits.shape[-1], v_min, v_max)
    return -(target * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1)


def expected_value(
    logits: torch.Tensor, v_min: float = V_MIN, v_max: float = V_MAX
) -> torch.Tensor:
    """float32[B] ``E[V] = sum_k softmax(logits)_k * atom_k`` of ``logits`` float[B, num_bins]."""
    atoms = value_atoms(logits.shape[-1], v_min, v_max, device=logits.device)
    return F.softmax(logits.float(), dim=-1) @ atoms


def flow_matching_loss(
    velocity: torch.Tensor,
    noise: torch.Tensor,
    actions: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """float32[B] flow-matching MSE of ``velocity`` float[B, H, A] against u = noise - actions.

    loss_b = sum_{h,a} m_bha (v_bha - u_bha)^2 / sum_{h,a} m_bha, with ``mask`` bool (or float
    weights) broadcastable to [B, H, A] (False at padded action steps or dims; default all True;
    an example with no valid entry has loss 0). docs/spec.md §6; openpi's loss is the unmasked mean.
    """
    error = (velocity.float() - (noise.float() - actions.float())).square()
    if mask is None:
        return error.mean(dim=(1, 2))
    weight = torch.broadcast_to(mask.to(error.device, torch.float32), error.shape)
    return (error * weight).sum(dim=(1, 2)) / weight.sum(dim=(1, 2)).clamp_min(1e-12)
