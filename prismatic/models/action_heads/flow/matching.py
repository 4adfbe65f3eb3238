"""π0's flow-matching rule (Black et al. 2024), as plain functions: what a flow-matching action expert trains on and
how it is sampled.

openpi's convention, which the functions keep (the π0 paper writes time the other way round):
    t = 1 is pure noise and t = 0 the actions;
    training: t = Beta(1.5, 1) * 0.999 + 0.001 per sample, x_t = t * noise + (1 - t) * actions, and the expert
        regresses the velocity u_t = noise - actions with a mean squared error;
    sampling: from x_1 = noise, `num_steps` Euler steps x <- x + dt * v(x, t) with dt = -1 / num_steps, at
        t = 1, 1 - 1/num_steps, ..., 1/num_steps (openpi's default: 10 steps).

Randomness goes through a `torch.Generator` the caller owns, so the same seed gives the same times, noise and
actions. The expert is any `velocity_fn(x_t_BHD, time_B) -> velocity_BHD`; this module holds no parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from prismatic.models.action_heads.flow.options import DEFAULT_NUM_STEPS
from prismatic.util.errors import ConfigError

BETA_ALPHA = 1.5  # π0's time distribution: Beta(1.5, 1), which puts more samples near t = 1 (noisier inputs)
TIME_SCALE = 0.999  # t = Beta * 0.999 + 0.001: t never reaches 0, where the input would be the target itself
TIME_OFFSET = 0.001

VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sample_time(
    batch_size: int, *, generator: torch.Generator | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """One flow time per sample, `[batch_size]` float32 in [0.001, 1.0], drawn as π0 draws it.

    Beta(1.5, 1) has the CDF x ** 1.5, so it is drawn by inverting it, u ** (1 / 1.5) with u uniform: the same
    distribution as `torch.distributions.Beta(1.5, 1)` (openpi's PyTorch port), which cannot take a generator.

    Args:
        batch_size: how many times to draw.
        generator: the source of randomness (same seed, same times); torch's global one when None. It must
            live on `device`.
        device: where the times are made (the generator's device when None).
    """
    if device is None and generator is not None:
        device = generator.device
    uniform = torch.rand(batch_size, generator=generator, device=device, dtype=torch.float32)
    return uniform.pow(1.0 / BETA_ALPHA) * TIME_SCALE + TIME_OFFSET


def sample_noise(
    shape: tuple[int, ...] | torch.Size,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Standard normal float32 noise of `shape` (x_1, where sampling starts), drawn from `generator`."""
    if device is None and generator is not None:
        device = generator.device
    return torch.randn(tuple(shape), generator=generator, device=device, dtype=torch.float32)


def noisy_actions_and_target(
    actions_BHD: torch.Tensor, noise_BHD: torch.Tensor, time_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The expert's input and its regression target at flow time `time_B`.

    Returns:
        x_t = t * noise + (1 - t) * actions, and the velocity target u_t = noise - actions (both `[B, H, D]`).
    """
    t = time_B.to(actions_BHD.dtype)[:, None, None]
    return t * noise_BHD + (1 - t) * actions_BHD, noise_BHD - actions_BHD


def flow_matching_loss(velocity_BHD: torch.Tensor, target_BHD: torch.Tensor) -> torch.Tensor:
    """π0's loss: the mean squared error between predicted and target velocity over every element, in float32
    (openpi's PyTorch port casts the expert's output to float32 before its last projection and the MSE).

    openpi weighs every element of the chunk alike (no mask); a head that needs per-sample sums for its metrics
    can take `(velocity - target) ** 2` itself.
    """
    if velocity_BHD.shape != target_BHD.shape:
        raise ValueError(f"velocity {tuple(velocity_BHD.shape)} and target {tuple(target_BHD.shape)} differ")
    return (velocity_BHD.float() - target_BHD.float()).square().mean()


def sample(
    velocity_fn: VelocityFn, noise_BHD: torch.Tensor, num_steps: int = DEFAULT_NUM_STEPS
) -> torch.Tensor:
    """Integrate the velocity field from t = 1 (`noise_BHD`) to t = 0 with `num_steps` Euler steps: the actions.

    `velocity_fn(x_t, time_B)` is called `num_steps` times, with `time_B` float32 `[B]` on the noise's device at
    t = 1 - k / num_steps for k = 0 .. num_steps - 1 (computed from k, not accumulated, so no drift). The caller
    chooses the grad mode (openpi samples under `no_grad`).

    Raises:
        ConfigError: `num_steps` is not a positive integer (it is a user setting).
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ConfigError(
            f"The flow-matching sampler's number of Euler steps must be a positive integer (π0's default: "
            f"{DEFAULT_NUM_STEPS}); got {num_steps!r}."
        )
    dt = -1.0 / num_steps
    batch_size = noise_BHD.shape[0]
    x_t = noise_BHD
    for k in range(num_steps):
        time_B = torch.full((batch_size,), 1.0 - k / num_steps, dtype=torch.float32, device=noise_BHD.device)
        x_t = x_t + dt * velocity_fn(x_t, time_B)
    return x_t
