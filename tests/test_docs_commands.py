"""Every shell command of the README and the user docs (DOCS below) runs as written from a fresh clone once
`make install` has made the venv: its program is a Makefile target or a program of the venv (`.venv/bin/python`,
`.venv/bin/torchrun`, `.venv/bin/hf`: never a bare `torchrun` that only an activated venv has), the script it runs
is in this checkout (or is a file the doc writes), and every flag it passes is one the script's (or torchrun's)
`--help` lists. Each script's `--help` is run as the docs run the script (cheap: `--help` loads no torch).
No command needs a W&B login: a script whose `--trackers` default includes wandb (train.py) is run with
`--trackers` naming no wandb, or with `WANDB_MODE=offline` / `disabled` in front; one without a login otherwise
fails minutes in, when W&B starts.
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
DOCS = (
    "README.md",
    "docs/training.md",
    "docs/checkpoints.md",
    "docs/inference.md",
    "docs/data_pipeline.md",
    "docs/lerobot.md",
    "docs/own_data.md",
    "docs/libero.md",
    "docs/metaworld.md",
)
BASH_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
EXAMPLE_FILE = re.compile(r"<!-- example: ([\w.]+) -->")
VENV = ".venv/bin/"
# Where the venv's programs are: this checkout's .venv (`make install`), else the interpreter running the tests.
VENV_BIN = REPO / ".venv" / "bin" if (REPO / ".venv" / "bin").is_dir() else Path(sys.executable).parent


def doc_commands() -> list[tuple[str, list[str], dict[str, str]]]:
    """(doc, argv, env) of every command line in the docs' bash blocks (continuations joined, comments dropped, the
    leading `NAME=value` assignments moved from argv to env)."""
    commands = []
    for doc in DOCS:
        for block in BASH_BLOCK.findall((REPO / doc).read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                argv = shlex.split(line, comments=True)
                env = {}
                while argv and re.fullmatch(r"\w+=.*", argv[0]):
                    name, value = argv.pop(0).split("=", 1)
                    env[name] = value
                if argv:
                    commands.append((doc, argv, env))
    return commands


COMMANDS_WITH_ENV = doc_commands()
COMMANDS = [(doc, argv) for doc, argv, _ in COMMANDS_WITH_ENV]


def _script(argv: list[str]) -> str | None:
    """The Python script a command runs (`python X.py ...`, `torchrun [flags] X.py ...`), if any."""
    return next((arg for arg in argv[1:] if arg.endswith(".py") and not arg.startswith("-")), None)


# The docs' commands that run a script of this checkout, with their environment: the ones the W&B rule applies to.
SCRIPT_COMMANDS = [
    (doc, argv, env)
    for doc, argv, env in COMMANDS_WITH_ENV
    if (_script(argv) or "").startswith("vla_scripts/")
]
WANDB_OFF = ("offline", "disabled")  # WANDB_MODE values under which W&B needs no login


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


def _trackers(argv: list[str]) -> list[str] | None:
    """The trackers a command names with `--trackers` (`a b`, `a,b`, `[a, b]`, `[]`, `--trackers=a`), None if it
    names none."""
    for i, arg in enumerate(argv):
        if arg == "--trackers" or arg.startswith("--trackers="):
            values = [arg.split("=", 1)[1]] if "=" in arg else []
            for value in argv[i + 1 :] if "=" not in arg else []:
                if value.startswith("--"):
                    break
                values.append(value)
            return [v for value in values for v in re.split(r"[,\s\[\]]+", value) if v]
    return None


def _default_trackers(script: str) -> list[str] | None:
    """The `--trackers` default a script's `--help` prints (`(default: [jsonl, wandb])`), None if it has none."""
    usage = help_text("python", script)
    found = re.search(r"--trackers\b.*?\(default:\s*\[([^\]]*)\]\)", usage, re.S)
    return None if found is None else [v for v in re.split(r"[,\s]+", found.group(1)) if v]


def needs_wandb_login(argv: list[str], env: dict[str, str]) -> bool:
    """Whether a command would start W&B online: it logs to wandb (named, or the script's default) and its
    environment does not turn W&B offline."""
    default = _default_trackers(_script(argv))
    if default is None:
        return False
    trackers = _trackers(argv)
    return "wandb" in (default if trackers is None else trackers) and env.get("WANDB_MODE") not in WANDB_OFF


def test_the_wandb_rule_reads_commands() -> None:
    # train.py logs to jsonl and wandb by default; eval_libero.py to jsonl alone (both from their --help).
    assert _default_trackers("vla_scripts/train.py") == ["jsonl", "wandb"]
    assert _default_trackers("vla_scripts/eval_libero.py") == ["jsonl"]
    train = [f"{VENV}torchrun", "--nproc-per-node", "2", "vla_scripts/train.py", "--vla.type", "tiny+mx-toy"]
    assert needs_wandb_login(train, {})
    assert needs_wandb_login([*train, "--trackers", "jsonl", "wandb"], {})
    assert needs_wandb_login([*train, "--trackers=jsonl,wandb", "--seed", "1"], {})
    assert not needs_wandb_login([*train, "--trackers", "jsonl", "--seed", "1"], {})
    assert not needs_wandb_login([*train, "--trackers", "[]"], {})
    assert not needs_wandb_login(train, {"WANDB_MODE": "offline"})
    assert needs_wandb_login(train, {"WANDB_MODE": "online"})
    evaluate = [f"{VENV}python", "vla_scripts/eval_libero.py", "--task_suite", "libero_10"]
    assert not needs_wandb_login(evaluate, {})
    assert needs_wandb_login([*evaluate, "--trackers", "jsonl", "wandb"], {})


@pytest.mark.parametrize(
    ("doc", "argv", "env"), SCRIPT_COMMANDS, ids=[f"{d}:{' '.join(a)[:60]}" for d, a, _ in SCRIPT_COMMANDS]
)
def test_no_command_needs_a_wandb_login(doc: str, argv: list[str], env: dict[str, str]) -> None:
    assert not needs_wandb_login(argv, env), (
        f"{doc}: '{shlex.join(argv)}' logs to W&B, which fails without `wandb login`: add `--trackers jsonl` (or "
        "put WANDB_MODE=offline in front), and say in prose how to add wandb"
    )


DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
REPORT_LINK = re.compile(r"\]\([^)]*benchmarks/results/[^)]*\)")


def test_the_docs_are_reference_and_the_readme_is_short() -> None:
    # Figures and their dates live in benchmarks/results/; the docs may link a report, not restate when or how.
    for doc in ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]:
        text = REPORT_LINK.sub("", (REPO / doc).read_text())
        assert not DATE.findall(text), f"{doc} names a date {DATE.findall(text)}: move the figure to a report"
        assert not re.search(r"\blease\b", text), f"{doc} speaks of a lease: move the figure to a report"
    assert len((REPO / "README.md").read_text().splitlines()) <= 250
    assert "<!-- demo-output -->" in (REPO / "README.md").read_text()


def test_every_report_has_its_header() -> None:
    reports = sorted((REPO / "benchmarks" / "results").glob("20*.md"))
    assert reports
    for report in reports:
        rows = dict(re.findall(r"(?m)^\| (card|date|commit|command) \| (.+) \|$", report.read_text()))
        assert set(rows) == {"card", "date", "commit", "command"}, (
            f"{report.name}: header rows {sorted(rows)}"
        )
        assert report.name.startswith(rows["date"][:10]), f"{report.name} is dated {rows['date']}"
