"""The head written from scratch in docs/adding_a_model.md ("Adding an action head"), run as written on the tiny VLM.

The example's block is executed as a plugin module would be; its registration goes into a copy of the registry that
is put back afterwards, so the head does not leak into other tests. Expected values: with the module's last layer
set to a known bias and zero weights, its chunk is that bias whatever the VLM computes, so the loss and sums are
arithmetic on the targets done here.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
K, D, B = 2, 3, 2  # chunk size, action width, batch


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    from prismatic.models.action_heads import ACTION_HEADS

    monkeypatch.setattr(ACTION_HEADS, "_targets", dict(ACTION_HEADS._targets))
    monkeypatch.setattr(ACTION_HEADS, "_facts", dict(ACTION_HEADS._facts))
    text = (REPO / "docs/adding_a_model.md").read_text()
    (code,) = re.findall(r"```python\n# docs-example: pooled-chunk\n(.*?)```", text, re.S)
    module = types.ModuleType("docs_example_pooled_chunk")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, "docs/adding_a_model.md[pooled-chunk]", "exec"), module.__dict__)
    return module


def test_the_docs_head_trains_and_predicts_through_the_head_protocol(example: types.ModuleType) -> None:
    from prismatic.models import build_vlm
    from prismatic.models.action_heads import ACTION_HEADS, ActionSpec, DecodeRequest, build_action_head
    from prismatic.util.errors import ConfigError
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import PaddedCollatorForActionPrediction
    from prismatic.vla.prompt import action_prompt_ids

    assert ACTION_HEADS.get_class("pooled-chunk") is example.PooledChunkHead
    spec = ActionSpec(head="pooled-chunk", chunk_size=K, action_dim=D, head_options={"hidden": 16})
    assert ActionSpec.from_dict(spec.to_dict()) == spec and spec.to_dict()["head_options"] == {"hidden": 16}
    assert ActionSpec(head="pooled-chunk").head_options == {"hidden": 64}  # completed with the defaults
    with pytest.raises(ConfigError, match="hidden"):
        ActionSpec(head="pooled-chunk", head_options={"width": 8})

    torch.manual_seed(0)
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.freeze_backbones("vla-full-train")
    vlm.attach_action_modules(spec)
    assert (
        isinstance(vlm.action_head, example.PooledChunkModule) and vlm.action_head.mlp[0].out_features == 16
    )
    bias = torch.linspace(-0.5, 0.5, K * D)
    with torch.no_grad():
        vlm.action_head.mlp[2].weight.zero_()
        vlm.action_head.mlp[2].bias.copy_(bias)

    tokenizer = vlm.llm_backbone.tokenizer
    head = build_action_head(spec, ActionTokenizer(tokenizer), vlm.num_prefix_tokens)
    _, height, width = vlm.vision_backbone.default_image_resolution
    generator = torch.Generator().manual_seed(1)
    frames = []
    for text in ("pick up the red block", "push"):
        ids = action_prompt_ids(tokenizer, vlm.llm_backbone.prompt_builder_fn, text)
        actions = torch.rand((K, D), generator=generator).numpy()
        frames.append(
            {
                **head.layout(ids, actions, tokenizer.eos_token_id),
                "pixel_values": torch.randn((3, height, width), generator=generator),
                "actions": actions,
                "dataset_name": "a",
            }
        )
    batch = PaddedCollatorForActionPrediction(tokenizer.model_max_length, tokenizer.pad_token_id)(frames)

    out = head(vlm, batch)
    targets = np.stack([f["actions"] for f in frames]).astype(np.float64)
    error = (bias.double().numpy().reshape(K, D) - targets) ** 2
    assert out.loss.item() == pytest.approx(error.mean(), rel=1e-6)
    np.testing.assert_allclose(out.sums[:, 0].numpy(), error.sum((1, 2)), rtol=1e-6)
    assert out.sums[:, 1].tolist() == [K * D] * B

    out.loss.backward()  # the head's module gets the gradient through the VLM's forward
    assert vlm.action_head.mlp[2].bias.grad is not None and vlm.action_head.mlp[2].bias.grad.abs().sum() > 0

    request = DecodeRequest(
        prompt_ids=[action_prompt_ids(tokenizer, vlm.llm_backbone.prompt_builder_fn, "pick")] * B,
        pixel_values=torch.zeros((B, 3, height, width)),
        proprio=None,
        action_dim=D,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        device=torch.device("cpu"),
    )
    prediction = head.predict(vlm.eval(), request)
    np.testing.assert_allclose(prediction.normalized, np.broadcast_to(bias.numpy().reshape(K, D), (B, K, D)))
    assert prediction.token_ids.shape == (B, 0)
