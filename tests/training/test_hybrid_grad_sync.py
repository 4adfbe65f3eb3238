"""Hybrid sharding with gradient accumulation and `--grad_sync micro-batch`: the cross-node all-reduce runs on the
step's last micro-batch only; earlier micro-batches are reduce-scattered within the node and their partial sums wait.

Read from what the strategy builds and does, not from what it logs: the FSDP2 units' own flags
(`reduce_grads`: reduce-scatter, `all_reduce_grads`: the all-reduce over the replicate dimension) inside
`strategy.accumulate(...)` for each micro-batch, and the all-reduce calls a real backward issues per micro-batch.
The gradients after the step equal those of the same step with the all-reduce run after every micro-batch.

The 2-D mesh needs two ranks on two "nodes": one `torchrun --nproc-per-node 2` of this file (its `__main__` is the
worker), each rank told it is a node of its own (LOCAL_WORLD_SIZE=1, as in tests/training/test_strategy_builds.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

BASE, VLA = "tiny-vit+tiny-llama", "tiny+mx-toy"
K, PER_DEVICE = 2, 2  # micro-batches per step, frames per micro-batch


def _strategy(grad_sync: str, sharding: str, rank: int, world: int, nodes: int) -> Any:
    from prismatic.conf.vla import get_vla_config
    from prismatic.models import build_vlm
    from prismatic.models.action_heads import ActionSpec
    from prismatic.training.strategies import get_train_strategy
    from prismatic.util.dist import DistInfo

    vla = get_vla_config(VLA)
    vla.train_strategy, vla.per_device_batch_size = "fsdp-full-shard", PER_DEVICE
    vla.global_batch_size = K * PER_DEVICE * world
    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    vlm.attach_action_modules(ActionSpec())
    info = DistInfo(rank, 0 if nodes > 1 else rank, world, nodes, torch.device("cpu"))
    strategy = get_train_strategy(vlm, vla, info, grad_sync=grad_sync, sharding=sharding)
    strategy.setup(2)
    assert strategy.grad_accumulation_steps == K
    return strategy


def _flags(model: torch.nn.Module) -> list[list[bool]]:
    """Every FSDP2 unit's (reduce-scatter, cross-replica all-reduce) flags, deduplicated."""
    from torch.distributed.fsdp import FSDPModule

    groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if isinstance(m, FSDPModule)]
    return sorted({(g.reduce_grads, g.all_reduce_grads) for g in groups if g is not None})


def _batch(vlm: Any, rank: int, micro: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + micro)
    vocab = vlm.llm_backbone.tokenizer.vocab_size
    input_ids = torch.randint(3, vocab, (PER_DEVICE, 12), generator=g)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids, dtype=torch.bool),
        "labels": input_ids.clone(),
        "pixel_values": torch.rand(PER_DEVICE, *vlm.vision_backbone.default_image_resolution, generator=g),
    }


def _one_step(strategy: Any, rank: int, defer: bool) -> dict[str, Any]:
    """K micro-batches through `strategy.accumulate`: flags inside each, all-reduces issued by each backward,
    and the gradients after the step (whole, as a flat vector)."""
    from torch.distributed.tensor import DTensor

    if not defer:  # the same step with the all-reduce after every micro-batch, for the gradients to compare
        strategy.defer_cross_node_reduce = contextlib.nullcontext
    vlm, model = strategy.vlm, strategy.model
    calls: list[list[int]] = []
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        calls.append(dist.get_process_group_ranks(kwargs["group"]) if kwargs.get("group") else [-1])
        return real(tensor, *args, **kwargs)

    per_micro = []
    for micro in range(K):
        with strategy.accumulate(is_last_micro_batch=micro == K - 1):
            flags = _flags(model)
            calls.clear()
            dist.all_reduce = counted
            try:
                (model(**_batch(vlm, rank, micro)).loss / K).backward()
            finally:
                dist.all_reduce = real
        per_micro.append({"flags": flags, "all_reduces": list(calls)})
    grads = [
        (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).flatten()
        for p in model.parameters()
        if p.grad is not None
    ]
    return {"per_micro": per_micro, "after": _flags(model), "grad": torch.cat(grads)}


def _worker(out_dir: Path) -> None:
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    os.environ["LOCAL_WORLD_SIZE"] = "1"  # two nodes of one rank: the (replicate 2 x shard 1) mesh
    deferred = _one_step(_strategy("micro-batch", "hybrid", rank, world, world), rank, defer=True)
    every = _one_step(_strategy("micro-batch", "hybrid", rank, world, world), rank, defer=False)
    results: dict[str, Any] = {
        "hybrid-micro-batch": {k: v for k, v in deferred.items() if k != "grad"},
        "grad_max_abs_diff": (deferred["grad"] - every["grad"]).abs().max().item(),
        "grad_max_abs": every["grad"].abs().max().item(),
        "every_micro_batch_all_reduces": [len(m["all_reduces"]) for m in every["per_micro"]],
    }
    step = _strategy("step", "hybrid", rank, world, world)
    with step.accumulate(is_last_micro_batch=False):
        results["hybrid-step-non-final"] = _flags(step.model)
    os.environ["LOCAL_WORLD_SIZE"] = "2"  # one node of two ranks: a 1-D mesh, nothing crosses nodes
    one_node = _strategy("micro-batch", "auto", rank, world, 1)
    with one_node.accumulate(is_last_micro_batch=False):
        results["one-node-micro-batch-non-final"] = _flags(one_node.model)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from train_runs import run_torchrun_worker

    out = tmp_path_factory.mktemp("hybrid_grad_sync")
    run_torchrun_worker(__file__, out, timeout=300)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_non_final_micro_batches_reduce_scatter_without_the_cross_node_all_reduce(
    two_ranks: list[dict[str, Any]],
) -> None:
    for rank, results in enumerate(two_ranks):
        first, last = results["hybrid-micro-batch"]["per_micro"]
        # (reduce-scatter, all-reduce across nodes) of every unit
        assert first["flags"] == [[True, False]], rank
        assert last["flags"] == [[True, True]], rank
        assert results["hybrid-micro-batch"]["after"] == [[True, True]], rank  # restored after the step
        # what the backward issued: no all-reduce on the first micro-batch, only the replicate group's on the last
        assert first["all_reduces"] == [], rank
        assert len(last["all_reduces"]) > 0 and all(g == [0, 1] for g in last["all_reduces"]), rank
        # without the deferral every micro-batch all-reduces, as often as the last one does with it
        assert results["every_micro_batch_all_reduces"] == [len(last["all_reduces"])] * K, rank


def test_deferring_the_all_reduce_leaves_the_gradients_as_they_were(two_ranks: list[dict[str, Any]]) -> None:
    """Partial sums added before one all-reduce vs all-reduced one by one: equal up to FP32 summation order."""
    for results in two_ranks:
        assert results["grad_max_abs"] > 0
        assert results["grad_max_abs_diff"] <= 1e-6 * results["grad_max_abs"]


def test_other_modes_keep_their_own_reduction(two_ranks: list[dict[str, Any]]) -> None:
    """`--grad_sync step` skips the reduction on non-final micro-batches (no_sync) whatever the mesh; on one node
    (a 1-D mesh) `micro-batch` reduces fully, there being no cross-node all-reduce to defer."""
    for results in two_ranks:
        assert results["hybrid-step-non-final"] == [[False, False]]  # FSDP2's no_sync clears both
        assert results["one-node-micro-batch-non-final"] == [[True, True]]


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
