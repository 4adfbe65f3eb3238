"""The GPU suite imports neither TensorFlow nor W&B: GPU machines may lack both.

A fresh interpreter with both made unimportable (`sys.modules[name] = None`: any `import` of them raises) imports
every module of this folder, and so everything they import from the project. Imports made while a test runs are
checked the same way by the `no_heavy_imports` fixture (conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

FORBIDDEN_IMPORTS = ("tensorflow", "wandb")  # as conftest.py's (a conftest is not importable by name)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def test_suite_imports_no_tensorflow_or_wandb(device: torch.device) -> None:
    modules = sorted(p.stem for p in HERE.glob("*.py") if p.stem != "conftest")
    if all(importlib.util.find_spec(name) for name in ("fastapi", "json_numpy")):  # else its test skips
        modules.append("prismatic.inference.server")
    code = "\n".join(
        [
            "import sys",
            *(f"sys.modules[{name!r}] = None" for name in FORBIDDEN_IMPORTS),
            *(f"import {module}" for module in modules),
            "print('imported', len(sys.modules))",
        ]
    )
    # Keep what the caller's PYTHONPATH adds (packages installed beside the interpreter's, e.g. with --target).
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([str(HERE), str(REPO / "tests"), str(REPO), *inherited])
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "imported" in proc.stdout
