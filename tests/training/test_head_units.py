"""An action head's own units (`HeadModule.get_blocks`, `prismatic/training/strategies/head_units.py`): what each
head declares, how checkpointing and compiling treat the flow expert's blocks, that an FSDP2-sharded flow head
module computes what the plain one does, and that a bf16 DDP step (autocast) trains the expert.

The two-rank FSDP2 facts (each expert block its own unit, its parameters sharded on dim 0, a bf16 step that moves
them) come from the one two-rank launch of tests/training/test_strategy_builds.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from prismatic.conf.vla import get_vla_config
from prismatic.models.action_heads import ActionSpec
from prismatic.models.action_heads.base import HeadInputs
from prismatic.models.action_heads.flow.head import FlowActionHead, FlowHeadModule
from prismatic.models.action_heads.l1_chunk import L1ChunkActionHead
from prismatic.models.action_heads.tokens import TokenActionHead
from prismatic.models.parallelize import SelectiveCheckpointWrapper
from prismatic.training.metrics import StepMetrics
from prismatic.training.model_setup import attach_action_head, build_vlm
from prismatic.training.strategies import get_train_strategy
from prismatic.training.strategies.head_units import (
    checkpoint_head_blocks,
    compile_head_blocks,
    head_module,
    shard_head_blocks,
)
from prismatic.training.trainer import train_step
from prismatic.util.dist import DistInfo
from prismatic.vla.datasets.synthetic import synthetic_batch

DEPTH, WIDTH, LLM_DIM, ACTION_DIM, CHUNK, PROPRIO = 3, 32, 16, 3, 4, 2
FLOW_OPTIONS = {"width": WIDTH, "depth": DEPTH, "num_heads": 4, "mlp_ratio": 2.0, "num_steps": 2}
# What the tiny flow preset's data looks like to `attach_action_head`: 7-dim actions, 8-dim proprio.
STATS = {"synthetic": {"action": {"q01": [-1.0] * 7}, "proprio": {"q01": [0.0] * 8}}}


def flow_module(seed: int = 0) -> FlowHeadModule:
    """A tiny flow head module whose gates and output are random (zero at init would hide every block's work)."""
    torch.manual_seed(seed)
    spec = ActionSpec("flow", CHUNK, ACTION_DIM, PROPRIO, head_options=FLOW_OPTIONS)
    module = FlowActionHead.build_module(spec, LLM_DIM)
    for name, param in module.named_parameters():
        if "modulation" in name or ".output." in name:
            nn.init.normal_(param, std=0.3)
    return module


def head_inputs(seed: int = 1) -> HeadInputs:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, -2:] = False
    return HeadInputs(
        hidden_BSE=torch.randn(2, 6, LLM_DIM, generator=g),
        mask_BS=mask,
        action_mask_BS=torch.zeros(2, 6, dtype=torch.bool),
        num_prefix_tokens=3,
        actions=torch.rand(2, CHUNK, ACTION_DIM, generator=g) * 2 - 1,
        proprio=torch.randn(2, PROPRIO, generator=g),
        generator=torch.Generator().manual_seed(seed + 1),
    )


def test_each_head_declares_its_units_the_flow_expert_its_blocks() -> None:
    flow = flow_module()
    blocks = flow.get_blocks()
    assert (
        blocks is flow.expert.blocks and len(blocks) == DEPTH
    )  # the container itself, so wrappers replace entries
    assert FlowHeadModule.block_methods == ("project_prefix",)
    assert all(callable(getattr(block, "project_prefix", None)) for block in blocks)
    # OFT's MLP is small: its blocks stay in the root unit. The tokens head has no module at all.
    l1 = L1ChunkActionHead.build_module(ActionSpec("l1-chunk", CHUNK, ACTION_DIM), LLM_DIM)
    assert len(l1.get_blocks()) == 0 and l1.block_methods == ()
    assert TokenActionHead.build_module(ActionSpec(), LLM_DIM) is None
    vlm = nn.Module()
    assert head_module(vlm) is None
    vlm.action_head = flow
    assert head_module(vlm) is flow
    assert (checkpoint_head_blocks(None, "full"), compile_head_blocks(None), shard_head_blocks(None)) == (
        0,
        0,
        0,
    )


@pytest.mark.parametrize(
    ("policy", "wrapped", "wrapper"),
    [("full", [0, 1, 2], CheckpointWrapper), ("every-2", [0, 2], CheckpointWrapper)]
    + [("selective-ops", [0, 1, 2], SelectiveCheckpointWrapper)],
)
def test_checkpointing_wraps_the_blocks_the_policy_names_and_computes_the_same(
    policy: str, wrapped: list[int], wrapper: type
) -> None:
    plain, module = flow_module(), flow_module()
    inner = list(module.get_blocks())
    assert checkpoint_head_blocks(module, policy) == len(wrapped)
    for index, block in enumerate(module.expert.blocks):
        if index in wrapped:
            assert type(block) is wrapper and block._checkpoint_wrapped_module is inner[index]
        else:
            assert block is inner[index]
    expected, got = plain(head_inputs()), module(head_inputs())
    assert torch.equal(got.prediction, expected.prediction) and torch.equal(got.target, expected.target)
    expected.prediction.sum().backward()
    got.prediction.sum().backward()
    grads = {name: p.grad for name, p in plain.named_parameters()}
    for name, p in module.named_parameters():
        assert torch.allclose(p.grad, grads[name.replace("_checkpoint_wrapped_module.", "")], atol=1e-6), name


def test_compiling_compiles_each_block_s_forward_inside_its_wrapper() -> None:
    module = flow_module()
    checkpoint_head_blocks(module, "every-2")  # block 0 wrapped, block 1 not, block 2 wrapped
    assert compile_head_blocks(module, {"dynamic": False}) == DEPTH
    for block in module.expert.blocks:
        inner = getattr(block, "_checkpoint_wrapped_module", block)
        # torch.compile's wrapper keeps the function it compiles; nothing runs until the first forward.
        assert inner.forward._torchdynamo_orig_callable.__self__ is inner
        assert (
            "forward" not in vars(block) or block is inner
        )  # the wrapper's own call stays outside the graph


@pytest.mark.parametrize("checkpointed", [False, True])
def test_fsdp2_sharded_head_module_matches_the_plain_one(one_rank: DistInfo, checkpointed: bool) -> None:
    """A flow head module sharded as the FSDP strategies shard it (its blocks, then the module as the root) gives
    the plain module's velocity and gradients in training, and its sampled chunks in validation, where
    `project_prefix` gathers its block's weights as a forward method (unregistered, it would meet the sharded
    weights)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    plain, sharded = flow_module(), flow_module()
    expected = plain(head_inputs())
    expected.prediction.sum().backward()
    if checkpointed:
        checkpoint_head_blocks(sharded, "full")
    mesh = init_device_mesh("cpu", (1,))
    assert shard_head_blocks(sharded, mesh=mesh) == DEPTH
    fully_shard(sharded, mesh=mesh)
    assert all(isinstance(block, FSDPModule) for block in sharded.get_blocks())
    got = sharded(head_inputs())
    got.prediction.sum().backward()
    assert torch.equal(got.prediction, expected.prediction) and torch.equal(got.target, expected.target)
    grads = {name: p.grad for name, p in plain.named_parameters()}
    for name, p in sharded.named_parameters():
        assert isinstance(p, DTensor), name
        expected_grad = grads[name.replace("_checkpoint_wrapped_module.", "")]
        assert torch.allclose(p.grad.full_tensor(), expected_grad, rtol=0, atol=1e-6), name
    # Validation samples from keys and values each block's `project_prefix` made before the Euler steps.
    with torch.no_grad():
        expected, got = plain.eval()(head_inputs()), sharded.eval()(head_inputs())
    assert torch.equal(got.actions, expected.actions) and torch.equal(got.prediction, expected.prediction)


def test_bf16_ddp_steps_under_autocast_train_the_checkpointed_expert(one_rank: DistInfo) -> None:
    """DDP's mixed precision is autocast over FP32 trainable weights: the expert's blocks are checkpointed (the tiny
    preset trains with activation checkpointing), the losses are finite float32 and every block learns. Its
    gates start at zero and so does the output projection, which passes no gradient back until the first step
    has moved it: the gates are non-zero after the second step by their gradients alone (weight decay keeps a
    zero at zero)."""
    torch.manual_seed(0)
    vla = get_vla_config("tiny-flow+mx-toy")
    vla.train_strategy, vla.enable_mixed_precision_training = "ddp", True
    vla.per_device_batch_size, vla.global_batch_size = 2, 2
    vlm = build_vlm(vla, None)
    head = attach_action_head(vlm, vla, STATS)
    strategy = get_train_strategy(vlm, vla, one_rank)
    strategy.setup(2)
    assert strategy.plan.mixed_precision and strategy.plan.checkpointing_policy == "full"
    blocks = vlm.action_head.get_blocks()
    assert all(isinstance(block, CheckpointWrapper) for block in blocks)
    assert all(not block.modulation.weight.any() for block in blocks)  # adaLN-Zero
    assert all(p.dtype == torch.float32 for p in blocks.parameters())  # trainable: FP32 master weights
    metrics = StepMetrics(["synthetic"], head, one_rank.device)
    batches = iter([synthetic_batch(vlm, head, 2, seed=seed) for seed in range(2)])
    losses = [metrics.reduce(train_step(strategy, head, batches, metrics))["loss"] for _ in range(2)]
    assert all(math.isfinite(loss) for loss in losses), losses
    assert all(block.modulation.weight.any() for block in blocks)
    with torch.no_grad(), strategy.autocast():
        output = head(strategy.model, strategy.to_device(synthetic_batch(vlm, head, 2, seed=2)))
    assert output.loss.dtype == torch.float32 and math.isfinite(output.loss.item())
