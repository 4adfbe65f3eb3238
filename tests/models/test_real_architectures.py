"""Every registered real backbone has its published architecture (built on the meta device: no weights, no RAM),
its image transforms produce the right shapes, and every chat format renders as its family expects."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from prismatic.models import BASE_VLMS, LLM_BACKBONES, VISION_BACKBONES
from prismatic.models.backbones.llm.prompting import (
    Llama2ChatPromptBuilder,
    MistralInstructPromptBuilder,
    PhiPromptBuilder,
    PurePromptBuilder,
    Qwen25ChatPromptBuilder,
)
from prismatic.models.backbones.vision import RESIZE_STRATEGIES, build_vision_backbone
from prismatic.models.backbones.vision.transforms import build_image_transform

# id -> (num_patches, embed_dim, per-part input sizes)
VISION_DIMS = {
    "clip-vit-l": (256, 1024, [224]),
    "clip-vit-l-336px": (576, 1024, [336]),
    "siglip-vit-so400m": (256, 1152, [224]),
    "siglip-vit-so400m-384px": (729, 1152, [384]),
    "dinov2-vit-l": (256, 1024, [224]),
    "in1k-vit-l": (196, 1024, [224]),
    "dinosiglip-vit-so-224px": (256, 1024 + 1152, [224, 224]),
    "dinosiglip-vit-so-384px": (729, 1024 + 1152, [384, 384]),
    "dinoclip-vit-l-336px": (576, 1024 + 1024, [336, 336]),
}


def test_every_real_vision_backbone_is_covered() -> None:
    assert {k for k, spec in VISION_BACKBONES.items() if spec.has_pretrained_weights} == set(VISION_DIMS)


@pytest.mark.parametrize("backbone_id", sorted(VISION_DIMS))
def test_vision_backbone_architecture_and_transforms(backbone_id: str) -> None:
    with torch.device("meta"):
        backbone = build_vision_backbone(backbone_id, "resize-naive", pretrained=False)
    num_patches, embed_dim, sizes = VISION_DIMS[backbone_id]
    assert (backbone.num_patches, backbone.embed_dim) == (num_patches, embed_dim)
    assert backbone.default_image_resolution == (3, max(sizes), max(sizes))
    data_cfgs = list(backbone.data_cfgs.values()) if hasattr(backbone, "data_cfgs") else [backbone.data_cfg]
    image = Image.new("RGB", (320, 200), (200, 30, 30))
    for strategy in RESIZE_STRATEGIES:
        shapes = [tuple(build_image_transform(cfg, strategy)(image).shape) for cfg in data_cfgs]
        assert shapes == [(3, s, s) for s in sizes], strategy
    if backbone_id.startswith("clip") or backbone_id.startswith("dinoclip"):
        clip = backbone.featurizer if hasattr(backbone, "featurizer") else backbone.clip_featurizer
        assert type(clip.blocks[0].mlp.act).__name__ == "QuickGELU"


# Published parameter counts of each Hub model (before Prismatic's pad-token row is added).
LLM_PARAMS = {
    "llama2-7b-pure": 6_738_415_616,
    "llama2-7b-chat": 6_738_415_616,
    "vicuna-v15-7b": 6_738_415_616,
    "llama2-13b-pure": 13_015_864_320,
    "llama2-13b-chat": 13_015_864_320,
    "vicuna-v15-13b": 13_015_864_320,
    "mistral-v0.1-7b-pure": 7_241_732_096,
    "mistral-v0.1-7b-instruct": 7_241_732_096,
    "phi-2-3b": 2_779_683_840,
    "qwen25-0_5b-pure": 494_032_768,
    "qwen25-0_5b-instruct": 494_032_768,
}


def test_every_real_llm_is_covered() -> None:
    assert {k for k, spec in LLM_BACKBONES.items() if spec.has_pretrained_weights} == set(LLM_PARAMS)


@pytest.mark.parametrize("llm_id", sorted(LLM_PARAMS))
def test_llm_architecture_on_meta(llm_id: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = LLM_BACKBONES[llm_id]
    arch = dict(spec.arch)
    config = AutoConfig.for_model(arch.pop("model_type"), **arch)
    assert config.model_type == spec.model_type
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    num_params = sum(p.numel() for p in model.parameters())
    assert num_params == LLM_PARAMS[llm_id]


def test_base_vlms_name_registered_parts() -> None:
    for base_id, spec in BASE_VLMS.items():
        assert spec.vision_backbone_id in VISION_BACKBONES, base_id
        assert spec.llm_backbone_id in LLM_BACKBONES, base_id
    assert BASE_VLMS["prism-qwen25-dinosiglip-224px+0_5b"].llm_backbone_id == "qwen25-0_5b-pure"


def _prefix(builder_cls, message: str = "What action should the robot take to open the drawer?") -> str:
    builder = builder_cls("openvla")
    builder.add_turn("human", message)
    return builder.get_response_prefix()


def test_chat_formats() -> None:
    q = "What action should the robot take to open the drawer?"
    assert _prefix(PurePromptBuilder) == f"In: {q}\nOut: "
    assert _prefix(MistralInstructPromptBuilder) == f"[INST] {q} [/INST] "
    assert _prefix(PhiPromptBuilder) == f"Input: {q}\nOutput: "
    llama = _prefix(Llama2ChatPromptBuilder)
    assert llama.startswith("[INST] <<SYS>>\nYou are a helpful language and vision assistant.")
    assert llama.endswith(f"\n<</SYS>>\n\n{q} [/INST] ")
    assert _prefix(Qwen25ChatPromptBuilder) == f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
    qwen = Qwen25ChatPromptBuilder("openvla", system_prompt="Be brief.")
    qwen.add_turn("human", q)
    qwen.add_turn("gpt", "ok")
    assert qwen.get_prompt() == (
        f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\nok<|im_end|>"
    )
    with pytest.raises(ValueError, match="must come from 'human'"):
        MistralInstructPromptBuilder("x").add_turn("gpt", "hi")


def test_prepend_bos_for_tokenizers_without_one(tiny_tokenizer) -> None:
    """Phi-2 / Qwen2.5 tokenizers add no BOS; `prepend_bos` makes the VLM's "patches after BOS" layout hold."""
    import copy

    from prismatic.models.backbones.llm.hf_causal import prepend_bos

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.backend_tokenizer.post_processor = None
    assert tokenizer("In: hi").input_ids[0] != tokenizer.convert_tokens_to_ids("</s>")
    prepend_bos(tokenizer, "</s>")
    ids = tokenizer("In: hi").input_ids
    assert ids[0] == tokenizer.bos_token_id == tokenizer.convert_tokens_to_ids("</s>")
    with pytest.raises(ValueError, match="not in the tokenizer"):
        prepend_bos(tokenizer, "<|not-a-token|>")
