r"""Fine-tune a VLA: base VLM + RLDS mixture -> policy, with FSDP2 or DDP, sharded checkpoints and exact resume.

Run (tiny preset, 2 CPU processes, toy data):
    torchrun --standalone --nproc-per-node 2 vla_scripts/train.py --vla.type tiny+mx-toy \
        --data_root_dir data/toy --run_root_dir runs --run_id demo

Continue it (after a crash, a preemption or Ctrl-C) from its newest complete checkpoint: the same command plus
    --resume                       (or --resume runs/demo/checkpoints/step-000040-epoch-01 for that one)

Exit codes: 0 done; 2 a mistake in the flags or data, or a GPU out of memory (one paragraph says which and what
to change); 143 / 130 stopped by SIGTERM / SIGINT after saving a checkpoint (resume with --resume); 70 a worker
whose torchrun died.
`--help` lists every flag; `--config_path file.yaml` reads them from a file (see configs/).
"""

from __future__ import annotations

import sys

from prismatic.conf.train import TrainConfig
from prismatic.training.run_folder import RunFolder
from prismatic.training.trackers import check_trackers
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.topology import num_nodes, world_size


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them), check them for this world size, then train.

    A mistake ends here in one paragraph with exit code 2 (prismatic.util.cli). The world size is torchrun's
    WORLD_SIZE, the one `init_distributed` joins: checking it now costs no model or TensorFlow start-up, and an
    unknown mixture or a dataset missing from data_root_dir is named before the model loads (minutes for 7B).
    """
    cfg = parse_config(TrainConfig, argv, doc=__doc__)
    world = world_size()
    cfg.validate(world)
    check_trackers(cfg.trackers)  # no W&B login: one paragraph now, not a traceback after the model loads
    if (
        cfg.vla.speed.cpu_offload
        or cfg.vla.speed.compile_mode == "reduce-overhead"
        or cfg.vla.speed.batched_grad_copy == "on"
    ):
        _check_device_flags(cfg, world)  # refused now, not after the model and data have loaded
    RunFolder.of(cfg, num_nodes(world)).check(cfg)
    # lazy: --help and the refusals above skip the dataset tables (0.1 s)
    from prismatic.vla.datasets.rlds import resolve_mixture_dirs

    resolve_mixture_dirs(cfg.data_root_dir, cfg.vla.data_mix)
    # lazy: every refusal above comes before torch and TensorFlow load (seconds)
    from prismatic.training.train import train

    result = train(cfg)
    return result if isinstance(result, int) else 0


def _check_device_flags(cfg: TrainConfig, world: int) -> None:
    """The flags that need CUDA, a strategy that is known without the model or a torch feature (CPU offload, CUDA
    graphs, batched gradient copies): refused by the speed plan's first phase, which set-up repeats with the model's
    size (`prismatic.training.speed_plan`)."""
    import torch  # lazy: only these flags need torch before training starts

    from prismatic.training.speed_plan import plan_flags

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plan_flags(cfg.vla, world, device, grad_sync=cfg.grad_sync, sharding=cfg.sharding)


if __name__ == "__main__":
    sys.exit(main())
