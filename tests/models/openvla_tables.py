"""OpenVLA's own tables, copied by hand from openvla/openvla `prismatic/extern/hf/configuration_prismatic.py`
(VISION_BACKBONE_TO_RESOLUTION / TIMM_OVERRIDE_ACT_LAYER / VISION_BACKBONE_TO_TIMM_ID, LLM_BACKBONE_TO_HF_PATH,
LLM_BACKBONE_TO_HF_METACLASS): the expected values of the export and import tests, independent of our registry."""

# OpenVLA's configuration_prismatic.py tables, copied by hand: vision id -> (timm ids, image sizes, act layers).
OPENVLA_VISION_TABLE = {
    "clip-vit-l": (["vit_large_patch14_clip_224.openai"], [224], ["quick_gelu"]),
    "siglip-vit-so400m": (["vit_so400m_patch14_siglip_224"], [224], [None]),
    "dinov2-vit-l": (["vit_large_patch14_reg4_dinov2.lvd142m"], [224], [None]),
    "in1k-vit-l": (["vit_large_patch16_224.augreg_in21k_ft_in1k"], [224], [None]),
    "clip-vit-l-336px": (["vit_large_patch14_clip_336.openai"], [336], ["quick_gelu"]),
    "siglip-vit-so400m-384px": (["vit_so400m_patch14_siglip_384"], [384], [None]),
    "dinoclip-vit-l-336px": (
        ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_large_patch14_clip_336.openai"],
        [336, 336],
        [None, "quick_gelu"],
    ),
    "dinosiglip-vit-so-224px": (
        ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
        [224, 224],
        [None, None],
    ),
    "dinosiglip-vit-so-384px": (
        ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_384"],
        [384, 384],
        [None, None],
    ),
}
# LLM_BACKBONE_TO_HF_PATH and LLM_BACKBONE_TO_HF_METACLASS, copied by hand.
OPENVLA_LLM_TABLE = {
    "llama2-7b-pure": ("meta-llama/Llama-2-7b-hf", "llama"),
    "llama2-13b-pure": ("meta-llama/Llama-2-13b-hf", "llama"),
    "llama2-7b-chat": ("meta-llama/Llama-2-7b-chat-hf", "llama"),
    "llama2-13b-chat": ("meta-llama/Llama-2-13b-chat-hf", "llama"),
    "vicuna-v15-7b": ("lmsys/vicuna-7b-v1.5", "llama"),
    "vicuna-v15-13b": ("lmsys/vicuna-13b-v1.5", "llama"),
    "mistral-v0.1-7b-pure": ("mistralai/Mistral-7B-v0.1", "mistral"),
    "mistral-v0.1-7b-instruct": ("mistralai/Mistral-7B-Instruct-v0.1", "mistral"),
    "phi-2-3b": ("microsoft/phi-2", "phi"),
}
