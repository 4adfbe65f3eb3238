"""No host sync inside a training step: every call that would make the host wait for a CUDA device, recorded on
CPU by where it is made (`tests/host_reads.py`).

`train_step` (forward, backward, clipping and fused AdamW over two micro-batches, with what `auto` resolves to on
CUDA: `causal_mask_only`, `logits_at_labels`, fused AdamW) makes none: the unmasked LLM forward runs under
`causal_attention`, without transformers' packed-sequence check (`find_packed_sequence_indices`, which reads its
result on the host; tests/models/test_causal_attention.py shows it there without the context). The step's metrics
copy (`StepMetrics.reduce`) follows the step, by design. On a GPU `benchmarks/bench_gpu.py` counts the syncs per
step with `torch.cuda.set_sync_debug_mode`.
"""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads

from prismatic.conf.vla import get_vla_config
from prismatic.training.metrics import StepMetrics
from prismatic.training.model_setup import attach_action_head, build_vlm
from prismatic.training.speed_plan import plan_flags
from prismatic.training.strategies import get_train_strategy
from prismatic.training.trainer import train_step
from prismatic.util.dist import DistInfo
from prismatic.vla.datasets.synthetic import synthetic_batch

THIS = "test_host_syncs.py"
DATASET = "synthetic"  # the dataset name `synthetic_batch` gives every frame


def test_the_recorder_sees_each_kind_of_host_read_in_forward_and_backward() -> None:
    """The recorder's own check, so that an empty record below means no read rather than a blind recorder."""

    class ReadsInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            grad.sum().item()
            return grad * 2

    x = torch.randn(6, requires_grad=True)
    with HostReads() as rec:
        y = ReadsInBackward.apply(x)
        _ = y[y > 0]  # boolean indexing
        bool(y.sum() > 0)
        y.detach().tolist()
        y.detach().cpu()
        y.detach().to("cpu")
        torch.unique(y.detach())
        y.detach().repeat_interleave(torch.ones(6, dtype=torch.long))  # read: the output's size
        y.detach().repeat_interleave(torch.ones(6, dtype=torch.long), output_size=6)  # not read: given
        y.detach().repeat_interleave(2)  # not read: an int
        rec.paused(lambda: y.sum().item())()  # not recorded
        y.sum().backward()
        with torch.inference_mode():  # as the policy decodes
            torch.ones(2).sum().item()
    assert [what for what, _ in rec.reads] == [
        "index",
        "_local_scalar_dense",  # bool(t)
        "tolist",
        "cpu",
        "to",
        "_unique2",
        "repeat_interleave",
        "_local_scalar_dense",
        "item",
    ]
    here = f"{THIS}:test_the_recorder_sees_each_kind_of_host_read_in_forward_and_backward"
    assert rec.sites == [here] * 7 + [f"{THIS}:backward", here]  # one read inside the backward pass


def _strategy(one_rank: DistInfo, head_kind: str, lora: bool, train_strategy: str):
    """The model, head and set-up strategy as training builds them (`prismatic.training.model_setup`)."""
    torch.manual_seed(0)
    vla = get_vla_config("tiny+mx-toy")
    # What `auto` resolves to on CUDA (tests/training/test_speed_options.py), forced on here.
    vla.speed.causal_mask_only, vla.speed.logits_at_labels, vla.speed.optimizer_impl = "on", "on", "fused"
    vla.use_lora, vla.train_strategy = lora, train_strategy
    vla.action_head, vla.chunk_size = head_kind, 4 if head_kind == "l1-chunk" else 1
    vla.per_device_batch_size, vla.global_batch_size = 2, 4  # two micro-batches per step
    vlm = build_vlm(vla, None)
    flags = plan_flags(vla, one_rank.world_size, one_rank.device)
    head = attach_action_head(vlm, vla, {DATASET: {"action": {"q01": [-1.0] * 7}}}, flags.logits_at_labels)
    strategy = get_train_strategy(vlm, vla, one_rank)
    strategy.setup(num_training_steps=4)
    return vlm, head, strategy


@pytest.mark.parametrize(
    ("head_kind", "lora", "train_strategy"),
    [
        ("tokens", True, "fsdp-full-shard"),
        ("tokens", False, "ddp"),
        ("l1-chunk", True, "fsdp-full-shard"),  # its parallel decoding passes a mask of its own
    ],
    ids=["tokens-lora-fsdp", "tokens-full-ddp", "l1chunk-lora-fsdp"],
)
def test_a_training_step_never_reads_the_device(
    one_rank: DistInfo,
    monkeypatch: pytest.MonkeyPatch,
    head_kind: str,
    lora: bool,
    train_strategy: str,
) -> None:
    vlm, head, strategy = _strategy(one_rank, head_kind, lora, train_strategy)
    assert strategy.grad_accumulation_steps == 2 and strategy.causal_mask_only
    batches = iter([synthetic_batch(vlm, head, 2, seed=seed) for seed in range(4)])
    metrics = StepMetrics([DATASET], head, one_rank.device)
    trainable = [p for p in strategy.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trainable]
    to_device = strategy.to_device
    for _ in range(2):  # the second step also runs AdamW over its state
        with HostReads() as rec:
            # `to_device` decides on the host copy of the mask (tests/training/test_speed_options.py).
            monkeypatch.setattr(strategy, "to_device", rec.paused(to_device))
            grad_norm = train_step(strategy, head, batches, metrics)
        assert rec.reads == []
    assert torch.isfinite(grad_norm) and grad_norm > 0
    assert any(not torch.equal(p.detach(), b) for p, b in zip(trainable, before, strict=True))  # it trained
    assert metrics.reduce(grad_norm)["loss"] > 0  # the step's one copy, after it
