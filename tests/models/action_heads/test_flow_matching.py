"""The flow-matching rule (prismatic/models/action_heads/flow/): π0's noisy input, velocity target, loss, time
distribution and Euler sampler.

Expected values are arithmetic written out in the test on tiny tensors, and the Beta(1.5, 1) time distribution's
mean and CDF from their closed forms; none comes from the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from prismatic.models.action_heads.flow import (
    flow_matching_loss,
    noisy_actions_and_target,
    sample,
    sample_noise,
    sample_time,
)
from prismatic.util.errors import ConfigError

# Two samples, a chunk of one step, two action dimensions.
ACTIONS = torch.tensor([[[1.0, -2.0]], [[0.0, 0.0]]])
NOISE = torch.tensor([[[0.5, 4.0]], [[2.0, -2.0]]])
TIME = torch.tensor([0.25, 0.5])


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-6) -> None:
    """Same shape and values within `atol` (plain `allclose`: `torch.testing` costs a second to import)."""
    assert actual.shape == expected.shape and torch.allclose(actual, expected, rtol=0, atol=atol), (
        actual,
        expected,
    )


def test_noisy_actions_and_velocity_target():
    x_t, u_t = noisy_actions_and_target(ACTIONS, NOISE, TIME)
    # x_t = t * noise + (1 - t) * actions, per sample's t: 0.25 * 0.5 + 0.75 * 1 = 0.875; 0.25 * 4 + 0.75 * -2 = -0.5;
    # 0.5 * 2 + 0.5 * 0 = 1; 0.5 * -2 = -1. u_t = noise - actions.
    assert_close(x_t, torch.tensor([[[0.875, -0.5]], [[1.0, -1.0]]]), atol=1e-7)
    assert_close(u_t, torch.tensor([[[-0.5, 6.0]], [[2.0, -2.0]]]), atol=0)


def test_loss_is_the_mean_squared_velocity_error_in_float32():
    target = torch.tensor([[[-0.5, 6.0]], [[2.0, -2.0]]])
    velocity = torch.tensor([[[0.0, 6.0]], [[1.0, -2.0]]])
    # Squared errors 0.25, 0, 1, 0 over four elements.
    loss = flow_matching_loss(velocity, target)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert loss.item() == pytest.approx(1.25 / 4, abs=1e-7)
    assert flow_matching_loss(velocity.bfloat16(), target).dtype == torch.float32
    velocity.requires_grad_(True)
    flow_matching_loss(velocity, target).backward()
    # d/dv mean((v - u)^2) = 2 (v - u) / 4.
    assert_close(velocity.grad, torch.tensor([[[0.25, 0.0]], [[-0.5, 0.0]]]), atol=1e-7)


def test_one_euler_step():
    calls = []

    def velocity_fn(x_t, time_B):  # v = 2 x + t
        calls.append(time_B.clone())
        return 2 * x_t + time_B[:, None, None]

    noise = torch.tensor([[[1.0, -3.0]]])
    # One step, dt = -1, at t = 1: x = noise - (2 * noise + 1) = [1 - 3, -3 + 5].
    assert_close(sample(velocity_fn, noise, num_steps=1), torch.tensor([[[-2.0, 2.0]]]))
    assert len(calls) == 1
    assert calls[0].dtype == torch.float32 and calls[0].tolist() == [1.0]


def test_two_euler_steps_walk_time_down_from_one():
    calls = []

    def velocity_fn(x_t, time_B):  # v = t * x
        calls.append(time_B.tolist())
        return time_B[:, None, None] * x_t

    noise = torch.tensor([[[4.0, -8.0]], [[1.0, 2.0]]])
    # dt = -0.5. At t = 1: x <- x - 0.5 * x = 0.5 x. At t = 0.5: x <- x - 0.5 * 0.5 * x = 0.75 x. So 0.375 * noise.
    assert_close(sample(velocity_fn, noise, num_steps=2), 0.375 * noise)
    assert calls == [[1.0, 1.0], [0.5, 0.5]]


def test_ten_steps_by_default_and_a_straight_path_is_recovered_exactly():
    actions = torch.tensor([[[0.3, -0.7], [0.1, 0.9]]])
    noise = torch.tensor([[[1.5, 0.2], [-1.0, 0.4]]])
    times = []

    def true_velocity(x_t, time_B):  # the straight path's velocity is constant: noise - actions
        times.append(time_B.item())
        return noise - actions

    assert_close(sample(true_velocity, noise), actions, atol=1e-6)
    assert times == pytest.approx([1.0 - k / 10 for k in range(10)], abs=1e-7)


def test_time_is_seeded_and_in_range():
    a = sample_time(1000, generator=torch.Generator().manual_seed(3))
    b = sample_time(1000, generator=torch.Generator().manual_seed(3))
    c = sample_time(1000, generator=torch.Generator().manual_seed(4))
    assert a.dtype == torch.float32 and a.shape == (1000,)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.min().item() >= 0.001 and a.max().item() <= 1.0
    noise = sample_noise((2, 3, 4), generator=torch.Generator().manual_seed(3))
    assert noise.shape == (2, 3, 4) and torch.equal(
        noise, sample_noise((2, 3, 4), generator=torch.Generator().manual_seed(3))
    )


def test_time_follows_pi0s_beta_distribution():
    n = 200_000
    t = sample_time(n, generator=torch.Generator().manual_seed(0)).double()
    # t = 0.999 * B + 0.001, B ~ Beta(1.5, 1): E[B] = 1.5 / 2.5 = 0.6, Var[B] = 1.5 / (2.5^2 * 3.5), CDF x^1.5.
    sd = 0.999 * math.sqrt(1.5 / (2.5**2 * 3.5))
    assert abs(t.mean().item() - (0.999 * 0.6 + 0.001)) < 5 * sd / math.sqrt(n)
    for x in (0.1, 0.5, 0.9):
        expected = ((x - 0.001) / 0.999) ** 1.5
        # A proportion of n draws: standard error sqrt(p (1 - p) / n), at most 0.0012 here.
        assert abs((t <= x).double().mean().item() - expected) < 5 * math.sqrt(expected * (1 - expected) / n)


def test_a_bad_number_of_steps_is_a_config_error():
    for bad in (0, -1, 2.5):
        with pytest.raises(ConfigError, match=rf"positive integer .*got {bad!r}"):
            sample(lambda x, t: x, torch.zeros(1, 1, 1), num_steps=bad)
