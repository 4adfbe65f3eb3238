"""Fixtures of the GPU suite (`make test-gpu`): the device, a process group of one, and a guard on heavy imports.

Every test here is marked `gpu`. With CUDA the tests run on `cuda:0`. Without it they are skipped, unless
PRISMATIC_GPU_TESTS_ON_CPU=1: then the tests whose logic also holds on CPU (the strategies' steps against the CPU
reference, the checkpoint round trip, the policy and server, the 2-rank run on gloo) run on the CPU, so the suite can
be checked on a machine without a GPU; NCCL, pinned memory and CPU offload stay skipped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from train_runs import free_port

from prismatic.util.dist import DistInfo, init_distributed

ON_CPU_ENV = "PRISMATIC_GPU_TESTS_ON_CPU"
# GPU machines may lack these and the suite must not need them (`no_heavy_imports`).
FORBIDDEN_IMPORTS = ("tensorflow", "wandb")


def on_cpu_requested() -> bool:
    return os.environ.get(ON_CPU_ENV) == "1"


@pytest.fixture(scope="session")
def device() -> torch.device:
    """`cuda:0`; the CPU when PRISMATIC_GPU_TESTS_ON_CPU=1 and there is no GPU; else the test is skipped."""
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if on_cpu_requested():
        return torch.device("cpu")
    pytest.skip(
        f"no CUDA GPU (run on one with `make test-gpu`; {ON_CPU_ENV}=1 runs the CPU-capable ones here)"
    )


@pytest.fixture(scope="session")
def cuda_device() -> torch.device:
    """`cuda:0`, or skipped: for what only exists on a GPU (NCCL, pinned host memory, CPU offload)."""
    if not torch.cuda.is_available():
        pytest.skip(
            f"needs a CUDA GPU (NCCL / pinned memory / CPU offload): not run on CPU even with {ON_CPU_ENV}=1"
        )
    return torch.device("cuda", 0)


@pytest.fixture(scope="module")
def process_group(device: torch.device) -> Iterator[DistInfo]:
    """Training's own `init_distributed` outside torchrun: a group of one (NCCL on the GPU, gloo on the CPU) on a
    free port, alone on its node; destroyed after the module (other test files build their own)."""
    if dist.is_initialized():
        pytest.fail("a process group is already initialized: a previous test module did not destroy its own")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }.items():
            mp.setenv(name, value)
        mp.setenv("MASTER_ADDR", "127.0.0.1")
        mp.setenv("MASTER_PORT", str(free_port()))
        info = init_distributed()
        try:
            assert info.device == device
            yield info
        finally:
            dist.destroy_process_group()


@pytest.fixture(autouse=True)
def no_heavy_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorFlow and W&B made unimportable during each test (unless this process already imported them): an
    import that needs them fails loudly, as on a GPU machine without them; optional ones (timm's W&B) see an
    ImportError and go on. `test_gpu_imports.py` checks the test modules' own imports the same way."""
    for name in FORBIDDEN_IMPORTS:
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, None)
