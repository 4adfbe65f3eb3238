"""`HostReads`: records, on CPU, every call that would make the host wait for a CUDA device, by where it is made.

On a GPU the host runs ahead of the device, queueing kernels; a call that reads a device value on the host
(`.item()`, `bool(tensor)`, `.tolist()`, `.cpu()`, `nonzero` and boolean indexing, `unique`, ...) drains that
queue and leaves the GPU idle while Python catches up. On CPU nothing waits, but the same calls are made, so a
recorder at torch's two Python layers (`__torch_function__` for tensor methods, `__torch_dispatch__` for ATen ops,
backward included) sees every one. `benchmarks/bench_gpu.py` counts the syncs themselves on a GPU
(`torch.cuda.set_sync_debug_mode`). Used by tests/training/test_host_syncs.py and
tests/inference/test_decode_host_syncs.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

TORCH_DIR = str(Path(torch.__file__).parent)
# ATen ops that read a device value on the host (on CUDA each waits for the queue).
READING_OPS = {
    "_local_scalar_dense",  # .item(), float(t), int(t), bool(t)
    "item",  # .item() under inference mode, where torch dispatches it undecomposed
    "is_nonzero",  # bool(t) of some ops' results
    "nonzero",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_consecutive",
    "unique_dim",
    "equal",
}
READING_METHODS = {"tolist", "cpu"}  # tensor methods whose host copy torch does not dispatch on CPU


def _site() -> str:
    """`file:function` of the innermost caller outside torch and this recorder."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(TORCH_DIR) and name != __file__:
            return f"{Path(name).name}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _bool_index(args: Any) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], list | tuple) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


def _to_host(args: Any, kwargs: dict) -> bool:
    """`.to("cpu")` spelled out: a `torch.device` argument is the model's own device here (`x.to(y.device)`)."""
    return "cpu" in (*args[1:], kwargs.get("device"))


class HostReads:
    """Context recording `reads`, `(what, where)` for each host read, `ops`, the name of every ATen op run, and
    `read_at`, how many ops ran before each read."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, str]] = []
        self.read_at: list[int] = []
        self.ops: list[str] = []
        recorder = self

        class Methods(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = getattr(func, "__name__", "")
                if name in READING_METHODS or (name == "to" and _to_host(args, kwargs)):
                    recorder._record(name)
                return func(*args, **kwargs)

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if name in READING_OPS or (name.startswith("index") and _bool_index(args)):
                    recorder._record(name)
                elif name == "repeat_interleave" and "Tensor" in func._overloadname:  # tensor repeats
                    if (kwargs or {}).get("output_size") is None:  # (the output's size is read from them)
                        recorder._record(name)
                recorder.ops.append(name)
                return func(*args, **(kwargs or {}))

        self._modes = [Methods(), Ops()]

    def _record(self, what: str) -> None:
        self.reads.append((what, _site()))
        self.read_at.append(len(self.ops))

    @property
    def sites(self) -> list[str]:
        return [site for _, site in self.reads]

    def __enter__(self) -> HostReads:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def paused(self, fn: Callable) -> Callable:
        """`fn` run with the recorder off: for host-side work the code under test does on host copies by design,
        which on CPU would look like device reads."""

        def run(*args: Any, **kwargs: Any) -> Any:
            self.__exit__(None, None, None)
            try:
                return fn(*args, **kwargs)
            finally:
                self.__enter__()

        return run
