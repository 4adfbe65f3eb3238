r"""Closed-loop evaluation in the LIBERO simulator: success rate per task with OpenVLA's protocol.

    python vla_scripts/eval_libero.py --checkpoint runs/<run_id> --task_suite libero_spatial
    python vla_scripts/eval_libero.py --checkpoint runs/<run_id> --task_suite libero_10 --num_envs 8 --tasks 0,3
    python vla_scripts/eval_libero.py --policy_url http://gpu-host:8000 --task_suite libero_goal --num_envs 16

Needs the simulator: `make install` (LIBERO, robosuite, MuJoCo and LIBERO's assets; see docs/libero.md). The same
evaluation runs as `vla_scripts/eval_sim.py --benchmark libero` (prismatic/sim/evaluation.py holds it).

Each task of the suite runs `--num_trials_per_task` episodes (default 50, OpenVLA's), episode i from the task's
fixed initial state i, exactly as OpenVLA's `experiments/robot/libero/run_libero_eval.py` does (and OpenVLA-OFT's
for chunk heads): 10 settling steps, the suite's step limit (220 / 280 / 300 / 520 / 400), 256x256 renders
rotated 180 degrees and resized through JPEG and Lanczos as training saw them, the centre crop for runs trained
with image augmentation (`--center_crop` overrides), the suite's statistics (or its `_no_noops` variant), the
gripper mapped, binarised and inverted for LIBERO's controller; a chunk head's whole chunk runs open loop, with
proprio and the wrist image when the run reads them. docs/libero.md lists each step and its source.

`--num_envs N` runs N simulators in subprocesses and decodes their observations in one batch; every episode is
seeded on its own, so the table is the same for any N. `--policy_url` asks a running `vla_scripts/serve.py`
instead of loading the model here (a GPU server, CPU simulators). Prints the table with 95 % Wilson intervals and
writes `results.json`, `metrics.jsonl` (one record per episode; `--trackers jsonl wandb` as in training) and,
with `--save_videos`, one mp4 per episode into `--out_dir` (default `<run>/eval_libero/<suite>`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from prismatic.sim.evaluation import EvalSimConfig, open_source, run_from_flags
from prismatic.util.cli import entry_point
from prismatic.util.errors import ConfigError

__all__ = ["EvalLiberoConfig", "main", "open_source"]


@dataclass
class EvalLiberoConfig(EvalSimConfig):
    """Example: python vla_scripts/eval_libero.py --checkpoint runs/<run_id> --task_suite libero_spatial"""

    task_suite: str | None = (
        "libero_spatial"  # libero_spatial, libero_object, libero_goal, libero_10 or libero_90
    )

    def __post_init__(self) -> None:
        if self.benchmark != "libero":
            raise ConfigError(
                f"eval_libero.py evaluates LIBERO only, got --benchmark {self.benchmark}: run "
                f"`vla_scripts/eval_sim.py --benchmark {self.benchmark} ...` instead."
            )
        super().__post_init__()


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them) and evaluate; a mistake exits 2 in one paragraph."""
    return run_from_flags(EvalLiberoConfig, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
