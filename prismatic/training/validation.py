"""Teacher-forced evaluation on the held-out split of every dataset of the mixture, during training.

`Validator` is built once; `Validator.run(model)` is collective (call it on every rank, at the same step). Each
dataset of the mixture is evaluated on its own (a one-dataset stream of its held-out split), so a dataset with a
tiny sampling weight is measured as well as a large one. The split is the pipeline's: `val` where the dataset has
one, else the last 5% of `train` (`rlds/discovery.py:split_name`); actions are normalised with the train
statistics, as in training. The held-out streams are the training `StreamSpec` with `dataclasses.replace`d fields.

Metrics are the action head's (`prismatic/models/action_heads/`): each head returns per-sample sums and names
the ratios reported, so train and val curves compare. Every sum is over the frames evaluated on all ranks;
"overall" pools the frames of all datasets, so each dataset counts by the frames it contributed
(`num_batches * batch * ranks` normally), not by its mixture weight. For `tokens`:
    loss            cross-entropy summed over every supervised token (labels != IGNORE_INDEX: the action tokens
                    and the stop token), divided by the number of those tokens. Recomputed per token from the
                    logits, so per-dataset losses are exact; it is the HF loss of one batch holding every frame.
    action_accuracy argmax prediction == target, over the action tokens (target > action_token_begin_idx).
    l1_loss         |decode(prediction) - decode(target)| averaged over the action tokens (normalised action
                    units; decode = bin centre, `ActionTokenizer.decode_ids`).
For `l1-chunk`: loss = l1_loss = |predicted - target| over every value of every chunk (normalised units), and
l1_dim<d> per action dimension. For `flow`: loss = flow_mse, the velocity MSE under π0's training rule, and
l1_loss = |sampled chunk - target| per value, the chunk sampled with the head's Euler sampler. Always: samples, the
frames evaluated.

Randomness: a head that draws noise (flow) takes it from a generator seeded per batch from the run seed, the rank,
the dataset and the batch index (`batch_seed`), so two validations of the same weights give the same numbers and
training's global RNG, which resumes restore, is not consumed.

Why a fixed number of batches: FSDP all-gathers parameters inside forward, so every rank must run the same number
of forward passes. Ranks' shards of a split differ in size; each rank runs exactly `num_batches` batches per
dataset and restarts its (deterministic) pass from the first frame when it runs out. The same frames are
evaluated every time, so val curves are comparable across steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from prismatic.conf.train import TrainConfig
from prismatic.models.action_heads import ActionHead
from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.datasets import RLDSDataset
from prismatic.vla.datasets.rlds.discovery import load_builder, resolve_mixture_dirs, split_name
from prismatic.vla.datasets.stream_spec import StreamSpec

if TYPE_CHECKING:
    from prismatic.training.strategies.base import TrainingStrategy
    from prismatic.vla.datasets.builders import TrainData

logger = logging.getLogger(__name__)


@dataclass
class HeldOut:
    """One dataset's held-out frames for this rank, as the batch transform returns them (iterated again from the
    first frame when a pass ends); `counted` False: run the forward passes, count nothing."""

    name: str
    frames: Iterable[dict[str, Any]]
    counted: bool = True


def held_out_streams(
    spec: StreamSpec, batch_transform: Callable[[dict[str, Any]], dict[str, Any]]
) -> list[HeldOut]:
    """This rank's held-out stream of every dataset of `spec`'s mixture present under its `data_root_dir`: the
    training spec with the held-out split, unshuffled, unaugmented, starting at frame 0, so that held-out frames
    look like training frames (resolution, chunk window, camera views, data options).

    Raises:
        ConfigError: from the pipeline (unknown mixture, missing data), or no dataset has held-out frames.
    """
    rank, world_size = spec.rank, spec.world_size
    streams: list[HeldOut] = []
    members = resolve_mixture_dirs(
        spec.data_root_dir, spec.data_mix, skip_missing_datasets=spec.skip_missing_datasets
    )
    for config, _, dataset_dir in members:
        builder = load_builder(dataset_dir)
        split = split_name(builder, train=False)
        num_trajectories = int(builder.info.splits[split].num_examples)
        if num_trajectories == 0:
            logger.warning(
                "Dataset '%s' has no held-out trajectories (%s): not evaluated.", config.name, split
            )
            continue
        # A split with fewer trajectories than ranks cannot be sharded: every rank reads all of it and only
        # rank 0's frames count (the others still run their forward passes, which FSDP needs).
        shared = num_trajectories < world_size
        held_out_spec = dataclasses.replace(
            spec,
            data_mix=config.name,  # a registered dataset is a one-dataset mixture
            shuffle_buffer_size=0,  # unused: held-out streams are not shuffled
            train=False,
            image_aug=False,
            keep_raw_action=False,
            rank=0 if shared else rank,
            world_size=1 if shared else world_size,
            start_sample=0,
            skip_missing_datasets=False,
            shuffle_buffer_ram_gb=None,
            recompute_stats=False,
        )
        dataset = RLDSDataset(held_out_spec, batch_transform)
        streams.append(HeldOut(config.name, dataset, counted=rank == 0 or not shared))
    if not streams:
        raise ConfigError(f"No dataset of mixture '{spec.data_mix}' has held-out frames to evaluate.")
    return streams


class Validator:
    """Held-out loss / action accuracy / L1, per dataset and overall; `run` is collective (see module docstring).

    Args:
        held_out: each dataset's held-out frames on this rank (`held_out_streams`, or frames made in memory).
        collator: list of transformed frames -> batch (`PaddedCollatorForActionPrediction`).
        head: the action head training uses (its forward, sums and ratios).
        per_device_batch_size: frames per forward pass.
        num_batches: forward passes per rank per dataset, every run (the same on every rank).
        device: where the batches, the metric sums and the final all-reduce live.
        world_size: the ranks that run it (their sums are all-reduced).
        seed: the run seed, from which every batch's generator is seeded (`batch_seed`).

    Raises:
        ValueError: `per_device_batch_size` or `num_batches` below 1, or no held-out stream.
    """

    def __init__(
        self,
        held_out: Sequence[HeldOut],
        collator: Callable[[list[dict[str, Any]]], dict[str, Any]],
        head: ActionHead,
        *,
        per_device_batch_size: int,
        num_batches: int,
        device: torch.device | str = "cpu",
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        if per_device_batch_size < 1:
            raise ValueError(f"per_device_batch_size must be >= 1, got {per_device_batch_size}.")
        if num_batches < 1:
            raise ValueError(f"num_batches must be >= 1, got {num_batches}.")
        if not held_out:
            raise ValueError("Validator needs at least one held-out stream.")
        self.collator, self.batch_size, self.num_batches = collator, per_device_batch_size, num_batches
        self.head, self.device, self.world_size = head, torch.device(device), world_size
        self.held_out, self.seed = list(held_out), seed
        self.dataset_names = [h.name for h in self.held_out]
        logger.info(
            "Validation: %d batches of %d held-out frames per rank on each of %s.",
            num_batches,
            per_device_batch_size,
            ", ".join(self.dataset_names),
        )

    @classmethod
    def from_spec(
        cls,
        spec: StreamSpec,
        batch_transform: Callable[[dict[str, Any]], dict[str, Any]],
        collator: Callable[[list[dict[str, Any]]], dict[str, Any]],
        head: ActionHead,
        *,
        per_device_batch_size: int,
        num_batches: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ) -> Validator:
        """The validator of the training stream `spec`: every dataset of its mixture (`held_out_streams`), through
        the training transform and collator, on `spec`'s ranks."""
        streams = held_out_streams(spec, batch_transform)
        return cls(
            streams,
            collator,
            head,
            per_device_batch_size=per_device_batch_size,
            num_batches=num_batches,
            device=device,
            world_size=spec.world_size,
            seed=seed,
        )

    @torch.no_grad()
    def run(
        self,
        model: torch.nn.Module,
        autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
        before_forward: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """Evaluate `model` (plain, DDP or FSDP2-wrapped) on every dataset's held-out frames; return the metrics.

        Collective: every rank runs `num_batches` forward passes per dataset, then one all-reduce (SUM) of the
        sums. The model is put in eval mode and given back in the mode it came in. `before_forward` runs before
        each forward pass (the strategy's `begin_step`: under CUDA graphs each pass is a step of its own, whose
        replays may overwrite the last pass's outputs, already summed by then).

        Returns:
            "val/<ratio>" for each of the head's `eval_ratios` (e.g. loss, action_accuracy, l1_loss) and
            "val/samples" overall, and the same under "val/<dataset>/..." for every evaluated dataset; identical
            on every rank.
        """
        was_training = model.training
        model.eval()
        width = len(self.head.eval_columns) + 1  # the head's sums, then the sample count
        rank = dist.get_rank() if self.world_size > 1 and dist.is_initialized() else 0
        sums = torch.zeros(len(self.held_out), width, dtype=torch.float64, device=self.device)
        try:
            for row, held_out in enumerate(self.held_out):
                with contextlib.closing(_cycle(held_out)) as frames:
                    for index in range(self.num_batches):
                        batch = self.collator(list(itertools.islice(frames, self.batch_size)))
                        batch = {
                            k: v if k == "dataset_names" else _to_device(v, self.device)
                            for k, v in batch.items()
                        }
                        if before_forward is not None:
                            before_forward()
                        generator = torch.Generator(device=self.device)
                        generator.manual_seed(batch_seed(self.seed, rank, row, index))
                        with autocast() if autocast is not None else contextlib.nullcontext():
                            batch_sums = self.head.evaluate(model, batch, generator=generator)
                        if held_out.counted:
                            sums[row, :-1] += batch_sums.sum(dim=0).to(self.device)
                            sums[row, -1] += len(batch["dataset_names"])
        finally:
            _reshard(model)
            model.train(was_training)
        if self.world_size > 1 and dist.is_initialized():
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        return _metrics(self.dataset_names, self.head, sums.cpu())

    def for_strategy(self, strategy: TrainingStrategy) -> Callable[[], dict[str, float]]:
        """`validate()` -> the held-out metrics of the model `strategy` trains, in its autocast, each forward pass
        begun as the strategy begins a step (what the training loop calls). The model is read at each call, as the
        strategy holds it then."""
        return lambda: self.run(strategy.model, strategy.autocast, strategy.begin_step)


def build_validation(
    cfg: TrainConfig, data: TrainData, head: ActionHead, strategy: TrainingStrategy
) -> Callable[[], dict[str, float]] | None:
    """`validate()` -> the held-out metrics of the model `strategy` trains (collective), or None without
    `--eval.interval`. Held-out frames look like the training stream's (`data.spec`) and go through its transform
    and collator."""
    if cfg.eval.interval is None:
        return None
    validator = Validator.from_spec(
        data.spec,
        data.batch_transform,
        data.collator,
        head,
        per_device_batch_size=cfg.vla.per_device_batch_size,
        num_batches=cfg.eval.num_batches,
        device=strategy.dist.device,
        seed=cfg.seed,
    )
    return validator.for_strategy(strategy)


def batch_seed(seed: int, rank: int, dataset_index: int, batch_index: int) -> int:
    """The seed of one validation batch's generator: a function of where the batch is alone (the same in every
    validation pass), different across ranks, datasets and batches, in [0, 2**63)."""
    mixed = seed
    for part in (rank, dataset_index, batch_index):
        mixed = (mixed * 1_000_003 + part + 1) % 2**63
    return mixed


def _cycle(held_out: HeldOut) -> Iterator[dict[str, Any]]:
    """This rank's held-out frames, forever: the (deterministic) pass restarts from its first frame when it ends."""
    while True:
        empty = True
        for frame in held_out.frames:
            empty = False
            yield frame
        if empty:
            raise ConfigError(
                f"The held-out split of dataset '{held_out.name}' yields no frames on this rank."
            )


def _to_device(value: torch.Tensor | dict[str, torch.Tensor], device: torch.device) -> Any:
    """Copy a batch tensor (or a fused backbone's dict of them) to `device`.

    To CUDA through pinned memory, asynchronously: a copy from pageable memory may wait for the GPU to finish the
    previous batch, a host synchronisation per batch.
    """
    if isinstance(value, dict):  # fused backbones: {"dino": ..., "siglip": ...}
        return {k: _to_device(v, device) for k, v in value.items()}
    if device.type == "cuda":
        return value.pin_memory().to(device, non_blocking=True)
    return value.to(device)


def _reshard(model: torch.nn.Module) -> None:
    """Free FSDP2 parameters left gathered: with `reshard_after_forward=False` only a backward would free them."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _metrics(names: list[str], head: ActionHead, sums: torch.Tensor) -> dict[str, float]:
    """The head's ratios of the reduced sums and the sample count, overall (pooled over datasets) and per dataset."""
    columns = {name: i for i, name in enumerate(head.eval_columns)}

    def ratios(row: torch.Tensor) -> dict[str, float]:
        values = {
            key: (row[columns[num]] / row[columns[den]].clamp(min=1)).item()
            for key, (num, den) in head.eval_ratios.items()
        }
        return {**values, "samples": row[-1].item()}

    out = {f"val/{key}": value for key, value in ratios(sums.sum(dim=0)).items()}
    for name, row in zip(names, sums, strict=True):
        out.update({f"val/{name}/{key}": value for key, value in ratios(row).items()})
    return out
