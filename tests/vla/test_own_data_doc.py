"""docs/own_data.md's worked example runs as written: episodes -> convert -> plugin file -> statistics -> train,
every script reading the user's dataset from `--plugins my_robot_example.py` (no library edit). The evaluation
after it reads plugins the same way (tests/test_cli_errors.py: a missing plugin file, per script).

The user's own script and torchrun run as subprocesses; `python vla_scripts/<script>.py ARGS` lines run the script's
`main(ARGS)` in this process (what its `__main__` calls; each script's command line is tests/test_cli_errors.py's):
a subprocess would spend seconds importing TensorFlow again. The plugin's registrations are undone afterwards."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch  # noqa: F401  (torch before TensorFlow in this process)
from scripts import SCRIPTS, import_script
from train_runs import ENV, REPO

from prismatic.vla.datasets.rlds import configs, mixtures, transforms

DOC = REPO / "docs" / "own_data.md"
BLOCK = re.compile(r"<!-- example: (?P<name>[\w.]+) -->\n```\w+\n(?P<body>.*?)```", re.S)


def _commands(script: str) -> list[list[str]]:
    """The doc's shell lines as argv lists, run with this interpreter and this checkout's scripts."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        if not line.strip():
            continue
        argv = shlex.split(line)
        if argv[0] in ("torchrun", ".venv/bin/torchrun"):
            argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
        elif argv[0] == ".venv/bin/python":
            argv = [sys.executable, *argv[1:]]
        commands.append([str(REPO / a) if a.startswith("vla_scripts/") else a for a in argv])
    return commands


@pytest.fixture
def registries_restored() -> Iterator[None]:
    """What the plugin registers in this process (datasets, standardisation functions, mixtures) is removed
    afterwards, so that no other test sees the user's dataset."""
    registries = (configs.DATASET_CONFIGS, transforms.STANDARDIZE_FNS, mixtures.MIXTURES)
    saved = [dict(registry) for registry in registries]
    try:
        yield
    finally:
        for registry, before in zip(registries, saved, strict=True):
            registry.clear()
            registry.update(before)


def run_as_written(argv: list[str], cwd: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """One command line of the doc: a project script's `main` here, anything else as a subprocess."""
    if argv[0] == sys.executable and Path(argv[1]).parent == SCRIPTS:
        with monkeypatch.context() as patch:
            patch.chdir(cwd)
            assert import_script(Path(argv[1]).stem).main(argv[2:]) == 0, shlex.join(argv)
        return
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_worked_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registries_restored: None
) -> None:
    blocks = {m["name"]: m["body"] for m in BLOCK.finditer(DOC.read_text())}
    assert set(blocks) == {"record_episodes.py", "my_robot_example.py", "run"}
    for name in ("record_episodes.py", "my_robot_example.py"):
        (tmp_path / name).write_text(blocks[name])
    env = {**ENV, "PYTHONPATH": str(REPO)}
    for argv in _commands(blocks["run"]):
        run_as_written(argv, tmp_path, env, monkeypatch)

    # 5 episodes of 6 steps, statistics over every split (OpenVLA); the plugin's function inverted the gripper
    # (stored 1 = closed from step 3 on): 1 = open on steps 0-2 of every episode.
    stats = json.loads((tmp_path / "stats" / "dataset_statistics.json").read_text())["my_robot_example"]
    assert stats["num_transitions"] == 30 and stats["num_trajectories"] == 5
    assert stats["action"]["mean"][6] == 0.5 and stats["action"]["mask"] == [True] * 6 + [False]
    run = tmp_path / "runs" / "my_robot_run"
    assert json.loads((run / "dataset_statistics.json").read_text())["my_robot_example"] == stats
    assert (run / "checkpoints" / "latest").is_file()
