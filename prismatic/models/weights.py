"""Checkpoint tensors into a built model: fit checks, one-tensor-at-a-time assignment, tied parameters.

The loaders (`prismatic.models.loading`) build the parts a checkpoint fills on the meta device, then
`assign_weights` puts each tensor in as it is read, so the model never exists twice in memory.
`prismatic.models.distributed_init` re-ties shared parameters with `tied_aliases` / `retie` after a broadcast.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import torch

from prismatic.models.materialize import cast_floating_parameters
from prismatic.util.errors import ConfigError


def renamed(
    shards: Iterable[dict[str, torch.Tensor]], names: Mapping[str, str]
) -> Iterator[dict[str, torch.Tensor]]:
    """Each shard under our names; the HF-named dict is emptied so no reference outlives the consumer's."""
    for shard in shards:
        yield {names[k]: shard.pop(k) for k in list(shard)}


def _check_fit(
    expected: Mapping[str, torch.Tensor],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    source: str,
    allow_missing_prefixes: tuple[str, ...],
) -> None:
    """Refuse a checkpoint whose names or shapes do not match the model, before any tensor data is read.

    Raises:
        ConfigError: a missing key (outside `allow_missing_prefixes`), an unexpected key, or a shape mismatch.
    """
    missing = [k for k in expected if k not in shapes and not k.startswith(allow_missing_prefixes)]
    unexpected = [k for k in shapes if k not in expected]
    if missing or unexpected:
        raise ConfigError(
            f"Checkpoint '{source}' does not fit this architecture: "
            + (f"missing key(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (
                f"unexpected key(s) {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
                if unexpected
                else ""
            )
            + "."
        )
    for key, shape in shapes.items():
        if tuple(shape) != tuple(expected[key].shape):
            raise ConfigError(
                f"Checkpoint '{source}': key '{key}' has shape {tuple(shape)} but the model expects "
                f"{tuple(expected[key].shape)} (a different vocabulary / width / resolution?)."
            )


def _assign(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Replace parameter / buffer `name` by `tensor` (what `load_state_dict(assign=True)` does for one key)."""
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if attr in owner._parameters:
        owner._parameters[attr] = torch.nn.Parameter(
            tensor, requires_grad=owner._parameters[attr].requires_grad
        )
    else:
        owner._buffers[attr] = tensor


def tied_aliases(module: torch.nn.Module) -> list[list[str]]:
    """Groups of parameter names that are one tensor (tied embeddings), first name first."""
    groups: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def retie(module: torch.nn.Module, groups: list[list[str]]) -> None:
    """Point every alias at its group's first parameter again (assigning replaced each one separately)."""
    for first, *aliases in groups:
        param = module.get_parameter(first)
        for alias in aliases:
            owner, _, attr = alias.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, attr, param)


def assign_weights(
    vlm: torch.nn.Module,
    shapes: Mapping[str, tuple[int, ...]],
    chunks: Iterable[dict[str, torch.Tensor]],
    *,
    source: str,
    dtype: torch.dtype = torch.float32,
    allow_missing_prefixes: tuple[str, ...] = (),
) -> None:
    """Put a checkpoint's tensors into `vlm`, one chunk (shard) at a time, as new tensors in `dtype`.

    Every parameter the checkpoint fills may be on the meta device (see `materialize.parameters_on_meta`): each
    tensor is popped from its chunk, converted and assigned (as `load_state_dict(assign=True)` would), so the model
    never exists twice and a chunk's memory is released as it is consumed. Tied parameters are tied again
    afterwards; parameters not in the checkpoint (allowed by `allow_missing_prefixes`) are cast to `dtype`.

    Args:
        vlm: the model; `requires_grad` flags are kept.
        shapes: every name the chunks will hold and its shape (checked before anything is read).
        chunks: flat state-dict pieces under `vlm`'s names; emptied as they are consumed.
        source: for error messages.
        dtype: floating-point tensors are converted to it; others keep theirs.
        allow_missing_prefixes: names that may be absent (their current weights are kept).

    Raises:
        ConfigError: a missing / unexpected key or a shape mismatch (before any data is read).
    """
    expected = vlm.state_dict(keep_vars=True)
    _check_fit(expected, shapes, source=source, allow_missing_prefixes=allow_missing_prefixes)
    tied = tied_aliases(vlm)
    for chunk in chunks:
        for name in list(chunk):
            # Popped, converted, assigned one tensor at a time: the chunk shrinks as the model fills.
            # copy=True: a tensor memory-mapped from a file becomes the model's own (writable, file closable).
            tensor = chunk.pop(name)
            _assign(
                vlm, name, tensor.to(dtype=dtype if tensor.is_floating_point() else tensor.dtype, copy=True)
            )
            del tensor
        del chunk
    retie(vlm, tied)
    cast_floating_parameters(vlm, dtype)
    left = [name for name, t in vlm.state_dict(keep_vars=True).items() if t.device.type == "meta"]
    if left:
        raise ConfigError(f"Checkpoint '{source}' left parameters unfilled: {left[:5]}.")
