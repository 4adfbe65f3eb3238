"""Meta-World (MT50, MT10 and LeRobot's difficulty groups) for closed-loop evaluation with LeRobot's protocol, and
its scripted experts for demonstrations.

`tasks` holds the suites' tables and checks (no simulator); `env` is one task's simulator; `benchmark` binds them
to the interface `vla_scripts/eval_sim.py` and the pool use; `demos` runs the scripted experts for
`vla_scripts/collect_demos.py`.
"""
