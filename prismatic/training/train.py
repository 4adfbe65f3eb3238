"""`train(cfg)`: one training run as a list of set-up steps, each a builder in the room it belongs to, then the loop.

Read top to bottom: processes and run folder (new run or resume, decided once by `RunFolder`), the model, the
mixture's statistics, the action head they decide, the speed plan (every `auto` resolved once:
`speed_plan.py`), the strategy it names (FSDP2 / DDP), the data stream, the checkpointer
(which owns everything a checkpoint holds and restores it), the run's files, evaluation and trackers, the loop
(`trainer.train_loop`), and the finish. `vla_scripts/train.py` parses and checks the flags, then calls this.
"""

from __future__ import annotations

import logging
import random
import signal
from datetime import timedelta
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from prismatic.conf.train import TrainConfig
from prismatic.models.hf_openvla import export_hf_openvla
from prismatic.models.loading import load_vla, spec_of
from prismatic.run_layout import CHECKPOINTS_DIR
from prismatic.training.checkpointing import build_checkpointer
from prismatic.training.metrics import StepMetrics
from prismatic.training.model_setup import attach_action_head, build_vlm
from prismatic.training.out_of_memory import explain_out_of_memory
from prismatic.training.preemption import Preempted, PreemptionHandler, exit_code
from prismatic.training.profiling import build_profiler
from prismatic.training.run_folder import RunFolder, check_resume_before_end, config_to_dict
from prismatic.training.speed_plan import plan_flags, resolve_speed_plan
from prismatic.training.strategies import build_strategy
from prismatic.training.trackers import TrackerRun, build_trackers, read_metrics
from prismatic.training.trainer import LoopHooks, LoopPlan, train_loop
from prismatic.training.validation import build_validation
from prismatic.util.dist import destroy_distributed, init_distributed, run_on_main
from prismatic.util.files import check_dir_writable
from prismatic.util.logging import setup_logging
from prismatic.vla.datasets import save_dataset_statistics
from prismatic.vla.datasets.builders import build_statistics, build_train_data, sample_training_chunks
from prismatic.vla.datasets.prefetch import prefetched

logger = logging.getLogger(__name__)


def train(cfg: TrainConfig) -> dict[str, float] | int:
    """Set up, load, loop, finish. Returns the last step's metrics (every rank), or the exit code after a
    preemption checkpoint. Collective: every torchrun worker calls it."""
    dist_info = init_distributed(timedelta(seconds=cfg.dist_timeout_s))
    setup_logging(dist_info.rank)
    cfg.validate(dist_info.world_size)
    run = RunFolder.of(cfg, dist_info.num_nodes)
    check_dir_writable(
        run.path, "run folder (--run_root_dir / --run_id)"
    )  # now, not after minutes of loading
    resume = run.start(cfg, dist_info.world_size, dist_info.is_main)
    dist.barrier()
    logger.info(
        "Run %s -> %s (world size %d, stage %s)", run.run_id, run.path, dist_info.world_size, cfg.vla.stage
    )
    seed_everything(cfg.seed)  # the same on every rank: identical initial weights; data order differs by rank

    vlm = build_vlm(cfg.vla, cfg.resolve_hf_token())
    # Every speed and memory choice, in two phases: the flags alone decide the head's; the model's size the rest.
    speed_options = {"grad_sync": cfg.grad_sync, "sharding": cfg.sharding}
    flags = plan_flags(cfg.vla, dist_info.world_size, dist_info.device, **speed_options)
    head = attach_action_head(vlm, cfg.vla, build_statistics(cfg, dist_info), flags.logits_at_labels)
    # A head's own files beside the statistics (FAST's vocabulary: fitted by rank 0 on a new run, read on a resume).
    head.prepare_files(
        run.path,
        partial(sample_training_chunks, cfg, head.spec.chunk_size),
        dist_info,
        resumed=resume is not None,
        timeout=timedelta(seconds=cfg.dist_timeout_s),
        base=starting_files_dir(cfg, vlm),  # the starting weights' run (or export): its head files
    )
    speed = resolve_speed_plan(cfg.vla, vlm, dist_info, **speed_options, flags=flags)
    strategy = build_strategy(vlm, cfg.vla, dist_info, speed)
    data = build_train_data(cfg, vlm, head, dist_info, pad_to_multiple=speed.pad_to_multiple)
    check_resume_before_end(resume, data.num_training_steps)
    with explain_out_of_memory(cfg.vla, strategy, lambda: "while setting up"):
        strategy.setup(data.num_training_steps)
        checkpointer = build_checkpointer(cfg, run, strategy, data.dataset, resume)
        checkpointer.restore(resume, cfg.pretrained_checkpoint)
    speed = strategy.plan  # as set up: blocks stay eager where the compiler cannot run
    if dist_info.is_main:
        run.write_run_files(cfg, resume, head.spec.to_dict(), speed.to_dict())
        save_dataset_statistics(data.dataset.dataset_statistics, run.path)
    dist.barrier()

    start_step = checkpointer.counters["step"]
    validate = build_validation(cfg, data, head, strategy)
    tracked = TrackerRun(
        run.path,
        run.run_id,
        config_to_dict(cfg),
        resume_step=start_step if resume is not None else None,
        wandb_project=cfg.wandb_project,
        wandb_entity=cfg.wandb_entity,
    )
    trackers = build_trackers(cfg.trackers, tracked) if dist_info.is_main else []
    metrics = StepMetrics(sorted(data.dataset.dataset_statistics), head, dist_info.device)
    plan = LoopPlan(
        start_step=start_step,
        num_training_steps=data.num_training_steps,
        steps_per_epoch=data.steps_per_epoch,
        global_batch_size=cfg.vla.global_batch_size,
        eval_interval=cfg.eval.interval,
        show_progress=dist_info.is_main,
        overlap_steps=speed.overlap_steps,
    )
    try:
        with (
            PreemptionHandler() as preemption,
            prefetched(data.loader, speed.prefetch_batches, dist_info.device) as batches,
            explain_out_of_memory(cfg.vla, strategy, partial(_after_step, checkpointer.counters)),
        ):
            logger.info(
                "Training steps %d to %d (SIGTERM or Ctrl-C: finish the step, save a checkpoint, exit)",
                start_step + 1,
                data.num_training_steps,
            )
            profiler = build_profiler(
                cfg.profile,
                run.path,
                dist_info.rank,
                dist_info.device,
                start_step + 1,
                data.num_training_steps,
            )
            hooks = LoopHooks(trackers, checkpointer, preemption, validate, profiler)
            last = train_loop(strategy, head, batches, metrics, plan, checkpointer.counters, hooks)
    except Preempted as stop:
        logger.warning(
            "Stopped by %s after step %d; checkpoint %s saved. Continue with the same command plus --resume.",
            signal.Signals(stop.signum).name,
            stop.step,
            checkpointer.last_saved,
        )
        destroy_distributed()
        return exit_code(stop.signum)
    finally:
        for tracker in trackers:
            tracker.finish()

    if cfg.checkpoint.export_final:  # rank 0 exports while the others wait on gloo, not in an NCCL collective
        export = partial(export_final, checkpointer.last_saved, run.path)
        run_on_main(export, dist_info, timeout=timedelta(seconds=cfg.dist_timeout_s))
    if dist_info.is_main:
        log_summary(run, data.num_training_steps, last)
    destroy_distributed()
    return last


def starting_files_dir(cfg: TrainConfig, vlm: torch.nn.Module) -> Path | None:
    """The folder of the run (or export) whose weights a new run starts from, where a head finds the files those
    weights learnt (FAST's vocabulary): `--pretrained_checkpoint X --is_resume false`'s run (X in <run>/checkpoints/;
    else X's own folder), else the `--vla.base_vlm` run or export it was loaded from (None: neither)."""
    checkpoint = cfg.pretrained_checkpoint
    if checkpoint is not None and not cfg.is_resume:
        checkpoint = Path(checkpoint).resolve()
        return checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS_DIR else checkpoint.parent
    return getattr(vlm, "run_files_dir", None)


def _after_step(counters: dict[str, int]) -> str:
    """Where in the loop the run is, for an error: after its last completed step."""
    return f"after step {counters['step']}" if counters["step"] else "in its first step"


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's global generators (model init, dropout; the data has its own seeds)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def export_final(checkpoint: Path, run_dir: Path) -> None:
    """`--checkpoint.export_final`: the HF OpenVLA export of the last checkpoint in <run_dir>/hf (rank 0)."""
    loaded = load_vla(checkpoint, dtype="bfloat16")
    out = export_hf_openvla(
        loaded.vlm, spec_of(loaded.vlm), run_dir / "hf", norm_stats=loaded.norm_stats, dtype="bfloat16"
    )
    logger.info("Exported %s to %s (HF OpenVLA layout, bf16)", checkpoint, out)


def log_summary(run: RunFolder, num_training_steps: int, last: dict[str, float]) -> None:
    """One line: the first logged step's loss / accuracy / L1 against the last's (rank 0)."""
    if not run.metrics.exists():
        return
    first = read_metrics(run.path)[0]
    changes = ", ".join(
        f"{name.replace('_', ' ')} {first[name]:.4f} -> {last[name]:.4f}"
        for name in ("loss", "action_accuracy", "l1_loss")
        if name in first and name in last
    )
    logger.info("Done after %d steps: %s. Run: %s", num_training_steps, changes, run.path)
