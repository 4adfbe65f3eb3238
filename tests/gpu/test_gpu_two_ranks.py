"""Two ranks on two GPUs (skipped on a machine with fewer): `torchrun --nproc-per-node 2` of this file, whose
`__main__` is the worker. Each rank joins NCCL through training's `init_distributed`, all-reduces its rank, and takes
one FSDP2 + bf16 step through the strategy on its own frames; the logged metrics are global, so both ranks must
report the same loss and gradient norm, and each shards half of every parameter. Then a LoRA run with the default
`--vla.train_strategy auto` and `--vla.speed.compile auto`: on two GPUs that is DDP with its blocks replayed from CUDA
graphs (as OpenVLA's LoRA fine-tuning, DDP on every GPU count), two steps on each rank's own frames; both ranks
report the loss and gradient norm that rank 0's FP32 CPU reference computes from both ranks' frames.

With PRISMATIC_GPU_TESTS_ON_CPU=1 and no GPU the same run uses two CPU ranks over gloo (and `auto` picks FSDP2).
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
from gpu_setup import (
    GRAD_NORM_RTOL,
    LOSS_RTOL,
    build,
    micro_batches,
    reference_steps,
    tiny_vla,
    train_steps,
)
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
        "lora_auto": _lora_auto(info),
    }
    (out_dir / RESULT_FILE.format(rank=info.rank)).write_text(json.dumps(result))
    dist.destroy_process_group()


def _lora_auto(info) -> dict:
    """Two steps of a LoRA run under the defaults, one micro-batch of 4 frames per rank and step; rank 0 also runs
    the FP32 CPU reference over both ranks' frames (a step's loss: the mean of the two micro-batches')."""
    vla = tiny_vla(use_lora=True, global_batch_size=4 * WORLD)
    built = build(vla, info)
    own = micro_batches(built, 2, seed=100 + 10 * info.rank)
    steps = train_steps(built, own)
    out = {
        "strategy": type(built.strategy).__name__,
        "cuda_graphs": built.strategy.cuda_graphs,
        "steps": [{"loss": m["loss"], "grad_norm": m["grad_norm"]} for m in steps],
    }
    if info.rank == 0:
        ranks = [micro_batches(built, 2, seed=100 + 10 * r) for r in range(WORLD)]
        interleaved = [ranks[r][step] for step in range(2) for r in range(WORLD)]
        out["reference"] = reference_steps(built, vla, interleaved, n_micro=WORLD)
    return out


def test_two_ranks(device: torch.device, tmp_path: Path) -> None:
    if device.type == "cuda" and torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs, this machine has {torch.cuda.device_count()}")
    # The workers import `prismatic` from this checkout also where it is not installed (`make test-gpu PY=python3`).
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
    # The LoRA phase compiles the tiny model's blocks on both GPUs (cold: a minute or more).
    proc = subprocess.run(
        [*cmd, __file__, str(tmp_path)], env=env, capture_output=True, text=True, timeout=480
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = [json.loads((tmp_path / RESULT_FILE.format(rank=r)).read_text()) for r in range(WORLD)]
    backend = "nccl" if device.type == "cuda" else "gloo"
    for result in results:
        assert result["backend"] == backend and result["all_reduce"] == 3.0  # 1 + 2
        assert result["rows"][0] * WORLD == result["rows"][1]  # each rank holds half the rows
    assert results[0]["loss"] == results[1]["loss"] and results[0]["grad_norm"] == results[1]["grad_norm"]
    assert torch.isfinite(torch.tensor([results[0]["loss"], results[0]["grad_norm"]])).all()

    lora = [result["lora_auto"] for result in results]
    on_gpus = device.type == "cuda"
    for got in lora:
        assert got["strategy"] == ("DDPStrategy" if on_gpus else "FSDPStrategy")
        assert got["cuda_graphs"] is on_gpus
    assert lora[0]["steps"] == lora[1]["steps"]  # global metrics
    for step, (got, want) in enumerate(zip(lora[0]["steps"], lora[0]["reference"], strict=True), start=1):
        assert abs(got["loss"] - want["loss"]) <= LOSS_RTOL * abs(want["loss"]), (step, got, want)
        assert abs(got["grad_norm"] - want["grad_norm"]) <= GRAD_NORM_RTOL * want["grad_norm"], (
            step,
            got,
            want,
        )


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
