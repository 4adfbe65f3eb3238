r"""Closed-loop evaluation in simulation: success rate per task of a trained policy, in LIBERO or Meta-World.

    python vla_scripts/eval_sim.py --benchmark metaworld --checkpoint runs/<run_id> --task_suite MT10
    python vla_scripts/eval_sim.py --benchmark metaworld --checkpoint runs/<run_id> --tasks reach-v3,push-v3 \
        --num_trials_per_task 20 --num_envs 2 --resolution 128
    python vla_scripts/eval_sim.py --benchmark libero --checkpoint runs/<run_id> --task_suite libero_spatial
    python vla_scripts/eval_sim.py --benchmark libero --policy_url http://gpu-host:8000 --task_suite libero_goal

Needs the simulators: `make install` (or `pip install -e '.[sim,sim-assets]'`; docs/libero.md, docs/metaworld.md).

Each task runs `--num_trials_per_task` episodes; episode i of a task is seeded from (task, i, `--seed`) alone, so the
table is the same for any `--num_envs` and any order. The benchmark fixes the protocol (prismatic/sim/<benchmark>/):
LIBERO follows OpenVLA's evaluation (10 settling steps, the suite's step limit, the gripper mapped for its
controller; `vla_scripts/eval_libero.py` is the same evaluation under LIBERO's own flag names), Meta-World follows
LeRobot's (the corner2 camera turned upright, 4-D state and action, success at any step, 500 steps). Frames go to
the policy resized as its training data was, centre-cropped for runs trained with image augmentation
(`--center_crop` overrides); a chunk head's chunk runs open loop. `--policy_url` asks a running
`vla_scripts/serve.py` instead of loading the model here. Prints the table with 95 % Wilson intervals (and, in
process, a head's chunks that did not decode: `invalid_chunks`) and writes
`results.json`, `metrics.jsonl` (one record per episode; `--trackers jsonl wandb` as in training) and, with
`--save_videos`, one mp4 per episode into `--out_dir` (default `<run>/eval_<benchmark>/<suite>`).
"""

from __future__ import annotations

import sys

from prismatic.sim.evaluation import EvalSimConfig, run_from_flags
from prismatic.util.cli import entry_point


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them) and evaluate; a mistake exits 2 in one paragraph."""
    return run_from_flags(EvalSimConfig, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
