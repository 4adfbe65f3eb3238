r"""Serve a trained policy over HTTP with OpenVLA's `/act` protocol, batching concurrent requests on the model.

    python vla_scripts/serve.py --checkpoint runs/<run_id> [--port 8000] [--host 127.0.0.1] [--device cuda] \
        [--dtype bfloat16] [--max_batch_size 16] [--max_wait_ms 5] [--auth_token_env VLA_TOKEN]

`--checkpoint` takes anything `load_policy` does: a run folder (its newest checkpoint), one of its
`checkpoints/*.pt`, an HF OpenVLA folder, or a Hub id (`--hf_token` for gated repos). Any policy the presets train
is served: OpenVLA's tokens head, or a chunk head reading proprio and several cameras (OpenVLA-OFT's).

The server binds 127.0.0.1 unless `--host` says otherwise; `--port 0` takes a free port (the log names it). Beyond
this machine (`--host 0.0.0.0`), start it with a shared token, read from an environment variable
(`--auth_token_env NAME`) or a file (`--auth_token_file PATH`), never typed on the command line: every request
but `GET /health` must then carry `Authorization: Bearer <token>` (401 otherwise). Without one it serves anyone
who can reach the port, and says so loudly at start-up.

A client, OpenVLA's `vla-scripts/deploy.py` but for the header (drop it for a server started without a token):

    import os, requests, json_numpy
    json_numpy.patch()
    import numpy as np
    action = requests.post("http://127.0.0.1:8000/act", json={"image": np.zeros((256, 256, 3), dtype=np.uint8),
                           "instruction": "do something", "unnorm_key": "bridge_orig"},
                           headers={"Authorization": f"Bearer {os.environ['VLA_TOKEN']}"}).json()  # (7,) float64

A policy trained with proprio also takes `"proprio": [...]` (robot units), one trained with two cameras takes
`"image": [primary, wrist]`, and a chunk head answers `(chunk_size, action_dim)`; `GET /metadata` says which
(`views`, `proprio_dim`, `chunk_size`, the unnorm keys and action dimensions), `GET /health` whether it serves.
The protocol, errors and batching are described in `prismatic/inference/server.py`. Up to `--max_batch_size`
concurrent requests are decoded together, waiting at most `--max_wait_ms` after the first; `--max_batch_size 1`
turns batching off. At start-up one batch of that size, shaped as the policy's requests (its camera views at its
image size, its proprio), is decoded, so a size the device can't hold fails now rather than under load, then one
request alone; `--compile_decoding true` compiles the decoding then (see docs/performance.md), so no request waits
for the compiler: each ViT block and decoder layer, or with `--compile_scope whole` the prefill and the decode step
each as one graph (longer to compile).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prismatic.inference.auth import read_token
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
    host: str = (
        "127.0.0.1"  # loopback only; 0.0.0.0 serves every interface (give it a token: --auth_token_env)
    )
    port: int = 8000  # TCP port to listen on (0: a free one, named in the log)
    auth_token_env: str | None = None  # require a Bearer token (all but /health), held by this env variable
    auth_token_file: Path | None = (
        None  # or held by this file (one line); never the token on the command line
    )
    device: str | None = None  # default: cuda if a GPU is available, else cpu
    dtype: str | None = None  # float32 / bfloat16 / float16; default bf16 on GPU, fp32 on CPU
    hf_token: str | None = None  # for gated Hub repos
    max_batch_size: int = 16  # most requests decoded together (1: no batching)
    max_wait_ms: float = 5.0  # longest wait for more requests after the first one of a batch
    max_request_mb: float = 64.0  # larger request bodies are refused (413)
    access_log: bool = False  # log every request (uvicorn's access log: method, path, status; never headers)
    compile_decoding: bool = False  # torch.compile the static-cache prefill and decode step (at start-up)
    compile_scope: str = DEFAULT_COMPILE_SCOPE  # with --compile_decoding: "layers" (each block) or "whole"

    def __post_init__(self) -> None:
        # A mistyped local path fails here, before torch loads (seconds); Hub / registry ids go to load_policy.
        if looks_like_local_path(self.checkpoint) and not Path(self.checkpoint).expanduser().exists():
            raise ConfigError(f"--checkpoint '{self.checkpoint}' does not exist.")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 1..65535 (or 0: any free port), got {self.port}.")
        if self.max_batch_size < 1:
            raise ConfigError(f"--max_batch_size must be >= 1, got {self.max_batch_size}.")
        if self.max_wait_ms < 0:
            raise ConfigError(f"--max_wait_ms must be >= 0, got {self.max_wait_ms}.")
        if self.max_request_mb <= 0:
            raise ConfigError(f"--max_request_mb must be > 0, got {self.max_request_mb}.")
        check_compile_scope(self.compile_scope, self.compile_decoding)
        self.auth_token()  # an unset variable or a missing file fails now, not after the model loaded

    def auth_token(self) -> str | None:
        """The token requests must carry (None: no authentication), read now; kept out of the config's fields so
        that nothing which prints or records the config can show it."""
        return read_token(self.auth_token_env, self.auth_token_file, "--auth_token")


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (port 0: a free one), before the model loads (which can take minutes): the
    address can't be taken meanwhile, and a busy one fails at once. uvicorn listens on it once the policy is warm.

    Raises:
        ConfigError: unknown host, port in use, or no permission.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ConfigError(f"Unknown --host '{host}': {e.strerror or e}.") from e
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ConfigError(
            f"Cannot listen on {host}:{port}: {e.strerror or e}. Is another server using that port? Pick another "
            "--port (or --host)."
        ) from e
    return sock


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is this machine's loopback (only local clients can connect)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def warm_up(policy: VLAPolicy, batch_size: int) -> None:
    """Decode one full batch, then one request alone, before serving: the first forward's one-off costs are paid
    here (with `--compile_decoding`, both of its compiles: one for single requests, one for every larger batch), and
    a `--max_batch_size` the device can't hold is a start-up error instead of failed requests under load. The
    requests are shaped as the policy reads them (`example_request`: its views, image size and proprio).

    Raises:
        ConfigError: the device ran out of memory, or the policy can't answer a request of its own shape.
    """
    # lazy: torch and the server load after the flags are checked, keeping --help and refusals instant
    import torch

    from prismatic.inference.policy import PolicyInputError
    from prismatic.inference.server import example_request, predict_batch

    requests = [example_request(policy)] * batch_size
    try:
        predict_batch(policy, requests)
        if batch_size > 1:
            predict_batch(policy, requests[:1])
    except torch.OutOfMemoryError as e:
        raise ConfigError(
            f"A batch of {batch_size} requests does not fit on {policy.device}: lower --max_batch_size ({e})."
        ) from e
    except PolicyInputError as e:  # e.g. proprio without the statistics to normalise it
        raise ConfigError(
            f"'{policy.source}' can't be served: a request of its own inputs fails ({e})."
        ) from e


def serve(cfg: ServeConfig) -> None:
    """Load the policy, warm it up, and serve it until interrupted."""
    token = cfg.auth_token()
    sock = bind(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    if token is None and not is_loopback(cfg.host):
        logger.warning(
            "NO AUTHENTICATION: --host %s serves anyone who can reach port %d. Start with --auth_token_env NAME "
            "or --auth_token_file PATH to require a token.",
            cfg.host,
            port,
        )

    # lazy: torch, uvicorn and the model code load after the port is bound (--help and refusals stay instant)
    import uvicorn

    from prismatic.inference import load_policy
    from prismatic.inference.server import create_app

    policy = load_policy(cfg.checkpoint, device=cfg.device, dtype=cfg.dtype, hf_token=cfg.hf_token)
    policy.compile_decoding, policy.compile_scope = cfg.compile_decoding, cfg.compile_scope
    spec = policy.action_spec
    logger.info(
        "Loaded %s from %s on %s (%s); unnorm keys: %s; reads %s%s, answers %s",
        policy.model_id,
        policy.source,
        policy.device,
        str(policy.dtype).removeprefix("torch."),
        ", ".join(policy.unnorm_keys) or "none",
        " + ".join(policy.views),
        f" + {spec.proprio_dim} proprio" if spec.proprio_dim else "",
        f"chunks of {spec.chunk_size}" if policy.is_chunked else "one action",
    )
    warm_up(policy, cfg.max_batch_size)
    app = create_app(
        policy,
        max_batch_size=cfg.max_batch_size,
        max_wait_ms=cfg.max_wait_ms,
        max_request_bytes=int(cfg.max_request_mb * 2**20),
        auth_token=token,
    )
    logger.info(
        "Serving on http://%s:%d (POST /act, GET /health, GET /metadata%s); batches of up to %d, %.1f ms wait",
        cfg.host,
        port,
        "; Bearer token required but for /health" if token is not None else "",
        cfg.max_batch_size,
        cfg.max_wait_ms,
    )
    config = uvicorn.Config(app, access_log=cfg.access_log, log_level="info")
    uvicorn.Server(config).run(sockets=[sock])


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them) and serve until interrupted; a mistake exits 2 in one paragraph."""
    cfg = parse_config(ServeConfig, argv, doc=__doc__)
    setup_logging(0)
    serve(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
