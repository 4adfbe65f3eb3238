"""`TrainingStrategy`: the unit you swap (FSDP2 full-shard, FSDP2 shard-grad-op, DDP).

A strategy wraps the model for its kind of data parallelism and provides the hooks the loop
(`prismatic/training/trainer.py`) calls: the context for accumulation micro-batches, autocast, gradient clipping,
moving a batch to the device. It builds the optimizer and LR schedule. It never computes a loss.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from typing import Any

import torch

from prismatic.conf.vla import VLAConfig
from prismatic.models.parallelize import (
    apply_llm_activation_checkpointing,
    compile_blocks,
    compiler_problem,
    format_param_bytes,
    param_bytes_by_dtype,
)
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.training.optim import build_lr_scheduler, build_optimizer
from prismatic.training.speed_plan import SpeedPlan, compile_kwargs, describe, without_compile
from prismatic.training.strategies.head_units import (
    checkpoint_head_blocks,
    compile_head_blocks,
    head_module,
)
from prismatic.util.dist import DistInfo, first_over_ranks
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)


class TrainingStrategy(ABC):
    """Wraps the model for one kind of data parallelism and trains it as the run's `SpeedPlan` says (every speed and
    memory choice is the plan's: `prismatic.training.speed_plan`)."""

    def __init__(self, vlm: PrismaticVLM, vla: VLAConfig, dist_info: DistInfo, plan: SpeedPlan) -> None:
        self.vlm, self.vla, self.dist = vlm, vla, dist_info
        # What this run does; `setup` replaces it where the compiler turns out not to run (`without_compile`).
        self.plan = plan
        self.model: torch.nn.Module = vlm
        # The wrapped model's trainable parameters in `parameters()` order, listed once by `setup`: clipping takes
        # them every step, and walking a large model's parameters costs host time every step.
        self.trainable_params: list[torch.nn.Parameter] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.sync_every_micro_batch = False
        self.compiled = False  # whether `setup` compiled the blocks (`--vla.speed.compile`)

    # --- the plan's values, as the loop and tests read them ---------------------------------------------------------
    @property
    def grad_accumulation_steps(self) -> int:
        return self.plan.grad_accumulation_steps

    @property
    def mixed_precision(self) -> bool:
        return self.plan.mixed_precision

    @property
    def causal_mask_only(self) -> bool:
        return self.plan.causal_mask_only

    @property
    def compile_mode(self) -> str | None:
        """How `setup` compiles the blocks (a `COMPILE_MODES` name); None: not at all."""
        return self.plan.compile_mode

    @property
    def checkpointing_policy(self) -> str | None:
        """What activation checkpointing recomputes; None: nothing is checkpointed."""
        return self.plan.checkpointing_policy

    @property
    def pad_to_multiple(self) -> int:
        """The multiple each batch's token length is rounded up to (the collator's `pad_to_multiple_of`)."""
        return self.plan.pad_to_multiple

    @property
    def cuda_graphs(self) -> bool:
        """Whether the compiled blocks replay from CUDA graphs (`--vla.speed.compile_mode`'s `reduce-overhead`)."""
        return self.compiled and self.plan.cuda_graphs

    # --- what subclasses define ---------------------------------------------------------------------------
    @abstractmethod
    def wrap_model(self) -> torch.nn.Module:
        """Apply this strategy's data parallelism to `self.vlm` (real on rank 0, possibly on the meta device on the
        others), put every rank's values on its device (`materialize_from_rank0`) and return the model."""

    @abstractmethod
    def no_sync(self) -> contextlib.AbstractContextManager:
        """Context for accumulation micro-batches: gradients accumulate locally, no cross-rank reduction."""

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context around forward passes (FSDP casts through its policy instead)."""
        return contextlib.nullcontext()

    def choose_grad_sync(self) -> bool:
        """Whether to reduce gradients after every micro-batch (True) or once per step (False): the plan's
        `grad_sync` (`speed_plan.choose_grad_sync`)."""
        return self.plan.grad_sync == "micro-batch"

    # --- set-up ---------------------------------------------------------------------------------------------
    def setup(self, num_training_steps: int) -> None:
        """Activation checkpointing, compiling, parallel wrapping (which also fills ranks that built the model on the
        meta device from rank 0, `prismatic.models.distributed_init`), optimizer and LR schedule, as the plan says;
        then the plan is logged, once. The action head's blocks (`HeadModule.get_blocks`) are checkpointed and
        compiled with the LLM's layers."""
        head = head_module(self.vlm)  # its blocks are treated as the LLM's layers (`head_units`)
        if self.plan.checkpointing_policy is not None:
            apply_llm_activation_checkpointing(self.vlm, self.plan.checkpointing_policy)
            if wrapped := checkpoint_head_blocks(head, self.plan.checkpointing_policy):
                logger.info("Activation checkpointing: %d action-head blocks checkpointed", wrapped)
        if self.plan.compile_mode is not None:
            kwargs = compile_kwargs(self.plan)
            self.compiled = self._compiler_works(kwargs)
            if self.compiled:
                logger.info(
                    "torch.compile (%s): %d blocks, compiled on their first forward (the first steps take longer; "
                    "--vla.speed.compile off trains without)",
                    self.compile_mode,
                    compile_blocks(self.vlm, kwargs) + compile_head_blocks(head, kwargs),
                )
            else:
                self.plan = without_compile(self.plan)
        self.model = self.wrap_model()
        self.model.train()  # every module, once (transformers' `from_pretrained` leaves its model in eval mode)
        self.trainable_params = [p for p in self.model.parameters() if p.requires_grad]
        logger.info("Parameter memory: %s", format_param_bytes(param_bytes_by_dtype(self.model)))
        if self.grad_accumulation_steps > 1:
            self.sync_every_micro_batch = self.choose_grad_sync()
            logger.info(
                "Gradient accumulation over %d micro-batches: gradients reduced %s.",
                self.grad_accumulation_steps,
                "after every micro-batch"
                if self.sync_every_micro_batch
                else "once per step (unsharded gradients kept between micro-batches)",
            )
        self.optimizer = build_optimizer(
            self.model, self.vla.learning_rate, self.vla.weight_decay, implementation=self.plan.optimizer_impl
        )
        logger.info(describe(self.plan))
        self.lr_scheduler = build_lr_scheduler(
            self.optimizer,
            self.vla.lr_scheduler_type,
            num_training_steps,
            self.vla.warmup_ratio,
            self.vla.num_steps_before_decay,
        )

    def _compiler_works(self, kwargs: dict[str, Any]) -> bool:
        """Whether `torch.compile` with `kwargs` runs on every rank; where it does not, `--vla.speed.compile on` is
        an error and `auto` trains without it after one warning (a cluster node without a C compiler still trains,
        only slower). The ranks agree (collective), so that all of them compile or none: the same graphs, the same
        numbers."""
        device = self.dist.device
        found = first_over_ranks(compiler_problem(device, kwargs))
        if found is None:
            return True
        rank, problem = found
        where = f"{device} here" if rank == self.dist.rank else f"rank {rank}'s {device.type} device"
        mode = self.compile_mode
        compiler = (
            "torch.compile" if mode == "default" else f"torch.compile (--vla.speed.compile_mode {mode})"
        )
        if self.vla.speed.compile == "on":
            raise ConfigError(
                f"--vla.speed.compile on, but {compiler} cannot run on {where} ({problem}). Inductor needs a C "
                "compiler (and Triton on GPUs) and a writable cache directory; fix that, or pass --vla.speed.compile "
                "off to train without compiling (or auto to fall back by itself)"
                + ("." if mode == "default" else ", or --vla.speed.compile_mode default.")
            )
        logger.warning(
            "%s cannot run on %s (%s): every rank trains without compiling the blocks, which is "
            "slower. --vla.speed.compile off skips this check; --vla.speed.compile on makes it an error.",
            compiler,
            where,
            problem,
        )
        return False

    # --- hooks the loop calls -------------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before an optimizer step's first forward. Under CUDA graphs it starts a new step for the blocks' graphs:
        the last step's outputs in their memory (gone by now: DDP copied the gradients into its buckets) may be
        overwritten by this step's replays."""
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()

    def accumulate(self, is_last_micro_batch: bool) -> contextlib.AbstractContextManager:
        """Gradient sync on the step's last micro-batch; local accumulation on the others, or, when gradients are
        reduced after every micro-batch, that reduction without its cross-node part (`defer_cross_node_reduce`)."""
        if is_last_micro_batch:
            return contextlib.nullcontext()
        if self.sync_every_micro_batch:
            return self.defer_cross_node_reduce()
        return self.no_sync()

    def defer_cross_node_reduce(self) -> contextlib.AbstractContextManager:
        """Context for a non-final micro-batch reduced at once: strategies whose mesh replicates across nodes (FSDP's
        hybrid sharding) keep the cross-node all-reduce for the last micro-batch; here nothing changes."""
        return contextlib.nullcontext()

    def clip_grad_norm(self) -> torch.Tensor:
        """Clip to `max_grad_norm`; return the global norm as a (local, device) tensor without waiting for it."""
        norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.trainable_params if p.grad is not None], max_norm=self.vla.max_grad_norm
        )
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def causal_attention(self, batch: dict[str, Any]) -> contextlib.AbstractContextManager:
        """Around a micro-batch's forward and backward: a batch without a padding mask (`to_device` dropped it)
        runs the LLM without transformers' mask preparation, whose packed-sequence check would wait for the
        device at the start of every forward (`LLMBackbone.causal_attention`; the same attention either way)."""
        if batch.get("attention_mask") is None:
            return self.vlm.llm_backbone.causal_attention()
        return contextlib.nullcontext()

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Every tensor of the batch on the device (host copies are non-blocking: the loader pins memory on GPU).

        With `--vla.speed.causal_mask_only` (the plan's `causal_mask_only`) a right-padded batch drops its attention
        mask: causal attention already hides right padding from every real token (the pads' own outputs carry no
        labels), and without a mask SDPA may pick its flash kernel and transformers skips its mask checks, which wait
        for the device. The check reads the host copy, so it costs no device sync.
        """
        device = self.dist.device
        out = {key: _to_device(value, device) for key, value in batch.items()}
        mask = batch.get("attention_mask")
        if self.causal_mask_only and isinstance(mask, torch.Tensor) and is_right_padded(mask):
            out["attention_mask"] = None
        return out


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {key: _to_device(item, device) for key, item in value.items()}
    return value


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row is ones then zeros (padding only on the right); False for a mask not on the host, whose
    check would wait for the device."""
    if attention_mask.device.type != "cpu":
        return False
    mask = attention_mask.bool()
    return bool((mask[:, 1:] <= mask[:, :-1]).all())
