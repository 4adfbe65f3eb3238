"""An async DCP save of a CUDA training state through `CheckpointManager`, loaded into a freshly wrapped model.

The state is an FSDP2 + bf16 model after one step (so AdamW has moments) on the GPU. The async save stages the
CUDA tensors to host memory and returns; a further step then changes every weight while the write runs in the
background, so the checkpoint must hold the values at the save, not the live tensors. A fresh wrap (other initial
weights, an optimizer without state) loads it: weights and AdamW moments equal the values at the save exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_setup import Built, build, local, micro_batches, tiny_vla, train_steps

from prismatic.training.checkpointing import CheckpointManager, training_state
from prismatic.util.dist import DistInfo

pytestmark = pytest.mark.gpu

MOMENTS = ("exp_avg", "exp_avg_sq", "step")


def _state(built: Built, counters: dict[str, int]) -> dict:
    strategy = built.strategy
    return training_state(strategy.model, strategy.optimizer, strategy.lr_scheduler, counters)


def _snapshot(built: Built) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Copies of every parameter and of AdamW's state per trainable parameter, by name."""
    strategy = built.strategy
    weights = {name: local(p) for name, p in strategy.model.named_parameters()}
    moments = {
        name: {key: local(strategy.optimizer.state[p][key]) for key in MOMENTS}
        for name, p in strategy.model.named_parameters()
        if p.requires_grad
    }
    return weights, moments


def test_async_save_of_cuda_state_loads_into_a_fresh_wrap(process_group: DistInfo, tmp_path: Path) -> None:
    vla = tiny_vla(train_strategy="fsdp-full-shard")
    built = build(vla, process_group)
    batches = micro_batches(built, 4)
    train_steps(built, batches[:2])
    weights, moments = _snapshot(built)
    assert all(w.device == process_group.device for w in weights.values())

    manager = CheckpointManager(tmp_path, save_interval=1, keep_last=None, async_save=True, rank=0)
    counters = {"step": 1, "epoch": 0, "frames": 8}
    path = manager.save(_state(built, counters), {"step": 1, "epoch": 0})
    train_steps(built, batches[2:], start_step=1)  # while the write may still run
    moved = _snapshot(built)[0]
    assert all(
        not torch.equal(moved[n], w) for n, w in weights.items() if w.is_floating_point() and n in moments
    )
    manager.wait()
    assert path.is_dir() and manager.last_saved == path

    fresh = build(vla, process_group, seed=1)
    assert any(not torch.equal(local(p), weights[n]) for n, p in fresh.strategy.model.named_parameters())
    restored_counters = {"step": 0, "epoch": 0, "frames": 0}
    loader = CheckpointManager(tmp_path, save_interval=1, keep_last=None, async_save=False, rank=0)
    loader.load(path, _state(fresh, restored_counters), same_world_size=True)

    got_weights, got_moments = _snapshot(fresh)
    assert got_weights.keys() == weights.keys() and got_moments.keys() == moments.keys()
    for name, want in weights.items():
        assert got_weights[name].device == want.device
        assert torch.equal(got_weights[name], want), name
    for name, want in moments.items():
        for key in MOMENTS:
            assert torch.equal(got_moments[name][key].cpu(), want[key].cpu()), (name, key)
    assert restored_counters == counters
