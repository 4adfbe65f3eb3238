"""`--vla.speed.checkpointing_policy` chooses what activation checkpointing recomputes, and only that: `full`,
`selective-ops` and `every-N` give checkpointing-off's gradients and losses exactly (FP32, CPU), through the real
strategy set-up (FSDP2 on a gloo group of one), and differ only in the forward matmuls the backward pass re-runs.

Expected values come from the run with checkpointing off: its gradients, its losses, its backward's matmul count
and each decoder layer's forward matmul count, counted here with a `TorchDispatchMode`.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils._python_dispatch import TorchDispatchMode

from prismatic.conf.speed import SpeedConfig
from prismatic.conf.vla import VLAConfig, get_vla_config
from prismatic.models import build_vlm
from prismatic.models.action_heads import ActionSpec, build_action_head
from prismatic.models.lora import apply_lora
from prismatic.models.parallelize import apply_llm_activation_checkpointing
from prismatic.training.strategies import get_train_strategy
from prismatic.util.dist import DistInfo
from prismatic.util.errors import ConfigError
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets.synthetic import synthetic_batch

BASE, VLA = "tiny-vit+tiny-llama", "tiny+mx-toy"
STEPS = 3
# What this test calls a matmul: the ops that carry a decoder layer's FLOPs (nn.Linear dispatches to addmm / mm,
# attention to a fused SDPA kernel or bmm).
aten = torch.ops.aten
MATMULS = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
}


class MatmulCounter(TorchDispatchMode):
    """Counts matmuls while active, in total and per decoder layer (the layer whose forward is running)."""

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.total, self.per_layer, self.layer = 0, [0] * num_layers, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            self.total += 1
            if self.layer is not None:
                self.per_layer[self.layer] += 1
        return func(*args, **(kwargs or {}))

    def track(self, layers: torch.nn.ModuleList) -> list:
        """Hooks that tell the counter which layer runs (forward only: hooks do not fire in a recomputation)."""
        handles = []
        for index, layer in enumerate(layers):
            handles.append(layer.register_forward_pre_hook(lambda *_, i=index: setattr(self, "layer", i)))
            handles.append(layer.register_forward_hook(lambda *_: setattr(self, "layer", None)))
        return handles


def _tiny():
    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    spec = ActionSpec(action_dim=7)
    vlm.attach_action_modules(spec)
    return vlm, build_action_head(spec, ActionTokenizer(vlm.llm_backbone.tokenizer), vlm.num_prefix_tokens)


def _strategy(one_rank: DistInfo, policy: str | None, compile_blocks: bool = False, **overrides):
    """The tiny model set up by the real strategy in FP32; `policy` None turns checkpointing off; `overrides` are
    `VLAConfig` fields (LoRA, the strategy)."""
    vla = get_vla_config(VLA)
    for name, value in overrides.items():
        setattr(vla, name, value)
    vlm, head = _tiny()
    if vla.use_lora:
        vlm.freeze_backbones(vla.stage)
        apply_lora(vlm, vla.lora_settings())
    vla.enable_mixed_precision_training = False
    vla.enable_gradient_checkpointing = policy is not None
    vla.speed.checkpointing_policy = policy or "full"
    vla.speed.compile = "on" if compile_blocks else "off"
    strategy = get_train_strategy(vlm, vla, one_rank)
    strategy.setup(STEPS)
    return strategy, head


def _whole(grad: torch.Tensor) -> torch.Tensor:
    """The whole gradient: FSDP2's is a DTensor (one shard of one here), DDP's a plain tensor."""
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def _train(one_rank: DistInfo, policy: str | None, **overrides) -> dict:
    """Losses over `STEPS` optimiser steps, the first step's gradients and matmul counts, the state-dict keys."""
    strategy, head = _strategy(one_rank, policy, **overrides)
    layers = strategy.vlm.llm_backbone.get_layers()
    out: dict = {"keys": set(strategy.model.state_dict()), "losses": []}
    for step in range(STEPS):
        batch = strategy.to_device(synthetic_batch(strategy.vlm, head, 2, seed=step))
        forward, backward = MatmulCounter(len(layers)), MatmulCounter(len(layers))
        handles = forward.track(layers)
        with forward:
            loss = head(strategy.model, batch).loss
        for handle in handles:
            handle.remove()
        with backward:
            loss.backward()
        if step == 0:
            out["forward"], out["backward"] = forward, backward
            out["grads"] = {
                name.replace("_checkpoint_wrapped_module.", ""): _whole(p.grad)
                for name, p in strategy.model.named_parameters()
                if p.grad is not None
            }
        strategy.clip_grad_norm()
        strategy.optimizer.step()
        strategy.optimizer.zero_grad(set_to_none=True)
        out["losses"].append(loss.item())
    return out


POLICIES = (None, "full", "selective-ops", "every-2")


@pytest.fixture(scope="module")
def runs(one_rank: DistInfo) -> dict:
    return {policy: _train(one_rank, policy) for policy in POLICIES}


@pytest.fixture(scope="module")
def whole_recomputation_runs(one_rank: DistInfo) -> dict:
    """Runs whose checkpointed layers re-run their whole forward: torch's default stops a recomputation once it has
    rebuilt the last tensor the backward needs (the layer's final down-projection is never re-run)."""
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        return {policy: _train(one_rank, policy) for policy in POLICIES}


@pytest.mark.parametrize("policy", ["full", "selective-ops", "every-2"])
def test_policy_gives_the_plain_gradients_and_losses(runs: dict, policy: str) -> None:
    """Exactly equal: the recomputation runs the same CPU kernels on the same inputs (and `selective-ops` hands back
    the very tensors the forward saved), so nothing is reordered or rounded differently."""
    plain, checkpointed = runs[None], runs[policy]
    assert plain["losses"][0] != plain["losses"][-1]  # the steps train
    assert checkpointed["losses"] == plain["losses"]
    assert sorted(checkpointed["grads"]) == sorted(plain["grads"])
    assert any(".layers.1." in name for name in plain["grads"])
    for name, grad in plain["grads"].items():
        assert torch.equal(checkpointed["grads"][name], grad), name
    assert checkpointed["keys"] == plain["keys"]  # checkpoint keys do not depend on the policy


def _reruns(runs: dict) -> dict[str | None, int]:
    """Matmuls each policy's first backward runs beyond checkpointing-off's: forward matmuls run again."""
    return {policy: run["backward"].total - runs[None]["backward"].total for policy, run in runs.items()}


@pytest.mark.parametrize("overrides", [{"use_lora": True, "lora_rank": 4}, {"train_strategy": "ddp"}])
def test_lora_and_ddp_get_the_plain_gradients(one_rank: DistInfo, overrides: dict) -> None:
    """LoRA adapters (peft) inside the checkpointed layers and DDP instead of FSDP2: the same exact equality."""
    plain = _train(one_rank, None, **overrides)
    assert plain["losses"][0] != plain["losses"][-1]
    if overrides.get("use_lora"):
        assert plain["grads"] and all("lora_" in name for name in plain["grads"] if ".layers." in name)
    for policy in ("selective-ops", "every-2"):
        checkpointed = _train(one_rank, policy, **overrides)
        assert checkpointed["losses"] == plain["losses"], policy
        assert sorted(checkpointed["grads"]) == sorted(plain["grads"]), policy
        for name, grad in plain["grads"].items():
            assert torch.equal(checkpointed["grads"][name], grad), (policy, name)
        assert checkpointed["keys"] == plain["keys"], policy
        reruns = _reruns({None: plain, policy: checkpointed})[policy]
        assert (reruns == 0) if policy == "selective-ops" else (reruns > 0), policy


def test_each_policy_reruns_the_forward_matmuls_it_should(whole_recomputation_runs: dict) -> None:
    plain = whole_recomputation_runs[None]
    per_layer = plain["forward"].per_layer
    assert len(per_layer) == 2 and min(per_layer) > 0
    for run in whole_recomputation_runs.values():
        assert run["forward"].total == plain["forward"].total  # the forward itself is the same
        assert run["losses"] == plain["losses"]
    # full re-runs every layer's forward; selective-ops none of its matmuls; every-2 those of layers 0, 2, ...
    expected = {None: 0, "full": sum(per_layer), "selective-ops": 0, "every-2": sum(per_layer[0::2])}
    assert _reruns(whole_recomputation_runs) == expected


def test_with_early_stop_selective_ops_still_reruns_no_matmul(runs: dict) -> None:
    """torch's default (a recomputation stops early): full and every-2 re-run part of the forward's matmuls, at most
    all of them, every-2 fewer than full; selective-ops still none."""
    per_layer = runs[None]["forward"].per_layer
    reruns = _reruns(runs)
    assert reruns["selective-ops"] == 0
    assert 0 < reruns["every-2"] < reruns["full"] <= sum(per_layer)
    assert reruns["every-2"] <= sum(per_layer[0::2])


def test_every_n_wraps_layers_0_n_2n_and_keeps_the_keys(caplog: pytest.LogCaptureFixture) -> None:
    def wrapped(policy: str) -> list[int]:
        vlm, _ = _tiny()
        layers = vlm.llm_backbone.get_layers()
        layers.extend(copy.deepcopy(layers[i % 2]) for i in range(3))  # 5 layers (never run)
        keys = set(vlm.state_dict())
        count = apply_llm_activation_checkpointing(vlm, policy)
        assert set(vlm.state_dict()) == keys, policy
        indices = [i for i, layer in enumerate(layers) if hasattr(layer, "_checkpoint_wrapped_module")]
        assert count == len(indices) and all(isinstance(layers[i], CheckpointWrapper) for i in indices)
        return indices

    assert wrapped("every-2") == [0, 2, 4]
    assert wrapped("every-3") == [0, 3]
    assert wrapped("every-7") == [0]
    assert wrapped("every-1") == wrapped("full") == wrapped("selective-ops") == [0, 1, 2, 3, 4]
    with caplog.at_level("INFO", logger="prismatic.models.parallelize"):
        wrapped("every-2")
    assert "Activation checkpointing (every-2): 3 of 5 LLM decoder layers checkpointed" in caplog.messages


@pytest.mark.parametrize(
    "value", ["every-0", "every-x", "every-", "partial", "selective", "Full", "every-2.5"]
)
def test_bad_policy_is_refused_with_the_choices(value: str) -> None:
    with pytest.raises(ConfigError) as error:
        SpeedConfig(checkpointing_policy=value)
    message = str(error.value)
    assert f"Unknown checkpointing_policy '{value}' (--vla.speed.checkpointing_policy)." in message
    assert message.endswith("Valid choices: auto, full, selective-ops, every-N (N >= 1).")
    assert "\n" not in message


def test_good_policies_are_accepted() -> None:
    for value in ("auto", "full", "selective-ops", "every-1", "every-2", "every-16"):
        assert VLAConfig(speed=SpeedConfig(checkpointing_policy=value)).speed.checkpointing_policy == value


def test_selective_ops_compiled_trains_like_eager(
    one_rank: DistInfo, runs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--vla.speed.compile` on top of `selective-ops`: the eager losses within the compile test's FP32 tolerance, and
    the compiled layers still keep their attention outputs: the backward runs no attention forward (it does when
    the checkpoint stays outside the compiled graph). The profiler counts ops inside compiled code; a dispatch mode
    would turn compilation off. The `aot_eager` backend runs the same capture and the same partitioner (which
    applies the policy) as inductor, without its code generation: 7 s here instead of 30 s or more."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    strategy, head = _strategy(one_rank, "selective-ops", compile_blocks=True)
    losses = []
    for step in range(STEPS):
        loss = head(
            strategy.model, strategy.to_device(synthetic_batch(strategy.vlm, head, 2, seed=step))
        ).loss
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            loss.backward()
        strategy.clip_grad_norm()
        strategy.optimizer.step()
        strategy.optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        ops = {event.key for event in profile.key_averages()}
        assert "aten::mm" in ops  # the profiler sees the compiled backward's matmuls
        assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in ops, step
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # something was compiled
    torch.testing.assert_close(losses, runs["selective-ops"]["losses"], rtol=1e-4, atol=1e-5)
