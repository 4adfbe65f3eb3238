"""The flow-matching action expert (prismatic/models/action_heads/flow/expert.py) on tiny sizes.

Expected values are written out in the test: π0's sine-cosine time embedding from its formula in numpy (and one
value by hand), exact equalities between two ways of computing the same velocity, a zero velocity at
initialisation (the design's zero-initialised gates and output), and a tiny overfit whose targets are the training
actions themselves. None comes from the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from prismatic.models.action_heads.flow import (
    FlowExpert,
    FlowExpertBlock,
    FlowExpertOptions,
    flow_matching_loss,
    noisy_actions_and_target,
    sample,
    sample_noise,
    sample_time,
    time_embedding,
)
from prismatic.util.errors import ConfigError

TINY = FlowExpertOptions(width=32, depth=2, num_heads=4, mlp_ratio=2.0)
LLM_DIM, ACTION_DIM, CHUNK, PROPRIO, PREFIX_LEN = 16, 3, 4, 2, 5


def build(proprio_dim: int = PROPRIO, seed: int = 0, random_gates: bool = True) -> FlowExpert:
    """A tiny expert; `random_gates` replaces the zero-initialised gates and output (which make the velocity exactly
    zero) with random values, so the tests can see how inputs reach the velocity."""
    torch.manual_seed(seed)
    expert = FlowExpert(TINY, LLM_DIM, ACTION_DIM, CHUNK, proprio_dim)
    if random_gates:
        for name, param in expert.named_parameters():
            if "modulation" in name or name.startswith("output."):
                nn.init.normal_(param, std=0.3)
    return expert


def inputs(batch: int = 2, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, PREFIX_LEN, dtype=torch.bool)
    mask[0, -2:] = False  # sample 0: its last two prefix positions are padding
    return {
        "prefix": torch.randn(batch, PREFIX_LEN, LLM_DIM, generator=g) * 3,
        "mask": mask,
        "x_t": torch.randn(batch, CHUNK, ACTION_DIM, generator=g),
        "time": torch.rand(batch, generator=g) * 0.9 + 0.1,
        "proprio": torch.randn(batch, PROPRIO, generator=g),
    }


def velocity(expert: FlowExpert, x: dict[str, torch.Tensor], **changes: torch.Tensor) -> torch.Tensor:
    x = {**x, **changes}
    cache = expert.encode_prefix(x["prefix"], x["mask"])
    return expert(cache, x["x_t"], x["time"], x["proprio"] if expert.proprio_dim else None)


def test_shape_dtype_seeded_build_and_zero_velocity_at_init():
    expert = build(random_gates=False)
    x = inputs()
    v = velocity(expert, x)
    assert v.shape == (2, CHUNK, ACTION_DIM) and v.dtype == torch.float32
    # Gates and output projection start at zero: the untrained expert predicts no motion at all.
    assert torch.equal(v, torch.zeros(2, CHUNK, ACTION_DIM))
    again = build(random_gates=False).state_dict()
    assert all(torch.equal(value, again[key]) for key, value in expert.state_dict().items())
    # One block per nn.Module in `blocks` (the unit FSDP2 shards and activation checkpointing wraps).
    assert isinstance(expert.blocks, nn.ModuleList) and len(expert.blocks) == TINY.depth
    assert all(isinstance(block, FlowExpertBlock) for block in expert.blocks)


def test_padded_prefix_positions_do_not_reach_the_velocity():
    expert, x = build(), inputs()
    v = velocity(expert, x)
    changed = x["prefix"].clone()
    changed[0, -2:] = torch.randn(2, LLM_DIM) * 100
    assert torch.equal(velocity(expert, x, prefix=changed), v)
    changed[0, -2:] = float("nan")
    assert torch.equal(velocity(expert, x, prefix=changed), v)
    # A real position does change it, for that sample only. (Not by a constant: the prefix's LayerNorm removes that.)
    changed = x["prefix"].clone()
    changed[0, 1] = torch.randn(LLM_DIM, generator=torch.Generator().manual_seed(9))
    moved = velocity(expert, x, prefix=changed)
    assert not torch.allclose(moved[0], v[0], atol=1e-4) and torch.equal(moved[1], v[1])


def test_prefix_encoded_once_equals_recomputed_each_step_and_inputs_stay_untouched():
    expert, x = build(), inputs()
    originals = {key: value.clone() for key, value in x.items()}
    cache = expert.encode_prefix(x["prefix"], x["mask"])
    cached_keys = [k.clone() for k in cache.keys]
    g = torch.Generator().manual_seed(5)
    for step in range(4):
        x_t = torch.randn(2, CHUNK, ACTION_DIM, generator=g)
        time = torch.full((2,), 1.0 - step / 4)
        reused = expert(cache, x_t, time, x["proprio"])
        fresh = expert(expert.encode_prefix(x["prefix"], x["mask"]), x_t, time, x["proprio"])
        assert torch.equal(reused, fresh)
    assert all(torch.equal(a, b) for a, b in zip(cache.keys, cached_keys, strict=True))
    assert all(torch.equal(x[key], originals[key]) for key in x)


def test_blocks_projecting_the_prefix_in_their_forward_give_the_cached_velocity_and_gradients():
    """`encode_prefix(per_block=False)` (a training step's: one velocity per observation) leaves each block to
    project the prefix inside its forward: the same numbers as the keys and values projected beforehand."""
    x = inputs()
    results = []
    for per_block in (True, False):
        expert = build()
        cache = expert.encode_prefix(x["prefix"], x["mask"], per_block=per_block)
        assert (cache.keys is None) is (not per_block) and cache.narrowed_BLW.shape == (
            2,
            PREFIX_LEN,
            TINY.width,
        )
        v = expert(cache, x["x_t"], x["time"], x["proprio"])
        v.square().sum().backward()
        results.append((v, {name: p.grad for name, p in expert.named_parameters()}))
    (cached, cached_grads), (inline, inline_grads) = results
    assert torch.equal(inline, cached)
    assert all(torch.equal(inline_grads[name], grad) for name, grad in cached_grads.items())


def test_time_embedding_is_pi0s_sine_cosine_formula():
    # dim 2 has one period, the shortest (4e-3): t = 0.001 is a quarter turn, sin = 1 and cos = 0.
    one = time_embedding(torch.tensor([0.001]), 2)
    assert one.dtype == torch.float32 and torch.allclose(one, torch.tensor([[1.0, 0.0]]), atol=1e-6)
    t = np.array([0.001, 0.1, 0.37, 1.0])
    half = 5
    periods = 4e-3 * (4.0 / 4e-3) ** (np.arange(half) / (half - 1))  # geometric from 4e-3 to 4.0
    angles = 2 * np.pi * t[:, None] / periods[None, :]
    expected = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    got = time_embedding(torch.tensor(t, dtype=torch.float32), 2 * half)
    # float32 times: t itself is rounded by up to 6e-8 relative, times 2π / 4e-3 at most.
    assert np.abs(got.numpy() - expected).max() < 1e-4
    got64 = time_embedding(torch.tensor(t, dtype=torch.float64), 2 * half)
    assert np.abs(got64.numpy() - expected).max() < 1e-6
    with pytest.raises(ValueError, match="even"):
        time_embedding(torch.tensor([0.5]), 3)


def test_time_and_proprio_reach_the_velocity():
    expert, x = build(), inputs()
    v = velocity(expert, x)
    assert not torch.allclose(velocity(expert, x, time=x["time"] * 0.5), v, atol=1e-4)
    assert not torch.allclose(velocity(expert, x, proprio=x["proprio"] + 1.0), v, atol=1e-4)
    cache = expert.encode_prefix(x["prefix"], x["mask"])
    with pytest.raises(ValueError, match="reads proprio"):
        expert(cache, x["x_t"], x["time"])
    blind = build(proprio_dim=0)
    out = velocity(blind, x)
    assert out.shape == (2, CHUNK, ACTION_DIM) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="without proprio"):
        blind(blind.encode_prefix(x["prefix"], x["mask"]), x["x_t"], x["time"], x["proprio"])


def test_gradients_reach_every_parameter():
    expert, x = build(), inputs()
    velocity(expert, x).square().mean().backward()
    missing = [name for name, p in expert.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_the_euler_sampler_drives_the_expert_seeded():
    expert, x = build(), inputs()
    cache = expert.encode_prefix(x["prefix"], x["mask"])
    calls = []

    def velocity_fn(x_t, time_B):
        calls.append(time_B)
        return expert(cache, x_t, time_B, x["proprio"])

    def draw(seed):
        noise = sample_noise((2, CHUNK, ACTION_DIM), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            return sample(velocity_fn, noise, num_steps=3)

    a, b, c = draw(7), draw(7), draw(8)
    assert a.shape == (2, CHUNK, ACTION_DIM) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.allclose(a, c)
    assert len(calls) == 9


def test_tiny_overfit_then_ten_euler_steps_land_on_the_actions():
    torch.manual_seed(0)
    expert = FlowExpert(TINY, LLM_DIM, ACTION_DIM, CHUNK, PROPRIO)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randn(4, PREFIX_LEN, LLM_DIM, generator=g)
    mask = torch.ones(4, PREFIX_LEN, dtype=torch.bool)
    mask[1, -1] = mask[3, -3:] = False
    proprio = torch.randn(4, PROPRIO, generator=g)
    actions = torch.rand(4, CHUNK, ACTION_DIM, generator=g) * 2 - 1
    steps, repeat = 200, 16  # each pair 16 times per step: 64 (time, noise) draws
    optimizer = torch.optim.Adam(expert.parameters(), lr=5e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    losses = []
    for _ in range(steps):
        cache = expert.encode_prefix(prefix.repeat(repeat, 1, 1), mask.repeat(repeat, 1))
        target_actions = actions.repeat(repeat, 1, 1)
        time = sample_time(4 * repeat, generator=g)
        noise = sample_noise(target_actions.shape, generator=g)
        x_t, u_t = noisy_actions_and_target(target_actions, noise, time)
        loss = flow_matching_loss(expert(cache, x_t, time, proprio.repeat(repeat, 1)), u_t)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    # The zero-velocity start has loss E|noise - actions|^2 = 1 + E[a^2] = 4/3 for a ~ U(-1, 1).
    assert losses[0] == pytest.approx(4 / 3, abs=0.3)
    assert np.mean(losses[-20:]) < 0.1 * np.mean(losses[:20])
    draws = 3  # three noise draws per pair, sampled as one batch
    with torch.no_grad():
        cache = expert.encode_prefix(prefix.repeat(draws, 1, 1), mask.repeat(draws, 1))
        noise = sample_noise((4 * draws, CHUNK, ACTION_DIM), generator=torch.Generator().manual_seed(1))
        sampled = sample(lambda x_t, t: expert(cache, x_t, t, proprio.repeat(draws, 1)), noise, num_steps=10)
    error = (sampled - actions.repeat(draws, 1, 1)).abs()
    # Tolerances measured over five training seeds and three noise draws each, with margin: mean error at most
    # 0.022 (allowed 0.06), the worst value off by at most 0.18 (allowed 0.3); two pairs' chunks differ by 0.67 in
    # mean absolute value, so each sample also lands nearest its own pair's actions.
    assert error.mean() < 0.06 and error.max() < 0.3, (error.mean(), error.max())
    distances = (sampled[:, None] - actions[None]).abs().mean(dim=(2, 3))  # [draws * 4, 4]
    assert distances.argmin(dim=1).tolist() == list(range(4)) * draws


def test_bf16_autocast_and_bf16_weights_run_on_cpu():
    expert, x = build(), inputs()
    reference = velocity(expert, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = velocity(expert, x)
    assert mixed.dtype == torch.float32 and mixed.shape == reference.shape
    # bf16 keeps 8 significant bits: a few percent of the velocity's scale.
    assert (mixed - reference).abs().max() < 0.05 * reference.abs().max()
    halved = velocity(expert.to(torch.bfloat16), x)
    assert halved.dtype == torch.float32 and (halved - reference).abs().max() < 0.05 * reference.abs().max()


def test_blocks_run_under_activation_checkpointing():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    expert, x = build(), inputs()
    plain = velocity(expert, x)
    plain.sum().backward()
    grads = {name: p.grad.clone() for name, p in expert.named_parameters()}
    expert.zero_grad()
    for i, block in enumerate(expert.blocks):
        expert.blocks[i] = checkpoint_wrapper(block)
    wrapped = velocity(expert, x)
    wrapped.sum().backward()
    assert torch.equal(wrapped, plain)
    for name, p in expert.named_parameters():
        key = name.replace("_checkpoint_wrapped_module.", "")
        assert torch.allclose(p.grad, grads[key], rtol=0, atol=1e-6), name


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"width": 0}, "width"),
        ({"depth": 2.0}, "depth"),
        ({"num_heads": True}, "num_heads"),
        ({"width": 30, "num_heads": 4}, "multiple of its num_heads"),
        ({"width": 5, "num_heads": 5}, "even"),
        ({"mlp_ratio": 0}, "mlp_ratio"),
    ],
)
def test_bad_options_are_config_errors(changes, named):
    with pytest.raises(ConfigError, match=named):
        FlowExpertOptions(**changes)


def test_defaults_are_pi0s_expert_size():
    options = FlowExpertOptions()
    assert (options.width, options.depth, options.num_heads, options.mlp_width) == (1024, 18, 8, 4096)
    assert math.isclose(options.mlp_ratio, 4.0)
