"""`make mutation`: mutation testing (cosmic-ray) of the modules that decide the numbers users depend on.

For each module of `mutation/config.toml` it copies the working tree to a private folder (the checkout itself is
never mutated: other runs use it), lets cosmic-ray generate the mutants, keeps those in the configured functions
and operators, runs the module's fast tests against each mutant (one at a time, in that copy, `PYTHONPATH`
pointing at it), and prints per module and in total: mutants, killed, survived, judged equivalent (listed in
`mutation/equivalent.toml` with reasons), timeouts and the score = killed / (mutants - equivalent). Timeouts and
mutants that cannot be imported count as killed (the tests noticed them).

    .venv/bin/python mutation/run.py                      # every module
    .venv/bin/python mutation/run.py --modules metrics trainer --keep
    .venv/bin/python mutation/run.py --list               # the mutants in scope, nothing run

The surviving mutants' diffs go to `<work dir>/survivors.txt`; the table to `<work dir>/report.txt`.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PYTHON = sys.executable
BIN = Path(PYTHON).parent
EXCLUDE = [".venv", ".git", "runs", "data", "wandb", "mutants", ".pytest_cache", ".ruff_cache", "__pycache__"]


# === Which mutants are in scope =================================================================================


@dataclass
class Scope:
    """Spans of one module's source: its functions (qualified names) and the parts never mutated."""

    # (first line, last line, qualified name) of every function and class (a class body holds field defaults)
    functions: list[tuple[int, int, str]] = field(default_factory=list)
    ignored: list[tuple[tuple[int, int], tuple[int, int], str]] = field(default_factory=list)

    @classmethod
    def of(cls, source: str) -> Scope:
        scope = cls()
        tree = ast.parse(source)

        def span(node: ast.AST) -> tuple[tuple[int, int], tuple[int, int]]:
            return (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    scope.functions.append((first, child.end_lineno, name))  # a class body: its fields
                    walk(child, f"{name}.")
                else:
                    walk(child, prefix)

        walk(tree, "")
        for node in ast.walk(tree):
            # Annotations (strings under `from __future__ import annotations`), log calls and the message of a
            # raised exception decide no number.
            if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
                scope.ignored.append((*span(node.annotation), "annotation"))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
                scope.ignored.append((*span(node.returns), "annotation"))
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("logger", "logging", "log")
            ):
                scope.ignored.append((*span(node), "logging"))
            if isinstance(node, ast.Raise) and node.exc is not None:
                scope.ignored.append((*span(node.exc), "error message"))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "tqdm":
                scope.ignored.append((*span(node), "progress bar"))
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("set_postfix", "update", "close")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "bar"
            ):
                scope.ignored.append((*span(node), "progress bar"))
        return scope

    def function_at(self, line: int) -> str:
        inner = [(first, name) for first, last, name in self.functions if first <= line <= last]
        return max(inner)[1] if inner else "<module>"

    def ignored_reason(self, start: tuple[int, int], end: tuple[int, int]) -> str | None:
        for first, last, reason in self.ignored:
            if first <= tuple(start) and tuple(end) <= last:
                return reason
        return None


def _selected(qualname: str, patterns: list[str]) -> bool:
    if qualname == "<module>":  # module-level tables and registrations are never in scope
        return False
    return any(p == "*" or qualname == p or qualname.startswith(f"{p}.") for p in patterns)


def mutation_text(source: str, operator_name: str, args: dict, occurrence: int) -> tuple[str, str]:
    """(original, mutated): the changed source lines before and after the mutation, stripped, blank lines dropped,
    joined by " / " (one line each for most operators; "" for a removed decorator)."""
    import difflib

    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    operator = cosmic_ray.plugins.get_operator(operator_name)(**args)
    code = mutate_code(source, operator, occurrence)
    if code is None:
        return "", ""
    before, after = source.splitlines(), code.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        if tag != "equal":
            join = lambda lines: " / ".join(line.strip() for line in lines if line.strip())  # noqa: E731
            return join(before[i1:i2]), join(after[j1:j2])
    return "", ""


def load_equivalents(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return tomllib.loads(path.read_text()).get("equivalent", [])


def match_equivalent(
    equivalents: list[dict], module: str, function: str, line: str, mutated: str
) -> str | None:
    for entry in equivalents:
        if (
            entry["module"] == module
            and entry["function"] == function
            and " ".join(entry["line"].split()) == " ".join(line.split())
            and " ".join(entry["mutated"].split()) == " ".join(mutated.split())
        ):
            return entry["reason"]
    return None


# === Running one module ==========================================================================================


@dataclass
class Tally:
    mutants: int = 0
    killed: int = 0
    survived: int = 0
    equivalent: int = 0
    timeouts: int = 0
    seconds: float = 0.0

    @property
    def score(self) -> float:
        denominator = self.mutants - self.equivalent
        return 100.0 * self.killed / denominator if denominator else 100.0

    def add(self, other: Tally) -> None:
        for name in ("mutants", "killed", "survived", "equivalent", "timeouts", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def test_args(tree: Path, module_cfg: dict, defaults: dict) -> list[str]:
    paths = []
    for pattern in module_cfg["tests"]:
        node = pattern.split("::")[0]
        matched = sorted(glob.glob(str(tree / node)))
        if "::" in pattern:
            paths += [pattern] if matched else []
        else:
            paths += [str(Path(m).relative_to(tree)) for m in matched]
    if not paths:
        raise SystemExit(f"no test file matches {module_cfg['tests']}")
    return [*defaults["pytest_args"], *module_cfg.get("pytest_args", []), *paths]


def start_server(tree: Path, sock: Path, preload: list[str], env: dict) -> subprocess.Popen:
    server = subprocess.Popen(
        [PYTHON, str(tree / "mutation" / "forkserver.py"), "serve", str(sock), *preload],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in server.stdout:  # import-time chatter first, then "forkserver ready"
        seen.append(line)
        if line.startswith("forkserver ready"):
            return server
    raise SystemExit(f"fork server failed to start: {''.join(seen)}")


def run_module(
    key: str, cfg: dict, defaults: dict, tree: Path, work: Path, equivalents: list[dict], list_only: bool
):
    module_path = cfg["path"]
    source = (tree / module_path).read_text()
    scope = Scope.of(source)
    operators = set(defaults["operators"])
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "PYTHONDONTWRITEBYTECODE": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
    }
    session = work / f"{key}.sqlite"
    sock = work / f"{key}.sock"
    args = [] if list_only else test_args(tree, cfg, defaults)
    tally = Tally()
    started = time.monotonic()

    server = None
    timeout = float(defaults["min_timeout_s"])
    if not list_only:
        server = start_server(tree, sock, cfg.get("preload", defaults["preload"]), env)
        baseline_start = time.monotonic()
        base = subprocess.run(
            [PYTHON, str(tree / "mutation" / "forkserver.py"), "run", str(sock), "600", "--", *args],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
        )
        baseline_s = time.monotonic() - baseline_start
        if base.returncode != 0:
            subprocess.run([PYTHON, str(tree / "mutation" / "forkserver.py"), "stop", str(sock)], env=env)
            raise SystemExit(f"[{key}] the tests fail on unmutated code:\n{base.stdout[-3000:]}")
        timeout = max(timeout, defaults["timeout_factor"] * baseline_s + 10)
        print(
            f"[{key}] baseline {baseline_s:.1f} s, per-mutant timeout {timeout:.0f} s; tests: {' '.join(args)}"
        )

    test_command = " ".join(
        [
            PYTHON,
            str(tree / "mutation" / "forkserver.py"),
            "run",
            str(sock),
            f"{timeout - 5:.0f}",
            "--",
            *args,
        ]
    )
    cr_config = work / f"{key}.toml"
    cr_config.write_text(
        "[cosmic-ray]\n"
        f'module-path = "{module_path}"\n'
        f"timeout = {timeout:.0f}.0\n"
        "excluded-modules = []\n"
        f"test-command = {test_command!r}\n".replace("'", '"')
        + '[cosmic-ray.distributor]\nname = "local"\n'
    )
    if session.exists():
        session.unlink()
    subprocess.run(
        [str(BIN / "cosmic-ray"), "init", str(cr_config), str(session)], cwd=tree, env=env, check=True
    )

    # Keep the mutants in scope; mark the rest (and the judged equivalents) skipped so `exec` does not run them.
    db = sqlite3.connect(session)
    rows = db.execute(
        "select job_id, operator_name, operator_args, occurrence, start_pos_row, start_pos_col, end_pos_row, "
        "end_pos_col from mutation_specs"
    ).fetchall()
    in_scope, skipped = {}, {}
    for job_id, op, op_args, occurrence, srow, scol, erow, ecol in rows:
        function = scope.function_at(srow)
        why = None
        if op not in operators:
            why = "out-of-scope: operator"
        elif not _selected(function, cfg["functions"]) or _selected(function, cfg.get("exclude", [])):
            why = "out-of-scope: function"
        else:
            reason = scope.ignored_reason((srow, scol), (erow, ecol))
            if reason:
                why = f"out-of-scope: {reason}"
        if why:
            skipped[job_id] = why
            continue
        op_args = json.loads(op_args) if op_args else {}
        op_args = json.loads(op_args) if isinstance(op_args, str) else op_args  # stored JSON-encoded twice
        original, mutated = mutation_text(source, op, op_args or {}, occurrence)
        if original == mutated:
            skipped[job_id] = "out-of-scope: no change on the line"
            continue
        reason = match_equivalent(equivalents, key, function, original, mutated)
        in_scope[job_id] = (function, srow, original, mutated, op, reason)
        if reason:
            skipped[job_id] = f"equivalent: {reason}"
    db.close()

    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as wdb:
        for job_id, why in skipped.items():
            wdb.set_result(job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=why))

    tally.mutants = len(in_scope)
    tally.equivalent = sum(1 for v in in_scope.values() if v[5])
    if list_only:
        for _job_id, (function, srow, original, mutated, op, reason) in sorted(
            in_scope.items(), key=lambda i: i[1][1]
        ):
            print(
                f"{key}:{srow} {function} [{op}] {original!r} -> {mutated!r}"
                + (" EQUIVALENT" if reason else "")
            )
        return tally, []

    print(
        f"[{key}] {tally.mutants} mutants in scope ({tally.equivalent} judged equivalent), running ...",
        flush=True,
    )
    try:
        subprocess.run(
            [str(BIN / "cosmic-ray"), "exec", str(cr_config), str(session)], cwd=tree, env=env, check=True
        )
    finally:
        subprocess.run([PYTHON, str(tree / "mutation" / "forkserver.py"), "stop", str(sock)], env=env)
        server.wait(timeout=30)

    survivors = []
    with use_db(str(session), WorkDB.Mode.open) as wdb:
        for item, result in wdb.completed_work_items:
            if item.job_id not in in_scope or in_scope[item.job_id][5]:
                continue
            function, srow, original, mutated, op, _ = in_scope[item.job_id]
            if result.test_outcome is not None and result.is_killed:
                tally.killed += 1
                if result.output and ("TIMEOUT" in result.output[-200:] or result.output == "timeout"):
                    tally.timeouts += 1
            else:
                tally.survived += 1
                survivors.append(
                    f"# {key} {module_path}:{srow} {function} [{op}]\n"
                    f"#   line:    {original}\n#   mutated: {mutated}\n{result.diff or ''}\n"
                )
    tally.seconds = time.monotonic() - started
    return tally, survivors


# === Main =========================================================================================================


def row(name: str, t: Tally) -> str:
    return (
        f"{name:<20} {t.mutants:>7} {t.killed:>7} {t.survived:>8} {t.equivalent:>10} {t.timeouts:>8} "
        f"{t.score:>6.1f}% {t.seconds / 60:>6.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modules", nargs="*", help="module keys of mutation/config.toml (default: all)")
    parser.add_argument(
        "--work_dir", type=Path, default=None, help="private copy + sessions (default: a temp dir)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work dir (the copy and cosmic-ray sessions)"
    )
    parser.add_argument("--list", action="store_true", help="list the mutants in scope; run nothing")
    opts = parser.parse_args()

    config = tomllib.loads((HERE / "config.toml").read_text())
    defaults, modules = config["defaults"], config["modules"]
    keys = opts.modules or list(modules)
    unknown = [k for k in keys if k not in modules]
    if unknown:
        raise SystemExit(f"unknown module(s) {unknown}; known: {list(modules)}")
    equivalents = load_equivalents(HERE / "equivalent.toml")

    work = opts.work_dir or Path(tempfile.mkdtemp(prefix="prismatic-mutation-"))
    work.mkdir(parents=True, exist_ok=True)
    tree = work / "tree"
    # The private copy: mutants are written here, never into the checkout.
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(*EXCLUDE), symlinks=True)
    print(f"private copy: {tree}", flush=True)

    total, tallies, survivors = Tally(), {}, []
    started = time.monotonic()
    try:
        for key in keys:
            tally, dead = run_module(key, modules[key], defaults, tree, work, equivalents, opts.list)
            tallies[key] = tally
            survivors += dead
            total.add(tally)
            if not opts.list:
                print(row(key, tally), flush=True)
    finally:
        if not opts.keep:
            shutil.rmtree(tree, ignore_errors=True)
    if opts.list:
        if not opts.keep and opts.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    total.seconds = time.monotonic() - started
    header = (
        f"{'module':<20} {'mutants':>7} {'killed':>7} {'survived':>8} {'equivalent':>10} {'timeouts':>8} "
        f"{'score':>7} {'min':>6}"
    )
    report = "\n".join([header, *(row(k, t) for k, t in tallies.items()), row("TOTAL", total)])
    print("\n" + report)
    print("score = killed / (mutants - equivalent); killed includes timeouts and mutants that fail to import")
    (work / "report.txt").write_text(report + "\n")
    (work / "survivors.txt").write_text("\n".join(survivors))
    print(f"survivors: {work / 'survivors.txt'}  report: {work / 'report.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
