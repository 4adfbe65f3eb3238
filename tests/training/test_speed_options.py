"""The speed flags keep the numbers: each means of `--vla.speed.optimizer_impl`, `--vla.speed.logits_at_labels`,
`--vla.speed.causal_mask_only` (with `causal_attention`) and `--vla.speed.compile` against the plain path on the tiny
model on CPU (FP32).

Expected values come from the plain path run in the test (the LLM's own loss over full logits, torch's default
AdamW, the eager model, the masked forward), never from the code under test; `auto` must leave CPU runs exactly
as they were, so it is checked to resolve to off there and on on CUDA.
"""

from __future__ import annotations

import collections
import copy
import functools
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from prismatic.conf.speed import SpeedConfig
from prismatic.conf.vla import VLAConfig, get_vla_config
from prismatic.models import build_vlm
from prismatic.models.action_heads import ActionSpec, build_action_head
from prismatic.models.lora import apply_lora
from prismatic.models.parallelize import compiler_problem
from prismatic.training import speed_plan
from prismatic.training.model_setup import attach_action_head
from prismatic.training.optim import build_optimizer
from prismatic.training.speed_plan import (
    adamw_implementation,
    compiles,
    pad_multiple,
    plan_flags,
    speed_switch,
)
from prismatic.training.strategies import base, ddp, get_train_strategy
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
    speed = get_vla_config(VLA).speed
    for name in ("logits_at_labels", "causal_mask_only", "overlap_steps"):
        assert (speed_switch(getattr(speed, name), CPU), speed_switch(getattr(speed, name), CUDA)) == (
            False,
            True,
        )
        setattr(speed, name, "on")
        assert speed_switch(getattr(speed, name), CPU) is True
        setattr(speed, name, "off")
        assert speed_switch(getattr(speed, name), CUDA) is False
    assert (adamw_implementation("auto", CPU), adamw_implementation("auto", CUDA)) == ("default", "fused")
    vlm, _ = _tiny(ActionSpec())
    for device, expected in ((CPU, False), (CUDA, True)):
        vla = get_vla_config(VLA)
        flags = plan_flags(vla, vla.expected_world_size, device)
        assert attach_action_head(vlm, vla, STATS, flags.logits_at_labels).logits_at_labels is expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("optimizer_impl", "apex"),
        ("logits_at_labels", "yes"),
        ("causal_mask_only", "true"),
        ("compile", "max"),
        ("overlap_steps", "sometimes"),
        ("batched_grad_copy", "yes"),
    ],
)
def test_bad_speed_flag_is_refused_with_the_choices(field: str, value: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"Unknown {field} '{value}' \(--vla.speed.{field}\).*Valid choices: auto"
    ):
        VLAConfig(speed=SpeedConfig(**{field: value}))


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
    vla.speed.causal_mask_only = "on"
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


@pytest.mark.parametrize("head_name", ["tokens", "l1-chunk"])
@pytest.mark.parametrize("drop_mask", [False, True])
def test_lengths_rounded_up_keep_the_loss_and_gradients(head_name: str, drop_mask: bool) -> None:
    """`--vla.speed.pad_to_multiple` (8 under CUDA graphs): the same frames padded to the longest sequence, and to that
    length rounded up to a multiple of 16, give the same loss, metric sums and gradients within FP32 tolerance, with
    the padding mask or without it (`causal_mask_only`): the extra positions carry ignored labels and come after
    every real token."""
    spec = (
        ActionSpec(action_dim=7)
        if head_name == "tokens"
        else ActionSpec("l1-chunk", chunk_size=4, action_dim=7)
    )
    vlm, head = _tiny(spec)
    outputs = []
    for multiple in (1, 16):
        batch = synthetic_batch(vlm, head, 4, pad_to_multiple=multiple)
        if drop_mask and multiple > 1:
            batch["attention_mask"] = None
        vlm.zero_grad(set_to_none=True)
        out = head(vlm, batch)
        out.loss.backward()
        grads = {name: p.grad.clone() for name, p in vlm.named_parameters() if p.grad is not None}
        outputs.append((batch["input_ids"].shape[1], out, grads))
    (short, plain, plain_grads), (long, padded, padded_grads) = outputs
    assert long % 16 == 0 and long > short  # really padded further
    torch.testing.assert_close(padded.loss, plain.loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(padded.sums, plain.sums, rtol=1e-5, atol=1e-6)
    assert padded_grads.keys() == plain_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(padded_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_lengths_round_up_to_8_where_the_blocks_replay_cuda_graphs(one_rank: DistInfo) -> None:
    """`--vla.speed.pad_to_multiple` null (the default) resolves to 8 where the blocks are to replay CUDA graphs and to
    1 (the longest sequence only, OpenVLA's padding) everywhere else; a value given is kept."""
    vlm, _ = _tiny()
    vla = get_vla_config(VLA)
    assert vla.speed.pad_to_multiple is None
    for compile_mode, expected in (("reduce-overhead", 8), ("default", 1), (None, 1)):
        assert pad_multiple(vla.speed.pad_to_multiple, compile_mode) == expected
    vla.speed.pad_to_multiple = 3
    assert pad_multiple(vla.speed.pad_to_multiple, "reduce-overhead") == 3
    assert get_train_strategy(vlm, vla, one_rank).pad_to_multiple == 3
    with pytest.raises(
        ConfigError, match=r"--vla.speed.pad_to_multiple=0 is out of range: it must be an integer >= 1"
    ):
        VLAConfig(speed=SpeedConfig(pad_to_multiple=0))


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


def _losses(one_rank: DistInfo, compile_blocks: bool, steps: int = 5, lora_ddp: bool = False) -> list[float]:
    vlm, head = _tiny()
    vla = get_vla_config(VLA)
    vla.speed.compile = "on" if compile_blocks else "off"
    if lora_ddp:  # what `auto` compiles on CUDA, under the LIBERO presets' strategy
        vla.use_lora, vla.train_strategy = True, "ddp"
        vlm.freeze_backbones(vla.stage)
        apply_lora(vlm, vla.lora_settings())
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


@pytest.mark.parametrize("lora_ddp", [False, True], ids=["full-fsdp", "lora-ddp"])
def test_compiled_blocks_train_like_eager(
    one_rank: DistInfo, lora_ddp: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five steps (activation checkpointing on; a full fine-tune under FSDP2, LoRA under DDP) with every block
    compiled: the eager run's losses within FP32 tolerance, and the checkpoint keys unchanged (blocks are compiled
    in place). LoRA's run stops at AOTAutograd's graphs (`aot_eager`): the capture is what DDP and peft could
    break, and inductor's C++ code generation, which GPUs do not run, would add half a minute."""
    if lora_ddp:
        monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    eager = _losses(one_rank, compile_blocks=False, lora_ddp=lora_ddp)
    compiled = _losses(one_rank, compile_blocks=True, lora_ddp=lora_ddp)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # something was compiled
    assert eager[0] != eager[-1]  # the steps train
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    vlm, _ = _tiny()
    keys = set(vlm.state_dict())
    vla = get_vla_config(VLA)
    vla.speed.compile = "on"
    strategy = get_train_strategy(vlm, vla, one_rank)
    strategy.setup(1)
    assert strategy.compiled
    assert set(strategy.model.state_dict()) == keys


def test_compiled_blocks_see_one_attention_setting_forward_and_recompute(
    lora_ddp_steps: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a mask the LLM runs under `causal_attention` (no host sync), which compiled decoder layers guard on:
    the context spans forward and backward, so activation checkpointing's recomputation hits the forward's graph
    instead of compiling another. Losses as eager (AOTAutograd's graphs, as in the test above)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    eager, _ = lora_ddp_steps("off")
    torch._logging.set_logs(recompiles=True)
    try:
        with caplog.at_level(logging.DEBUG, logger="torch._dynamo"):
            compiled, _ = lora_ddp_steps("on")
    finally:
        torch._logging.set_logs()
        torch._dynamo.reset()
    recompiles = [r.getMessage() for r in caplog.records if "Recompiling" in r.getMessage()]
    assert recompiles  # the log is seen (timm's first block, once its input requires grad)
    assert not [m for m in recompiles if "_attn_implementation" in m], recompiles
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


class _OpCounts(TorchDispatchMode):
    """How many times each ATen op ran (by name, e.g. `mul.out`), DDP's reducer included."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[func.name().removeprefix("aten::")] += 1
        return func(*args, **(kwargs or {}))


def test_batched_grad_copies_train_like_per_parameter_copies(lora_ddp_steps: Any) -> None:
    """`--vla.speed.batched_grad_copy on` (CUDA's `auto`): DDP copies a bucket's gradients with one `_foreach_copy_`
    instead of one `mul.out` per parameter, and training gives the same losses and weights (`==`) as the copies one
    by one (3 steps of 2 micro-batches under DDP, one all-reduce per step)."""
    steps = 3
    with _OpCounts() as per_parameter:
        losses, one_by_one = lora_ddp_steps("off", steps=steps, batched_grad_copy="off")
    with _OpCounts() as per_bucket:
        batched_losses, batched = lora_ddp_steps("off", steps=steps, batched_grad_copy="on")
    assert losses[0] != losses[-1]  # the steps train
    assert batched_losses == losses
    trained = len(one_by_one.trainable_params)
    assert trained > 20
    for param, expected in zip(batched.trainable_params, one_by_one.trainable_params, strict=True):
        assert torch.equal(param, expected)
    # Once a step (the micro-batch that syncs), every trainable parameter's gradient goes into its bucket.
    assert per_parameter.counts["mul.out"] == steps * trained
    assert per_parameter.counts["_foreach_copy_"] == 0
    assert per_bucket.counts["mul.out"] == 0
    assert steps <= per_bucket.counts["_foreach_copy_"] < steps * trained / 10


def test_batched_grad_copy_auto_is_on_on_cuda_where_torch_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto` copies a bucket at a time on CUDA, one by one on CPU (as before); with a torch whose DDP lacks it,
    `auto` copies one by one and `on` is refused with the torch version and the settings that work."""

    def resolved(setting: str, device: torch.device) -> bool:
        return speed_plan.batched_grad_copy(VLAConfig(speed=SpeedConfig(batched_grad_copy=setting)), device)

    assert [resolved(s, CPU) for s in ("auto", "on", "off")] == [False, True, False]
    assert [resolved(s, CUDA) for s in ("auto", "on", "off")] == [True, True, False]
    monkeypatch.setattr(ddp, "HAS_BATCHED_GRAD_COPY", False)
    assert [resolved(s, CUDA) for s in ("auto", "off")] == [False, False]
    with pytest.raises(
        ConfigError, match=rf"torch {re.escape(torch.__version__)} does not have.*auto.*or off"
    ):
        resolved("on", CUDA)


def test_compile_auto_compiles_where_it_was_measured_faster() -> None:
    """`auto` compiles on CUDA for LoRA runs, runs without activation checkpointing and full fine-tunes under DDP
    (each measured faster on GPUs), not for a full fine-tune with checkpointing under FSDP2 (measured slower
    there), and never on CPU; on / off force."""
    vla = get_vla_config(VLA)
    # (LoRA, activation checkpointing, strategy) -> compiled on CUDA under auto
    expected_on_cuda = {
        (False, True, "fsdp-full-shard"): False,
        (False, True, "fsdp-shard-grad-op"): False,
        (False, True, "ddp"): True,
        (False, False, "fsdp-full-shard"): True,
        (True, True, "fsdp-full-shard"): True,
        (True, False, "fsdp-full-shard"): True,
        (True, True, "ddp"): True,
    }
    for (lora, checkpointing, strategy), on_cuda in expected_on_cuda.items():
        vla.use_lora, vla.enable_gradient_checkpointing, vla.speed.compile = lora, checkpointing, "auto"
        assert (compiles(vla, CPU, strategy), compiles(vla, CUDA, strategy)) == (False, on_cuda)
        vla.speed.compile = "on"
        assert (compiles(vla, CPU, strategy), compiles(vla, CUDA, strategy)) == (True, True)
        vla.speed.compile = "off"
        assert (compiles(vla, CPU, strategy), compiles(vla, CUDA, strategy)) == (False, False)


def test_set_up_logs_what_each_speed_flag_resolved_to(
    one_rank: DistInfo, caplog: pytest.LogCaptureFixture
) -> None:
    """config.yaml records `auto`; the log says what ran: on CPU every `auto` is off, `on` shows as on."""
    vlm, _ = _tiny()
    vla = get_vla_config(VLA)
    vla.speed.causal_mask_only, vla.speed.checkpointing_policy, vla.speed.prefetch_batches = (
        "on",
        "every-2",
        3,
    )
    with caplog.at_level(logging.INFO):
        get_train_strategy(vlm, vla, one_rank).setup(1)
    assert (
        "Speed flags on cpu: AdamW default, LM head only at labels (tokens head) off, padding mask dropped on, "
        "compiled blocks off, activation checkpointing every-2, prefetched batches 3, steps overlapped off "
        "(docs/performance.md)."
    ) in caplog.text
    vla.speed.pad_to_multiple = 8
    with caplog.at_level(logging.INFO):
        get_train_strategy(_tiny()[0], vla, one_rank).setup(1)
    assert (
        "steps overlapped off, batch lengths rounded up to a multiple of 8 (docs/performance.md)."
        in caplog.text
    )


def test_compile_falls_back_to_eager_where_the_compiler_cannot_run(
    one_rank: DistInfo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the set-up's probe compile fails (no C compiler, no Triton), `auto` trains eagerly after one warning
    naming the error, and `on` stops with an error naming it and `--vla.speed.compile off`."""
    assert compiler_problem(CPU) is None  # this machine's compiler stack works
    compiled: list = []

    def broken_compile(fn, **kwargs):
        compiled.append(fn)

        def run(*args, **kw):
            raise RuntimeError("Compiler: cc is not found.\nThe rest of inductor's traceback.")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(
        speed_plan, "compiles", lambda vla, device, strategy: True
    )  # as `auto` is for LoRA on CUDA
    vlm, head = _tiny()
    vla = get_vla_config(VLA)
    vla.enable_mixed_precision_training = False
    strategy = get_train_strategy(vlm, vla, one_rank)
    with caplog.at_level(logging.WARNING):
        strategy.setup(1)
    assert strategy.compiled is False and len(compiled) == 1  # the probe, and no block
    assert (
        "torch.compile cannot run on cpu here (RuntimeError: Compiler: cc is not found.): every rank trains "
        "without compiling"
    ) in caplog.text
    head(strategy.model, strategy.to_device(synthetic_batch(vlm, head, 2))).loss.backward()  # eager training

    vla = get_vla_config(VLA)
    vla.speed.compile = "on"
    with pytest.raises(
        ConfigError,
        match=r"--vla.speed.compile on, but torch.compile cannot run on cpu here \(RuntimeError: Compiler: cc is not "
        r"found.\).*--vla.speed.compile off",
    ):
        get_train_strategy(_tiny()[0], vla, one_rank).setup(1)


def _probe_on_two_ranks(rank: int, store: str, out: str) -> None:
    """Rank 1's compiler is broken, rank 0's works: record what each rank's set-up did under each setting (one pair
    of processes for both: each costs seconds of imports)."""
    os.environ["LOCAL_WORLD_SIZE"] = "2"  # one node of two ranks, as torchrun would say
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    base.compiler_problem = lambda device, *_: "RuntimeError: cc is not found." if rank == 1 else None
    speed_plan.compiles = lambda vla, device, strategy: True  # as `auto` is for LoRA on CUDA
    for setting in ("auto", "on"):
        vla = get_vla_config(VLA)
        vla.speed.compile, vla.enable_mixed_precision_training = setting, False
        strategy = get_train_strategy(_tiny()[0], vla, DistInfo(rank, rank, 2, 1, CPU))
        records: list[str] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record, records=records: records.append(record.getMessage())
        logging.getLogger(base.__name__).addHandler(handler)
        try:
            strategy.setup(1)
            result = {"compiled": strategy.compiled, "warnings": records}
        except ConfigError as error:
            result = {"error": str(error)}
        finally:
            logging.getLogger(base.__name__).removeHandler(handler)
        Path(out, f"{setting}-rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiler_probes")
    mp.spawn(_probe_on_two_ranks, args=(str(out / "store"), str(out)), nprocs=2, join=True)
    return out


@pytest.mark.parametrize("setting", ["auto", "on"])
def test_ranks_agree_when_the_compiler_fails_on_one(probes: Path, setting: str) -> None:
    """All ranks compile or none (the same graphs, the same numbers): a probe failing on rank 1 alone sends both
    ranks eager under `auto`, and stops both under `on`, rank 0 naming rank 1."""
    zero, one = (json.loads((probes / f"{setting}-rank{r}.json").read_text()) for r in range(2))
    if setting == "auto":
        assert zero["compiled"] is False and one["compiled"] is False
        assert zero["warnings"] == [
            "torch.compile cannot run on rank 1's cpu device (RuntimeError: cc is not found.): every rank trains "
            "without compiling the blocks, which is slower. --vla.speed.compile off skips this check; "
            "--vla.speed.compile on makes it an error."
        ]
        assert one["warnings"][0].startswith("torch.compile cannot run on cpu here (RuntimeError: cc is not")
    else:
        assert zero["error"].startswith(
            "--vla.speed.compile on, but torch.compile cannot run on rank 1's cpu device (RuntimeError: cc is not "
            "found.)."
        )
        assert one["error"].startswith(
            "--vla.speed.compile on, but torch.compile cannot run on cpu here (RuntimeError: cc is not found.)."
        )
