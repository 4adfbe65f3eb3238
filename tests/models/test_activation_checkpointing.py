"""`--vla.enable_gradient_checkpointing` (`apply_llm_activation_checkpointing`) trades compute for memory only: the
loss and every parameter's gradient are exactly those of the plain model (FP32, CPU), and each LLM decoder layer really runs its
forward a second time in the backward pass (a no-op wrapper would pass the first check and save no memory)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from prismatic.models import build_vlm
from prismatic.models.parallelize import apply_llm_activation_checkpointing


def _tiny(base: str):
    torch.manual_seed(21)
    vlm = build_vlm(base)
    vlm.freeze_backbones("vla-full-train")
    return vlm.train()


def _count_mlp_calls(vlm) -> list[int]:
    """Forward calls of each decoder layer's MLP, counted from now on (by wrapping `forward`: module hooks do not
    fire during the recomputation)."""
    calls = [0] * len(vlm.llm_backbone.get_layers())
    for i, layer in enumerate(vlm.llm_backbone.get_layers()):
        mlp = layer._checkpoint_wrapped_module.mlp if isinstance(layer, CheckpointWrapper) else layer.mlp

        def counted(*args, _forward=mlp.forward, _i=i, **kwargs):
            calls[_i] += 1
            return _forward(*args, **kwargs)

        mlp.forward = counted
    return calls


def _loss_and_grads(vlm, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = vlm(batch["input_ids"], batch["attention_mask"], batch["pixel_values"], labels=batch["labels"])
    out.loss.backward()
    return out.loss.detach(), {
        n.replace("._checkpoint_wrapped_module", ""): p.grad for n, p in vlm.named_parameters()
    }


@pytest.mark.parametrize("base", ["tiny-vit+tiny-llama", "tiny-dinosiglip+tiny-llama"])
def test_checkpointing_gives_the_plain_gradients_and_recomputes_each_layer(base, make_batch):
    plain, checkpointed = _tiny(base), _tiny(base)
    apply_llm_activation_checkpointing(checkpointed)
    layers = checkpointed.llm_backbone.get_layers()
    assert len(layers) == 2 and all(isinstance(layer, CheckpointWrapper) for layer in layers)
    assert not any(isinstance(m, CheckpointWrapper) for m in plain.modules())

    batch = make_batch(plain)
    plain_calls, checkpointed_calls = _count_mlp_calls(plain), _count_mlp_calls(checkpointed)
    loss, grads = _loss_and_grads(plain, batch)
    ckpt_loss, ckpt_grads = _loss_and_grads(checkpointed, batch)
    assert torch.equal(ckpt_loss, loss)
    assert sorted(ckpt_grads) == sorted(grads)
    missing = [n for n, g in grads.items() if g is not None and ckpt_grads[n] is None]
    assert not missing, f"no gradient with checkpointing: {missing[:3]}"
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if ".layers.0." in n)
    for name, grad in grads.items():
        if grad is None:
            assert ckpt_grads[name] is None, name
        else:
            assert torch.equal(ckpt_grads[name], grad), name  # the same kernels on the same inputs, on CPU
    assert plain_calls == [1, 1]
    assert checkpointed_calls == [2, 2], "each layer's forward must run again in the backward pass"
