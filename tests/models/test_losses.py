"""Categorical value loss: two-hot targets, literal values from SPEC.md, expected value."""

from __future__ import annotations

import math

import pytest
import torch

from recap.models.losses import categorical_value_loss, expected_value, two_hot, value_atoms


@pytest.mark.parametrize(
    ("y", "bins"),
    [
        (-0.3023, {139: 0.46, 140: 0.54}),  # SPEC.md example
        (0.0, {200: 1.0}),
        (-1.0, {0: 1.0}),
        (-0.5, {100: 1.0}),
        (-0.0025, {199: 0.5, 200: 0.5}),
        (0.7, {200: 1.0}),  # clamped to 0
        (-3.0, {0: 1.0}),  # clamped to -1
    ],
)
def test_two_hot_literal(y, bins):
    target = two_hot(torch.tensor([y]))[0]
    assert target.shape == (201,)
    assert math.isclose(float(target.sum()), 1.0, abs_tol=1e-6)
    for index, mass in bins.items():
        assert math.isclose(float(target[index]), mass, abs_tol=1e-4)
    assert float(target.sum() - sum(target[i] for i in bins)) < 1e-4


def test_uniform_logits_give_ln_201():
    loss = categorical_value_loss(torch.zeros(3, 201), torch.tensor([-0.3023, 0.0, -1.0]))
    assert loss.shape == (3,)
    assert torch.allclose(loss, torch.full((3,), math.log(201)))
    assert math.isclose(math.log(201), 5.303, abs_tol=1e-3)


def test_loss_is_two_hot_cross_entropy_and_unreduced():
    logits = torch.randn(2, 201, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([-0.3023, -0.5])
    logp = torch.log_softmax(logits, dim=-1)
    expected0 = -(0.46 * logp[0, 139] + 0.54 * logp[0, 140])
    loss = categorical_value_loss(logits.to(torch.bfloat16), y)
    assert loss.dtype == torch.float32
    assert math.isclose(float(categorical_value_loss(logits, y)[0]), float(expected0), rel_tol=1e-3)
    assert math.isclose(float(categorical_value_loss(logits, y)[1]), float(-logp[1, 100]),
                        rel_tol=1e-4)  # fmt: skip


def test_expected_value():
    atoms = value_atoms()
    assert (
        atoms[0] == -1.0
        and atoms[-1] == 0.0
        and math.isclose(float(atoms[139]), -0.305, abs_tol=1e-7)
    )
    peaked = torch.full((1, 201), -1e4)
    peaked[0, 139] = 0.0
    assert math.isclose(float(expected_value(peaked)[0]), -0.305, abs_tol=1e-6)
    assert math.isclose(float(expected_value(torch.zeros(1, 201))[0]), -0.5, abs_tol=1e-6)
    # the two-hot target's own expectation is y
    logits = torch.log(two_hot(torch.tensor([-0.3023])).clamp_min(1e-30))
    assert math.isclose(float(expected_value(logits)[0]), -0.3023, abs_tol=1e-5)
