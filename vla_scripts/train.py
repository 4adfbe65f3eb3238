r"""Fine-tune a VLA: base VLM + RLDS mixture -> policy, with FSDP2 or DDP, checkpoints and exact resume.

Run (tiny preset, 2 CPU processes, toy data):
    torchrun --standalone --nnodes 1 --nproc-per-node 2 vla_scripts/train.py \
        --vla.type tiny+mx-toy --data_root_dir data/toy --run_root_dir runs

Resume from a checkpoint of that run:
    torchrun ... vla_scripts/train.py --vla.type tiny+mx-toy --data_root_dir data/toy --run_root_dir runs \
        --pretrained_checkpoint runs/<run_id>/checkpoints/step-000040-epoch-01-loss=1.2345.pt \
        --resume_step 40 --resume_epoch 1 --vla.max_steps 80

`--help` lists every flag; `--config_path file.yaml` reads them from a file (see configs/).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import sys
from pathlib import Path
from typing import Any

from prismatic.conf.train import TrainConfig
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError
from prismatic.util.files import check_dir_writable, make_dirs, write_text_atomic
from prismatic.util.redact import redact_config

logger = logging.getLogger("vla_scripts.train")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The resolved config as plain JSON values, with the experiment id under `vla.type` and secrets (`hf_token`)
    blanked: it is what config.yaml / config.json and W&B get, and a run folder must never hold a token."""
    out = _jsonable(dataclasses.asdict(cfg))
    out["vla"] = {"type": cfg.vla.vla_id, **out["vla"]}
    return redact_config(out)


def write_run_config(cfg: TrainConfig, run_dir: Path) -> None:
    """`config.json` and a `config.yaml` that `--config_path` accepts to repeat the run (each written atomically,
    group-readable under a 022 umask; `ConfigError` naming the file when the folder cannot be written)."""
    import yaml

    resolved = config_to_dict(cfg)
    write_text_atomic(run_dir / "config.json", json.dumps(resolved, indent=2) + "\n", "run config")
    write_text_atomic(run_dir / "config.yaml", yaml.safe_dump(resolved, sort_keys=False), "run config")


def train(cfg: TrainConfig) -> dict[str, float]:
    """Set up, load, loop, finish. Returns the last step's metrics (on every rank)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from prismatic.models import load
    from prismatic.training.checkpointing import (
        Checkpointer,
        check_resume_compatible,
        load_checkpoint_file,
        saved_train_state,
    )
    from prismatic.training.metrics import StepMetrics
    from prismatic.training.strategies import get_train_strategy
    from prismatic.training.trackers import METRICS_FILE, build_trackers, read_metrics
    from prismatic.util.dist import destroy_distributed, init_distributed, run_once_per_node
    from prismatic.util.logging import setup_logging
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import (
        PaddedCollatorForActionPrediction,
        RLDSBatchTransform,
        RLDSDataset,
        save_dataset_statistics,
    )
    from prismatic.vla.datasets.rlds import mixture_statistics

    # --- set up: processes, config checks, run folder ---------------------------------------------------------
    dist_info = init_distributed()
    setup_logging(dist_info.rank)
    cfg.validate(dist_info.world_size)
    resume = cfg.resume_point()
    run_id = cfg.resolve_run_id(dist_info.num_nodes)
    run_dir = cfg.run_root_dir / run_id
    check_dir_writable(run_dir, "run folder (--run_root_dir / --run_id)")  # now, not after minutes of loading
    if resume is None and (run_dir / METRICS_FILE).exists():
        raise ConfigError(
            f"Run folder '{run_dir}' already holds a run. Resume it with --pretrained_checkpoint "
            f"{run_dir}/checkpoints/<checkpoint>.pt --resume_step N --resume_epoch E, or start a new run with "
            "another --run_id or --run_id_note."
        )
    dist.barrier()
    logger.info(
        "Run %s -> %s (world size %d, stage %s)", run_id, run_dir, dist_info.world_size, cfg.vla.stage
    )

    # Same seed on every rank: identical initial weights; data order differs by rank inside the dataset.
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    # --- load: checkpoint, model, data, strategy ------------------------------------------------------------
    # The checkpoint first (memory-mapped, cheap): resuming it as another experiment is refused before the model
    # and data load.
    ckpt = load_checkpoint_file(cfg.pretrained_checkpoint) if cfg.pretrained_checkpoint is not None else None
    samples_per_rank = 0
    if resume is not None:
        saved = saved_train_state(ckpt, cfg.pretrained_checkpoint)
        check_resume_compatible(
            saved,
            vla_id=cfg.vla.vla_id,
            seed=cfg.seed,
            path=cfg.pretrained_checkpoint,
            allow_config_change=cfg.allow_config_change,
        )
        samples_per_rank = int(saved.get("samples_per_rank", 0))
        if saved.get("world_size") not in (None, dist_info.world_size):
            logger.warning(
                "Checkpoint was written with world size %s, this run has %d: data order will differ from an "
                "uninterrupted run.",
                saved.get("world_size"),
                dist_info.world_size,
            )

    # A registry id builds the base VLM; a Prismatic run folder / HF OpenVLA folder / Hub id loads its weights.
    vlm = load(cfg.vla.base_vlm, hf_token=cfg.resolve_hf_token())
    vlm.freeze_backbones(cfg.vla.stage)
    if cfg.vla.use_lora:  # adapters on the modules the stage trains; the same loop and strategies train them
        from prismatic.models.lora import apply_lora

        apply_lora(vlm, cfg.vla.lora_settings())
    tokenizer = vlm.llm_backbone.tokenizer
    action_tokenizer = ActionTokenizer(tokenizer)

    # Statistics are computed once per node and cached beside the data; the node's other ranks wait, then read.
    run_once_per_node(lambda: mixture_statistics(cfg.data_root_dir, cfg.vla.data_mix), dist_info)
    dataset = RLDSDataset(
        cfg.data_root_dir,
        cfg.vla.data_mix,
        RLDSBatchTransform(
            action_tokenizer,
            tokenizer,
            vlm.vision_backbone.get_image_transform(),
            vlm.llm_backbone.prompt_builder_fn,
        ),
        resize_resolution=tuple(vlm.vision_backbone.default_image_resolution[1:]),
        shuffle_buffer_size=cfg.vla.shuffle_buffer_size,
        train=True,
        image_aug=cfg.image_aug,
        seed=cfg.seed,
        rank=dist_info.rank,
        world_size=dist_info.world_size,
        start_sample=samples_per_rank,
    )
    logger.info(
        "Data: mixture '%s', %d train transitions, shuffle buffer %d frames (~%.2f GiB per rank, images encoded)",
        cfg.vla.data_mix,
        len(dataset),
        cfg.vla.shuffle_buffer_size,
        dataset.shuffle_buffer_gb,
    )
    max_length = min(
        tokenizer.model_max_length, vlm.llm_backbone.llm.config.max_position_embeddings - vlm.num_patches
    )
    collator = PaddedCollatorForActionPrediction(max_length, tokenizer.pad_token_id)
    steps_per_epoch = max(1, len(dataset) // cfg.vla.global_batch_size)
    num_training_steps = cfg.vla.max_steps or cfg.vla.epochs * steps_per_epoch
    start_step = resume[0] if resume is not None else 0
    if start_step >= num_training_steps:
        raise ConfigError(
            f"Resuming at step {start_step} but the run ends at step {num_training_steps}: raise "
            f"--vla.max_steps (or --vla.epochs) above {start_step}."
        )

    if dist_info.is_main:
        make_dirs(run_dir, "run folder")
        write_run_config(cfg, run_dir)
        save_dataset_statistics(dataset.dataset_statistics, run_dir)

    strategy = get_train_strategy(vlm, cfg.vla, dist_info)
    strategy.run_setup(num_training_steps)
    if ckpt is not None:
        Checkpointer.load_model_weights(strategy.model, ckpt, cfg.pretrained_checkpoint)
        if resume is not None:
            Checkpointer.load_training_state(
                strategy.model, strategy.optimizer, strategy.lr_scheduler, ckpt, cfg.pretrained_checkpoint
            )
            logger.info("Resumed from %s at step %d", cfg.pretrained_checkpoint, start_step)
        del ckpt

    trackers = (
        build_trackers(
            cfg.trackers,
            run_dir,
            run_id,
            config_to_dict(cfg),
            cfg.wandb_project,
            cfg.wandb_entity,
            resume_step=start_step if resume is not None else None,
        )
        if dist_info.is_main
        else []
    )
    checkpointer = Checkpointer(run_dir, cfg.save_interval, dist_info.is_main)
    loader = DataLoader(dataset, batch_size=cfg.vla.per_device_batch_size, collate_fn=collator, num_workers=0)
    metrics = StepMetrics(sorted(dataset.dataset_statistics), action_tokenizer, dist_info.device)

    # --- loop -----------------------------------------------------------------------------------------------
    try:
        last = strategy.run_training(
            iter(loader),
            metrics,
            checkpointer,
            trackers,
            start_step=start_step,
            num_training_steps=num_training_steps,
            steps_per_epoch=steps_per_epoch,
            train_state={"vla_id": cfg.vla.vla_id, "seed": cfg.seed},
        )
    finally:
        for tracker in trackers:
            tracker.finish()

    # --- finish ---------------------------------------------------------------------------------------------
    if dist_info.is_main and (run_dir / METRICS_FILE).exists():
        records = read_metrics(run_dir)
        first = records[0]
        logger.info(
            "Done after %d steps: loss %.4f -> %.4f, action accuracy %.3f -> %.3f, L1 %.4f -> %.4f. Run: %s",
            num_training_steps,
            first["loss"],
            last["loss"],
            first["action_accuracy"],
            last["action_accuracy"],
            first["l1_loss"],
            last["l1_loss"],
            run_dir,
        )
    destroy_distributed()
    return last


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them), check them for this world size, then train.

    A mistake ends here in one paragraph with exit code 2 (prismatic.util.cli). The world size is torchrun's
    WORLD_SIZE, the one `init_distributed` joins: checking it now costs no model or TensorFlow start-up, and an
    unknown mixture or a dataset missing from data_root_dir is named before the model loads (minutes for 7B).
    """
    cfg = parse_config(TrainConfig, argv, doc=__doc__)
    cfg.validate(int(os.environ.get("WORLD_SIZE", "1")))
    from prismatic.vla.datasets.rlds import resolve_mixture_dirs

    resolve_mixture_dirs(cfg.data_root_dir, cfg.vla.data_mix)
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
