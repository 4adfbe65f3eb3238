"""Shared fixtures for model tests: the tiny base VLMs, built once per session, and no Hub access."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

TINY_BASE_VLMS = ("tiny-vit+tiny-llama", "tiny-dinosiglip+tiny-llama")


@pytest.fixture(scope="module", autouse=True)
def hub_offline() -> Iterator[None]:
    """Make any Hub request fail at once (offline mode) instead of retrying for ~30 s without a network."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="session", params=TINY_BASE_VLMS)
def tiny_vlm(request: pytest.FixtureRequest):
    """A tiny PrismaticVLM; tests that change `requires_grad` call `freeze_backbones` first."""
    from prismatic.models import build_vlm

    torch.manual_seed(0)
    return build_vlm(request.param)


@pytest.fixture(scope="session")
def make_batch():
    """`make_batch(vlm, batch_size=2)`: see `_make_batch`."""
    return _make_batch


def _make_batch(vlm, batch_size: int = 2) -> dict:
    """A right-padded batch of two prompts with action-like labels, and random images of the right shape."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    tokenizer = vlm.llm_backbone.tokenizer
    texts = ["In: What action should the robot take to pick up the can?\nOut: ", "In: push it\nOut: "]
    encoded = tokenizer(texts[:batch_size], padding=True, return_tensors="pt")
    labels = encoded.input_ids.clone()
    labels[:, :4] = -100
    labels[encoded.attention_mask == 0] = -100

    transform = vlm.vision_backbone.get_image_transform()
    images = []
    for _ in range(batch_size):
        pixels = torch.randint(0, 256, (64, 64, 3), generator=generator, dtype=torch.uint8).numpy()
        images.append(transform(Image.fromarray(pixels)))
    if isinstance(images[0], dict):
        pixel_values = {key: torch.stack([image[key] for image in images]) for key in images[0]}
    else:
        pixel_values = torch.stack(images)
    return {
        "input_ids": encoded.input_ids,
        "attention_mask": encoded.attention_mask,
        "pixel_values": pixel_values,
        "labels": labels,
    }
