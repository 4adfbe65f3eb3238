""".ci/gpu.sh, the one command a machine with a GPU runs (make test-gpu, then make bench-gpu): a misspelt step
stops it before anything runs, steps the time budget cannot hold are named as not run in its summary, and a step
that fails makes it exit 1 (its log kept)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / ".ci/gpu.sh"


def _gpu_sh(tmp_path: Path, *steps: str, budget: int = 570) -> subprocess.CompletedProcess:
    """The script, with this interpreter as `python3` (the GPU machine's has torch; CI's system one may not)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    python3 = bin_dir / "python3"
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BUDGET": str(budget)}
    env["LOGS"], env["WHEELS"] = str(tmp_path / "logs"), str(tmp_path / "no-wheels")
    # The timeout only stops a hang: a step that starts Python may take minutes on a loaded machine.
    return subprocess.run(["bash", str(SCRIPT), *steps], capture_output=True, text=True, env=env, timeout=600)


def test_a_misspelt_step_stops_before_anything_runs(tmp_path: Path) -> None:
    done = _gpu_sh(tmp_path, "test", "bench:--cases", "benchmark")
    assert done.returncode == 2
    assert done.stderr == (
        "gpu.sh: unknown step 'benchmark'; valid: test, bench, bench:ARGS (bench_gpu.py's arguments)\n"
    )
    assert done.stdout == "" and not (tmp_path / "logs").exists()


def test_steps_past_the_budget_are_reported_as_not_run(tmp_path: Path) -> None:
    done = _gpu_sh(tmp_path, "test", "bench:--cases lora-tiny", budget=20)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.split("== summary")[1].splitlines()[1:]
    assert [line.split(",")[0] for line in summary] == [
        "== test: not run",
        "== bench:--cases lora-tiny: not run",
    ]
    assert not list((tmp_path / "logs").iterdir())  # nothing started, so no logs


def test_a_failed_step_fails_the_script(tmp_path: Path) -> None:
    done = _gpu_sh(tmp_path, "bench:--cases nope")
    assert done.returncode == 1, done.stdout[-2000:]
    summary = done.stdout.split("== summary")[1].splitlines()[1:]
    assert summary[0].startswith("== bench:--cases nope: exit 2 in ")
    assert summary[1:] == [""]  # a benchmark that failed printed no targets block
    assert (tmp_path / "logs" / "step0.log").read_text().startswith("bench_gpu: unknown case(s) ['nope']")
