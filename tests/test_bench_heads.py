"""`benchmarks/bench_heads.py`'s arithmetic, without training: the Wilson intervals it prints, the steady-state step
time it reads from a run's metrics, the task names it gives eval_sim's rows and the table it writes. Expected
figures are worked by hand (Wilson: centre (p + z²/2n) / (1 + z²/n), half-width
z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n), z = 1.96)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from prismatic.util.lazy import import_file

bench = import_file("bench_heads", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_heads.py")


@pytest.mark.parametrize(
    ("successes", "episodes", "expected"),
    [
        (6, 10, (31.3, 83.2)),
        (4, 10, (16.8, 68.7)),
        (10, 20, (29.9, 70.1)),
        (0, 20, (0.0, 16.1)),
        (20, 20, (83.9, 100.0)),
    ],
)
def test_wilson_percent(successes: int, episodes: int, expected: tuple[float, float]) -> None:
    low, high = bench.wilson_percent(successes, episodes)
    assert (round(low, 1), round(high, 1)) == expected


def test_steady_step_time_skips_the_first_steps_and_validation_records() -> None:
    records = [{"step": s, "step_time_s": t} for s, t in enumerate([5.0, 1.0, 0.3, 0.2, 0.4, 0.1], start=1)]
    records.insert(4, {"step": 4, "val_loss": 0.5})  # a validation record has no step time
    assert bench.steady_step_time(records, skip_steps=2) == pytest.approx(
        0.25
    )  # median of 0.3, 0.2, 0.4, 0.1
    with pytest.raises(ValueError, match="after step 6"):
        bench.steady_step_time(records, skip_steps=6)


def test_successes_by_task_names_eval_sims_rows() -> None:
    results = {
        "tasks": [
            {"suite": "MT50", "task_id": 4, "successes": 4, "episodes": 10},
            {"suite": "MT50", "task_id": 18, "successes": 6, "episodes": 10},
        ]
    }
    assert bench.successes_by_task(results) == {"button-press-topdown-v3": (4, 10), "drawer-open-v3": (6, 10)}


def test_markdown_table_rows() -> None:
    tokens = bench.HeadResult(
        preset="tiny+metaworld",
        head="tokens",
        successes={"drawer-open-v3": (6, 10), "button-press-topdown-v3": (4, 10)},
        step_time_s=0.25,
        actions_per_s=1234.4,
        chunk_size=1,
    )
    flow = bench.HeadResult(
        preset="tiny-flow+metaworld",
        head="flow",
        successes={"drawer-open-v3": (0, 20), "button-press-topdown-v3": (20, 20)},
        step_time_s=0.1206,
        actions_per_s=4000.0,
        chunk_size=8,
    )
    lines = bench.markdown_table([tokens, flow], ["drawer-open-v3", "button-press-topdown-v3"]).splitlines()
    assert lines[0] == (
        "| head | preset | drawer-open-v3 | button-press-topdown-v3 | all tasks | training step (median) "
        "| actions/s (batched predict) |"
    )
    assert lines[1] == "|---|---|---|---|---|---|---|"
    assert lines[2] == (
        "| tokens | `tiny+metaworld` | 6/10 [31.3, 83.2] % | 4/10 [16.8, 68.7] % | 10/20 [29.9, 70.1] % | 250 ms "
        "| 1234 (chunk 1) |"
    )
    assert lines[3] == (
        "| flow | `tiny-flow+metaworld` | 0/20 [0.0, 16.1] % | 20/20 [83.9, 100.0] % | 20/40 [35.2, 64.8] % "
        "| 121 ms | 4000 (chunk 8) |"
    )
    assert len(lines) == 4


def test_run_id_of_a_preset() -> None:
    assert bench.run_id_of("tiny-oft+metaworld") == "tiny-oft_metaworld"


def test_the_docs_command_parses() -> None:
    """docs/heads.md's command passes only flags the script has (test_docs_commands checks vla_scripts/ only)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "heads.md").read_text()
    (block,) = re.findall(r"```bash\n(.*?)```", text, re.S)
    argv = shlex.split(block.replace("\\\n", " "))
    while "=" in argv[0]:  # OMP_NUM_THREADS=1 WANDB_MODE=offline
        argv.pop(0)
    assert argv[:2] == [".venv/bin/python", "benchmarks/bench_heads.py"]
    args = bench.build_parser().parse_args(argv[2:])
    assert args.presets == [
        "tiny+metaworld",
        "tiny-oft+metaworld",
        "tiny-flow+metaworld",
        "tiny-fast+metaworld",
    ]
