"""`--profile.*` and `bench_gpu.py --profile` on the device: a profiled window sees its kernels by name (cuBLAS
matmuls counted as matmul, elementwise kernels as other), the device's busy time is positive and within the
window's wall time, and the steps before and after the window are not in it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from prismatic.training.profiling import StepProfiler

pytestmark = pytest.mark.gpu

MATMULS_PER_STEP = 5  # in the window's steps
MATMULS_OUTSIDE = 40  # in the steps before and after it


def test_a_profiled_window_sees_its_kernels(device: torch.device, tmp_path: Path) -> None:
    x = torch.randn(512, 512, device=device)
    profiler = StepProfiler(tmp_path, 0, device, 2, 2)
    for step in (1, 2, 3, 4):  # the window: steps 2 and 3
        profiler.before_step(step)
        for _ in range(MATMULS_PER_STEP if step in (2, 3) else MATMULS_OUTSIDE):
            x = torch.tanh(x @ x)
    profiler.close()
    trace, summary_path = profiler.written
    summary = json.loads(summary_path.read_text())
    assert summary["steps"] == [2, 3] and summary["units"] == 2
    # One to three kernels per matmul (one ATen mm on CPU; on an H100 cuBLAS ran two `sm80_xmma_gemm_f32f32`
    # kernels per 512 x 512 FP32 matmul); step 1 or 4 in the window would add at least 20 a step.
    assert MATMULS_PER_STEP <= summary["launches_by_kind"]["matmul"] <= 3 * MATMULS_PER_STEP
    assert summary["ms_by_kind"]["matmul"] > 0
    if device.type == "cuda":
        assert 0 < summary["device_busy_ms"] <= summary["wall_ms"]
        assert summary["launches_by_kind"]["other"] >= MATMULS_PER_STEP  # the tanh kernels
        assert summary["host_top"]
    assert "traceEvents" in json.loads(trace.read_text())
