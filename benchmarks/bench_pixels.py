"""The policy's pixel values for a batch of uint8 frames at the backbone's size: normalised on the host and uploaded
(the host path) against uploaded as bytes and normalised by the device (`VLAPolicy.pixels_on_device`).

    python benchmarks/bench_pixels.py                                   # the 7B preset's DINOv2 + SigLIP, on CPU
    python benchmarks/bench_pixels.py --device cuda --batch_sizes 1 16 64

The vision backbone is built on the meta device (no weights), so any base VLM id runs on any machine. On CPU the
device path's figure is its host part alone (stacking the bytes), what it leaves on the host when a GPU does the
rest; on CUDA it is the whole path, upload and look-ups, synchronised.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prismatic.inference.pixels import DevicePixels  # noqa: E402
from prismatic.models.backbones.vision import build_vision_backbone  # noqa: E402
from prismatic.models.backbones.vision.transforms import FusedImageTransform, build_image_transform  # noqa: E402
from prismatic.models.registry import get_base_vlm_spec  # noqa: E402
from prismatic.util.errors import ConfigError  # noqa: E402
from prismatic.vla.datasets.batch_transform import fast_image_transform  # noqa: E402


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first call warms up
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base_vlm", default="prism-dinosiglip-224px+7b")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    try:  # an unknown id (the error lists the valid ones) or a malformed device string: one line, exit 2
        device, spec = torch.device(args.device), get_base_vlm_spec(args.base_vlm)
    except (ConfigError, RuntimeError) as error:
        print(f"bench_pixels: {error}", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "bench_pixels: --device cuda, but no CUDA device is visible here; use --device cpu.",
            file=sys.stderr,
        )
        return 2
    dtype = getattr(torch, args.dtype)
    with torch.device("meta"):
        backbone = build_vision_backbone(
            spec.vision_backbone_id, spec.image_resize_strategy, pretrained=False
        )
    # The transform again, off the meta device (its Normalize tensors were made there).
    cfgs = getattr(backbone, "data_cfgs", None) or {None: backbone.data_cfg}
    parts = {name: build_image_transform(cfg, spec.image_resize_strategy) for name, cfg in cfgs.items()}
    fast = fast_image_transform(parts[None] if None in parts else FusedImageTransform(parts))
    if fast is None:
        print(f"bench_pixels: {args.base_vlm}'s image transform has no array path.", file=sys.stderr)
        return 2
    on_device = DevicePixels(fast, device, dtype)
    rng = np.random.default_rng(0)
    print(f"bench_pixels: {args.base_vlm}, {fast.size_hw} px, {args.dtype} on {device}")
    for batch in args.batch_sizes:
        frames = [rng.integers(0, 256, (*fast.size_hw, 3), dtype=np.uint8) for _ in range(batch)]

        def host(frames: list[np.ndarray] = frames) -> object:
            values = [fast(frame) for frame in frames]
            if isinstance(values[0], dict):
                return {k: torch.stack([v[k] for v in values]).to(device, dtype) for k in values[0]}
            return torch.stack(values).to(device, dtype)

        def device_path(frames: list[np.ndarray] = frames) -> object:
            if device.type == "cpu":  # the host's part: the bytes stacked, ready to upload
                return torch.from_numpy(np.stack([np.stack([frame]) for frame in frames]))
            return on_device([[frame] for frame in frames])

        host_ms = median_ms(host, device, args.repeats)
        device_ms = median_ms(device_path, device, args.repeats)
        label = "host part of the device path" if device.type == "cpu" else "device path"
        print(f"  batch {batch:3d}: host path {host_ms:8.2f} ms   {label} {device_ms:8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
