r"""Serve a trained policy over HTTP with OpenVLA's `/act` protocol, batching concurrent requests on the model.

    python vla_scripts/serve.py --checkpoint runs/<run_id> [--port 8000] [--host 127.0.0.1] [--device cuda] \
        [--dtype bfloat16] [--max_batch_size 16] [--max_wait_ms 5]

`--checkpoint` takes anything `load_policy` does: a run folder (its newest checkpoint), one of its
`checkpoints/*.pt`, an HF OpenVLA folder, or a Hub id (`--hf_token` for gated repos). The server binds 127.0.0.1
unless `--host` says otherwise (`--host 0.0.0.0` exposes it to the network: it has no authentication).

A client, unchanged from OpenVLA's `vla-scripts/deploy.py`:

    import requests, json_numpy
    json_numpy.patch()
    import numpy as np
    action = requests.post("http://127.0.0.1:8000/act", json={"image": np.zeros((256, 256, 3), dtype=np.uint8),
                           "instruction": "do something", "unnorm_key": "bridge_orig"}).json()   # (7,) float64

`GET /metadata` lists the unnorm keys and action dimensions, `GET /health` says whether it serves; the protocol,
errors and batching are described in `prismatic/inference/server.py`. Up to `--max_batch_size` concurrent
requests are decoded together, waiting at most `--max_wait_ms` after the first; `--max_batch_size 1` turns
batching off. At start-up one batch of that size is decoded, so a size the device can't hold fails now rather
than under load, then one request alone; `--compile_decoding true` compiles the decoding then (see
docs/performance.md), so no request waits for the compiler: each ViT block and decoder layer, or with
`--compile_scope whole` the prefill and the decode step each as one graph (longer to compile; the scope timed on an
H100, 51.8 against 63.0 ms per 7B action).
"""

from __future__ import annotations

import logging
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prismatic.models.compile_scope import DEFAULT_COMPILE_SCOPE, check_compile_scope
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError
from prismatic.util.files import looks_like_local_path
from prismatic.util.logging import setup_logging

if TYPE_CHECKING:  # annotations only: the policy module imports torch
    from prismatic.inference import VLAPolicy

logger = logging.getLogger("vla_scripts.serve")


@dataclass
class ServeConfig:
    """Example: python vla_scripts/serve.py --checkpoint runs/<run_id> --port 8000 (clients POST OpenVLA's
    {"image", "instruction", "unnorm_key"} payload to /act; see the module docstring)."""

    checkpoint: str  # a run folder, <run>/checkpoints/step-*, an HF OpenVLA folder, or a Hub id
    host: str = "127.0.0.1"  # loopback only; 0.0.0.0 serves every interface (no authentication!)
    port: int = 8000  # TCP port to listen on
    device: str | None = None  # default: cuda if a GPU is available, else cpu
    dtype: str | None = None  # float32 / bfloat16 / float16; default bf16 on GPU, fp32 on CPU
    hf_token: str | None = None  # for gated Hub repos
    max_batch_size: int = 16  # most requests decoded together (1: no batching)
    max_wait_ms: float = 5.0  # longest wait for more requests after the first one of a batch
    max_request_mb: float = 64.0  # larger request bodies are refused (413)
    access_log: bool = False  # log every request (uvicorn's access log)
    compile_decoding: bool = False  # torch.compile the static-cache prefill and decode step (at start-up)
    compile_scope: str = DEFAULT_COMPILE_SCOPE  # with --compile_decoding: "layers" (each block) or "whole"

    def __post_init__(self) -> None:
        # A mistyped local path fails here, before torch loads (seconds); Hub / registry ids go to load_policy.
        if looks_like_local_path(self.checkpoint) and not Path(self.checkpoint).expanduser().exists():
            raise ConfigError(f"--checkpoint '{self.checkpoint}' does not exist.")
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 1..65535, got {self.port}.")
        if self.max_batch_size < 1:
            raise ConfigError(f"--max_batch_size must be >= 1, got {self.max_batch_size}.")
        if self.max_wait_ms < 0:
            raise ConfigError(f"--max_wait_ms must be >= 0, got {self.max_wait_ms}.")
        if self.max_request_mb <= 0:
            raise ConfigError(f"--max_request_mb must be > 0, got {self.max_request_mb}.")
        check_compile_scope(self.compile_scope, self.compile_decoding)


def check_bindable(host: str, port: int) -> None:
    """Fail before the model loads (which can take minutes) when `host:port` can't be listened on.

    Raises:
        ConfigError: unknown host, port in use, or no permission.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ConfigError(f"Unknown --host '{host}': {e.strerror or e}.") from e
    try:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            sock.bind(address)
    except OSError as e:
        raise ConfigError(
            f"Cannot listen on {host}:{port}: {e.strerror or e}. Is another server using that port? Pick another "
            "--port (or --host)."
        ) from e


def warm_up(policy: VLAPolicy, batch_size: int) -> None:
    """Decode one full batch, then one request alone, before serving: the first forward's one-off costs are paid
    here (with `--compile_decoding`, both of its compiles: one for single requests, one for every larger batch), and
    a `--max_batch_size` the device can't hold is a start-up error instead of failed requests under load.

    Raises:
        ConfigError: the device ran out of memory.
    """
    # lazy: numpy, torch and the server load after the flags are checked, keeping --help and refusals instant
    import numpy as np
    import torch

    from prismatic.inference.server import ActRequest, predict_batch

    keys = policy.unnorm_keys
    image = np.zeros((224, 224, 3), dtype=np.uint8)
    requests = [ActRequest(image, "warm up", keys[0] if keys else None)] * batch_size
    try:
        predict_batch(policy, requests)
        if batch_size > 1:
            predict_batch(policy, requests[:1])
    except torch.OutOfMemoryError as e:
        raise ConfigError(
            f"A batch of {batch_size} requests does not fit on {policy.device}: lower --max_batch_size ({e})."
        ) from e


def serve(cfg: ServeConfig) -> None:
    """Load the policy, warm it up, and serve it until interrupted."""
    check_bindable(cfg.host, cfg.port)

    # lazy: torch, uvicorn and the model code load after the port is checked (--help and refusals stay instant)
    import uvicorn

    from prismatic.inference import load_policy
    from prismatic.inference.server import create_app

    policy = load_policy(cfg.checkpoint, device=cfg.device, dtype=cfg.dtype, hf_token=cfg.hf_token)
    policy.compile_decoding, policy.compile_scope = cfg.compile_decoding, cfg.compile_scope
    logger.info(
        "Loaded %s from %s on %s (%s); unnorm keys: %s",
        policy.model_id,
        policy.source,
        policy.device,
        str(policy.dtype).removeprefix("torch."),
        ", ".join(policy.unnorm_keys) or "none",
    )
    warm_up(policy, cfg.max_batch_size)
    app = create_app(
        policy,
        max_batch_size=cfg.max_batch_size,
        max_wait_ms=cfg.max_wait_ms,
        max_request_bytes=int(cfg.max_request_mb * 2**20),
    )
    logger.info(
        "Serving on http://%s:%d (POST /act, GET /health, GET /metadata); batches of up to %d, %.1f ms wait",
        cfg.host,
        cfg.port,
        cfg.max_batch_size,
        cfg.max_wait_ms,
    )
    uvicorn.run(app, host=cfg.host, port=cfg.port, access_log=cfg.access_log, log_level="info")


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them) and serve until interrupted; a mistake exits 2 in one paragraph."""
    cfg = parse_config(ServeConfig, argv, doc=__doc__)
    setup_logging(0)
    serve(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
