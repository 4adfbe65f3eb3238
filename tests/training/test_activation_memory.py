"""`--vla.speed.checkpointing_policy auto`: `selective-ops` for a LoRA run on CUDA where what it keeps fits the GPU,
`full` elsewhere. The estimate of what it keeps is checked against the bytes the forward's saved ops (the ops
`selective-ops` keeps the outputs of) actually produce inside the decoder layers, counted here with a
`TorchDispatchMode`; the choice on CUDA is checked with the free memory torch reports replaced."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prismatic.conf.speed import SpeedConfig
from prismatic.conf.vla import get_vla_config
from prismatic.models import build_vlm
from prismatic.models.action_heads import ActionSpec, build_action_head
from prismatic.models.lora import apply_lora
from prismatic.models.parallelize import SelectiveCheckpointWrapper
from prismatic.training.speed_plan import choose_checkpointing_policy
from prismatic.training.strategies import get_train_strategy
from prismatic.training.strategies.activation_memory import (
    PROMPT_TOKENS,
    selective_saved_bytes,
    tokens_per_sample,
)
from prismatic.training.strategies.ddp import replica_bytes
from prismatic.util.dist import DistInfo
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets.synthetic import synthetic_batch

aten = torch.ops.aten
# What `selective-ops` keeps, named here rather than read from the code: every matmul and attention kernel.
KEPT_OPS = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
}
CUDA = torch.device("cuda", 0)
LOGGER = "prismatic.training.speed_plan"


class KeptBytes(TorchDispatchMode):
    """Sums the output bytes of `KEPT_OPS` run while a decoder layer's forward runs."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.bytes, self.ops = False, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.inside and func in KEPT_OPS:
            self.ops += 1
            outputs = out if isinstance(out, (tuple, list)) else [out]
            self.bytes += sum(t.numel() * t.element_size() for t in outputs if isinstance(t, torch.Tensor))
        return out


def _vla(**fields):
    vla = get_vla_config("tiny+mx-toy")
    for name, value in fields.items():
        setattr(vla, name, value)
    return vla


def _tiny(vla, spec: ActionSpec | None = None):
    torch.manual_seed(0)
    vlm = build_vlm(vla.base_vlm)
    spec = spec or ActionSpec(action_dim=7)
    vlm.attach_action_modules(spec)
    if vla.use_lora:
        vlm.freeze_backbones(vla.stage)
        apply_lora(vlm, vla.lora_settings())
    return vlm, build_action_head(spec, ActionTokenizer(vlm.llm_backbone.tokenizer), vlm.num_prefix_tokens)


def _count_kept(vlm, head, bf16: bool = False) -> tuple[KeptBytes, int]:
    """One forward of 3 synthetic frames under `KeptBytes` (in FP32, or under bf16 autocast as DDP trains): the
    counter and the tokens its layers ran on."""
    counter, lengths = KeptBytes(), []
    layers = vlm.llm_backbone.get_layers()
    handles = []
    for layer in layers:
        handles.append(layer.register_forward_pre_hook(lambda *_: setattr(counter, "inside", True)))
        handles.append(layer.register_forward_hook(lambda *_: setattr(counter, "inside", False)))
    handles.append(
        layers[0].register_forward_pre_hook(
            lambda _, args, kwargs: lengths.append(
                kwargs.get("hidden_states", args[0] if args else None).shape
            ),
            with_kwargs=True,
        )
    )
    with counter, torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        head(vlm, synthetic_batch(vlm, head, 3, seed=0))
    for handle in handles:
        handle.remove()
    ((batch, length, _),) = lengths
    return counter, batch * length


@pytest.mark.parametrize("lora", [True, False])
def test_the_estimate_is_what_the_kept_ops_produce(lora: bool) -> None:
    """FP32 on CPU: the bytes the matmuls and attention of every decoder layer output in one forward (LoRA: base,
    A and B matmuls) equal `selective_saved_bytes` for the batch's tokens, exactly."""
    vla = _vla(use_lora=lora, lora_rank=4)
    vlm, head = _tiny(vla)
    counter, tokens = _count_kept(vlm, head)
    # Per layer: 7 Linear (LoRA: 3 matmuls each) and one attention.
    assert counter.ops == len(vlm.llm_backbone.get_layers()) * (7 * (3 if lora else 1) + 1)
    assert counter.bytes > 0
    assert selective_saved_bytes(vlm, tokens, 4) == counter.bytes


def test_tokens_per_sample_counts_patches_action_positions_and_the_prompt() -> None:
    vla = _vla()
    vlm, _ = _tiny(vla)
    assert tokens_per_sample(vlm) == vlm.vision_backbone.num_patches + 7 + PROMPT_TOKENS
    chunked, _ = _tiny(vla, ActionSpec(head="l1-chunk", chunk_size=4, action_dim=7, num_images=2))
    assert tokens_per_sample(chunked) == 2 * chunked.vision_backbone.num_patches + 4 * 7 + PROMPT_TOKENS


@pytest.mark.parametrize(
    ("fields", "device", "expected"),
    [
        ({"use_lora": True}, "cpu", "full"),  # CPU runs as before
        ({}, CUDA, "full"),  # a full fine-tune: not measured faster
        ({"use_lora": True, "speed": SpeedConfig(checkpointing_policy="full")}, CUDA, "full"),
        ({"speed": SpeedConfig(checkpointing_policy="selective-ops")}, "cpu", "selective-ops"),
        ({"use_lora": True, "speed": SpeedConfig(checkpointing_policy="every-2")}, CUDA, "every-2"),
    ],
)
def test_auto_is_selective_ops_for_lora_on_cuda_only_and_a_named_policy_stays(
    fields: dict, device, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_: (10**15, 10**15))
    vla = _vla(**fields)
    vlm, _ = _tiny(vla)
    assert choose_checkpointing_policy(vla, vlm, device, mixed_precision=True) == expected


def test_auto_on_cuda_keeps_the_matmul_outputs_only_where_they_fit(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Needed: DDP's two replicas (frozen weights in bf16) plus the kept activations in bf16 for
    `per_device_batch_size` samples of `tokens_per_sample`; with one byte less free, `full`."""
    vla = _vla(use_lora=True, per_device_batch_size=4)
    vlm, head = _tiny(vla)
    counter, tokens = _count_kept(vlm, head, bf16=True)  # bf16 outputs (the attention's lse stays FP32)
    assert counter.bytes % tokens == 0 and selective_saved_bytes(vlm, tokens, 2) == counter.bytes
    kept = counter.bytes // tokens * 4 * tokens_per_sample(vlm)
    need = 2 * replica_bytes(vlm, torch.bfloat16) + kept
    free = {"bytes": need}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_: (free["bytes"], 80 * 10**9))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert choose_checkpointing_policy(vla, vlm, CUDA, mixed_precision=True) == "selective-ops"
        free["bytes"] = need - 1
        assert choose_checkpointing_policy(vla, vlm, CUDA, mixed_precision=True) == "full"
    chosen = [record.getMessage() for record in caplog.records if record.name == LOGGER]
    assert len(chosen) == 2
    assert chosen[0].startswith("--vla.speed.checkpointing_policy auto: selective-ops (selective-ops keeps")
    assert chosen[1].startswith("--vla.speed.checkpointing_policy auto: full (")
    assert f"on rank 0, {need / 1e9:.1f} GB expected" in chosen[1]


def test_set_up_wraps_the_layers_as_auto_resolved(
    one_rank: DistInfo, caplog: pytest.LogCaptureFixture
) -> None:
    """On CPU `auto` is `full`: plain checkpoint wrappers, and the speed-flags line and the strategy say so."""
    vla = _vla(use_lora=True, speed=SpeedConfig(compile="off"))
    vla.enable_mixed_precision_training = False
    vlm, _ = _tiny(vla)
    assert vla.speed.checkpointing_policy == "auto"
    strategy = get_train_strategy(vlm, vla, one_rank)
    with caplog.at_level(logging.INFO):
        strategy.setup(1)
    assert strategy.checkpointing_policy == "full"
    layers = strategy.vlm.llm_backbone.get_layers()
    assert all(hasattr(layer, "_checkpoint_wrapped_module") for layer in layers)
    assert not any(isinstance(layer, SelectiveCheckpointWrapper) for layer in layers)
    assert "activation checkpointing full, " in caplog.text
