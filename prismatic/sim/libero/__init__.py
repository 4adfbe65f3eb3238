"""LIBERO (libero_spatial / object / goal / 10 / 90) for closed-loop evaluation with OpenVLA's protocol.

`setup` configures LIBERO, its assets and the rendering back-end; `suites` holds the suites' tables and checks;
`env` is one task's simulator; `pool` runs several in worker processes. The protocol between simulator and policy
(`protocol`), the episode loop (`rollout`) and the report (`report`) build on them;
`vla_scripts/eval_libero.py` is the entry point.
"""
