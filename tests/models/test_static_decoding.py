"""Static-cache decoding (`prismatic.models.static_decoding`, CUDA-graph replay on GPU) gives the dynamic KV cache's
ids: on CPU in FP32 the same steps run eagerly, so the ids must be equal and the log-probabilities equal to FP32
rounding, for single requests and for batches of different prompt lengths (left padding), constrained or not.
The reference is `greedy_decode`'s dynamic-cache path (itself pinned against re-running the full sequence)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from prismatic.models import build_vlm, static_decoding
from prismatic.models.action_heads import ActionSpec
from prismatic.models.decoding import DecodeOptions, greedy_decode
from prismatic.models.prompt_layout import layout

PROMPTS = (
    "In: What action should the robot take to pick up the can?\nOut: ",
    "In: push\nOut: ",
    "In: open the drawer now\nOut: ",
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    vlm = build_vlm("tiny-dinosiglip+tiny-llama").eval()
    vlm.attach_action_modules(ActionSpec(action_dim=7))
    tokenizer = vlm.llm_backbone.tokenizer
    transform = vlm.vision_backbone.get_image_transform()
    images = [
        transform(Image.fromarray(np.random.default_rng(i).integers(0, 256, (64, 64, 3), dtype=np.uint8)))
        for i in range(len(PROMPTS))
    ]
    pixels = {key: torch.stack([image[key] for image in images]) for key in images[0]}
    prompts = [tokenizer(text).input_ids for text in PROMPTS]
    return vlm, prompts, pixels, tokenizer.pad_token_id


def _decode(model, rows: slice, allowed: range | None, static: bool):
    vlm, prompts, pixels, pad_id = model
    return greedy_decode(
        vlm,
        prompts[rows],
        {key: value[rows] for key, value in pixels.items()},
        7,
        pad_id=pad_id,
        allowed_ids=allowed,
        options=DecodeOptions(static_cache=static),
    )


@pytest.mark.parametrize("allowed", [range(768, 1024), None], ids=["constrained", "unconstrained"])
@pytest.mark.parametrize("rows", [slice(0, 1), slice(0, 3)], ids=["one", "batch"])
def test_static_cache_ids_equal_the_dynamic_cache(model, rows: slice, allowed: range | None) -> None:
    assert static_decoding.supported(model[0].llm_backbone.llm)
    dynamic = _decode(model, rows, allowed, static=False)
    static = _decode(model, rows, allowed, static=True)
    assert torch.equal(static.token_ids, dynamic.token_ids)
    torch.testing.assert_close(static.logprobs, dynamic.logprobs, rtol=0, atol=1e-5)
    again = _decode(model, rows, allowed, static=True)  # the kept cache, reset and refilled
    assert torch.equal(again.token_ids, static.token_ids) and torch.equal(again.logprobs, static.logprobs)


def test_decoders_are_kept_per_shape_and_bounded(model) -> None:
    vlm = model[0]
    vlm.__dict__.pop("_static_decoders", None)
    _decode(model, slice(1, 2), range(768, 1024), static=True)
    _decode(model, slice(1, 2), range(768, 1024), static=True)  # the same shape: the same decoder again
    kept = vlm.__dict__["_static_decoders"]
    assert len(kept) == 1 and next(iter(kept.values())).max_len % static_decoding.CACHE_BUCKET == 0
    for batch in range(1, static_decoding.MAX_GRAPHS + 2):
        vlm, prompts, pixels, pad_id = model
        greedy_decode(
            vlm,
            [prompts[1]] * batch,
            {key: value[1:2].expand(batch, -1, -1, -1) for key, value in pixels.items()},
            2,
            pad_id=pad_id,
            allowed_ids=None,
            options=DecodeOptions(static_cache=True),
        )
    assert len(kept) == static_decoding.MAX_GRAPHS


def test_layout_right_aligns_bos_prefix_and_text() -> None:
    ids, index, mask = layout([[1, 7, 8], [1, 9]], num_prefix=2, pad_id=0, bucket=static_decoding.TEXT_BUCKET)
    assert ids.shape == (2, 16) and ids[0, :3].tolist() == [1, 7, 8] and ids[1, :3].tolist() == [1, 9, 0]
    # 16 positions: row 0 = 11 pads, BOS, prefix (text_len + 0, + 1), text 1..2; row 1 one pad more, one token less.
    assert index[0, 11:].tolist() == [0, 16, 17, 1, 2] and mask[0].tolist() == [0] * 11 + [1] * 5
    assert index[1, 12:].tolist() == [0, 16, 17, 1] and mask[1].tolist() == [0] * 12 + [1] * 4


def test_eager_attention_falls_back_to_the_dynamic_cache(model) -> None:
    llm = model[0].llm_backbone.llm
    kernel = llm.config._attn_implementation
    try:
        llm.config._attn_implementation = "eager"
        assert not static_decoding.supported(llm)
        model[0].__dict__.pop("_static_decoders", None)
        ids = _decode(model, slice(0, 3), None, static=True).token_ids
        assert "_static_decoders" not in model[0].__dict__
    finally:
        llm.config._attn_implementation = kernel
    assert torch.equal(ids, _decode(model, slice(0, 3), None, static=False).token_ids)


def test_two_views_and_proprio_in_the_prefix() -> None:
    """The prefix also carries a second camera view and the proprio token: the gathered layout keeps them."""
    torch.manual_seed(0)
    vlm = build_vlm("tiny-vit+tiny-llama").eval()
    vlm.attach_action_modules(ActionSpec(action_dim=7, proprio_dim=8, num_images=2))
    tokenizer = vlm.llm_backbone.tokenizer
    transform = vlm.vision_backbone.get_image_transform()
    views = [
        torch.cat(
            [
                transform(
                    Image.fromarray(np.random.default_rng(10 * i + j).integers(0, 256, (64, 64, 3), np.uint8))
                )
                for j in range(2)
            ]
        )
        for i in range(2)
    ]
    prompts = [tokenizer(text).input_ids for text in PROMPTS[1:]]
    kwargs = {"pad_id": tokenizer.pad_token_id, "allowed_ids": range(768, 1024), "proprio": torch.randn(2, 8)}
    dynamic = greedy_decode(
        vlm, prompts, torch.stack(views), 7, options=DecodeOptions(static_cache=False), **kwargs
    )
    static = greedy_decode(
        vlm, prompts, torch.stack(views), 7, options=DecodeOptions(static_cache=True), **kwargs
    )
    assert torch.equal(static.token_ids, dynamic.token_ids)
    torch.testing.assert_close(static.logprobs, dynamic.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type", ["qwen2", "phi"])
def test_other_llm_families_decode_the_same(model_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2 (biased q/k/v projections) and Phi (partial rotary, biased LM head) take the static path too: the
    same ids as the dynamic cache, on tiny random models of each architecture, also with the decode step's
    layers compiled (`compile_steps`, the default `compile_scope`: their cache writes go through the stacked
    cache as Llama's do)."""
    from prismatic.models.backbones.llm.hf_causal import HFCausalLLMBackbone
    from prismatic.models.backbones.llm.prompting import PurePromptBuilder
    from prismatic.models.backbones.llm.registry import LLMBackboneSpec
    from prismatic.models.backbones.vision import build_vision_backbone
    from prismatic.models.registry import get_base_vlm_spec
    from prismatic.models.vlms.prismatic import PrismaticVLM

    torch.manual_seed(0)
    config = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    config.update(num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    spec = LLMBackboneSpec(
        model_type, PurePromptBuilder, model_type=model_type, config=config, tokenizer_source="tiny"
    )
    llm = HFCausalLLMBackbone(f"tiny-{model_type}", spec, pretrained=False)
    base = get_base_vlm_spec("tiny-vit+tiny-llama")
    vision = build_vision_backbone(base.vision_backbone_id, base.image_resize_strategy, pretrained=False)
    vlm = PrismaticVLM(f"tiny-vit+tiny-{model_type}", vision, llm, base.arch_specifier).eval()
    vlm.attach_action_modules(ActionSpec(action_dim=7))
    assert static_decoding.supported(llm.llm)
    transform = vision.get_image_transform()
    pixels = torch.stack(
        [
            transform(Image.fromarray(np.random.default_rng(i).integers(0, 256, (64, 64, 3), np.uint8)))
            for i in range(2)
        ]
    )
    prompts = [llm.tokenizer(text).input_ids for text in PROMPTS[:2]]
    kwargs = {"pad_id": llm.tokenizer.pad_token_id, "allowed_ids": None}
    dynamic = greedy_decode(vlm, prompts, pixels, 7, options=DecodeOptions(static_cache=False), **kwargs)
    static = greedy_decode(vlm, prompts, pixels, 7, options=DecodeOptions(static_cache=True), **kwargs)
    assert torch.equal(static.token_ids, dynamic.token_ids)
    torch.testing.assert_close(static.logprobs, dynamic.logprobs, rtol=0, atol=1e-5)
    monkeypatch.setattr(
        static_decoding, "COMPILED", ("step",)
    )  # the layers' graphs; the prefill's ViT is Llama's
    options = DecodeOptions(static_cache=True, compile_steps=True)
    compiled = greedy_decode(vlm, prompts, pixels, 7, options=options, **kwargs)
    assert static_decoding.COMPILE_FAILED not in vlm.__dict__
    assert torch.equal(compiled.token_ids, dynamic.token_ids)
    torch.testing.assert_close(compiled.logprobs, dynamic.logprobs, rtol=0, atol=1e-5)


def test_sliding_window_models_keep_the_dynamic_cache() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "mistral",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        sliding_window=32,
    )
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert not static_decoding.supported(model)
