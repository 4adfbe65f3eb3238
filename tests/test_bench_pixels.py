"""`benchmarks/bench_pixels.py` keeps working on CPU: the 7B preset's fused backbone (built on the meta device) and
a one-part backbone, both paths timed per batch size."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("base_vlm", "size"), [("prism-dinosiglip-224px+7b", "(224, 224)"), ("tiny-vit+tiny-llama", "(64, 64)")]
)
def test_bench_pixels_times_both_paths(base_vlm: str, size: str) -> None:
    cmd = [sys.executable, str(REPO / "benchmarks/bench_pixels.py"), "--base_vlm", base_vlm]
    done = subprocess.run(
        [*cmd, "--batch_sizes", "1", "3", "--repeats", "1"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{base_vlm}, {size} px, bfloat16 on cpu" in done.stdout
    rows = re.findall(
        r"batch +(\d+): host path +([\d.]+) ms +host part of the device path +([\d.]+) ms", done.stdout
    )
    assert [int(batch) for batch, _, _ in rows] == [1, 3]
    assert all(float(host) > 0 and float(device) > 0 for _, host, device in rows)


def test_bench_pixels_refuses_an_unknown_base_vlm_with_the_choices() -> None:
    cmd = [sys.executable, str(REPO / "benchmarks/bench_pixels.py"), "--base_vlm", "prism-dinosiglip-7b"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert (
        "Unknown base VLM 'prism-dinosiglip-7b'" in done.stderr and "prism-dinosiglip-224px+7b" in done.stderr
    )
    assert "Traceback" not in done.stderr
