"""No import loop across the packages of `prismatic/`, and none between the modules the run folder and the checkpoints
live in: read from the source with `ast` (every `import` counts, also one inside a function or under
`TYPE_CHECKING`), so a lazy import cannot hide a loop that a later change turns eager.

A loop across packages is what makes a change in one layer reach the others: `conf/` (flags and grammar), `models/`
(what a model is), `training/`, `inference/`, `vla/` (data) and `sim/` (simulators) must import each other in one
direction only. A failure names the loop and every import that closes it, file and line, so the fix is to move
the name it imports into the lower package (or `prismatic/util/`), not to make the import lazy.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "prismatic"
LAYERS = ("conf", "models", "training", "inference", "vla", "sim")
# Module pairs that must not import each other in either direction, directly or through other modules of the pair's
# package: the run folder decides what to resume; the checkpointer reads and writes what it names.
UNTIED_MODULES = (("prismatic.training.checkpointing", "prismatic.training.run_folder"),)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, modules: set[str]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import in the file at `path` (module `name`), at any depth; `from package
    import name` counts as importing `package.name` where that is a module, else `package`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield (candidate if candidate in modules else base), node.lineno


def import_edges() -> dict[str, list[tuple[str, str, int]]]:
    """module -> [(imported prismatic module, file, line)] for every module under prismatic/."""
    paths = sorted(PACKAGE_ROOT.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    edges: dict[str, list[tuple[str, str, int]]] = {}
    for path in paths:
        source = module_name(path)
        for target, line in imported_modules(path, source, modules):
            if target.startswith("prismatic"):
                where = str(path.relative_to(PACKAGE_ROOT.parent))
                edges.setdefault(source, []).append((target, where, line))
    return edges


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def _describe(cycle: list[str], imports: dict[tuple[str, str], list[str]]) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:], strict=False):
        lines.append(f"  {a} -> {b}:")
        lines.extend(
            f"    {where}" for where in dict.fromkeys(imports[a, b])
        )  # each import once, in file order
    return "\n".join(lines)


def test_no_import_loop_across_packages() -> None:
    graph: dict[str, set[str]] = {}
    imports: dict[tuple[str, str], list[str]] = {}
    for source, targets in import_edges().items():
        for target, where, line in targets:
            a, b = layer_of(source), layer_of(target)
            if a and b and a != b:
                graph.setdefault(a, set()).add(b)
                imports.setdefault((a, b), []).append(f"{where}:{line} imports {target}")
    cycle = find_cycle(graph)
    assert cycle is None, (
        "An import loop across packages (lazy imports count):\n"
        + _describe(cycle, imports)
        + "\nMove what one of these imports needs into the lower package (or prismatic/util/), so that the "
        "packages import each other in one direction only."
    )


def test_checkpointing_and_run_folder_do_not_import_each_other() -> None:
    edges = import_edges()
    graph = {source: {target for target, _, _ in targets} for source, targets in edges.items()}

    def reaches(start: str, goal: str) -> list[str] | None:
        seen, stack = {start}, [[start]]
        while stack:
            path = stack.pop()
            for nxt in sorted(graph.get(path[-1], ())):
                if nxt == goal:
                    return [*path, nxt]
                if nxt not in seen and nxt.startswith("prismatic.training"):
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None

    for a, b in UNTIED_MODULES:
        there, back = reaches(a, b), reaches(b, a)
        if there and back:
            where = {
                (s, t): [f"{w}:{line}" for tt, w, line in edges[s] if tt == t]
                for path in (there, back)
                for s, t in zip(path, path[1:], strict=False)
            }
            loop = [*there, *back[1:]]
            raise AssertionError(
                f"{a} and {b} import each other (lazy imports count):\n"
                + _describe(loop, {k: [f"{x} imports {k[1]}" for x in v] for k, v in where.items()})
                + "\nMove what both need into a module of its own that neither imports back."
            )


def test_the_walk_finds_a_loop_and_lazy_imports(tmp_path: Path) -> None:
    """The walk itself: a cycle is found (and none where there is none), and an import inside a function or an
    `if TYPE_CHECKING:` block counts as much as one at the top of a module."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}}) is None
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from prismatic.conf import vla\n"
        "def f():\n    import prismatic.models.lora\n"
    )
    found = {
        name
        for name, _ in imported_modules(source, "prismatic.sim.mod", {"prismatic.conf.vla"})
        if name.startswith("prismatic")
    }
    assert found == {"prismatic.conf.vla", "prismatic.models.lora"}
