"""Synthetic training batches through the real batch transform and collator, without TensorFlow or data on disk.

Benchmarks and GPU checks need frames shaped exactly as training's (the head's layout, the prompt format, the
image transform, right padding) on machines that have no RLDS data and often no TensorFlow. Each frame here is a
random 224 px image, a random action in [-1, 1] and one of a few robot instructions; it goes through
`RLDSBatchTransform` and `PaddedCollatorForActionPrediction` as a frame from the tf.data pipeline would.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from prismatic.models.action_heads import ActionHead
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.vla.datasets.batch_transform import RLDSBatchTransform, views_for
from prismatic.vla.datasets.collator import PaddedCollatorForActionPrediction

INSTRUCTIONS = (
    "pick up the red block and put it in the bowl",
    "open the top drawer",
    "move the sponge to the left of the sink",
    "put the can on the plate",
)


def synthetic_frame(
    rng: np.random.Generator, action_shape: tuple[int, ...], proprio_dim: int = 8, size: int = 224
) -> dict:
    """One standardised frame (the pipeline's format) with random image, action and proprio."""
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    return {
        "task": {"language_instruction": INSTRUCTIONS[int(rng.integers(len(INSTRUCTIONS)))]},
        "action": rng.uniform(-1, 1, action_shape).astype(np.float32),
        "observation": {
            "image_primary": image,
            "image_wrist": image[::-1].copy(),
            "proprio": rng.uniform(-1, 1, (proprio_dim,)).astype(np.float32),
        },
        "dataset_name": "synthetic",
    }


def synthetic_frames(
    vlm: PrismaticVLM, head: ActionHead, count: int, seed: int = 0, image_size: int = 224
) -> list[dict[str, Any]]:
    """`count` synthetic frames for `vlm` and `head` through training's batch transform (host tensors): what the
    collator takes."""
    spec = head.spec
    transform = RLDSBatchTransform(
        head.action_tokenizer,
        vlm.llm_backbone.tokenizer,
        vlm.vision_backbone.get_image_transform(),
        vlm.llm_backbone.prompt_builder_fn,
        layout=head.layout,
        views=views_for(spec.num_images),
        use_proprio=bool(spec.proprio_dim),
    )
    rng = np.random.default_rng(seed)
    action_shape = (spec.chunk_size, spec.action_dim) if head.chunked else (spec.action_dim,)
    frames = [synthetic_frame(rng, action_shape, spec.proprio_dim or 8, image_size) for _ in range(count)]
    with torch.device("cpu"):  # host tensors, as the loader makes them, whatever the default device
        return [transform(frame) for frame in frames]


def synthetic_collator(vlm: PrismaticVLM, pad_to_multiple: int = 1) -> PaddedCollatorForActionPrediction:
    """Training's collator for `vlm`'s tokenizer (right padding to the longest sequence, its length rounded up to a
    multiple of `pad_to_multiple`)."""
    tokenizer = vlm.llm_backbone.tokenizer
    return PaddedCollatorForActionPrediction(
        tokenizer.model_max_length, tokenizer.pad_token_id, pad_to_multiple_of=pad_to_multiple
    )


def synthetic_batch(
    vlm: PrismaticVLM,
    head: ActionHead,
    batch_size: int,
    seed: int = 0,
    image_size: int = 224,
    pad_to_multiple: int = 1,
) -> dict[str, Any]:
    """A collated training batch of `batch_size` synthetic frames for `vlm` and `head` (host tensors)."""
    frames = synthetic_frames(vlm, head, batch_size, seed, image_size)
    with torch.device("cpu"):
        return synthetic_collator(vlm, pad_to_multiple)(frames)
