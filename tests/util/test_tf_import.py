"""TensorFlow must load after torch and torchvision, or the process segfaults: guard the entry points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tensorflow_first_use_then_torchvision_does_not_crash():
    code = (
        "from prismatic.util.tf import import_tensorflow\n"
        "tf = import_tensorflow()\n"
        "import timm, torchvision.ops\n"
        "print(tf.constant(2).numpy() + 1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("3")


def test_nothing_imports_tensorflow_directly():
    offenders = [
        str(path.relative_to(REPO))
        for folder in ("prismatic", "vla_scripts")
        for path in (REPO / folder).rglob("*.py")
        if path.name != "tf.py"
        and any(
            line.strip().startswith(("import tensorflow ", "import tensorflow\n", "from tensorflow "))
            or line.strip() == "import tensorflow"
            for line in path.read_text().splitlines()
        )
    ]
    assert offenders == []
