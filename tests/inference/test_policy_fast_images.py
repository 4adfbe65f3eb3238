"""The policy's image path: uint8 arrays already at the backbone's input size skip the PIL round trip and give the
same pixel values (hence the same actions); other sizes and PIL images take OpenVLA's PIL path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from prismatic.inference.pixels import DevicePixels
from prismatic.inference.policy import VLAPolicy
from prismatic.models import build_vlm
from prismatic.models.action_heads import ActionSpec

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
    fast = policy.pixel_values(images)
    policy._fast_transform = None  # OpenVLA's path: PIL image -> the backbone's transform
    slow = policy.pixel_values(images)
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

    class CountingFast:
        size_hw = fast.size_hw
        accepts = staticmethod(fast.accepts)

        def __call__(self, image: np.ndarray) -> torch.Tensor:
            calls.append(image)
            return fast(image)

    monkeypatch.setattr(policy, "_fast_transform", CountingFast())
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


def _torchvision_pixels(policy: VLAPolicy, requests: list[list[np.ndarray]]) -> torch.Tensor | dict:
    """What OpenVLA's processor path gives: each view through the backbone's torchvision transform (PIL), views
    concatenated along channels, requests stacked, then cast to the policy's dtype."""
    per_request = []
    for views in requests:
        values = [policy.image_transform(Image.fromarray(view).convert("RGB")) for view in views]
        if isinstance(values[0], dict):
            per_request.append({k: torch.cat([v[k] for v in values]) for k in values[0]})
        else:
            per_request.append(torch.cat(values))
    if isinstance(per_request[0], dict):
        return {k: torch.stack([r[k] for r in per_request]).to(policy.dtype) for k in per_request[0]}
    return torch.stack(per_request).to(policy.dtype)


def _assert_same_pixels(got: torch.Tensor | dict, expected: torch.Tensor | dict, dtype: torch.dtype) -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys()
        pairs = [(got[k], expected[k]) for k in expected]
    else:
        pairs = [(got, expected)]
    for value, reference in pairs:
        assert value.dtype == dtype and value.is_contiguous()
        assert torch.equal(value, reference)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pixels_made_on_the_device_equal_the_pil_path(dtype: torch.dtype) -> None:
    """`pixels_on_device`: uint8 frames go to the device as bytes and are normalised there. The pixel values equal
    the backbone's torchvision transform cast to the policy's dtype, and so do the actions."""
    torch.manual_seed(0)
    base = "tiny-vit+tiny-llama"
    policy = VLAPolicy(build_vlm(base), {"bench": {"action": STATS}}, base, torch.device("cpu"), dtype)
    policy.pixels_on_device = True
    size = policy._fast_transform.size_hw
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(3)]
    images[0][:2, :2] = [[0, 255, 128], [255, 0, 1]]  # both ends of the byte range in every channel
    _assert_same_pixels(
        policy.pixel_values(images), _torchvision_pixels(policy, [[i] for i in images]), dtype
    )
    on_device = policy.predict_action_batch(images, ["push", "pick", "push"], "bench")
    policy.pixels_on_device = False
    assert np.array_equal(policy.predict_action_batch(images, ["push", "pick", "push"], "bench"), on_device)


def test_two_views_made_on_the_device_are_concatenated_along_channels_in_order() -> None:
    """A two-camera policy: each request's primary view's channels, then its wrist view's, as training's batch
    transform lays them out."""
    torch.manual_seed(0)
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.attach_action_modules(ActionSpec(action_dim=7, num_images=2))
    policy = VLAPolicy(vlm, None, "tiny", torch.device("cpu"), torch.bfloat16)
    policy.pixels_on_device = True
    size = policy._fast_transform.size_hw
    rng = np.random.default_rng(2)
    requests = [[rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(2)] for _ in range(2)]
    got = policy.pixel_values(requests)
    _assert_same_pixels(got, _torchvision_pixels(policy, requests), torch.bfloat16)
    assert got.shape == (2, 6, *size)


def test_openvlas_fused_backbone_pixels_made_on_the_device() -> None:
    """DINOv2 + SigLIP at 224 px (OpenVLA's backbone, built on the meta device), two requests of two views, in
    bf16: each part's values equal its own torchvision transform's."""
    from prismatic.models.backbones.vision import build_vision_backbone
    from prismatic.models.backbones.vision.transforms import FusedImageTransform, build_image_transform
    from prismatic.vla.datasets.batch_transform import fast_image_transform

    with torch.device("meta"):
        backbone = build_vision_backbone("dinosiglip-vit-so-224px", "resize-naive", pretrained=False)
    transform = FusedImageTransform(
        {name: build_image_transform(cfg, "resize-naive") for name, cfg in backbone.data_cfgs.items()}
    )
    pixels = DevicePixels(fast_image_transform(transform), torch.device("cpu"), torch.bfloat16)
    rng = np.random.default_rng(4)
    requests = [[rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(2)] for _ in range(2)]
    expected = {
        name: torch.stack(
            [torch.cat([part(Image.fromarray(view)) for view in views]) for views in requests]
        ).to(torch.bfloat16)
        for name, part in transform.transforms.items()
    }
    assert sorted(expected) == ["dino", "siglip"]
    _assert_same_pixels(pixels(requests), expected, torch.bfloat16)


def test_a_batch_with_any_other_image_takes_the_host_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device path takes a batch only when every view is an array at the backbone's size; on CPU it is off
    unless asked for (the host's table look-ups are faster there)."""
    torch.manual_seed(0)
    policy = VLAPolicy(build_vlm("tiny-vit+tiny-llama"), None, "tiny", torch.device("cpu"), torch.float32)
    h, w = policy._fast_transform.size_hw
    calls: list[int] = []
    device_path = DevicePixels(policy._fast_transform, policy.device, policy.dtype)
    monkeypatch.setattr(
        policy, "_device_pixels", lambda requests: calls.append(len(requests)) or device_path(requests)
    )
    policy._device_pixels.accepts = device_path.accepts
    rng = np.random.default_rng(3)
    at_size = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    other = rng.integers(0, 256, (h + 2, w, 3), dtype=np.uint8)
    policy.pixel_values([at_size, at_size])  # pixels_on_device None: not on CPU
    policy.pixels_on_device = True
    mixed = policy.pixel_values([at_size, other])
    pil = policy.pixel_values([at_size, Image.fromarray(at_size)])
    assert calls == []
    assert torch.equal(mixed, _torchvision_pixels(policy, [[at_size], [other]]))
    assert torch.equal(pil, _torchvision_pixels(policy, [[at_size], [at_size]]))
    policy.pixel_values([at_size, at_size])
    assert calls == [2]
