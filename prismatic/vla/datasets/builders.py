"""Training's data set-up: the mixture's statistics, then one rank's stream of model-ready batches.

The statistics come first (computed once per node and cached beside the data: the node's other ranks wait, then
read the cache), because they decide the action side of the model (action and proprio widths); the head that
side makes then decides each frame's text layout and the chunk of future actions the stream attaches. Every
option of the stream is in one `StreamSpec`, built here from the run's config.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from prismatic.conf.train import TrainConfig
from prismatic.models.action_heads import ActionHead
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.util.dist import DistInfo, run_once_per_node
from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.batch_transform import RLDSBatchTransform, views_for
from prismatic.vla.datasets.collator import PaddedCollatorForActionPrediction
from prismatic.vla.datasets.datasets import RLDSDataset
from prismatic.vla.datasets.rlds import mixture_statistics
from prismatic.vla.datasets.stream_spec import StreamSpec

logger = logging.getLogger(__name__)


def build_statistics(cfg: TrainConfig, dist_info: DistInfo) -> dict[str, Any]:
    """{dataset: statistics} of the run's mixture, in the layout of `dataset_statistics.json`. Collective."""
    run_once_per_node(
        lambda: mixture_statistics(
            cfg.data_root_dir, cfg.vla.data_mix, options=cfg.data, recompute=cfg.recompute_stats
        ),
        dist_info,
    )
    if not cfg.data.load_proprio:
        # Else a user reading dataset_statistics.json thinks the state was lost.
        logger.info(
            "Proprio statistics are zeros of the action's width, as in OpenVLA: --data.load_proprio is off, so the "
            "state is not read (it stays in the data; --data.load_proprio true reads it and gives it statistics)"
        )
    return mixture_statistics(cfg.data_root_dir, cfg.vla.data_mix, options=cfg.data)  # the cache just filled


@dataclass
class TrainData:
    """One rank's training stream and what the loop, evaluation and checkpoints read of it."""

    spec: StreamSpec
    batch_transform: RLDSBatchTransform
    dataset: RLDSDataset
    collator: PaddedCollatorForActionPrediction
    loader: DataLoader
    steps_per_epoch: int
    num_training_steps: int


def build_train_data(
    cfg: TrainConfig, vlm: PrismaticVLM, head: ActionHead, dist_info: DistInfo, *, pad_to_multiple: int = 1
) -> TrainData:
    """This rank's stream: frames resized for `vlm`'s vision backbone, laid out by `head` (its chunk of future
    actions and camera views), shuffled and sharded by rank, batched per device, each batch's token length rounded
    up to a multiple of `pad_to_multiple` (the strategy's: `TrainingStrategy.pad_to_multiple`)."""
    tokenizer = vlm.llm_backbone.tokenizer
    views = views_for(cfg.vla.num_images)
    batch_transform = RLDSBatchTransform(
        head.action_tokenizer,
        tokenizer,
        vlm.vision_backbone.get_image_transform(),
        vlm.llm_backbone.prompt_builder_fn,
        layout=head.layout,
        views=views,
        use_proprio=cfg.vla.use_proprio,
    )
    spec = StreamSpec(
        data_root_dir=cfg.data_root_dir,
        data_mix=cfg.vla.data_mix,
        resize_resolution=tuple(vlm.vision_backbone.default_image_resolution[1:]),
        shuffle_buffer_size=cfg.vla.shuffle_buffer_size,
        options=cfg.data,
        image_views=views,
        future_action_window_size=head.future_action_window_size,
        image_aug=cfg.image_aug,
        seed=cfg.seed,
        rank=dist_info.rank,
        world_size=dist_info.world_size,
    )
    dataset = RLDSDataset(spec, batch_transform)
    # The count is OpenVLA's dataset length, from the statistics' transition counts: not the train split's size.
    counted = "every split, val included" if cfg.data.statistics_split == "all" else "the train split"
    logger.info(
        "Data: mixture '%s', epoch of %d frames (OpenVLA's dataset length: transitions of %s, per mixture "
        "weight), shuffle buffer %d frames (~%.2f GiB per rank, images encoded)",
        cfg.vla.data_mix,
        len(dataset),
        counted,
        cfg.vla.shuffle_buffer_size,
        dataset.shuffle_buffer_gb,
    )
    max_length = min(
        tokenizer.model_max_length,
        vlm.llm_backbone.llm.config.max_position_embeddings - vlm.num_prefix_tokens,
    )
    collator = PaddedCollatorForActionPrediction(
        max_length, tokenizer.pad_token_id, pad_to_multiple_of=pad_to_multiple
    )
    loader = DataLoader(
        dataset,
        batch_size=cfg.vla.per_device_batch_size,
        collate_fn=collator,
        num_workers=0,
        pin_memory=dist_info.device.type == "cuda",
        # `iter(loader)` draws a worker base seed; from its own generator, not torch's global one, which holds the
        # checkpoint's restored state: dropout masks after a resume must continue the saved run's stream.
        generator=torch.Generator(),
    )
    steps_per_epoch = max(1, len(dataset) // cfg.vla.global_batch_size)
    num_training_steps = cfg.vla.max_steps or cfg.vla.epochs * steps_per_epoch
    return TrainData(spec, batch_transform, dataset, collator, loader, steps_per_epoch, num_training_steps)


# Frames read only for their actions (`sample_training_chunks`): images are decoded at this small size, then dropped.
_SAMPLE_RESOLUTION = (32, 32)


def sample_training_chunks(cfg: TrainConfig, chunk_size: int, count: int) -> np.ndarray:
    """`[count, chunk_size, action_dim]` normalised action chunks, as the training stream gives them to a head: the
    first `count` frames of one seeded, shuffled pass over the run's training mixture (a shuffle buffer of at most
    `count` frames), as a one-process run would read them, so the sample depends on the data, the mixture and
    `--seed` only, not on the world size. What a head fits on its training data (FAST's vocabulary). One process.

    Raises:
        ConfigError: the mixture yields no frames.
    """
    spec = StreamSpec(
        data_root_dir=cfg.data_root_dir,
        data_mix=cfg.vla.data_mix,
        resize_resolution=_SAMPLE_RESOLUTION,
        shuffle_buffer_size=max(1, min(cfg.vla.shuffle_buffer_size, count)),
        options=cfg.data,
        future_action_window_size=chunk_size - 1,
        seed=cfg.seed,
        train=True,
    )
    dataset = RLDSDataset(spec, lambda frame: np.asarray(frame["action"], np.float32))
    chunks = [chunk.reshape(chunk_size, -1) for chunk in itertools.islice(iter(dataset), count)]
    if not chunks:
        raise ConfigError(
            f"Mixture '{cfg.vla.data_mix}' yields no training frames to sample action chunks from."
        )
    return np.stack(chunks)
