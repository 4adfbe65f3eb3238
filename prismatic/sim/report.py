"""An evaluation's result, whatever the benchmark: success per task and overall, with 95 % Wilson score intervals,
as a printed table and as JSON.

Wilson's interval, not the normal approximation: at 50 episodes per task, rates near 0 % or 100 % are common and
the normal interval would cross them.

Where the policy said which of its chunks did not decode (FAST's zeros, `EpisodeResult.invalid_chunks`), every task
row, the overall row and each episode carry `invalid_chunks`; otherwise the key is absent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the rollout imports TensorFlow's image maths
    from prismatic.sim.rollout import EpisodeResult, RolloutSettings

Z_95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def wilson_interval(successes: int, episodes: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a success rate, as fractions in [0, 1]; (0, 1) for no episodes."""
    if episodes == 0:
        return 0.0, 1.0
    p = successes / episodes
    denominator = 1 + z * z / episodes
    centre = (p + z * z / (2 * episodes)) / denominator
    half = z * math.sqrt(p * (1 - p) / episodes + z * z / (4 * episodes * episodes)) / denominator
    # The bounds are exactly 0 / 1 at no / all successes (rounding would leave 1e-17 off).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == episodes else min(1.0, centre + half)
    return low, high


def success_table(results: Iterable[EpisodeResult]) -> dict[tuple[str, int], tuple[int, int]]:
    """(suite, task id) -> (successes, episodes)."""
    table: dict[tuple[str, int], tuple[int, int]] = {}
    for r in results:
        wins, total = table.get((r.spec.suite, r.spec.task_id), (0, 0))
        table[(r.spec.suite, r.spec.task_id)] = (wins + int(r.success), total + 1)
    return table


def _row(successes: int, episodes: int) -> dict[str, Any]:
    low, high = wilson_interval(successes, episodes)
    rate = successes / episodes if episodes else 0.0
    return {"successes": successes, "episodes": episodes, "success_rate": rate, "ci95": [low, high]}


def summarize(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    """Per-task and overall rows, and one record per episode (in the order they were asked for)."""
    table = success_table(results)
    instructions = {(r.spec.suite, r.spec.task_id): r.instruction for r in results}
    tasks = [
        {"suite": suite, "task_id": task_id, "instruction": instructions[(suite, task_id)], **_row(*counts)}
        for (suite, task_id), counts in sorted(table.items())
    ]
    wins = sum(r.success for r in results)
    overall = _row(wins, len(results))
    counted = [r for r in results if r.invalid_chunks is not None]
    if counted:
        for task in tasks:
            key = (task["suite"], task["task_id"])
            task["invalid_chunks"] = sum(
                r.invalid_chunks for r in counted if (r.spec.suite, r.spec.task_id) == key
            )
        overall["invalid_chunks"] = sum(r.invalid_chunks for r in counted)
    episodes = [
        {
            "suite": r.spec.suite,
            "task_id": r.spec.task_id,
            "episode": r.spec.episode_idx,
            "success": r.success,
            "steps": r.steps,
            "seconds": round(r.seconds, 3),
            "actions_digest": r.actions_digest,
            "final_eef_pos": list(r.final_eef_pos),
            **({"error": r.error} if r.error else {}),
            **({"invalid_chunks": r.invalid_chunks} if r.invalid_chunks is not None else {}),
        }
        for r in results
    ]
    return {"tasks": tasks, "overall": overall, "episodes": episodes}


def protocol_record(settings: RolloutSettings) -> dict[str, Any]:
    """The protocol an evaluation ran with, as the report records it (so two reports can be compared)."""
    return {
        "unnorm_key": settings.unnorm_key,
        "center_crop": settings.center_crop,
        "image_size": list(settings.image_size),
        "num_images": settings.num_images,
        "proprio": settings.use_proprio,
        "open_loop_steps": settings.open_loop_steps,
        "max_steps": settings.max_steps,
        "num_steps_wait": settings.num_steps_wait,
    }


def _percent(row: Mapping[str, Any]) -> str:
    low, high = row["ci95"]
    return f"{100 * row['success_rate']:5.1f}%  [{100 * low:5.1f}, {100 * high:5.1f}]"


def format_table(summary: Mapping[str, Any]) -> str:
    """The table printed at the end: one line per task, then the overall line (with an `invalid` column, the
    chunks that did not decode, where the policy counts them)."""
    counts = "invalid_chunks" in summary["overall"]
    invalid_header = "invalid  " if counts else ""
    lines = [f"{'task':>4}  {'successes':>9}  {'rate':>6}  {'95% CI':>14}  {invalid_header}instruction"]

    def invalid(row: Mapping[str, Any]) -> str:
        return f"{row['invalid_chunks']:>7d}  " if counts else ""

    for row in summary["tasks"]:
        count = f"{row['successes']}/{row['episodes']}"
        lines.append(f"{row['task_id']:>4}  {count:>9}  {_percent(row)}  {invalid(row)}{row['instruction']}")
    overall = summary["overall"]
    count = f"{overall['successes']}/{overall['episodes']}"
    lines.append(f"{'all':>4}  {count:>9}  {_percent(overall)}  {invalid(overall)}".rstrip())
    return "\n".join(lines)
