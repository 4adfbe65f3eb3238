"""The grammar of `--vla.speed.checkpointing_policy`: its values and what each recomputes, read by the config (to refuse
a bad value while parsing) and by the model's sharding code (`prismatic.models.parallelize`, to apply it). Torch-free,
so the config layer can use it before torch loads; neither side imports the other for it.
"""

from __future__ import annotations

# `auto` picks one of the others per run (`prismatic.training.speed_plan`).
CHECKPOINTING_POLICIES = ("auto", "full", "selective-ops", "every-N (N >= 1)")


def checkpointing_stride(policy: str) -> int | None:
    """Every how many LLM decoder layers `--vla.speed.checkpointing_policy` checkpoints one: N for `every-N`, 1 for
    `full` and `selective-ops` (all of them); None when `policy` is none of its values."""
    if policy in ("full", "selective-ops"):
        return 1
    digits = policy.removeprefix("every-")
    return int(digits) if digits != policy and digits.isdecimal() and int(digits) >= 1 else None
