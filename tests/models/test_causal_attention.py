"""`LLMBackbone.causal_attention`: inside it, an LLM forward given no padding mask skips transformers' mask
preparation (whose packed-sequence check reads a device value, a host sync, at the start of every forward) and runs
the same SDPA call: logits, loss and gradients `torch.equal` to the plain forward's, for the Llama, Qwen2 and Phi
architectures (the registry's families without sliding windows), with nothing read from the device. A 4D mask is
still used as given; a 2D one is refused inside; sliding-window models keep transformers' masks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from host_reads import HostReads
from transformers import AutoConfig, AutoModelForCausalLM

from prismatic.models import build_vlm
from prismatic.models.backbones.llm.base_llm import CAUSAL_SDPA, LLMBackbone

PACKED_CHECK = "masking_utils.py:find_packed_sequence_indices"
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}


def _model(model_type: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **TINY, **extra)
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config)


def _context(model: torch.nn.Module):
    """The backbone's context on a bare transformers model (the method reads only `self.llm`)."""
    return LLMBackbone.causal_attention(SimpleNamespace(llm=model))


def _run(model: torch.nn.Module, embeds: torch.Tensor, labels: torch.Tensor):
    model.zero_grad(set_to_none=True)
    out = model(inputs_embeds=embeds, labels=labels, use_cache=False)
    out.loss.backward()
    return (
        out.logits.detach(),
        out.loss.detach(),
        [p.grad.clone() for p in model.parameters() if p.grad is not None],
    )


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "phi"])
def test_the_same_numbers_without_reading_the_device(model_type: str) -> None:
    model = _model(model_type)
    embeds = torch.randn(3, 11, TINY["hidden_size"])
    labels = torch.randint(0, TINY["vocab_size"], (3, 11))
    with HostReads() as plain_reads:
        plain = _run(model, embeds, labels)
    with HostReads() as reads, _context(model):
        assert model.config._attn_implementation == CAUSAL_SDPA
        causal = _run(model, embeds, labels)
    assert model.config._attn_implementation == "sdpa"
    assert plain_reads.sites == [PACKED_CHECK]  # what the context removes
    assert reads.sites == []
    assert torch.equal(causal[0], plain[0]) and torch.equal(causal[1], plain[1])
    assert all(torch.equal(a, b) for a, b in zip(causal[2], plain[2], strict=True))


def test_a_4d_mask_is_used_as_given_and_a_2d_mask_is_refused() -> None:
    """Parallel decoding's 4D mask (here: the first two positions see only themselves) gives the plain call's
    hidden states inside; the backbone refuses a 2D mask there and the setting is back after the error."""
    vlm = build_vlm("tiny-vit+tiny-llama")
    backbone = vlm.llm_backbone
    embeds = torch.randn(2, 6, backbone.embed_dim)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    mask[1, 0] = False
    mask = mask.expand(2, 1, 6, 6)
    with torch.no_grad():
        plain = backbone.last_hidden_state(embeds, mask)
        with backbone.causal_attention():
            inside = backbone.last_hidden_state(embeds, mask)
    assert torch.equal(inside, plain)
    with pytest.raises(ValueError, match="2D attention mask"), backbone.causal_attention():
        backbone(inputs_embeds=embeds, attention_mask=torch.ones(2, 6, dtype=torch.long))
    assert backbone.llm.config._attn_implementation == "sdpa"


def test_sliding_window_models_keep_transformers_masks() -> None:
    """A Mistral with a 4-token window: the window lives in the mask transformers builds, so nothing changes."""
    model = _model("mistral", sliding_window=4)
    with _context(model):
        assert model.config._attn_implementation == "sdpa"
