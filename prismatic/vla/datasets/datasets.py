"""Torch side of the VLA data path: one RLDS frame -> model inputs, and the `IterableDataset` over the pipeline.

`RLDSBatchTransform` builds OpenVLA's prompt ("What action should the robot take to {instruction}?"), tokenizes
the text *before* the answer, and appends the action token ids and EOS as integers: the ids a released OpenVLA
checkpoint was trained on, with no decode / re-encode round trip through text that could merge or split them.
`RLDSDataset` wraps the `tf.data` pipeline of `rlds/dataset.py`; iterate it with a `DataLoader` with
`num_workers=0` (the pipeline parallelises internally, and copies in worker processes would repeat one stream).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info
from transformers import PreTrainedTokenizerBase

from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder
from prismatic.util.constants import IGNORE_INDEX
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets.rlds.dataset import make_interleaved_dataset

ImageTransform = Callable[[Image.Image], torch.Tensor | dict[str, torch.Tensor]]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class RLDSBatchTransform:
    """One standardised frame -> {"pixel_values", "input_ids", "labels", "dataset_name", "actions"}.

    Only the action tokens (and EOS, when `predict_stop_token`) carry labels; everything else is
    `IGNORE_INDEX`. HF causal LMs shift labels inside `forward`, so labels align with `input_ids` here.
    """

    action_tokenizer: ActionTokenizer
    base_tokenizer: PreTrainedTokenizerBase
    image_transform: ImageTransform
    prompt_builder_fn: type[PromptBuilder]
    predict_stop_token: bool = True

    def __call__(self, frame: dict[str, Any]) -> dict[str, Any]:
        instruction = _text(frame["task"]["language_instruction"]).lower()
        action = np.asarray(frame["action"], dtype=np.float32)

        prompt_builder = self.prompt_builder_fn("openvla")
        prompt_builder.add_turn("human", f"What action should the robot take to {instruction}?")
        prefix_ids = self.base_tokenizer(
            prompt_builder.get_response_prefix(), add_special_tokens=True
        ).input_ids
        action_ids = self.action_tokenizer.encode_to_ids(action).tolist()
        eos_id = self.base_tokenizer.eos_token_id

        input_ids = torch.tensor([*prefix_ids, *action_ids, eos_id], dtype=torch.long)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[len(prefix_ids) : len(prefix_ids) + len(action_ids)] = torch.tensor(action_ids)
        if self.predict_stop_token:
            labels[-1] = eos_id

        image = Image.fromarray(np.asarray(frame["observation"]["image_primary"]))
        return {
            "pixel_values": self.image_transform(image),
            "input_ids": input_ids,
            "labels": labels,
            "dataset_name": _text(frame["dataset_name"]),
            "actions": action,
        }


class RLDSDataset(IterableDataset):
    """Infinite (train) or single-pass (val) stream of transformed frames for one rank.

    Deterministic for (seed, rank, world_size): every `iter()` restarts the same stream at `start_sample`.
    `len()` is the number of train transitions in the mixture, summed over its datasets (one mixture epoch,
    across all ranks). `dataset_statistics` holds every dataset's statistics in OpenVLA's layout (save it with
    `save_dataset_statistics`; inference needs it to un-normalise actions).
    """

    def __init__(
        self,
        data_root_dir: Path,
        data_mix: str,
        batch_transform: Callable[[dict[str, Any]], dict[str, Any]],
        resize_resolution: tuple[int, int],
        shuffle_buffer_size: int,
        *,
        train: bool = True,
        image_aug: bool = False,
        seed: int = 7,
        rank: int = 0,
        world_size: int = 1,
        start_sample: int = 0,
    ) -> None:
        self.data_root_dir, self.data_mix, self.batch_transform = (
            Path(data_root_dir),
            data_mix,
            batch_transform,
        )
        self.train, self.seed, self.rank, self.world_size = train, seed, rank, world_size
        pipeline = make_interleaved_dataset(
            self.data_root_dir,
            data_mix,
            resize_resolution=tuple(resize_resolution),
            shuffle_buffer_size=shuffle_buffer_size,
            train=train,
            image_aug=image_aug,
            seed=seed,
            rank=rank,
            world_size=world_size,
            start_sample=start_sample,
        )
        self.dataset = pipeline.dataset
        self.dataset_statistics = pipeline.dataset_statistics
        self.sample_weights = pipeline.sample_weights
        self.num_transitions = pipeline.num_transitions

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise RuntimeError(
                "RLDSDataset must be loaded with num_workers=0: each worker would repeat the stream."
            )
        for frame in self.dataset.as_numpy_iterator():
            yield self.batch_transform(frame)

    def __len__(self) -> int:
        return self.num_transitions

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError("RLDSDataset is an IterableDataset; iterate over it instead of indexing.")
