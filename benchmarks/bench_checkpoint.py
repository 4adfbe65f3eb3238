"""Checkpoint cost under FSDP2: sharded DCP checkpoints (`CheckpointManager`) vs the old single file on rank 0.

    python benchmarks/bench_checkpoint.py [--sizes tiny,big] [--nproc 2] [--repeats 3] [--work_dir DIR]

Two models: `tiny` (the `tiny-vit+tiny-llama` preset) and `big` (the tiny ViT and tokenizer with a 20 x 1024 Llama,
intermediate 4096, random init, ~340M parameters: ~1.4 GB of FP32 weights plus ~2.7 GB of AdamW moments), set up as
training does (`freeze_backbones("vla-full-train")`, FSDP2 full-shard on a CPU mesh, AdamW + constant schedule,
one optimizer step so the moments exist). Each method runs in fresh `torchrun --nproc-per-node N` processes (gloo),
one for saving and one for loading (as a resume does), so the two never share an allocator or a high-water mark:

- sharded: `CheckpointManager.save(..., blocking=True)`; an async manager's `save(..., blocking=False)` (the loop
           stalls until it returns) then `wait()` (written); `CheckpointManager.load(...)`. Every rank writes and
           reads its own ~1/N of the state.
- single:  the pre-DCP path, reproduced below: every rank takes the full model and optimizer state dicts
           (`full_state_dict=True, cpu_offload=True`: gathered onto rank 0), rank 0 alone `torch.save`s them
           (temp file + fsync + rename), barrier; loading `torch.load(mmap=True)`s the whole file on every rank
           and lets `set_*_state_dict(full_state_dict=True)` keep each rank's shard. There was no async variant.

Times are medians over `--repeats` (each save into a new folder / file; each load after zeroing the weights and
moments, the restored values then checked against the saving process's checksum). Peak RSS is per rank: VmHWM is
reset (`/proc/self/clear_refs`) just before each operation and read when it returns, minus the rank's RSS once set
up (the floor: weights, moments, code). For saves the highest over the repeats (memory an earlier save left
allocated counts: training saves again and again); for loads the first (a resume loads once). Both writers fsync;
loads then read from the page cache. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memory import reset_peak, status_bytes

if TYPE_CHECKING:
    import torch

    from prismatic.models.vlms.prismatic import PrismaticVLM

REPO = Path(__file__).resolve().parents[1]
GB = 1e9
STAGE = "vla-full-train"
SIZES = ("tiny", "big")
METHODS = ("sharded", "single")
# The big LLM: 20 x 1024, intermediate 4096, 16 heads -> ~336M in the decoder alone.
BIG_LLM = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 20, "num_attention_heads": 16}


# === Memory readings ==============================================================================================


def _measure(fn: Callable[[], Any]) -> dict[str, float]:
    """Run `fn` on every rank at once (barrier first); its seconds and this rank's VmHWM during it."""
    import torch.distributed as dist

    dist.barrier()
    reset_peak()
    start = time.perf_counter()
    fn()
    return {"seconds": time.perf_counter() - start, "peak": status_bytes("VmHWM")}


# === The model, as training sets it up ===========================================================================


def build_bench_vlm(size: str) -> PrismaticVLM:
    """`tiny`: the registry's tiny preset; `big`: its ViT and tokenizer with the `BIG_LLM` Llama (random init)."""
    from transformers import LlamaConfig

    from prismatic.models import build_vlm
    from prismatic.models.materialize import VLMArchitecture, build_vlm_from_spec
    from prismatic.models.registry import get_base_vlm_spec

    if size == "tiny":
        return build_vlm("tiny-vit+tiny-llama")
    config = LlamaConfig(
        **BIG_LLM,
        num_key_value_heads=BIG_LLM["num_attention_heads"],
        vocab_size=1024,  # resized to the tiny tokenizer's length (a multiple of 64) by the LLM backbone
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
    )
    return build_vlm_from_spec(
        VLMArchitecture("bench-checkpoint-big", get_base_vlm_spec("tiny-vit+tiny-llama"), llm_config=config)
    )


def set_up_training(
    size: str, world_size: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, dict[str, int]]:
    """Sharded model, AdamW and schedule after one optimizer step (so the moments exist), as `train.py` has them."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from prismatic.models.parallelize import apply_fsdp
    from prismatic.training.optim import build_lr_scheduler, build_optimizer

    torch.manual_seed(0)
    vlm = build_bench_vlm(size)
    vlm.freeze_backbones(STAGE)
    mesh = init_device_mesh("cpu", (world_size,))
    model = apply_fsdp(vlm, mesh, MixedPrecisionPolicy(), reshard_after_forward=True)
    optimizer = build_optimizer(model, 1e-4, 0.0)
    lr_scheduler = build_lr_scheduler(optimizer, "constant", 100, 0.0)
    # Gradients set by hand: a forward / backward pass would change nothing a checkpoint holds, only set-up time.
    for param in model.parameters():
        if param.requires_grad:
            param.grad = param.detach() * 1e-3
    optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer, lr_scheduler, {"step": 1, "epoch": 0, "frames": 0}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor a checkpoint restores: parameters and optimizer state (DTensors where sharded)."""
    tensors = list(model.parameters())
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if hasattr(v, "numel")]
    return tensors


def _checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    return sum(float(_local(t).double().sum()) for t in _state_tensors(model, optimizer))


def _scramble(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Zero weights and moments, so a load that restores nothing fails the checksum."""
    import torch

    with torch.no_grad():
        for t in _state_tensors(model, optimizer):
            _local(t).zero_()


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Model and optimizer state: logical (what a full gather holds) and this rank's shards."""
    params = list(model.parameters())
    moments = _state_tensors(model, optimizer)[len(params) :]

    def size(ts: list[torch.Tensor], local: bool) -> int:
        return sum((_local(t) if local else t).numel() * t.element_size() for t in ts)

    return {
        "num_params": sum(p.numel() for p in params),
        "model": size(params, False),
        "optimizer": size(moments, False),
        "model_local": size(params, True),
        "optimizer_local": size(moments, True),
    }


# === The old single-file path (before sharded checkpoints) =====================================================


def save_single_file(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    train_state: dict[str, Any],
    path: Path,
    rank: int,
) -> None:
    """The pre-DCP save: full state gathered onto rank 0, which writes it alone. Collective."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from prismatic.training.checkpointing import atomic_torch_save

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 keeps it; the others get {}
    model_sd = get_model_state_dict(model, options=options)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=options)
    if rank == 0:
        payload = {
            "model": model_sd,
            "optimizer": optim_sd,
            "lr_scheduler": lr_scheduler.state_dict(),
            "train_state": train_state,
        }
        atomic_torch_save(payload, path)  # temp file beside it, fsync, rename: what the old save used
    del model_sd, optim_sd
    dist.barrier()


def load_single_file(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    path: Path,
) -> None:
    """The pre-DCP resume: every rank maps the whole file and keeps its own shards. Collective."""
    import torch
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    set_model_state_dict(model, ckpt["model"], options=StateDictOptions(full_state_dict=True, strict=True))
    set_optimizer_state_dict(
        model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True)
    )
    lr_scheduler.load_state_dict(ckpt["lr_scheduler"])


# === One method, one torchrun per phase ==========================================================================


def _folder_files(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def _drop(path: Path, rank: int) -> None:
    """Rank 0 deletes a checkpoint outside the timed region (disk space); collective."""
    import torch.distributed as dist

    if rank == 0:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    dist.barrier()


def _save_phase(
    method: str,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    counters: dict[str, int],
    repeats: int,
    work_dir: Path,
) -> dict[str, Any]:
    """Blocking saves (then, sharded only, async saves); keeps the last blocking checkpoint for the load phase."""
    from prismatic.training.checkpointing import CheckpointManager, training_state

    saves, async_saves, last = [], [], None
    if method == "sharded":
        state = training_state(model, optimizer, lr_scheduler, counters)
        kwargs = {"save_interval": 1, "keep_last": None, "rank": rank}
        blocking = CheckpointManager(work_dir / "blocking", async_save=False, **kwargs)
        background = CheckpointManager(work_dir / "async", async_save=True, **kwargs)
        for step in range(1, repeats + 1):
            saves.append(
                _measure(lambda s=step: blocking.save(state, {"step": s, "epoch": 0}, blocking=True))
            )
            if last is not None:
                _drop(last, rank)
            last = blocking.last_saved
        rss_after_saves = status_bytes("VmRSS")
        for step in range(1, repeats + 1):
            stalled: list[float] = []

            def save_async(s: int = step, stalled: list[float] = stalled) -> None:
                start = time.perf_counter()
                background.save(state, {"step": s, "epoch": 0}, blocking=False)
                stalled.append(time.perf_counter() - start)  # the loop would carry on from here
                background.wait()

            async_saves.append({**_measure(save_async), "stalled": stalled[0]})
            _drop(background.last_saved, rank)
        files = _folder_files(last)
    else:
        for step in range(1, repeats + 1):
            path = work_dir / f"step-{step:06d}.pt"
            train_state = {"step": step, "epoch": 0}
            saves.append(
                _measure(
                    lambda p=path, t=train_state: save_single_file(model, optimizer, lr_scheduler, t, p, rank)
                )
            )
            if last is not None:
                _drop(last, rank)
            last = path
        rss_after_saves = status_bytes("VmRSS")
        files = {last.name: last.stat().st_size}
    return {
        "save": saves,
        "async_save": async_saves,
        "files": files if rank == 0 else {},
        "checkpoint": str(last),
        "rss_after_saves": rss_after_saves,
    }


def _load_phase(
    method: str,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    counters: dict[str, int],
    repeats: int,
    checkpoint: Path,
    expected: float,
) -> dict[str, Any]:
    """Resume from the save phase's checkpoint `repeats` times, zeroing weights and moments before each."""
    from prismatic.training.checkpointing import CheckpointManager, training_state

    if method == "sharded":
        state = training_state(model, optimizer, lr_scheduler, counters)
        manager = CheckpointManager(
            checkpoint.parent.parent, save_interval=1, keep_last=None, async_save=False, rank=rank
        )

    def load() -> None:
        if method == "sharded":
            manager.load(checkpoint, state, same_world_size=True)
        else:
            load_single_file(model, optimizer, lr_scheduler, checkpoint)

    loads, restored = [], True
    for _ in range(repeats):
        _scramble(model, optimizer)
        # The set-up is seeded like the saving one: only zeroed state shows that the load restored anything.
        restored &= _checksum(model, optimizer) == 0.0
        loads.append(_measure(load))
        restored &= abs(_checksum(model, optimizer) - expected) <= 1e-9 * max(1.0, abs(expected))
    return {"load": loads, "restored": restored}


def worker(phase: str, method: str, size: str, repeats: int, work_dir: Path, out_dir: Path) -> None:
    """One rank of one method and phase (save, or load in fresh processes as a resume does): set up, measure,
    write this rank's figures as JSON. The load phase reads the save phase's checkpoint and checksums."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer, lr_scheduler, counters = set_up_training(size, world)
    result: dict[str, Any] = {
        "rank": rank,
        "state": _state_bytes(model, optimizer),
        "floor": status_bytes("VmRSS"),
        "peak_reset": reset_peak(),
    }
    args = (method, rank, model, optimizer, lr_scheduler, counters, repeats)
    if phase == "save":
        result["checksum"] = _checksum(model, optimizer)
        result.update(_save_phase(*args, work_dir))
    else:
        saved = json.loads((out_dir / f"{method}-save-rank{rank}.json").read_text())
        result.update(_load_phase(*args, Path(saved["checkpoint"]), saved["checksum"]))
    (out_dir / f"{method}-{phase}-rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _launch(
    phase: str, method: str, size: str, args: argparse.Namespace, tmp: Path
) -> tuple[list[dict], float]:
    """One fresh `torchrun` for one phase of one method; its per-rank results and the launch's wall time."""
    work_dir, out_dir = tmp / f"{size}-{method}", tmp / f"{size}-results"
    work_dir.mkdir(exist_ok=True)
    out_dir.mkdir(exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(args.nproc),
        __file__,
        "--_phase",
        phase,
        "--_method",
        method,
        "--_size",
        size,
        "--repeats",
        str(args.repeats),
        "--_work",
        str(work_dir),
        "--_out",
        str(out_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{size} / {method} / {phase} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    if phase == "load":
        shutil.rmtree(work_dir, ignore_errors=True)
    ranks = [json.loads((out_dir / f"{method}-{phase}-rank{r}.json").read_text()) for r in range(args.nproc)]
    return ranks, wall


# === Report ========================================================================================================


def _figures(ranks: list[dict[str, Any]], op: str) -> dict[str, list]:
    """Per rank: median seconds (and stall); peak RSS above the set-up floor: the highest over the repeats for
    saves (training saves again and again), the first for loads (a resume loads once, into a fresh process)."""
    peaks = [[m["peak"] - r["floor"] for m in r[op]] for r in ranks]
    out = {
        "seconds": [statistics.median(m["seconds"] for m in r[op]) for r in ranks],
        "peak_above_setup": [p[0] if op == "load" else max(p) for p in peaks],
        "peaks_above_setup_per_repeat": peaks,
    }
    if op == "async_save":
        out["stalled"] = [statistics.median(m["stalled"] for m in r[op]) for r in ranks]
    return out


def _bytes(n: float) -> str:
    return f"{n / GB:.2f} GB" if abs(n) >= 1e8 else f"{n / 1e6:.1f} MB"


def _secs(s: float) -> str:
    return f"{s:.3f} s" if s < 10 else f"{s:.1f} s"


def _report(
    size: str, runs: dict[tuple[str, str], list[dict[str, Any]]], walls: dict[tuple[str, str], float]
) -> dict:
    """Print one size's table; return its figures for the JSON line."""
    nproc = len(runs["sharded", "save"])
    st = runs["sharded", "save"][0]["state"]
    full = st["model"] + st["optimizer"]
    local = [r["state"]["model_local"] + r["state"]["optimizer_local"] for r in runs["sharded", "save"]]
    print(
        f"\n== {size}: {st['num_params'] / 1e6:.1f}M parameters; state = model {_bytes(st['model'])} + AdamW "
        f"{_bytes(st['optimizer'])} = {_bytes(full)} (FP32); ranks hold "
        + " / ".join(_bytes(b) for b in local)
        + " =="
    )
    print(
        "   single file: all of it is gathered onto rank 0, which writes it alone; sharded: each rank writes its own"
    )
    figures = {
        m: {
            "save": _figures(runs[m, "save"], "save"),
            **(
                {"async_save": _figures(runs[m, "save"], "async_save")}
                if runs[m, "save"][0]["async_save"]
                else {}
            ),
            "load": _figures(runs[m, "load"], "load"),
            "setup_floor": [r["floor"] for r in runs[m, "save"]],
            "kept_after_saves": [r["rss_after_saves"] - r["floor"] for r in runs[m, "save"]],
            "restored": all(r["restored"] for r in runs[m, "load"]),
        }
        for m in METHODS
    }
    width = 14
    print(f"{'':<38}" + "".join(f"{f'{m} r{r}':>{width}}" for m in METHODS for r in range(nproc)))

    def row(label: str, get: Callable[[dict], list[float] | None], fmt: Callable[[float], str]) -> None:
        cells = ""
        for m in METHODS:
            values = get(figures[m])
            cells += "".join(f"{fmt(v) if values else '-':>{width}}" for v in (values or [0.0] * nproc))
        print(f"{label:<38}{cells}")

    row("blocking save", lambda f: f["save"]["seconds"], _secs)
    row("async save: loop stalled", lambda f: f.get("async_save", {}).get("stalled"), _secs)
    row("async save: until written (wait)", lambda f: f.get("async_save", {}).get("seconds"), _secs)
    row("load / resume (fresh processes)", lambda f: f["load"]["seconds"], _secs)
    row("RSS after set-up (floor)", lambda f: f["setup_floor"], _bytes)
    row("peak RSS above floor: blocking save", lambda f: f["save"]["peak_above_setup"], _bytes)
    row("peak RSS above floor: async save", lambda f: f.get("async_save", {}).get("peak_above_setup"), _bytes)
    row("RSS kept after the blocking saves", lambda f: f["kept_after_saves"], _bytes)
    row("peak RSS above floor: 1st load", lambda f: f["load"]["peak_above_setup"], _bytes)

    files = runs["sharded", "save"][0]["files"]
    rank_files = [sum(n for f, n in files.items() if f.startswith(f"__{r}_")) for r in range(nproc)]
    sharded_total, single_total = sum(files.values()), sum(runs["single", "save"][0]["files"].values())
    print(
        f"{'bytes on disk':<38}sharded {_bytes(sharded_total)}: "
        + ", ".join(f"rank {r} file {_bytes(n)}" for r, n in enumerate(rank_files))
        + f", rest {_bytes(sharded_total - sum(rank_files))} (.metadata, train_state.json)"
    )
    print(f"{'':<38}single file {_bytes(single_total)}, all written by rank 0")
    print(
        f"{'restored state matches (checksum)':<38}"
        + ", ".join(f"{m} {'yes' if figures[m]['restored'] else 'NO'}" for m in METHODS)
    )
    print(
        f"{'launch wall (set-up included)':<38}"
        + ", ".join(f"{m} {p} {walls[m, p]:.0f} s" for m in METHODS for p in ("save", "load"))
    )
    return {
        "num_params": st["num_params"],
        "state_bytes": full,
        "state_bytes_per_rank": local,
        "sharded_bytes": sharded_total,
        "sharded_rank_file_bytes": rank_files,
        "single_bytes": single_total,
        **figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (processes) per torchrun")
    parser.add_argument("--repeats", type=int, default=3, help="saves / loads per method (medians reported)")
    parser.add_argument(
        "--work_dir", type=Path, default=None, help="where checkpoints go (default: a temp dir)"
    )
    parser.add_argument("--_phase", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_method", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_size", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_work", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._phase is not None:
        worker(args._phase, args._method, args._size, args.repeats, args._work, args._out)
        return

    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or not sizes:
        raise ValueError(f"--sizes {args.sizes}: unknown {unknown}; valid: {', '.join(SIZES)}.")
    if args.nproc < 2 or args.repeats < 1:
        raise ValueError(f"--nproc {args.nproc} / --repeats {args.repeats}: need >= 2 ranks and >= 1 repeat.")

    print(
        f"bench-checkpoint: FSDP2 full-shard on CPU (gloo), {args.nproc} ranks, stage {STAGE}; times: medians of "
        f"{args.repeats}; save peaks: highest of {args.repeats}; load peaks: the first load (a resume loads once)"
    )
    summary: dict[str, Any] = {"bench": "checkpoint", "nproc": args.nproc, "repeats": args.repeats}
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        for size in sizes:
            runs, walls = {}, {}
            for method in METHODS:
                for phase in ("save", "load"):
                    runs[method, phase], walls[method, phase] = _launch(phase, method, size, args, Path(tmp))
            summary[size] = _report(size, runs, walls)
            if not all(r["peak_reset"] for ranks in runs.values() for r in ranks):
                print("note: the kernel refused to reset VmHWM; peaks include the set-up peak")
    print(
        "\nfloor: a rank's RSS once set up (weights, moments, code); peak above floor: VmHWM during the operation "
        "(reset just before it) minus that floor (saves: highest of the repeats, so memory an earlier save left "
        "allocated counts; loads: the first); the single-file load's mmap'd pages count too"
    )
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
