"""Camera images normalised on the policy's device: uint8 frames go up as bytes, pixel values are made there.

On the host, a batch of 64 224-px frames for the fused DINOv2 + SigLIP backbone costs single-threaded table
look-ups, stacking and casting (`benchmarks/bench_pixels.py` times them), then a 77 MB float32 upload: a visible
share of a batch-64 request on a GPU. Here the host stacks the raw frames (9.6 MB of uint8) and the device looks
every byte up in the host path's own table (`fast_image_transform`), cast to the policy's dtype first: casting a
looked-up value and looking up a cast one give the same number, so the pixel values are bit-identical to the host
path's (and to torchvision's PIL path, which the table reproduces).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

CHANNELS = 3
BYTE_VALUES = 256


class DevicePixels:
    """Requests' uint8 views at the backbone's size -> pixel values `[B, 3V, H, W]` on `device` in `dtype` (per
    part for a fused backbone), made by the device. Views are concatenated along the channel axis, as training's
    batch transform does."""

    def __init__(self, fast_transform: Any, device: torch.device, dtype: torch.dtype) -> None:
        parts = getattr(fast_transform, "parts", None)
        self.fused = parts is not None
        tables = (
            {name: part.table for name, part in parts.items()} if self.fused else {None: fast_transform.table}
        )
        # Each part's [3, 256] table, flattened: the value of byte v in channel c sits at 256 * c + v.
        self.tables = {
            name: torch.from_numpy(table).to(device=device, dtype=dtype).reshape(-1)
            for name, table in tables.items()
        }
        self.device = device
        # The host array path's own test, so an image takes the device path exactly where it would take that one.
        self.accepts = fast_transform.accepts

    def __call__(self, requests: Sequence[Sequence[np.ndarray]]) -> torch.Tensor | dict[str, torch.Tensor]:
        frames = torch.from_numpy(np.stack([np.stack(views) for views in requests]))  # [B, V, H, W, 3] uint8
        frames = frames.to(self.device)
        batch, views, height, width, _ = frames.shape
        channels = torch.arange(views * CHANNELS, device=self.device) % CHANNELS
        index = frames.permute(0, 1, 4, 2, 3).reshape(batch, views * CHANNELS, height, width).long()
        index += (BYTE_VALUES * channels).view(1, -1, 1, 1)
        values = {name: table.take(index) for name, table in self.tables.items()}
        return values if self.fused else values[None]
