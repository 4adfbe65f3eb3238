"""`vla_scripts/*.py` imported as modules, for tests that call a script's `main` or its functions in process: a
subprocess would spend seconds importing torch again."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "vla_scripts"


def import_script(name: str) -> ModuleType:
    """`vla_scripts/<name>.py` as the module `<name>_script`, imported once per process and kept in `sys.modules`,
    where the dataclasses defined in it look their module up."""
    module_name = f"{name}_script"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    return sys.modules[module_name]
