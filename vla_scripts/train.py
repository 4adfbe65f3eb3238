r"""Fine-tune a VLA: base VLM + RLDS mixture -> policy, with FSDP2 or DDP, sharded checkpoints and exact resume.

Run (tiny preset, 2 CPU processes, toy data):
    torchrun --standalone --nproc-per-node 2 vla_scripts/train.py --vla.type tiny+mx-toy \
        --data_root_dir data/toy --run_root_dir runs --run_id demo

Continue it (after a crash, a preemption or Ctrl-C) from its newest complete checkpoint: the same command plus
    --resume                       (or --resume runs/demo/checkpoints/step-000040-epoch-01 for that one)

Exit codes: 0 done; 2 a mistake in the flags or data (one paragraph says which); 143 / 130 stopped by SIGTERM /
SIGINT after saving a checkpoint (resume with --resume); 70 a worker whose torchrun died.
`--help` lists every flag; `--config_path file.yaml` reads them from a file (see configs/).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

from prismatic.conf.train import ResumePoint, TrainConfig
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError
from prismatic.util.files import check_dir_writable, make_dirs, write_json_atomic, write_text_atomic
from prismatic.util.redact import redact_config

logger = logging.getLogger("vla_scripts.train")
DATA_SNAPSHOT_DIR = "data"  # each rank's data-stream snapshot inside a checkpoint folder


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


def write_run_config(cfg: TrainConfig, run_dir: Path, resumed_at: str | None = None) -> None:
    """`config.json` and a `config.yaml` that `--config_path` accepts to repeat the run (each written atomically,
    group-readable under a 022 umask; `ConfigError` naming the file when the folder cannot be written). A resume
    never overwrites them: it writes `config.resume-<checkpoint>.json/.yaml` beside them."""
    import yaml

    resolved = config_to_dict(cfg)
    stem = "config" if resumed_at is None else f"config.resume-{resumed_at}"
    write_text_atomic(run_dir / f"{stem}.json", json.dumps(resolved, indent=2) + "\n", "run config")
    write_text_atomic(run_dir / f"{stem}.yaml", yaml.safe_dump(resolved, sort_keys=False), "run config")


def check_run_folder(cfg: TrainConfig, run_dir: Path) -> ResumePoint | None:
    """What this command continues, checked before anything loads (read-only, every rank): the checkpoint to
    resume (refused when it is another experiment), or None for a new run (refused over a run with checkpoints)."""
    from prismatic.models.checkpoint_format import complete_checkpoints
    from prismatic.run_layout import CHECKPOINTS_DIR

    resume = cfg.resume_point(run_dir)
    if resume is not None:
        from prismatic.training.checkpointing import check_resume_compatible, read_resume_state  # loads torch

        check_resume_compatible(
            read_resume_state(resume.path),
            run_identity(cfg),
            path=resume.path,
            allow_config_change=cfg.allow_config_change,
        )
        return resume
    checkpoints = run_dir / CHECKPOINTS_DIR
    found = complete_checkpoints(checkpoints) or sorted(checkpoints.glob("step-*.pt"))
    if found:
        raise ConfigError(
            f"Run folder '{run_dir}' already holds a run with checkpoints (newest: '{found[-1]}'). Continue it with "
            "the same command plus --resume, or start a new run with another --run_id or --run_id_note."
        )
    return None


def move_aside_logs_without_checkpoint(run_dir: Path) -> None:
    """Logs of an attempt that crashed before its first checkpoint are moved aside (named in a warning), so
    re-running the same command just works. Rank 0 only."""
    from datetime import datetime, timezone

    from prismatic.training.trackers import METRICS_FILE, WANDB_ID_FILE

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for name in (METRICS_FILE, WANDB_ID_FILE):
        if (run_dir / name).exists():
            aside = run_dir / f"{name}.no-checkpoint-{stamp}"
            (run_dir / name).rename(aside)
            logger.warning(
                "'%s' is from an earlier attempt that saved no checkpoint; moved to '%s', starting over.",
                run_dir / name,
                aside,
            )


def run_identity(cfg: TrainConfig) -> dict[str, Any]:
    """What makes a run the same experiment (a resume with other values is refused)."""
    return {
        "vla_id": cfg.vla.vla_id,
        "seed": cfg.seed,
        "data_mix": cfg.vla.data_mix,
        "base_vlm": cfg.vla.base_vlm,
        "action_head": cfg.vla.action_head,
        "chunk_size": cfg.vla.chunk_size,
        "use_proprio": cfg.vla.use_proprio,
        "num_images": cfg.vla.num_images,
        **{f"data.{name}": value for name, value in cfg.data.to_dict().items()},
    }


def train(cfg: TrainConfig) -> dict[str, float] | int:
    """Set up, load, loop, finish. Returns the last step's metrics (every rank), or the exit code after a
    preemption checkpoint."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from prismatic.models.action_heads import build_action_head
    from prismatic.models.checkpoint_format import load_checkpoint_file
    from prismatic.models.distributed_init import load_on_rank0
    from prismatic.run_layout import ACTION_MODEL_FILE, checkpoint_dir_name
    from prismatic.training.checkpointing import (
        CheckpointManager,
        load_full_model_weights,
        read_resume_state,
        restore_from_file,
        training_state,
    )
    from prismatic.training.metrics import StepMetrics
    from prismatic.training.preemption import Preempted, PreemptionHandler, exit_code
    from prismatic.training.strategies import get_train_strategy
    from prismatic.training.trackers import METRICS_FILE, build_trackers, read_metrics
    from prismatic.training.trainer import LoopPlan, train_loop
    from prismatic.util.dist import destroy_distributed, init_distributed, run_once_per_node
    from prismatic.util.logging import setup_logging
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import (
        PaddedCollatorForActionPrediction,
        RLDSBatchTransform,
        RLDSDataset,
        save_dataset_statistics,
    )
    from prismatic.vla.datasets.batch_transform import views_for
    from prismatic.vla.datasets.rlds import mixture_statistics

    # --- set up: processes, config checks, run folder ---------------------------------------------------------
    dist_info = init_distributed()
    setup_logging(dist_info.rank)
    cfg.validate(dist_info.world_size)
    run_dir = cfg.resolve_run_dir(dist_info.num_nodes)
    run_id = run_dir.name
    check_dir_writable(run_dir, "run folder (--run_root_dir / --run_id)")  # now, not after minutes of loading
    resume = check_run_folder(cfg, run_dir)
    if resume is None and dist_info.is_main:
        move_aside_logs_without_checkpoint(run_dir)
    dist.barrier()
    logger.info(
        "Run %s -> %s (world size %d, stage %s)", run_id, run_dir, dist_info.world_size, cfg.vla.stage
    )

    # Same seed on every rank: identical initial weights; data order differs by rank inside the dataset.
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    # --- what to continue: checked before the model and data load -------------------------------------------
    frames, saved = 0, {}
    if resume is not None:
        saved = read_resume_state(resume.path)
        saved_world = int(saved.get("world_size", dist_info.world_size))
        # Older single-file checkpoints counted samples per rank.
        frames = int(saved.get("frames", int(saved.get("samples_per_rank", 0)) * saved_world))
        changed = [
            f"{what} {before} -> {now}"
            for what, before, now in (
                ("world size", saved_world, dist_info.world_size),
                (
                    "global batch size",
                    saved.get("global_batch_size", cfg.vla.global_batch_size),
                    cfg.vla.global_batch_size,
                ),
            )
            if before != now
        ]
        logger.info(
            "Resuming %s at step %d, epoch %d, after %d frames%s",
            resume.path,
            resume.step,
            resume.epoch,
            frames,
            f" ({'; '.join(changed)}: the data stream continues at the same frame of the mixture)"
            if changed
            else "",
        )

    # A registry id builds the base VLM; a Prismatic run folder / HF OpenVLA folder / Hub id loads its weights.
    # Only rank 0 holds them: the other ranks build the model on the meta device and receive their shards from
    # rank 0 when the strategy wraps it (host memory at 7B: one full copy per node instead of one per rank).
    vlm = load_on_rank0(cfg.vla.base_vlm, hf_token=cfg.resolve_hf_token())
    vlm.freeze_backbones(cfg.vla.stage)
    if cfg.vla.use_lora:  # adapters on the modules the stage trains; the same loop and strategies train them
        from prismatic.models.lora import apply_lora

        apply_lora(vlm, cfg.vla.lora_settings())
    tokenizer = vlm.llm_backbone.tokenizer
    action_tokenizer = ActionTokenizer(tokenizer)

    # Statistics are computed once per node and cached beside the data; the node's other ranks wait, then read.
    run_once_per_node(
        lambda: mixture_statistics(
            cfg.data_root_dir, cfg.vla.data_mix, options=cfg.data, recompute=cfg.recompute_stats
        ),
        dist_info,
    )
    batch_transform = RLDSBatchTransform(
        action_tokenizer,
        tokenizer,
        vlm.vision_backbone.get_image_transform(),
        vlm.llm_backbone.prompt_builder_fn,
        views=views_for(cfg.vla.num_images),
        use_proprio=cfg.vla.use_proprio,
    )
    resize = tuple(vlm.vision_backbone.default_image_resolution[1:])
    # Frames carry the head's chunk (the current action and chunk_size - 1 future ones) and the camera views.
    stream_kwargs = stream_options(cfg)
    dataset = RLDSDataset(
        cfg.data_root_dir,
        cfg.vla.data_mix,
        batch_transform,
        resize_resolution=resize,
        shuffle_buffer_size=cfg.vla.shuffle_buffer_size,
        train=True,
        image_aug=cfg.image_aug,
        seed=cfg.seed,
        rank=dist_info.rank,
        world_size=dist_info.world_size,
        options=cfg.data,
        **stream_kwargs,
    )
    # The action side of the model follows from the data: the action width and the proprio width.
    spec = action_spec(cfg, dataset.dataset_statistics)
    vlm.attach_action_modules(spec)
    head = build_action_head(spec, action_tokenizer, vlm.num_prefix_tokens)
    batch_transform.layout = head.layout
    # Every rank continues its own stream at the same share of the frames consumed so far.
    rank_frames = frames // dist_info.world_size
    if frames % dist_info.world_size:
        logger.info(
            "%d frames consumed do not split evenly over %d ranks: each continues after %d.",
            frames,
            dist_info.world_size,
            rank_frames,
        )
    snapshot = resume.path / DATA_SNAPSHOT_DIR if resume is not None and resume.sharded else None
    how = dataset.resume_from(rank_frames, snapshot)
    if resume is not None:
        logger.info("Data stream of rank %d restored at frame %d (%s)", dist_info.rank, rank_frames, how)
    logger.info(
        "Data: mixture '%s', %d train transitions, shuffle buffer %d frames (~%.2f GiB per rank, images encoded)",
        cfg.vla.data_mix,
        len(dataset),
        cfg.vla.shuffle_buffer_size,
        dataset.shuffle_buffer_gb,
    )
    max_length = min(
        tokenizer.model_max_length,
        vlm.llm_backbone.llm.config.max_position_embeddings - vlm.num_prefix_tokens,
    )
    collator = PaddedCollatorForActionPrediction(max_length, tokenizer.pad_token_id)
    steps_per_epoch = max(1, len(dataset) // cfg.vla.global_batch_size)
    num_training_steps = cfg.vla.max_steps or cfg.vla.epochs * steps_per_epoch
    start_step = resume.step if resume is not None else 0
    if start_step >= num_training_steps:
        raise ConfigError(
            f"Resuming at step {start_step} but the run ends at step {num_training_steps}: raise "
            f"--vla.max_steps (or --vla.epochs) above {start_step}."
        )

    # --- model, optimizer, state ----------------------------------------------------------------------------
    strategy = get_train_strategy(vlm, cfg.vla, dist_info, grad_sync=cfg.grad_sync, sharding=cfg.sharding)
    strategy.setup(num_training_steps)
    counters = {"step": start_step, "epoch": resume.epoch if resume is not None else 0, "frames": frames}
    state = training_state(strategy.model, strategy.optimizer, strategy.lr_scheduler, counters)
    checkpoints = CheckpointManager(
        run_dir,
        save_interval=cfg.save_interval,
        keep_last=cfg.checkpoint.keep_last,
        async_save=cfg.checkpoint.async_save,
        rank=dist_info.rank,
    )
    checkpoints.remove_leftovers()
    if resume is not None and resume.sharded:
        rng = checkpoints.load(
            resume.path, state, same_world_size=saved.get("world_size") == dist_info.world_size
        )
        logger.info(
            "Restored model, optimizer, schedule%s from %s", " and RNG states" if rng else "", resume.path
        )
    elif resume is not None:
        restore_from_file(
            strategy.model,
            strategy.optimizer,
            strategy.lr_scheduler,
            load_checkpoint_file(resume.path),
            resume.path,
        )
    elif cfg.pretrained_checkpoint is not None:  # --is_resume false: a new run from a checkpoint's weights
        load_full_model_weights(
            strategy.model, load_checkpoint_file(cfg.pretrained_checkpoint), cfg.pretrained_checkpoint
        )
    counters.update(step=start_step, frames=frames)

    if dist_info.is_main:
        make_dirs(run_dir, "run folder")
        write_run_config(
            cfg,
            run_dir,
            resumed_at=None if resume is None else checkpoint_dir_name(resume.step, resume.epoch),
        )
        save_dataset_statistics(dataset.dataset_statistics, run_dir)
        write_json_atomic(run_dir / ACTION_MODEL_FILE, spec.to_dict(), "the model's action spec")
    dist.barrier()

    def save(blocking: bool) -> Path:
        train_state = {
            **counters,
            **run_identity(cfg),
            "world_size": dist_info.world_size,
            "global_batch_size": cfg.vla.global_batch_size,
            "per_device_batch_size": cfg.vla.per_device_batch_size,
        }
        snapshot = (
            (lambda f: dataset.save_stream_state(f / DATA_SNAPSHOT_DIR))
            if cfg.checkpoint.data_snapshot
            else None
        )
        return checkpoints.save(state, train_state, snapshot, blocking=blocking)

    validate = None
    if cfg.eval.interval is not None:
        from prismatic.training.validation import Validator

        validator = Validator(
            cfg.data_root_dir,
            cfg.vla.data_mix,
            batch_transform,
            resize,
            collator,
            per_device_batch_size=cfg.vla.per_device_batch_size,
            num_batches=cfg.eval.num_batches,
            head=head,
            rank=dist_info.rank,
            world_size=dist_info.world_size,
            seed=cfg.seed,
            device=dist_info.device,
            options=cfg.data,
            stream_kwargs=stream_kwargs,
        )

        def validate() -> dict[str, float]:
            return validator.run(strategy.model, autocast=strategy.autocast)

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
    metrics = StepMetrics(sorted(dataset.dataset_statistics), head, dist_info.device)
    plan = LoopPlan(
        start_step=start_step,
        num_training_steps=num_training_steps,
        steps_per_epoch=steps_per_epoch,
        global_batch_size=cfg.vla.global_batch_size,
        eval_interval=cfg.eval.interval,
        show_progress=dist_info.is_main,
    )

    # --- loop -----------------------------------------------------------------------------------------------
    try:
        with PreemptionHandler() as preemption:
            logger.info(
                "Training steps %d to %d (SIGTERM or Ctrl-C: finish the step, save a checkpoint, exit)",
                start_step + 1,
                num_training_steps,
            )
            last = train_loop(
                strategy,
                head,
                iter(loader),
                metrics,
                trackers,
                plan,
                counters,
                checkpoints,
                save,
                validate,
                preemption,
            )
    except Preempted as stop:
        logger.warning(
            "Stopped by %s after step %d; checkpoint %s saved. Continue with the same command plus --resume.",
            signal.Signals(stop.signum).name,
            stop.step,
            checkpoints.last_saved,
        )
        destroy_distributed()
        return exit_code(stop.signum)
    finally:
        for tracker in trackers:
            tracker.finish()

    # --- finish ---------------------------------------------------------------------------------------------
    if cfg.checkpoint.export_final:
        export_final(checkpoints.last_saved, run_dir, dist_info.is_main)
    if dist_info.is_main and (run_dir / METRICS_FILE).exists():
        records = read_metrics(run_dir)
        first = records[0]
        changes = ", ".join(
            f"{name.replace('_', ' ')} {first[name]:.4f} -> {last[name]:.4f}"
            for name in ("loss", "action_accuracy", "l1_loss")
            if name in first and name in last
        )
        logger.info("Done after %d steps: %s. Run: %s", num_training_steps, changes, run_dir)
    destroy_distributed()
    return last


def stream_options(cfg: TrainConfig) -> dict[str, Any]:
    """`RLDSDataset` keywords the action side decides: the chunk window and, beyond one camera, the views."""
    from prismatic.vla.datasets.batch_transform import views_for

    options: dict[str, Any] = {"future_action_window_size": cfg.vla.chunk_size - 1}
    if cfg.vla.num_images > 1:
        options["image_views"] = views_for(cfg.vla.num_images)
    return options


def action_spec(cfg: TrainConfig, statistics: dict[str, Any]) -> Any:
    """The model's `ActionSpec`: the head and chunk from the flags, the action and proprio widths from the data.

    Raises:
        ConfigError: the mixture's datasets have actions (or proprio) of different widths.
    """
    from prismatic.models.action_heads import ActionSpec

    def width(key: str) -> int:
        widths = {name: len(stats[key]["q01"]) for name, stats in statistics.items() if key in stats}
        if len(set(widths.values())) != 1:
            raise ConfigError(
                f"The datasets of mixture '{cfg.vla.data_mix}' have {key} vectors of different widths ({widths}); "
                "one model predicts one width: train them separately."
            )
        return next(iter(widths.values()))

    return ActionSpec(
        head=cfg.vla.action_head,
        chunk_size=cfg.vla.chunk_size,
        action_dim=width("action"),
        proprio_dim=width("proprio") if cfg.vla.use_proprio else 0,
        num_images=cfg.vla.num_images,
    )


def export_final(checkpoint: Path, run_dir: Path, is_main: bool) -> None:
    """`--checkpoint.export_final`: the HF OpenVLA export of the last checkpoint in <run_dir>/hf (rank 0 reads the
    shards; the others wait)."""
    import torch.distributed as dist

    if is_main:
        from prismatic.models.hf_openvla import export_hf_openvla
        from prismatic.models.loading import load_vla, spec_of

        loaded = load_vla(checkpoint, dtype="bfloat16")
        out = export_hf_openvla(
            loaded.vlm, spec_of(loaded.vlm), run_dir / "hf", norm_stats=loaded.norm_stats, dtype="bfloat16"
        )
        logger.info("Exported %s to %s (HF OpenVLA layout, bf16)", checkpoint, out)
    dist.barrier()


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them), check them for this world size, then train.

    A mistake ends here in one paragraph with exit code 2 (prismatic.util.cli). The world size is torchrun's
    WORLD_SIZE, the one `init_distributed` joins: checking it now costs no model or TensorFlow start-up, and an
    unknown mixture or a dataset missing from data_root_dir is named before the model loads (minutes for 7B).
    """
    cfg = parse_config(TrainConfig, argv, doc=__doc__)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cfg.validate(world_size)
    if cfg.vla.cpu_offload:  # needs CUDA: refused now, not after the model and data have loaded
        import torch

        from prismatic.training.strategies.fsdp import check_cpu_offload

        check_cpu_offload(True, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    num_nodes = max(1, world_size // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world_size))))
    check_run_folder(cfg, cfg.resolve_run_dir(num_nodes))
    from prismatic.vla.datasets.rlds import resolve_mixture_dirs

    resolve_mixture_dirs(cfg.data_root_dir, cfg.vla.data_mix)
    result = train(cfg)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
