"""OpenMP's wait policy for our processes: threads of torch's CPU thread team sleep when idle instead of spinning.

torch runs its CPU ops (and MKL's matmuls) on an OpenMP team of `torch.get_num_threads()` threads (libgomp). By
default libgomp lets a team's idle threads busy-wait (`GOMP_SPINCOUNT` 300,000 spins) at every region's end before
they sleep, and throttles that spinning only while it manages more threads than the process has cores. A process
of ours with a team as large as its cores is never in that case, yet it always shares those cores: tf.data's
pipeline threads, a server's or simulator's threads, other ranks and processes. The spinning members then take
the cores from the threads that hold the work, and each of the thousands of parallel regions in a training step
waits for a member the kernel descheduled: a 1-process CPU run of a tiny preset crawled until its first
checkpoint, whose save ran a torch op on a gloo worker thread: that thread's own OpenMP team pushed libgomp over
its throttling line, by accident (benchmarks/results/ has the measurement).

`OMP_WAIT_POLICY=PASSIVE` makes idle team members sleep at once, from the first step. libgomp reads it once, when
it loads with torch, so `entry_point` (`cli_report.py`) sets it before a script's `main` runs, before anything
imports torch. A policy or spin count the user set is kept (`OMP_WAIT_POLICY=ACTIVE` for a machine whose cores
are the team's alone).
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"  # libgomp's own knob, which overrides the policy's spin count
DEFAULT_WAIT_POLICY = "PASSIVE"


def prefer_passive_openmp_waits() -> bool:
    """Set `OMP_WAIT_POLICY=PASSIVE` for this process and the ones it starts, unless the user set a wait policy or
    spin count, or torch is already imported (its libgomp has read the environment: setting it would change only
    the children's). Returns True when it was set."""
    if os.environ.get(WAIT_POLICY_ENV) or os.environ.get(SPIN_COUNT_ENV) or "torch" in sys.modules:
        return False
    os.environ[WAIT_POLICY_ENV] = DEFAULT_WAIT_POLICY
    return True
