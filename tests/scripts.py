"""`vla_scripts/*.py` imported as modules, for tests that call a script's `main` or its functions in process: a
subprocess would spend seconds importing torch again."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from prismatic.util.lazy import import_file

SCRIPTS = Path(__file__).resolve().parents[1] / "vla_scripts"


def import_script(name: str) -> ModuleType:
    """`vla_scripts/<name>.py` as the module `<name>_script`, imported once per process."""
    return import_file(f"{name}_script", SCRIPTS / f"{name}.py")
