"""A step's host work around the model: `setup` puts every module in train mode once (a step walks the modules
again only when something left the model in eval mode), clipping reads the trainable parameters `setup` listed,
with the norm of every gradient, and DDP broadcasts no buffers before each forward. Under DDP and FSDP2, with LoRA
(frozen weights have no gradient).

Expected norms are computed here from the model's own gradients, in `parameters()` order, as torch's
`clip_grad_norm_` does (the norm of the per-tensor norms), before clipping changes them.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from prismatic.conf.vla import get_vla_config
from prismatic.training.metrics import StepMetrics
from prismatic.training.model_setup import attach_action_head
from prismatic.training.model_setup import build_vlm as build_training_vlm
from prismatic.training.speed_plan import plan_flags
from prismatic.training.strategies import get_train_strategy
from prismatic.training.trainer import train_step
from prismatic.util.dist import DistInfo
from prismatic.vla.datasets.synthetic import synthetic_batch

VLA = "tiny+mx-toy"


def _strategy(one_rank: DistInfo, train_strategy: str, use_lora: bool):
    torch.manual_seed(0)
    vla = get_vla_config(VLA)
    vla.train_strategy, vla.use_lora, vla.enable_mixed_precision_training = train_strategy, use_lora, False
    vla.max_grad_norm = 1e-3  # small enough that every step clips
    vlm = build_training_vlm(vla, None)
    flags = plan_flags(vla, one_rank.world_size, one_rank.device)
    head = attach_action_head(
        vlm, vla, {"synthetic": {"action": {"q01": [-1.0] * 7}}}, flags.logits_at_labels
    )
    vlm.llm_backbone.llm.eval()  # as transformers' `from_pretrained` returns a model
    vlm.vision_backbone.eval()
    strategy = get_train_strategy(vlm, vla, one_rank)
    strategy.setup(4)
    return vlm, head, strategy


@pytest.mark.parametrize(
    ("train_strategy", "use_lora"), [("ddp", True), ("fsdp-full-shard", False), ("fsdp-full-shard", True)]
)
def test_a_step_walks_no_module_syncs_no_buffer_and_clips_every_gradient(
    one_rank: DistInfo, train_strategy: str, use_lora: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    vlm, head, strategy = _strategy(one_rank, train_strategy, use_lora)
    model = strategy.model
    assert all(module.training for module in model.modules())
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert [id(p) for p in strategy.trainable_params] == [id(p) for p in trainable]
    assert len(trainable) < len(list(model.parameters())) if use_lora else len(trainable) > 0

    calls: list[torch.nn.Module] = []
    real_train = torch.nn.Module.train
    monkeypatch.setattr(
        torch.nn.Module, "train", lambda self, mode=True: calls.append(self) or real_train(self, mode)
    )
    batches = iter([synthetic_batch(vlm, head, 2, seed=seed) for seed in range(8)])
    metrics = StepMetrics(["synthetic"], head, one_rank.device)

    # Clipping: the returned norm is the norm of every gradient the step made, taken before it clipped them.
    norms: list[tuple[torch.Tensor, torch.Tensor]] = []  # (before, after) per step
    real_clip = torch.nn.utils.clip_grad_norm_

    def grad_norm() -> torch.Tensor:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in local]))

    def recorded_clip(parameters, max_norm, *args, **kwargs):
        before = grad_norm()
        out = real_clip(parameters, max_norm, *args, **kwargs)
        norms.append((before, grad_norm()))
        return out

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recorded_clip)
    buffer_syncs: list[int] = []
    real_sync = DistributedDataParallel._sync_buffers
    monkeypatch.setattr(
        DistributedDataParallel, "_sync_buffers", lambda self: buffer_syncs.append(1) or real_sync(self)
    )
    first = train_step(strategy, head, batches, metrics)
    second = train_step(strategy, head, batches, metrics)
    assert calls == []  # the model stayed in train mode: no walk over its modules
    assert buffer_syncs == []  # DDP: no broadcast of the (constant) buffers before each forward
    assert first.item() == norms[0][0].item() and second.item() == norms[1][0].item()
    for before, after in norms:
        assert before > 1e-3 and after.item() == pytest.approx(1e-3, rel=1e-4)  # every gradient was clipped

    model.eval()  # left in eval mode (a hook, a user's evaluation): the next step trains every module again
    train_step(strategy, head, batches, metrics)
    assert calls[:1] == [model] and all(module.training for module in model.modules())
