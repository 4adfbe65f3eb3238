"""Two ranks on two GPUs (skipped on a machine with fewer): `torchrun --nproc-per-node 2` of this file, whose
`__main__` is the worker. Each rank joins NCCL through training's `init_distributed`, all-reduces its rank, and takes
one FSDP2 + bf16 step through the strategy on its own frames; the logged metrics are global, so both ranks must
report the same loss and gradient norm, and each shards half of every parameter.

With PRISMATIC_GPU_TESTS_ON_CPU=1 and no GPU the same run uses two CPU ranks over gloo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gpu_setup import build, micro_batches, tiny_vla, train_steps
from torch.distributed.tensor import DTensor

from prismatic.util.dist import init_distributed

pytestmark = pytest.mark.gpu

WORLD = 2
RESULT_FILE = "rank{rank}.json"
REPO = Path(__file__).resolve().parents[2]


def _worker(out_dir: Path) -> None:
    info = init_distributed()
    value = torch.tensor([float(info.rank + 1)], device=info.device)
    dist.all_reduce(value)
    built = build(tiny_vla(train_strategy="fsdp-full-shard", global_batch_size=4 * WORLD), info)
    (metrics,) = train_steps(
        built, micro_batches(built, built.strategy.grad_accumulation_steps, seed=10 * info.rank)
    )
    param = next(p for p in built.strategy.model.parameters() if isinstance(p, DTensor) and p.ndim == 2)
    result = {
        "backend": dist.get_backend(),
        "all_reduce": value.item(),
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "rows": [param.to_local().shape[0], param.shape[0]],
    }
    (out_dir / RESULT_FILE.format(rank=info.rank)).write_text(json.dumps(result))
    dist.destroy_process_group()


def test_two_ranks(device: torch.device, tmp_path: Path) -> None:
    if device.type == "cuda" and torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs, this machine has {torch.cuda.device_count()}")
    # The workers import `prismatic` from this checkout also where it is not installed (`make test-gpu PY=python3`).
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
    proc = subprocess.run(
        [*cmd, __file__, str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = [json.loads((tmp_path / RESULT_FILE.format(rank=r)).read_text()) for r in range(WORLD)]
    backend = "nccl" if device.type == "cuda" else "gloo"
    for result in results:
        assert result["backend"] == backend and result["all_reduce"] == 3.0  # 1 + 2
        assert result["rows"][0] * WORLD == result["rows"][1]  # each rank holds half the rows
    assert results[0]["loss"] == results[1]["loss"] and results[0]["grad_norm"] == results[1]["grad_norm"]
    assert torch.isfinite(torch.tensor([results[0]["loss"], results[0]["grad_norm"]])).all()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
