"""`--vla.speed.compile_mode`: how compiled blocks launch their kernels (one by one from inductor's Python wrapper, or
replayed from CUDA graphs), and what `auto` picks. On CPU: each mode reaches `torch.compile` and trains the tiny LoRA
model (DDP, FP32, the LIBERO presets' set-up) as the default mode does; CUDA graphs are refused where a replay would
be wrong. The GPU side (graphs replayed, losses against the CPU reference) is tests/gpu/test_gpu_training.py's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from prismatic.conf.speed import SpeedConfig
from prismatic.conf.vla import VLAConfig, get_vla_config
from prismatic.training.model_setup import build_vlm as build_training_vlm
from prismatic.training.speed_plan import blocks_compile_mode
from prismatic.training.strategies import base, get_train_strategy
from prismatic.util.dist import DistInfo
from prismatic.util.errors import ConfigError

VLA = "tiny+mx-toy"
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_bad_compile_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(
        ConfigError,
        match=r"Unknown compile_mode 'cudagraphs' \(--vla.speed.compile_mode\)\..* Valid choices: auto, default, "
        r"reduce-overhead\.",
    ):
        VLAConfig(speed=SpeedConfig(compile_mode="cudagraphs"))


def test_cuda_graphs_need_ddp_with_gradients_reduced_every_micro_batch() -> None:
    """A replay overwrites the previous one's outputs: FSDP2 (parameters re-gathered every step) and `--grad_sync
    step` under accumulation (gradients left in the graphs' memory between micro-batches) are refused, naming
    them; DDP passes, with or without accumulation, and so does a run that compiles nothing."""
    vla = get_vla_config(VLA)
    vla.use_lora, vla.speed.compile, vla.speed.compile_mode = True, "auto", "reduce-overhead"
    vla.per_device_batch_size, vla.global_batch_size = 4, 8
    with pytest.raises(ConfigError) as error:
        blocks_compile_mode(vla, "fsdp-full-shard", 1, CUDA, "step")
    assert str(error.value) == (
        "--vla.speed.compile_mode reduce-overhead (compiled blocks replayed from CUDA graphs) needs DDP "
        "(--vla.train_strategy ddp, or auto: LoRA on GPUs, a full fine-tune on one GPU where it fits) with "
        "gradients reduced after every micro-batch "
        "(--grad_sync auto or micro-batch), but the strategy is fsdp-full-shard, which frees and re-gathers the "
        "parameters every step and --grad_sync step keeps the gradients of 2 micro-batches in the graphs' memory "
        "until the step ends. Use --vla.speed.compile_mode auto or default, or DDP with --grad_sync auto."
    )
    with pytest.raises(ConfigError, match=r"but --grad_sync step keeps the gradients of 2 micro-batches"):
        blocks_compile_mode(vla, "ddp", 1, CUDA, "step")
    with pytest.raises(ConfigError, match=r"but the strategy is fsdp-shard-grad-op, which frees"):
        blocks_compile_mode(vla, "fsdp-shard-grad-op", 1, CUDA, "auto")
    for grad_sync in ("auto", "micro-batch"):
        assert blocks_compile_mode(vla, "ddp", 1, CUDA, grad_sync) == "reduce-overhead"
    assert (
        blocks_compile_mode(vla, "ddp", 2, CUDA, "step") == "reduce-overhead"
    )  # 4 x 2 processes: 1 micro-batch
    assert (
        blocks_compile_mode(vla, "fsdp-full-shard", 1, CPU, "step") is None
    )  # `auto` compiles nothing on CPU
    vla.speed.compile_mode = "default"
    assert blocks_compile_mode(vla, "fsdp-full-shard", 1, CUDA, "step") == "default"


@pytest.mark.parametrize(
    ("lora", "strategy", "device", "world", "grad_sync", "compile", "expected"),
    [
        (True, "ddp", CUDA, 1, "auto", "auto", "reduce-overhead"),  # the measured win: 7B LoRA on one GPU
        (True, "ddp", CUDA, 1, "micro-batch", "auto", "reduce-overhead"),
        (
            True,
            "ddp",
            CUDA,
            2,
            "step",
            "auto",
            "reduce-overhead",
        ),  # 4 x 2 processes: one micro-batch, no wait
        (
            True,
            "ddp",
            CUDA,
            1,
            "step",
            "auto",
            "default",
        ),  # 2 micro-batches' gradients would wait in the graphs
        (True, "fsdp-full-shard", CUDA, 1, "auto", "auto", "default"),  # parameters re-gathered every step
        (True, "fsdp-shard-grad-op", CUDA, 2, "auto", "auto", "default"),
        (False, "ddp", CUDA, 1, "auto", "auto", "reduce-overhead"),  # the ~1B full fine-tune: 300 vs 627 ms
        (False, "ddp", CUDA, 1, "step", "auto", "default"),  # full-size gradients would wait in the graphs
        (False, "ddp", CUDA, 2, "auto", "auto", "reduce-overhead"),  # an explicit DDP on several GPUs
        (False, "fsdp-full-shard", CUDA, 1, "auto", "auto", None),  # eager: measured slower compiled
        (True, "ddp", CPU, 1, "auto", "auto", None),  # `auto` compiles nothing on CPU
        (True, "ddp", CPU, 1, "auto", "on", "default"),  # no CUDA graphs without CUDA
        (True, "ddp", CUDA, 1, "auto", "off", None),
    ],
)
def test_auto_replays_cuda_graphs_under_ddp_on_cuda(
    lora: bool,
    strategy: str,
    device: torch.device,
    world: int,
    grad_sync: str,
    compile: str,
    expected: str | None,
) -> None:
    """`--vla.speed.compile_mode auto` (the default) never refuses a run: it replays the blocks from CUDA graphs where
    that was measured faster and is safe (LoRA or full fine-tune, CUDA, DDP, every micro-batch's gradients reduced out
    of the graphs' memory), launches them one by one where they compile otherwise, and is None where they stay eager."""
    vla = get_vla_config(VLA)
    vla.use_lora, vla.speed.compile, vla.per_device_batch_size, vla.global_batch_size = lora, compile, 4, 8
    assert vla.speed.compile_mode == "auto"
    assert blocks_compile_mode(vla, strategy, world, device, grad_sync) == expected


def _spy(monkeypatch: pytest.MonkeyPatch, name: str, owner: Any) -> list[tuple[Any, dict[str, Any]]]:
    """Record every call of `owner.name` (its first argument and keyword arguments), still calling it."""
    calls: list[tuple[Any, dict[str, Any]]] = []
    real: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(real)
    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append((args[0] if args else None, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def test_compile_modes_train_like_the_default(lora_ddp_steps: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`default` compiles the blocks and reduces once per step (AOTAutograd's graphs here: the eager losses within
    rounding). `reduce-overhead` reaches inductor (which, on CPU, skips the graphs and counts the skip), compiles
    each LLM layer with its checkpoint wrapper (the recomputation inside the compiled backward), starts each step
    for the graphs and has DDP reduce every micro-batch's gradients (out of the graphs' memory): the eager losses
    within FP32 tolerance (inductor's kernels fuse differently)."""
    eager, _ = lora_ddp_steps("off")
    # AOTAutograd's graphs only: inductor's own kernels are the reduce-overhead run's to check, below.
    with monkeypatch.context() as aot_eager:
        aot_eager.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
        default, strategy = lora_ddp_steps("on", "default")
    assert strategy.compiled and not strategy.cuda_graphs and not strategy.sync_every_micro_batch
    assert eager[0] != eager[-1]  # the steps train
    torch.testing.assert_close(default, eager, rtol=1e-5, atol=1e-6)

    compiled = _spy(monkeypatch, "compile", torch)
    steps_begun = _spy(monkeypatch, "cudagraph_mark_step_begin", torch.compiler)
    torch._dynamo.utils.counters.clear()
    graphs, strategy = lora_ddp_steps("on", "reduce-overhead")
    assert strategy.cuda_graphs and strategy.sync_every_micro_batch
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] >= 1
    assert len(steps_begun) == len(graphs) == 3
    layers = strategy.vlm.llm_backbone.get_layers()
    wrapped_whole = [
        fn.__self__ for fn, _ in compiled if isinstance(getattr(fn, "__self__", None), CheckpointWrapper)
    ]
    assert wrapped_whole == list(layers)
    blocks = [kwargs for fn, kwargs in compiled if getattr(fn, "__name__", "") == "forward"]
    assert blocks and all(kwargs == {"mode": "reduce-overhead"} for kwargs in blocks)
    torch.testing.assert_close(graphs, eager, rtol=1e-4, atol=1e-5)


def test_a_mode_the_compiler_cannot_run_is_named_in_the_error(
    one_rank: DistInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set-up probes the compiler in the chosen mode: with `--vla.speed.compile on` its failure stops the run, naming
    the mode and the one left to try."""
    probed: list[Any] = []

    def problem(device: torch.device, compile_kwargs: Any = None) -> str:
        probed.append(compile_kwargs)
        return "InductorError: no CUDA graphs here"

    monkeypatch.setattr(base, "compiler_problem", problem)
    vla = get_vla_config(VLA)
    vla.speed.compile, vla.speed.compile_mode = "on", "reduce-overhead"
    vla.enable_mixed_precision_training = False
    vla.train_strategy = "ddp"
    vlm = build_training_vlm(vla, None)
    with pytest.raises(ConfigError) as error:
        get_train_strategy(vlm, vla, one_rank).setup(1)
    assert probed == [{"mode": "reduce-overhead"}]
    assert str(error.value).startswith(
        "--vla.speed.compile on, but torch.compile (--vla.speed.compile_mode reduce-overhead) cannot run on cpu here "
        "(InductorError: no CUDA graphs here)."
    )
    assert str(error.value).endswith(", or --vla.speed.compile_mode default.")
