"""Host-memory readings the benchmarks share: a process's current / peak RSS from /proc, and resetting the peak."""

from __future__ import annotations

from pathlib import Path


def status_bytes(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS: resident now; VmHWM: the high-water mark)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS where the kernel allows it (`clear_refs` 5); False where it refuses, and the
    peak then still holds what came before."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
