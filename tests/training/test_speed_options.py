"""The speed flags keep the numbers: each means of `--vla.optimizer_impl`, `--vla.logits_at_labels`,
`--vla.causal_mask_only` and `--vla.compile` against the plain path on the tiny model on CPU (FP32).

Expected values come from the plain path run in the test (the LLM's own loss over full logits, torch's default
AdamW, the eager model, the masked forward), never from the code under test; `auto` must leave CPU runs exactly
as they were, so it is checked to resolve to off there and on on CUDA.
"""

from __future__ import annotations

import copy

import pytest
import torch

from prismatic.conf.vla import VLAConfig, get_vla_config
from prismatic.models import build_vlm
from prismatic.models.action_heads import ActionSpec, build_action_head
from prismatic.models.builders import attach_action_head
from prismatic.training.optim import adamw_implementation, build_optimizer
from prismatic.training.strategies import get_train_strategy
from prismatic.training.strategies.base import is_right_padded
from prismatic.util.dist import DistInfo
from prismatic.util.errors import ConfigError
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets.synthetic import synthetic_batch

BASE, VLA = "tiny-vit+tiny-llama", "tiny+mx-toy"
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
STATS = {"toy": {"action": {"q01": [0.0] * 7}}}


def _tiny(spec: ActionSpec = ActionSpec(action_dim=7)):
    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    vlm.attach_action_modules(spec)
    head = build_action_head(spec, ActionTokenizer(vlm.llm_backbone.tokenizer), vlm.num_prefix_tokens)
    return vlm, head


def test_auto_is_off_on_cpu_and_on_on_cuda() -> None:
    vla = get_vla_config(VLA)
    for name in ("logits_at_labels", "causal_mask_only"):
        assert (vla.speed_option(name, CPU), vla.speed_option(name, CUDA)) == (False, True)
        setattr(vla, name, "on")
        assert vla.speed_option(name, CPU) is True
        setattr(vla, name, "off")
        assert vla.speed_option(name, CUDA) is False
    assert (adamw_implementation("auto", CPU), adamw_implementation("auto", CUDA)) == ("default", "fused")
    vlm, _ = _tiny(ActionSpec())
    assert attach_action_head(vlm, get_vla_config(VLA), STATS, CPU).logits_at_labels is False
    assert attach_action_head(vlm, get_vla_config(VLA), STATS, CUDA).logits_at_labels is True


@pytest.mark.parametrize(
    ("field", "value"),
    [("optimizer_impl", "apex"), ("logits_at_labels", "yes"), ("causal_mask_only", "true")],
)
def test_bad_speed_flag_is_refused_with_the_choices(field: str, value: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"Unknown {field} '{value}' \(--vla.{field}\).*Valid choices: auto"
    ):
        VLAConfig(**{field: value})


def test_logits_at_labels_loss_equals_full_logits_loss() -> None:
    """The same mean cross-entropy over the labelled tokens as the LLM's own loss on full logits, exactly, and the
    same metric sums (float64 sums of the same values, summed over fewer zeros)."""
    vlm, head = _tiny()
    batch = synthetic_batch(vlm, head, 4)
    assert len(set(batch["attention_mask"].sum(1).tolist())) > 1  # rows of several lengths: real padding
    full = head(vlm, batch)
    head.logits_at_labels = True
    at_labels = head(vlm, batch)
    assert at_labels.loss.item() == full.loss.item()
    torch.testing.assert_close(at_labels.sums, full.sums, rtol=1e-12, atol=1e-12)
    # Its own reference: HF's shifted cross-entropy, written out here over the full logits.
    logits = vlm(**head.model_inputs(batch)).logits[:, head.num_prefix_tokens : -1].float()
    targets = batch["labels"][:, 1:]
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    torch.testing.assert_close(at_labels.loss, expected, rtol=1e-6, atol=0)
    at_labels.loss.backward()  # the loss reaches the weights through the gathered rows
    assert vlm.llm_backbone.llm.get_output_embeddings().weight.grad.abs().sum() > 0


def test_label_positions_are_the_labelled_ones_in_order() -> None:
    _, head = _tiny(ActionSpec(action_dim=2))
    labels = torch.tensor([[1, 5, -100, 7, 8, 9, -100], [1, -100, -100, -100, 4, 5, 6]])
    positions, targets = head.label_positions(labels)
    # Text token j + 1 is predicted at text position j; three labels per row (2 action tokens + EOS).
    assert positions.tolist() == [[0, 2, 3], [3, 4, 5]]
    assert targets.tolist() == [[5, 7, 8], [4, 5, 6]]
    truncated = torch.tensor([[1, -100, -100, 7, -100]])
    positions, targets = head.label_positions(truncated)
    assert targets.tolist() == [[7, -100, -100]]  # fewer labels than the layout's: the rest is ignored


def test_causal_mask_only_drops_right_padding_alone_and_keeps_the_outputs(one_rank: DistInfo) -> None:
    assert is_right_padded(torch.tensor([[1, 1, 1], [1, 1, 0]]))
    assert not is_right_padded(torch.tensor([[1, 1, 1], [0, 1, 1]]))
    vlm, head = _tiny()
    vla = get_vla_config(VLA)
    vla.causal_mask_only = "on"
    strategy = get_train_strategy(vlm, vla, one_rank)
    batch = synthetic_batch(vlm, head, 4)
    moved = strategy.to_device(batch)
    assert moved["attention_mask"] is None
    assert torch.equal(moved["labels"], batch["labels"])
    left = dict(batch, attention_mask=batch["attention_mask"].flip(1))
    assert torch.equal(strategy.to_device(left)["attention_mask"], left["attention_mask"])
    # Every labelled position's logits match the masked forward's; the loss is the same number.
    with torch.no_grad():
        masked, unmasked = head(vlm, batch), head(vlm, moved)
    torch.testing.assert_close(unmasked.loss, masked.loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(unmasked.sums, masked.sums, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("implementation", ["fused", "foreach", "for-loop"])
def test_adamw_implementations_give_the_default_update(implementation: str) -> None:
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    model = copy.deepcopy(reference)
    optimizers = [
        build_optimizer(net, 1e-2, 0.1, impl)
        for net, impl in ((reference, "default"), (model, implementation))
    ]
    kind = {"fused": "fused", "foreach": "foreach", "for-loop": "foreach"}[implementation]
    assert optimizers[1].defaults[kind] is (implementation != "for-loop")
    inputs = torch.randn(5, 4, 8)
    for x in inputs:
        for net, optimizer in zip((reference, model), optimizers, strict=True):
            net(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    for expected, got in zip(reference.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    assert optimizers[1].param_groups[1]["weight_decay"] == 0.0  # norms and biases still undecayed


def _losses(one_rank: DistInfo, compile_blocks: bool, steps: int = 5) -> list[float]:
    vlm, head = _tiny()
    vla = get_vla_config(VLA)
    vla.compile = compile_blocks
    vla.enable_mixed_precision_training = False
    strategy = get_train_strategy(vlm, vla, one_rank)
    strategy.setup(steps)
    losses = []
    for step in range(steps):
        batch = strategy.to_device(synthetic_batch(vlm, head, 2, seed=step))
        loss = head(strategy.model, batch).loss
        loss.backward()
        strategy.clip_grad_norm()
        strategy.optimizer.step()
        strategy.optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_compiled_blocks_train_like_eager(one_rank: DistInfo) -> None:
    """Five FSDP2 steps (activation checkpointing on) with every block compiled: the eager run's losses within
    FP32 tolerance, and the checkpoint keys unchanged (blocks are compiled in place)."""
    torch._dynamo.reset()
    eager = _losses(one_rank, compile_blocks=False)
    compiled = _losses(one_rank, compile_blocks=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # something was compiled
    assert eager[0] != eager[-1]  # the steps train
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    vlm, _ = _tiny()
    keys = set(vlm.state_dict())
    vla = get_vla_config(VLA)
    vla.compile = True
    strategy = get_train_strategy(vlm, vla, one_rank)
    strategy.setup(1)
    assert set(strategy.model.state_dict()) == keys
