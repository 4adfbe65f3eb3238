"""Every shell command of README.md, docs/lerobot.md, docs/own_data.md and docs/libero.md runs as written from a fresh clone once
`make install` has made the venv: its program is a Makefile target or a program of the venv (`.venv/bin/python`,
`.venv/bin/torchrun`, `.venv/bin/hf`: never a bare `torchrun` that only an activated venv has), the script it runs
is in this checkout (or is a file the doc writes), and every flag it passes is one the script's (or torchrun's)
`--help` lists. Each script's `--help` is run as the docs run the script (cheap: `--help` loads no torch).
docs/own_data.md's worked example is run in full by tests/vla/test_own_data_doc.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/lerobot.md", "docs/own_data.md", "docs/libero.md")
BASH_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
EXAMPLE_FILE = re.compile(r"<!-- example: ([\w.]+) -->")
VENV = ".venv/bin/"
# Where the venv's programs are: this checkout's .venv (`make install`), else the interpreter running the tests.
VENV_BIN = REPO / ".venv" / "bin" if (REPO / ".venv" / "bin").is_dir() else Path(sys.executable).parent


def doc_commands() -> list[tuple[str, list[str]]]:
    """(doc, argv) of every command line in the docs' bash blocks (continuations joined, comments and leading
    `NAME=value` assignments dropped)."""
    commands = []
    for doc in DOCS:
        for block in BASH_BLOCK.findall((REPO / doc).read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                argv = shlex.split(line, comments=True)
                while argv and re.fullmatch(r"\w+=.*", argv[0]):
                    argv = argv[1:]
                if argv:
                    commands.append((doc, argv))
    return commands


COMMANDS = doc_commands()


def _script(argv: list[str]) -> str | None:
    """The Python script a command runs (`python X.py ...`, `torchrun [flags] X.py ...`), if any."""
    return next((arg for arg in argv[1:] if arg.endswith(".py") and not arg.startswith("-")), None)


def _flags(args: list[str]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("--")]


@cache
def help_text(program: str, *args: str) -> str:
    """`.venv/bin/<program> [args] --help` (a script, a subcommand), run from the repository root as the docs run
    it."""
    argv = [str(VENV_BIN / program), *args, "--help"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout + done.stderr


def test_the_docs_have_commands() -> None:
    docs = {doc for doc, _ in COMMANDS}
    assert docs == set(DOCS), docs
    programs = {argv[0] for _, argv in COMMANDS}
    assert {"make", f"{VENV}python", f"{VENV}torchrun"} <= programs, programs


@pytest.mark.parametrize(("doc", "argv"), COMMANDS, ids=[f"{d}:{' '.join(a)[:60]}" for d, a in COMMANDS])
def test_every_command_runs_as_written(doc: str, argv: list[str]) -> None:
    program = argv[0]
    if program == "make":
        targets = set(re.findall(r"(?m)^([\w.-]+):", (REPO / "Makefile").read_text()))
        wanted = [arg for arg in argv[1:] if not arg.startswith("-") and "=" not in arg]
        assert wanted and set(wanted) <= targets, (
            f"{doc}: make {wanted}: Makefile targets are {sorted(targets)}"
        )
        return
    assert program.startswith(VENV), (
        f"{doc}: '{shlex.join(argv)}' calls '{program}', which exists only in an activated venv: write "
        f"{VENV}{Path(program).name} as the other commands do"
    )
    name = program.removeprefix(VENV)
    assert (VENV_BIN / name).is_file(), f"{doc}: {program} is not a program of the venv ({VENV_BIN})"
    script = _script(argv)
    if script is None:  # another program of the venv (`hf download ...`): its subcommand's flags
        subcommand = [arg for arg in argv[1:2] if not arg.startswith("-")]
        if name != "python":
            usage = help_text(name, *subcommand)
            for flag in _flags(argv[1:]):
                assert re.search(rf"{re.escape(flag)}\b", usage), (
                    f"{doc}: {shlex.join(argv[:2])} has no {flag}"
                )
        return
    written_by_doc = set(EXAMPLE_FILE.findall((REPO / doc).read_text()))
    if not script.startswith("vla_scripts/"):
        assert script in written_by_doc, (
            f"{doc}: '{script}' is neither in vla_scripts/ nor written by the doc"
        )
        return
    assert (REPO / script).is_file(), f"{doc}: {script} does not exist"
    position = argv.index(script)
    if name == "torchrun":
        launcher = help_text("torchrun")
        for flag in _flags(argv[1:position]):
            assert re.search(rf"{re.escape(flag)}\b", launcher), f"{doc}: torchrun has no {flag}"
    script_help = help_text("python", script)
    for flag in _flags(argv[position + 1 :]):
        if flag == "--plugins":  # read by `parse_config` itself, before the flags `--help` lists
            assert "parse_config(" in (REPO / script).read_text(), f"{doc}: {script} does not read --plugins"
            continue
        assert re.search(rf"{re.escape(flag)}\b", script_help), f"{doc}: {script} --help lists no {flag}"
