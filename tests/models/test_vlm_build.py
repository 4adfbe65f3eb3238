"""build_vlm on the tiny base VLMs: composition, FP32, determinism, forward layout and loss."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from prismatic.util.constants import IGNORE_INDEX
from prismatic.util.errors import ConfigError


def test_children_and_fp32(tiny_vlm) -> None:
    assert [name for name, _ in tiny_vlm.named_children()] == ["vision_backbone", "projector", "llm_backbone"]
    assert all(p.dtype == torch.float32 for p in tiny_vlm.parameters())
    assert tiny_vlm.num_patches == 16
    assert tiny_vlm.all_module_keys == ["vision_backbone", "llm_backbone", "projector"]


@pytest.mark.parametrize("base_vlm_id", ("tiny-vit+tiny-llama", "tiny-dinosiglip+tiny-llama"))
def test_build_is_deterministic_given_torch_seed(base_vlm_id: str) -> None:
    from prismatic.models import build_vlm

    states = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        states.append(build_vlm(base_vlm_id).state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])


def test_forward_shapes_and_loss(tiny_vlm, make_batch) -> None:
    tiny_vlm.freeze_backbones("vla-full-train")
    batch = make_batch(tiny_vlm)
    seq_len = batch["input_ids"].shape[1]
    out = tiny_vlm(**batch)

    vocab_rows = tiny_vlm.llm_backbone.llm.get_input_embeddings().weight.shape[0]
    assert out.logits.shape == (2, 1 + tiny_vlm.num_patches + (seq_len - 1), vocab_rows)
    assert torch.isfinite(out.loss)

    # The loss is the HF shifted cross-entropy over labels with IGNORE_INDEX inserted at the patch positions.
    labels = batch["labels"]
    patch_labels = torch.full((2, tiny_vlm.num_patches), IGNORE_INDEX)
    full_labels = torch.cat([labels[:, :1], patch_labels, labels[:, 1:]], dim=1)
    expected = F.cross_entropy(
        out.logits[:, :-1].flatten(0, 1), full_labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX
    )
    torch.testing.assert_close(out.loss, expected)


def test_patches_sit_right_after_bos(tiny_vlm, make_batch) -> None:
    """Causal attention: the BOS logits ignore the image, every later position sees it."""
    batch = make_batch(tiny_vlm)
    other = make_batch(tiny_vlm)
    if isinstance(other["pixel_values"], dict):
        other["pixel_values"] = {k: -v for k, v in other["pixel_values"].items()}
    else:
        other["pixel_values"] = -other["pixel_values"]
    with torch.no_grad():
        logits_a = tiny_vlm(**batch).logits
        logits_b = tiny_vlm(**other).logits
    assert torch.equal(logits_a[:, 0], logits_b[:, 0])
    assert (logits_a[:, 1:] - logits_b[:, 1:]).abs().amax(dim=-1).gt(1e-6).all()


def test_forward_without_labels_or_mask(tiny_vlm, make_batch) -> None:
    batch = make_batch(tiny_vlm, batch_size=1)
    with torch.no_grad():
        out = tiny_vlm(batch["input_ids"], None, batch["pixel_values"])
    assert out.loss is None
    assert out.logits.shape[1] == 1 + tiny_vlm.num_patches + batch["input_ids"].shape[1] - 1


def test_unknown_base_vlm_id() -> None:
    from prismatic.models import build_vlm

    with pytest.raises(ConfigError, match="'tiny-vit\\+tiny-lama'.*Did you mean 'tiny-vit\\+tiny-llama'"):
        build_vlm("tiny-vit+tiny-lama")


def test_real_base_vlm_offline_is_a_config_error() -> None:
    """No Hub access: the first pretrained download fails with a message naming the backbone (meta: no RAM)."""
    from prismatic.models import build_vlm

    with torch.device("meta"), pytest.raises(ConfigError, match="'dinosiglip-vit-so-224px'.*unavailable"):
        build_vlm("prism-dinosiglip-224px+7b")


def test_import_is_cheap() -> None:
    code = "import sys, prismatic.models; print(sorted(m for m in ('torch', 'timm', 'transformers') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
