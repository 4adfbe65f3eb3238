"""The policy's image path: uint8 arrays already at the backbone's input size skip the PIL round trip and give the
same pixel values (hence the same actions); other sizes and PIL images take OpenVLA's PIL path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from prismatic.inference.policy import VLAPolicy
from prismatic.models import build_vlm

STATS = {"q01": [-1.0] * 7, "q99": [1.0] * 7, "mask": [True] * 6 + [False]}


def test_real_fused_backbone_parts_have_an_exact_array_path() -> None:
    """DINOv2 and SigLIP at 224 px (OpenVLA's fused backbone; built on the meta device): each part's array path
    equals its PIL transform."""
    from prismatic.models.backbones.vision import build_vision_backbone
    from prismatic.models.backbones.vision.transforms import build_image_transform
    from prismatic.vla.datasets.batch_transform import fast_image_transform

    with torch.device("meta"):
        backbone = build_vision_backbone("dinosiglip-vit-so-224px", "resize-naive", pretrained=False)
    image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    assert len(backbone.data_cfgs) == 2
    for cfg in backbone.data_cfgs.values():
        transform = build_image_transform(cfg, "resize-naive")
        fast = fast_image_transform(transform)
        assert fast is not None and fast.size_hw == (224, 224)
        assert torch.equal(fast(image), transform(Image.fromarray(image).convert("RGB")))


@pytest.mark.parametrize("base", ["tiny-vit+tiny-llama"])
def test_array_path_gives_the_pil_path_pixels_and_actions(base: str) -> None:
    torch.manual_seed(0)
    policy = VLAPolicy(
        build_vlm(base), {"bench": {"action": STATS}}, base, torch.device("cpu"), torch.float32
    )
    size = policy._fast_transform.size_hw
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(3)]
    fast = policy._pixel_values(images)
    policy._fast_transform = None  # OpenVLA's path: PIL image -> the backbone's transform
    slow = policy._pixel_values(images)
    if isinstance(fast, dict):
        assert fast.keys() == slow.keys() and all(torch.equal(fast[k], slow[k]) for k in fast)
    else:
        assert torch.equal(fast, slow)
    pil_actions = policy.predict_action_batch(images, ["push"] * 3, "bench")
    policy._fast_transform = VLAPolicy(
        build_vlm(base), None, base, torch.device("cpu"), torch.float32
    )._fast_transform
    assert np.array_equal(policy.predict_action_batch(images, ["push"] * 3, "bench"), pil_actions)


def test_other_sizes_and_pil_images_take_the_pil_path(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    policy = VLAPolicy(build_vlm("tiny-vit+tiny-llama"), None, "tiny", torch.device("cpu"), torch.float32)
    calls = []
    fast = policy._fast_transform
    monkeypatch.setattr(policy, "_fast_transform", lambda image: calls.append(image) or fast(image))
    policy._fast_transform.size_hw = fast.size_hw
    h, w = fast.size_hw
    policy._transform(np.zeros((h + 1, w, 3), np.uint8))
    policy._transform(Image.new("RGB", (w, h)))
    assert calls == []
    policy._transform(np.zeros((h, w, 3), np.uint8))
    assert len(calls) == 1


def test_array_tables_are_host_tensors_under_another_default_device() -> None:
    from prismatic.vla.datasets.batch_transform import _ArrayToNormalizedTensor

    with torch.device("meta"):  # stands for "cuda": any default device other than the host
        table = _ArrayToNormalizedTensor.from_mean_std((2, 2), [0.5, 0.5, 0.5], [0.25, 0.25, 0.25])
    assert table(np.full((2, 2, 3), 255, np.uint8)).tolist() == [[[2.0, 2.0], [2.0, 2.0]]] * 3
