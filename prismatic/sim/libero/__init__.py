"""LIBERO (libero_spatial / object / goal / 10 / 90) for closed-loop evaluation with OpenVLA's protocol.

`setup` configures LIBERO and its assets; `suites` holds the suites' tables and checks; `env` is one task's
simulator; `protocol` the gripper and statistics rules between simulator and policy; `benchmark` binds them to the
interface of `prismatic/sim/benchmark.py`, through which the shared pool, rollout and report (`prismatic/sim/`) run
it. `vla_scripts/eval_sim.py --benchmark libero` and `vla_scripts/eval_libero.py` are the entry points.
"""
