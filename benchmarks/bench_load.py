"""Peak host memory of loading an HF OpenVLA checkpoint: the old all-at-once path vs the streamed one, FP32 vs BF16.

    python benchmarks/bench_load.py [--hidden 1024] [--layers 12] [--shard_mb 100] [--work_dir DIR]

Builds a wider / deeper variant of the tiny preset (the tiny ViT and tokenizer, a Llama of `--layers` x `--hidden`
built from a config: ~620 MB in FP32 by default), exports it as several safetensors shards in FP32 and in BF16
(OpenVLA's release dtype), then loads each export once per method, each in a fresh subprocess so peaks don't mix:

- old:             build the FP32 model (random init), read every shard into one state dict, copy it in: what
                   `load_vla` did before streaming, reproduced here from the same public functions;
- streamed fp32:   `load_vla(folder)` (parameters on the meta device, one shard at a time, assigned);
- streamed bf16:   `load_vla(folder, dtype=torch.bfloat16)`.

Peak RSS above the floor is the process's high-water mark (VmHWM) when the load returns, minus its RSS just before
the load; the high-water mark is reset there (`/proc/self/clear_refs`). Before that, each process loads a tiny
checkpoint the same way, so the code the first load imports (timm, tokenizers, model classes) sits in the
floor rather than in the figure. Linux only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> int:
    """Reset the high-water mark to the current RSS (where the kernel allows it); return that RSS in bytes."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # then VmHWM still holds the import-time peak, which the floor below does not exceed in practice
    return _status_kib("VmRSS") * 1024


def build_bench_vlm(hidden: int, layers: int):
    """The tiny preset with a `layers` x `hidden` Llama (random weights, FP32)."""
    import torch
    from transformers import LlamaConfig

    from prismatic.models.materialize import VLMArchitecture, build_vlm_from_spec
    from prismatic.models.registry import BaseVLMSpec

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.6875) // 64 * 64,  # Llama-2's ratio (4096 -> 11008)
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        vocab_size=1024,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
    )
    spec = BaseVLMSpec("tiny-vit-64px", "tiny-llama", "gelu-mlp", "resize-naive")
    return build_vlm_from_spec(VLMArchitecture("bench-load", spec, llm_config=config))


def _old_load(folder: Path):
    """The pre-streaming loader: a random-init FP32 model, plus every shard read at once, copied in."""
    from prismatic.models.hf_config import hf_architecture
    from prismatic.models.hf_openvla import from_hf_state_dict
    from prismatic.models.hf_shards import read_hf_state_dict
    from prismatic.models.materialize import build_vlm_from_spec

    arch = hf_architecture(folder)
    vlm = build_vlm_from_spec(arch, pretrained_vision=False, pretrained_llm=False)
    state = from_hf_state_dict(read_hf_state_dict(folder), arch.vision_spec)
    vlm.load_state_dict(state, strict=True)
    return vlm


def measure(method: str, folder: Path, dtype: str, warmup: Path) -> dict[str, float]:
    """Run in a fresh process: load `folder` by `method`, return peak RSS above the floor and seconds."""
    import torch  # before anything that may import tensorflow

    from prismatic.models.loading import load_vla

    def run(path: Path) -> torch.nn.Module:
        return _old_load(path) if method == "old" else load_vla(path, dtype=getattr(torch, dtype)).vlm

    run(warmup)  # imports and one-time set-up belong to the floor
    floor = reset_peak()
    start = time.perf_counter()
    vlm = run(folder)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM") * 1024
    param_bytes = sum(p.numel() * p.element_size() for p in vlm.parameters())
    return {"peak_above_floor": peak - floor, "floor": floor, "seconds": seconds, "param_bytes": param_bytes}


def _run_child(method: str, folder: Path, dtype: str, warmup: Path) -> dict[str, float]:
    args = ["--_measure", method, "--_folder", str(folder), "--_dtype", dtype, "--_warmup", str(warmup)]
    proc = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"measurement {method} {folder.name} {dtype} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=1024, help="LLM width")
    parser.add_argument("--layers", type=int, default=12, help="LLM decoder layers")
    parser.add_argument("--shard_mb", type=int, default=100, help="largest safetensors shard, MB")
    parser.add_argument(
        "--work_dir", type=Path, default=None, help="where the exports go (default: a temp dir)"
    )
    parser.add_argument("--_measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_folder", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--_warmup", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args._measure is not None:
        print(json.dumps(measure(args._measure, args._folder, args._dtype, args._warmup)))
        return

    from prismatic.models import build_vlm
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import spec_of

    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        tiny = build_vlm("tiny-vit+tiny-llama")
        warmup = export_hf_openvla(
            tiny, spec_of(tiny), Path(tmp) / "warmup", norm_stats=None, dtype="float32"
        )
        vlm = build_bench_vlm(args.hidden, args.layers)
        numel = sum(p.numel() for p in vlm.parameters())
        folders = {}
        for dtype in ("float32", "bfloat16"):
            folders[dtype] = export_hf_openvla(
                vlm,
                spec_of(vlm),
                Path(tmp) / dtype,
                norm_stats=None,
                dtype=dtype,
                max_shard_size=args.shard_mb * 10**6,
            )
        del vlm
        print(
            f"model: {numel / 1e6:.1f}M parameters = {numel * 4 / MIB:.0f} MiB in FP32, {numel * 2 / MIB:.0f} MiB "
            f"in BF16; LLM {args.layers} x {args.hidden}; shards of at most {args.shard_mb} MB"
        )
        print(
            f"{'export':<10}{'shards':>7}  {'method':<16}{'peak RSS above floor':>22}{'x model':>9}{'seconds':>9}"
        )
        for export_dtype, folder in folders.items():
            shards = len(list(folder.glob("*.safetensors")))
            for method, dtype in (("old", "float32"), ("streamed", "float32"), ("streamed", "bfloat16")):
                result = _run_child(method, folder, dtype, warmup)
                label = f"{method} {'fp32' if dtype == 'float32' else 'bf16'}"
                print(
                    f"{export_dtype:<10}{shards:>7}  {label:<16}{result['peak_above_floor'] / MIB:>18.0f} MiB"
                    f"{result['peak_above_floor'] / result['param_bytes']:>9.2f}{result['seconds']:>9.1f}",
                    flush=True,
                )
        print("x model: peak above floor / bytes of the loaded parameters (1.00 = one copy of the model)")


if __name__ == "__main__":
    main()
