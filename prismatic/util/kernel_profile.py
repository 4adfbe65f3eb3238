"""Where a call's time goes, from `torch.profiler`: device busy against wall time, time by kind of kernel, the
kernels that cost most.

`bench_gpu.py --profile` runs this after each timed case, and training's `--profile.start_step` over a window of
real steps (`prismatic/training/profiling.py`): a figure like "23 % MFU" says how far from the card a step is,
this says why (the GPU idle between launches, matmuls, attention, casts and copies, the optimizer, or
small unfused kernels). On a GPU the kinds are read from the kernels' names (cuBLAS, flash attention, NCCL,
inductor's Triton kernels, ATen's own) and busy time is the union of the device's kernel and copy intervals; on
CPU, with no device, the same table is built from the ATen ops' own (self) CPU time, so the path runs in tests.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# First match wins: attention before matmul (CUTLASS attention kernels say "cutlass"), inductor's fused kernels
# before copies (their names list the ops they fuse, `_to_copy` among them), copies before the optimizer's
# multi-tensor kernels (FSDP2 copies parameters in with a multi-tensor `Copy`). Patterns are lower-case substrings
# of kernel or ATen op names.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("collective", ("nccl", "c10d::", "gloo", "all_gather", "reduce_scatter", "allreduce")),
    ("attention", ("flash", "fmha", "attention", "attn")),
    (
        "matmul",
        (
            "gemm",
            "nvjet",
            "xmma",
            "cutlass",
            "cublas",
            "wgmma",
            "triton_tem",
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::baddbmm",
            "aten::_addmm_activation",
        ),
    ),
    ("inductor", ("triton_", "compiledfunction", "torch-compiled region")),
    ("copy", ("memcpy", "memset", "copy", "aten::clone", "aten::cat")),
    ("optimizer", ("adam", "multi_tensor_apply", "_foreach_")),  # and gradient clipping's norms and scaling
)
OTHER = "other"  # ATen's elementwise, reduction, norm, index kernels launched one by one
HOST = "host"  # CPU time outside ATen's kernels: autograd nodes, tensor-subclass (DTensor) dispatch, Python
ALL_KINDS = tuple(kind for kind, _ in KINDS) + (OTHER, HOST)


def kind_of(name: str, on_host: bool = False) -> str:
    """The kind of a kernel (or, `on_host`, of a profiled CPU event, where what is no ATen op and no known kind
    is `host` work), from its name (`KINDS`)."""
    lowered = name.lower()
    kind = next((kind for kind, patterns in KINDS if any(p in lowered for p in patterns)), OTHER)
    return HOST if on_host and kind == OTHER and not name.startswith("aten::") else kind


def _is_annotation(event: Any) -> bool:
    """A range the profiler draws on the device's timeline for a `record_function` scope (DDP's forward, a step's
    marker): it spans the kernels launched inside it and is no kernel, so counting it would add its whole span to
    the busy time and a launch of kind `other` (a profile of a DDP step lists `DistributedDataParallel.forward`,
    as long as the whole forward)."""
    return bool(event.is_user_annotation)


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of `(start, end)` intervals: time the device was busy, overlaps counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _costliest(times: dict[str, list[float]], units: int, top: int, on_host: bool) -> list[dict[str, Any]]:
    ranked = sorted(times.items(), key=lambda item: -sum(item[1]))[:top]
    return [
        {
            "name": name[:120],
            "kind": kind_of(name, on_host),
            "ms": round(sum(t) / 1e3 / units, 3),
            "n": len(t) / units,
        }
        for name, t in ranked
    ]


def summarize(
    events: Iterable[Any], units: int, wall_s: float, on_device: bool, top: int = 10
) -> dict[str, Any]:
    """Per unit (step, request): wall and device-busy ms, ms and count by kind, and the `top` costliest kernels.
    On CPU the kinds and the top are the CPU events' own (self) time; on a GPU the host's costliest events are
    listed too (`host_top`: where a launch-bound step's CPU time goes)."""
    device_times: dict[str, list[float]] = {}
    host_times: dict[str, list[float]] = {}
    intervals = []
    for event in events:
        if event.device_type == DeviceType.CUDA and not _is_annotation(event):
            start, end = event.time_range.start, event.time_range.end
            intervals.append((start, end))
            device_times.setdefault(event.name, []).append(end - start)
        elif event.device_type == DeviceType.CPU and event.self_cpu_time_total > 0:
            host_times.setdefault(event.name, []).append(event.self_cpu_time_total)
    times = device_times if on_device else host_times
    kinds = {kind: [0.0, 0] for kind in ALL_KINDS}
    for name, spans in times.items():
        entry = kinds[kind_of(name, not on_device)]
        entry[0] += sum(spans)
        entry[1] += len(spans)
    wall_ms = 1e3 * wall_s / units
    busy_ms = union_us(intervals) / 1e3 / units if on_device else None
    summary = {
        "units": units,
        "wall_ms": round(wall_ms, 2),
        "device_busy_ms": None if busy_ms is None else round(busy_ms, 2),
        "device_idle_pct": None if busy_ms is None else round(100 * max(0.0, 1 - busy_ms / wall_ms), 1),
        "launches": round(sum(n for kind, (_, n) in kinds.items() if kind != HOST) / units, 1),
        "ms_by_kind": {kind: round(t / 1e3 / units, 2) for kind, (t, _) in kinds.items()},
        "launches_by_kind": {kind: round(n / units, 1) for kind, (_, n) in kinds.items()},
        "top": _costliest(times, units, top, not on_device),
    }
    if on_device:
        summary["host_top"] = _costliest(host_times, units, top, True)
    return summary


# What `torch.cuda.set_sync_debug_mode("warn")` says at each call that waits for the device. Its other warning,
# that the mode is a prototype, comes once per process and is no sync (counting it would put a phantom sync in the
# first row of every `bench_gpu.py` run).
SYNC_WARNING = "called a synchronizing CUDA operation"


def cuda_syncs(fn: Callable[[], Any]) -> list[str]:
    """The calls in `fn` that made the host wait for a CUDA device, one warning text each (none on a machine
    without CUDA, where nothing waits for a device; `fn` runs either way)."""
    if not torch.cuda.is_available():
        fn()
        return []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [str(w.message) for w in caught if SYNC_WARNING in str(w.message)]


class ProfileWindow:
    """A stretch of work on `device` under the profiler, the device synchronised at both ends so that the window
    holds exactly that work (what `bench_gpu.py --profile` and training's `--profile.*` both profile)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on_device = device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_device else [])
        self.profiler = profile(activities=activities)
        self.started = 0.0

    def start(self) -> None:
        self._sync()
        self.profiler.start()
        self.started = time.perf_counter()

    def stop(self, units: int) -> dict[str, Any]:
        """End the window (the profiler stops even if the sync fails) and `summarize` it per unit of work."""
        try:
            self._sync()
        finally:
            wall_s = time.perf_counter() - self.started
            self.profiler.stop()
        return summarize(self.profiler.events(), units, wall_s, self.on_device)

    def _sync(self) -> None:
        if self.on_device:
            torch.cuda.synchronize(self.device)


def profile_run(
    fn: Callable[[], Any], units: int, device: torch.device, trace: Path | None = None
) -> dict[str, Any]:
    """Run `fn` once under the profiler (after the caller's warm-up) and `summarize` it per unit of work (`fn`
    does `units` steps or requests); `trace` also writes the Chrome trace there (open it in Perfetto)."""
    window = ProfileWindow(device)
    window.start()
    fn()
    summary = window.stop(units)
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        window.profiler.export_chrome_trace(str(trace))
    return summary


def format_profile(label: str, summary: dict[str, Any], unit: str = "step") -> str:
    """A few lines for a terminal: busy / idle, ms by kind, the costliest kernels."""
    busy = summary["device_busy_ms"]
    head = f"  profile {label}: {summary['wall_ms']:.1f} ms per {unit}"
    if busy is not None:
        head += f", device busy {busy:.1f} ms (idle {summary['device_idle_pct']:.1f} %)"
    head += f", {summary['launches']:.0f} {'kernels' if busy is not None else 'ATen calls'} per {unit}"
    kinds = ", ".join(
        f"{kind} {ms:.1f} ms / {summary['launches_by_kind'][kind]:.0f}"
        for kind, ms in summary["ms_by_kind"].items()
        if ms > 0 or summary["launches_by_kind"][kind] > 0
    )
    lines = [head, f"    by kind (ms / count): {kinds}", *_rows(summary["top"])]
    if "host_top" in summary:
        lines += ["    host (CPU self time):", *_rows(summary["host_top"])]
    return "\n".join(lines)


def _rows(top: list[dict[str, Any]]) -> list[str]:
    return [f"    {t['ms']:9.3f} ms  x{t['n']:<7g} {t['kind']:<10} {t['name']}" for t in top]
