"""Data-parallel start-up with one copy of the weights: rank 0 loads them, every other rank builds the same
architecture on the meta device (no memory, no weight file read), and once the strategy has wrapped the model
every rank's parameters (FSDP2 shards or DDP replicas) and buffers are filled from rank 0.

Without this every rank loads the whole FP32 model into host memory before sharding (8 x 28 GB per node for a
7B model). With it only rank 0 does; the others hold their shards plus one full tensor in flight.

Call sequence (every call on every rank, in this order; see `materialize_from_rank0` for what moves):

    vlm = load_on_rank0(base_vlm, hf_token=...)         # rank 0: weights; others: meta (`load(..., device="meta")`)
    vlm.freeze_backbones(stage)
    apply_lora(vlm, settings)                            # optional: ranks != 0 get adapters on meta
    apply_llm_activation_checkpointing(vlm)              # optional
    # no `vlm.to(device)` here: a meta tensor cannot be copied (materialize moves everything)
    FSDP:
        cast_frozen_params_to_bf16(vlm)                  # under bf16 mixed precision
        full_state = full_state_on_rank0(vlm)            # rank 0: references to its tensors; others: None
        model = apply_fsdp(vlm, mesh, policy, reshard)   # rank 0 shards its weights; others shard meta tensors
        materialize_from_rank0(model, full_state, device)
    DDP:
        cast_frozen_params_to_bf16(vlm)                  # under bf16 mixed precision
        materialize_from_rank0(vlm, None, device)
        model = DistributedDataParallel(vlm, ...)

In a single process (no process group, or a group of one) `load_on_rank0` is `load`, `full_state_on_rank0` is
None and `materialize_from_rank0` moves the model to `device`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.tensor import DTensor

from prismatic.models.loading import load
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.models.weights import retie, tied_aliases

logger = logging.getLogger(__name__)


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def has_meta_tensors(model: nn.Module) -> bool:
    """True when any parameter or buffer is on the meta device (built by `load(..., device="meta")`)."""
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def _is_sharded(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def load_on_rank0(
    source: str | Path, hf_token: str | None = None, dtype: str | torch.dtype | None = None
) -> PrismaticVLM:
    """`load(source)` on rank 0 (or in a single process); the same model on the meta device on every other rank.

    Collective only in the sense that every rank must call it; it communicates nothing.
    """
    rank, _ = _rank_and_world()
    return load(source, hf_token=hf_token, dtype=dtype, device=None if rank == 0 else "meta")


def full_state_on_rank0(vlm: nn.Module) -> dict[str, torch.Tensor] | None:
    """Rank 0's full state dict (references to its tensors, no copy), taken before sharding; None elsewhere.

    Call it after everything that changes parameters (freezing, LoRA, bf16 casting of frozen weights) and right
    before `apply_fsdp`, whose shards replace the module's tensors: these references are then the only full copy,
    freed when `materialize_from_rank0` has broadcast them. Not needed for DDP (rank 0's module is the source).

    Raises:
        ValueError: the model is already sharded, or rank 0's model has tensors on the meta device.
    """
    rank, world = _rank_and_world()
    if rank != 0 or world == 1:
        return None
    if _is_sharded(vlm):
        raise ValueError(
            "full_state_on_rank0 must be called before apply_fsdp: the model is already sharded."
        )
    state = vlm.state_dict()
    on_meta = [name for name, tensor in state.items() if tensor.is_meta]
    if on_meta:
        raise ValueError(
            f"Rank 0's model has tensors on the meta device ({on_meta[:3]}); load it with weights."
        )
    return state


def _layout(model: nn.Module) -> list[tuple[Any, ...]]:
    """What must agree across ranks: names, global shapes, dtypes, trainable flags of parameters and buffers."""
    params = [(name, tuple(p.shape), str(p.dtype), p.requires_grad) for name, p in model.named_parameters()]
    buffers = [(name, tuple(b.shape), str(b.dtype)) for name, b in model.named_buffers()]
    return params + buffers


def _layout_difference(mine: list[tuple[Any, ...]], rank0: list[tuple[Any, ...]]) -> str | None:
    if mine == rank0:
        return None
    for own, theirs in zip(mine, rank0, strict=False):
        if own != theirs:
            return f"{own} here but {theirs} on rank 0"
    return f"{len(mine)} parameters and buffers here but {len(rank0)} on rank 0"


def _agree(problem: str | None) -> None:
    """Raise on every rank if any rank found a problem, so none is left waiting in a collective."""
    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    found = [f"rank {rank}: {p}" for rank, p in enumerate(problems) if p]
    if found:
        raise RuntimeError("Cannot materialize the model from rank 0: " + "; ".join(found))


def materialize_from_rank0(
    model: nn.Module,
    full_state: dict[str, torch.Tensor] | None,
    device: str | torch.device,
    *,
    sync_rng: bool = True,
) -> None:
    """Give every rank real tensors on `device` holding rank 0's values. Collective: call on every rank.

    Ranks whose model is (partly) on the meta device allocate it (`to_empty`); rank 0 moves to `device` what is not
    there yet. Then, from rank 0:
    - FSDP2-sharded models: parameters and persistent buffers through `set_model_state_dict(full_state_dict=True,
      broadcast_from_rank0=True)`: one full tensor at a time is broadcast and each rank keeps its shard (ignored
      parameters whole), cast to the local dtype (bf16 frozen weights);
    - plain modules (before DDP wraps them): every parameter, broadcast as is;
    - every buffer, persistent or not (rotary `inv_freq`);
    - the CPU RNG state (`sync_rng`): ranks that built on meta drew no random init, so without it their stream would
      differ from the one they had when every rank built the model from the same seed.
    Tied parameters stay tied. Names, shapes, dtypes and `requires_grad` are checked equal across ranks first.

    Args:
        model: the wrapped (FSDP2) or plain model, the same on every rank.
        full_state: `full_state_on_rank0(vlm)` on rank 0 for a sharded model (emptied here); None elsewhere and
            for plain modules.
        device: where the model lives (the mesh's device for FSDP2).
        sync_rng: adopt rank 0's CPU RNG state (False: leave each rank's as it is, e.g. when seeded per rank).

    Raises:
        RuntimeError (on every rank): the ranks' models differ, rank 0's is on meta, or a sharded model came
            without rank 0's full state.
    """
    device = torch.device(device)
    rank, world = _rank_and_world()
    if world == 1:
        if has_meta_tensors(model):
            raise RuntimeError("A single process has no rank 0 to fill meta tensors from; load with weights.")
        model.to(device)
        return

    sharded = _is_sharded(model)
    problem = None
    if rank == 0 and has_meta_tensors(model):
        problem = "rank 0's model has tensors on the meta device"
    elif rank == 0 and sharded and full_state is None:
        problem = "the model is sharded but rank 0 passed no full_state (take full_state_on_rank0 before apply_fsdp)"
    message: list[Any] = [_layout(model), torch.get_rng_state()] if rank == 0 else [None, None]
    dist.broadcast_object_list(message, src=0)
    rank0_layout, rng_state = message
    _agree(problem or (_layout_difference(_layout(model), rank0_layout) if rank != 0 else None))

    tied = tied_aliases(model)
    if has_meta_tensors(model):
        model.to_empty(device=device)  # `to_empty` gives each alias of a tied parameter its own tensor
        retie(model, tied)
        if tied_aliases(model) != tied:
            raise RuntimeError(
                "Re-tying parameters after allocating the meta-device model failed: ties differ."
            )
    else:
        model.to(device)

    with torch.no_grad():
        if sharded:
            set_model_state_dict(
                model,
                full_state if rank == 0 else {},
                options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True),
            )
        else:
            for param in model.parameters():  # each tied parameter once
                dist.broadcast(param.data, src=0)
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)
    if sync_rng:
        torch.set_rng_state(rng_state)
    if full_state is not None:
        full_state.clear()
    logger.info(
        "Materialized the model from rank 0 on %s (%s)", device, "sharded" if sharded else "replicated"
    )
