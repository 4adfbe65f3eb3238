"""torch's OpenMP team sleeps when idle in our scripts (`prismatic/util/openmp.py`): with libgomp's default spinning,
a 1-process CPU run crawled until its first checkpoint happened to throttle it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prismatic.util.openmp import SPIN_COUNT_ENV, WAIT_POLICY_ENV, prefer_passive_openmp_waits

REPO = Path(__file__).resolve().parents[2]

# The training script is imported as torchrun's workers run it, then an entry point's `main` loads torch: libgomp
# prints the settings it read at load (OMP_DISPLAY_ENV).
_LOAD_TORCH_IN_AN_ENTRY_POINT = """
import sys
from pathlib import Path
from prismatic.util.lazy import import_file
import_file("train_script", Path("vla_scripts/train.py"))
print("torch before main:", "torch" in sys.modules, flush=True)
from prismatic.util.cli import entry_point

@entry_point
def main():
    import torch
    torch.ones(1)

main()
"""


def _unset(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Remove `names` from the environment for this test (restored, or removed again, afterwards)."""
    for name in names:
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)


def test_a_script_loads_torch_with_a_team_that_does_not_spin() -> None:
    env = {k: v for k, v in os.environ.items() if k not in (WAIT_POLICY_ENV, SPIN_COUNT_ENV)}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_TORCH_IN_AN_ENTRY_POINT],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "torch before main: False" in proc.stdout
    )  # else the policy below would come too late for the script
    settings = [line.strip() for line in proc.stderr.splitlines()]
    # libgomp's default is 300000 spins per wait (what the slow runs had); PASSIVE makes it 0.
    assert f"{SPIN_COUNT_ENV} = '0'" in settings, proc.stderr[-2000:]


def test_the_policy_is_set_before_torch_loads_and_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    _unset(monkeypatch, WAIT_POLICY_ENV, SPIN_COUNT_ENV)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert prefer_passive_openmp_waits() is True
    assert os.environ[WAIT_POLICY_ENV] == "PASSIVE"


@pytest.mark.parametrize("name, value", [(WAIT_POLICY_ENV, "ACTIVE"), (SPIN_COUNT_ENV, "1000")])
def test_a_users_wait_setting_is_kept(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    _unset(monkeypatch, WAIT_POLICY_ENV, SPIN_COUNT_ENV)
    monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert prefer_passive_openmp_waits() is False
    assert os.environ[name] == value
    assert (WAIT_POLICY_ENV in os.environ) == (name == WAIT_POLICY_ENV)


def test_nothing_is_set_once_torch_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its libgomp read the environment at load: a value set now would reach only child processes.
    import torch  # noqa: F401

    _unset(monkeypatch, WAIT_POLICY_ENV, SPIN_COUNT_ENV)
    assert prefer_passive_openmp_waits() is False
    assert WAIT_POLICY_ENV not in os.environ
