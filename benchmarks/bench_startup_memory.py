"""Peak host memory per rank while FSDP2 training sets up: every rank loading the full model (today's path) vs rank 0
loading it and the other ranks building on the meta device, filled from rank 0 after sharding
(`prismatic.models.distributed_init`).

    python benchmarks/bench_startup_memory.py [--hidden 1024] [--layers 26] [--nproc 2]

The model is the tiny ViT and tokenizer with a `--layers` x `--hidden` Llama (random init, ~338M parameters = 1.35
GB in FP32 by default), registered here as a benchmark-only base VLM so both paths build it by id. Each path runs
in its own `torchrun --nproc-per-node N` on CPU (gloo), fresh processes so high-water marks don't mix:

- today:  every rank `load(id)` -> `freeze_backbones` -> `apply_fsdp`;
- rank0:  `load_on_rank0(id)` -> `freeze_backbones` -> `full_state_on_rank0` -> `apply_fsdp` ->
          `materialize_from_rank0`.

Per rank: the floor is the RSS after imports and a tiny warm-up load (code, tokenizer, allocator arenas), where the
high-water mark is reset (`/proc/self/clear_refs`; where the kernel refuses, VmHWM keeps the import-time peak,
which the floor does not exceed in practice); the peak is VmHWM when set-up returns. The target: rank 1's peak
<= floor + 0.6 x the FP32 model. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memory import reset_peak, status_bytes

REPO = Path(__file__).resolve().parents[1]
GB = 1e9
BENCH_ID = "bench-vit+llama"
STAGE = "vla-full-train"
TARGET = 0.6


def _register(hidden: int, layers: int) -> None:
    """The benchmark model as a registry id, so `load(id, device="meta")` builds it on ranks != 0."""
    from prismatic.models.backbones.llm.prompting.base_prompter import PurePromptBuilder
    from prismatic.models.backbones.llm.registry import LLMBackboneSpec, register_llm_backbone
    from prismatic.models.registry import BaseVLMSpec, register_base_vlm

    config = {
        "hidden_size": hidden,
        "intermediate_size": int(hidden * 2.75) // 64 * 64,  # ~Llama-2's ratio (4096 -> 11008)
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": hidden // 64,
        "max_position_embeddings": 256,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    spec = LLMBackboneSpec(
        "llama2", PurePromptBuilder, config=config, tokenizer_source="tiny", max_length=256
    )
    register_llm_backbone("bench-llama", spec, replace=True)
    register_base_vlm(
        BENCH_ID, BaseVLMSpec("tiny-vit-64px", "bench-llama", "gelu-mlp", "resize-naive"), replace=True
    )


def _worker(mode: str, hidden: int, layers: int, out_dir: Path) -> None:
    """One rank of one path: set up the sharded model, write this rank's figures as JSON."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint.state_dict  # noqa: F401  (what materializing imports: in the floor)
    from torch.distributed.device_mesh import init_device_mesh

    from prismatic.models import load
    from prismatic.models.distributed_init import full_state_on_rank0, load_on_rank0, materialize_from_rank0
    from prismatic.models.parallelize import apply_fsdp, mixed_precision_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    _register(hidden, layers)
    load("tiny-vit+tiny-llama").freeze_backbones(STAGE)  # imports and one-time set-up belong to the floor
    dist.barrier()
    reset = reset_peak()
    floor = status_bytes("VmRSS")

    times = [time.perf_counter()]
    torch.manual_seed(0)
    vlm = load(BENCH_ID) if mode == "today" else load_on_rank0(BENCH_ID)
    vlm.freeze_backbones(STAGE)
    times.append(time.perf_counter())
    model_bytes = sum(p.numel() * 4 for p in vlm.parameters())
    num_params = sum(p.numel() for p in vlm.parameters())
    full = full_state_on_rank0(vlm) if mode == "rank0" else None
    model = apply_fsdp(vlm, mesh, mixed_precision_policy(False, True), reshard_after_forward=True)
    times.append(time.perf_counter())
    if mode == "rank0":
        materialize_from_rank0(model, full, "cpu")
        del full
    times.append(time.perf_counter())
    peak = status_bytes("VmHWM")
    # Same seed, same shards whichever path built them: a checksum of this rank's shards.
    with torch.no_grad():
        local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]  # ignored: whole
        checksum = sum(float(t.double().sum()) for t in local)
    dist.barrier()
    result = {
        "rank": rank,
        "floor": floor,
        "peak": peak,
        "rss_end": status_bytes("VmRSS"),
        "model_bytes": model_bytes,
        "num_params": num_params,
        "seconds": [b - a for a, b in zip(times, times[1:], strict=False)],
        "peak_reset": reset,
        "checksum": checksum,
    }
    (out_dir / f"{mode}-rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(mode: str, args: argparse.Namespace, out_dir: Path) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(args.nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{_free_port()}",
        __file__,
        "--_worker",
        mode,
        "--hidden",
        str(args.hidden),
        "--layers",
        str(args.layers),
        "--_out",
        str(out_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"path '{mode}' failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return [json.loads((out_dir / f"{mode}-rank{rank}.json").read_text()) for rank in range(args.nproc)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=1024, help="LLM width")
    parser.add_argument("--layers", type=int, default=26, help="LLM decoder layers")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (processes) per path")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker is not None:
        _worker(args._worker, args.hidden, args.layers, args._out)
        return

    with tempfile.TemporaryDirectory() as tmp:
        results = {mode: _run(mode, args, Path(tmp)) for mode in ("today", "rank0")}
    first = results["today"][0]
    model = first["model_bytes"]
    print(
        f"model: {first['num_params'] / 1e6:.1f}M parameters = {model / GB:.2f} GB in FP32 (LLM {args.layers} x "
        f"{args.hidden}); {args.nproc} ranks, FSDP2 full-shard on CPU (gloo)"
    )
    print(
        f"{'path':<7}{'rank':>5}{'floor GB':>10}{'peak GB':>9}{'peak-floor GB':>15}{'x model':>9}"
        f"{'end RSS GB':>12}   set-up s (load + shard + materialize)"
    )
    for mode, ranks in results.items():
        for r in ranks:
            above = r["peak"] - r["floor"]
            print(
                f"{mode:<7}{r['rank']:>5}{r['floor'] / GB:>10.2f}{r['peak'] / GB:>9.2f}{above / GB:>15.2f}"
                f"{above / model:>9.2f}{r['rss_end'] / GB:>12.2f}   {sum(r['seconds']):.1f} = "
                + " + ".join(f"{t:.1f}" for t in r["seconds"])
            )
    same = all(
        abs(a["checksum"] - b["checksum"]) <= 1e-6 * max(1.0, abs(a["checksum"]))
        for a, b in zip(results["today"], results["rank0"], strict=True)
    )
    print(f"same shards on every rank in both paths (checksum): {'yes' if same else 'NO'}")
    if not all(r["peak_reset"] for ranks in results.values() for r in ranks):
        print("note: the kernel refused to reset VmHWM; peaks include the import-time peak")
    r1 = results["rank0"][1]
    ratio = (r1["peak"] - r1["floor"]) / model
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"target rank 1 peak <= floor + {TARGET} x model: {verdict} ({ratio:.2f} x model)")


if __name__ == "__main__":
    main()
