"""Optimizer parameter groups and the two LR schedules."""

from __future__ import annotations

import math

import pytest
import torch

from prismatic.training.optim import build_lr_scheduler, build_optimizer
from prismatic.util.errors import ConfigError


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    model[2].weight.requires_grad_(False)
    return model


def test_no_weight_decay_on_biases_and_norms_and_frozen_params_excluded():
    model = _model()
    opt = build_optimizer(model, learning_rate=1e-3, weight_decay=0.1)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(model[0].weight)}
    assert {id(p) for p in no_decay["params"]} == {
        id(model[0].bias),
        id(model[1].weight),
        id(model[1].bias),
        id(model[2].bias),
    }


def test_warmup_cosine_schedule_values():
    opt = build_optimizer(_model(), learning_rate=1.0, weight_decay=0.0)
    sched = build_lr_scheduler(opt, "linear-warmup+cosine-decay", num_training_steps=100, warmup_ratio=0.1)
    lrs = []
    for _ in range(100):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(0.5) and lrs[10] == pytest.approx(1.0)
    assert lrs[55] == pytest.approx(0.5 * (1 + math.cos(math.pi * 45 / 90)))
    assert lrs[99] < 0.001


def test_constant_schedule_and_unknown_type():
    opt = build_optimizer(_model(), learning_rate=0.5, weight_decay=0.0)
    sched = build_lr_scheduler(opt, "constant", num_training_steps=10, warmup_ratio=0.0)
    for _ in range(5):
        opt.step()
        sched.step()
    assert sched.get_last_lr() == [0.5, 0.5]
    with pytest.raises(ConfigError, match="Unknown lr_scheduler_type 'cosine'"):
        build_lr_scheduler(opt, "cosine", 10, 0.0)


def test_scheduler_state_round_trips():
    opt = build_optimizer(_model(), learning_rate=1.0, weight_decay=0.0)
    sched = build_lr_scheduler(opt, "linear-warmup+cosine-decay", 50, 0.2)
    for _ in range(17):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = build_optimizer(_model(), learning_rate=1.0, weight_decay=0.0)
    sched2 = build_lr_scheduler(opt2, "linear-warmup+cosine-decay", 50, 0.2)
    sched2.load_state_dict(state)
    opt2.step()
    sched2.step()
    opt.step()
    sched.step()
    assert sched2.get_last_lr() == sched.get_last_lr()


def test_step_decay_equals_multistep_lr():
    """OpenVLA-OFT's schedule: the peak for `num_steps_before_decay` optimiser steps, then a tenth (its
    `MultiStepLR(milestones=[N], gamma=0.1)`, which torch computes independently here)."""
    opt = build_optimizer(_model(), learning_rate=5e-4, weight_decay=0.0)
    sched = build_lr_scheduler(opt, "step-decay", 10, 0.0, num_steps_before_decay=4)
    reference_opt = torch.optim.AdamW(_model().parameters(), lr=5e-4)
    reference = torch.optim.lr_scheduler.MultiStepLR(reference_opt, milestones=[4], gamma=0.1)
    ours, theirs = [], []
    for _ in range(10):
        ours.append(sched.get_last_lr()[0])
        theirs.append(reference.get_last_lr()[0])
        for o, s in ((opt, sched), (reference_opt, reference)):
            o.step()
            s.step()
    assert ours == pytest.approx(theirs, rel=1e-12)
    assert ours[3] == 5e-4 and ours[4] == pytest.approx(5e-5)
    with pytest.raises(ConfigError, match="num_steps_before_decay"):
        build_lr_scheduler(opt, "step-decay", 10, 0.0)
