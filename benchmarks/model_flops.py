"""The model FLOPs of one training sample, what `bench_gpu.py`'s model TFLOP/s and MFU are computed from.

Counted by running the sample rather than by a rule over parameter counts: `torch.utils.flop_counter.FlopCounterMode`
over one forward and backward of each distinct frame, alone, before any strategy wraps the model. What counts is
the matmuls of the model's weights (`mm`, `addmm`, convolutions): forward, an input's gradient where something
before it trains, a weight's gradient where it trains. So the count leaves out what a sample's training does not
need computed:
- embedding look-ups, and the ViT blocks after the feature layer (never run);
- the LM head away from the labelled positions (the loss needs no other logits; counted so whatever
  `logits_at_labels` a variant runs), and all of it for a head that does not read it (l1-chunk);
- batching's padding, and activation checkpointing's recomputation;
- attention's own FLOPs (scores and weighted values: no weights; `bmm` and SDPA's kernels).

The rule this replaced (6 x trainable + 4 x frozen parameters per token, as the issue's first figures were counted)
counted the first two as work and missed the l1-chunk head's MLP, so it read high, most for the ~1B full fine-tune
(Qwen2.5's large tied embedding counted at every token); benchmarks/results/2026-11-28-model-flops.md compares the
two counts and corrects the MFU of the reports before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

# The ops that multiply by the model's weights (forward and backward), by ATen name.
WEIGHT_MATMULS = frozenset({"mm", "addmm", "convolution", "_convolution", "convolution_backward"})


def _sample_key(frame: dict[str, Any]) -> tuple[int, int]:
    """Frames with the same text length and labelled positions cost the same FLOPs."""
    labels = frame["labels"]
    return int(labels.numel()), int((labels >= 0).sum())


def _weight_matmul_flops(counts: dict[Any, int]) -> int:
    """The FLOPs of `WEIGHT_MATMULS` in one of `FlopCounterMode.get_flop_counts()`'s per-op tables."""
    return sum(flops for op, flops in counts.items() if op.__name__ in WEIGHT_MATMULS)


def model_flops_per_sample(
    strategy: Any,
    head: Any,
    frames: Sequence[dict[str, Any]],
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> float:
    """The mean over `frames` of one frame's forward-and-backward FLOPs (the module docstring says which).

    `frames` are the batch transform's outputs; each distinct kind (`_sample_key`) runs once, collated alone and
    moved and run as `train_step` does it with `strategy` (a training strategy not yet set up: `setup` wraps the
    model). The weights' gradients are dropped afterwards and the RNG restored, so training starts as it would have.
    """
    model = strategy.vlm
    kinds: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for frame in frames:
        kinds.setdefault(_sample_key(frame), []).append(frame)
    device = next(model.parameters()).device
    at_labels, head.logits_at_labels = head.logits_at_labels, True
    total = 0
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for same in kinds.values():
                batch = strategy.to_device(collate(same[:1]))
                with (
                    FlopCounterMode(display=False) as counter,
                    strategy.autocast(),
                    strategy.causal_attention(batch),
                ):
                    head(model, batch).loss.backward()
                total += len(same) * _weight_matmul_flops(counter.get_flop_counts()["Global"])
    finally:
        head.logits_at_labels = at_labels
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the memory this used is not the training step's to report
    return total / len(frames)
