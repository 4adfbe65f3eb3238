"""Policy-server benchmark: requests/s and latency of `vla_scripts/serve.py` with dynamic batching and without.

    python benchmarks/bench_serve.py [--checkpoint runs/<run_id>] [--device cpu] [--concurrency 1 16] \
        [--requests 160] [--max_seconds 30] [--image_size 256]

Starts the server twice on a free 127.0.0.1 port (loopback traffic only): with its default batching, then with
`--max_batch_size 1`. At each concurrency, that many client threads (each with its own keep-alive `requests`
session) post one OpenVLA `/act` payload (a random image, encoded once) until `--requests` answers or
`--max_seconds` have passed, after a warm-up round. Prints requests/s, p50 / p90 latency, the mean batch size the
server ran (from /health), and how many times the batched server's requests/s the unbatched one's is at the
highest concurrency. Without `--checkpoint` a tiny random-weight run folder (the test fixtures' model,
`tiny-vit+tiny-llama`, with two datasets' statistics) is written to a temporary folder and served on CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY_BASE_VLM = "tiny-vit+tiny-llama"
STARTUP_TIMEOUT_S = 180


def write_tiny_run(folder: Path, action_dim: int = 7) -> Path:
    """A run folder as training writes it (config.json, one checkpoint, dataset_statistics.json), random weights."""
    import torch

    from prismatic.models import build_vlm

    torch.manual_seed(0)
    vlm = build_vlm(TINY_BASE_VLM)
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps({"vla": {"type": "tiny+mx-toy", "base_vlm": TINY_BASE_VLM}})
    )
    weights = {
        key: getattr(vlm, key).state_dict() for key in ("vision_backbone", "projector", "llm_backbone")
    }
    torch.save({"model": weights}, folder / "checkpoints" / "step-000001-epoch-00-loss=1.0000.pt")
    q01, q99 = [-1.0] * action_dim, [1.0] * action_dim
    stats = {"action": {"q01": q01, "q99": q99, "mask": [True] * (action_dim - 1) + [False]}}
    (folder / "dataset_statistics.json").write_text(json.dumps({"ds_a": stats, "ds_b": stats}))
    return folder


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`serve.py` in a subprocess on a free loopback port; a context manager that waits for /health."""

    def __init__(self, checkpoint: str, extra_args: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            sys.executable,
            str(REPO / "vla_scripts" / "serve.py"),
            "--checkpoint",
            checkpoint,
            "--port",
            str(self.port),
            *extra_args,
        ]
        self.log_path = log_path

    def __enter__(self) -> Server:
        import requests

        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"serve.py exited with {self.proc.returncode}:\n{self.log_path.read_text()}"
                )
            try:
                if requests.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"serve.py not healthy after {STARTUP_TIMEOUT_S} s:\n{self.log_path.read_text()}")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def health(self) -> dict:
        import requests

        return requests.get(f"{self.url}/health", timeout=10).json()


@dataclass
class Level:
    """Figures of one (server, concurrency) measurement."""

    concurrency: int
    completed: int
    failures: list[str]  # status and start of the body of each non-200 answer (warm-up included)
    wall_s: float
    latencies_ms: list[float]
    mean_batch: float

    @property
    def requests_per_s(self) -> float:
        return self.completed / self.wall_s

    def percentile(self, q: int) -> float:
        if len(self.latencies_ms) < 2:
            return self.latencies_ms[0] if self.latencies_ms else float("nan")
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[q - 1]


def measure(server: Server, body: bytes, concurrency: int, num_requests: int, max_seconds: float) -> Level:
    """`concurrency` threads post `body` until `num_requests` answers or `max_seconds`; a warm-up round first."""
    import requests

    headers = {"Content-Type": "application/json"}
    lock = threading.Lock()
    latencies: list[float] = []
    failures: list[str] = []
    issued = [0]

    def client(deadline: float, count: bool) -> None:
        with requests.Session() as session:
            while time.monotonic() < deadline:
                with lock:
                    if count and issued[0] >= num_requests:
                        return
                    issued[0] += 1
                start = time.perf_counter()
                response = session.post(f"{server.url}/act", data=body, headers=headers, timeout=60)
                elapsed_ms = 1000 * (time.perf_counter() - start)
                with lock:
                    if response.status_code == 200:
                        latencies.append(elapsed_ms)
                    else:
                        failures.append(f"{response.status_code} {response.text[:200]}")
                if not count:
                    return

    def run_threads(count: bool) -> float:
        deadline = time.monotonic() + max_seconds
        threads = [threading.Thread(target=client, args=(deadline, count)) for _ in range(concurrency)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - start

    run_threads(count=False)  # warm-up: one request per thread (connections, first batches)
    latencies.clear()
    issued[0] = 0
    before = server.health()
    wall_s = run_threads(count=True)
    after = server.health()
    batches = after["batches_run"] - before["batches_run"]
    served = after["requests_served"] - before["requests_served"]
    return Level(concurrency, len(latencies), failures, wall_s, latencies, served / max(batches, 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="anything serve.py takes (default: a tiny run)")
    parser.add_argument("--unnorm_key", default="ds_a", help="unnorm key of every request")
    parser.add_argument("--device", default=None, help="serve.py --device (default: its own)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=160, help="answers measured per concurrency level")
    parser.add_argument("--max_seconds", type=float, default=30.0, help="time bound per concurrency level")
    parser.add_argument("--image_size", type=int, default=256)
    parser.add_argument(
        "--max_batch_size", type=int, default=None, help="batched server's (default: its own)"
    )
    parser.add_argument("--max_wait_ms", type=float, default=None, help="batched server's (default: its own)")
    args = parser.parse_args()

    import json_numpy
    import numpy as np
    import requests

    image = np.random.default_rng(0).integers(0, 256, (args.image_size, args.image_size, 3), dtype=np.uint8)
    payload = {"image": image, "instruction": "pick up the red block", "unnorm_key": args.unnorm_key}
    body = json_numpy.dumps(payload).encode()  # encoded once: the clients measure the server, not json-numpy

    device_args = ["--device", args.device] if args.device else []
    batching = [
        f"--{name}={getattr(args, name)}"
        for name in ("max_batch_size", "max_wait_ms")
        if getattr(args, name) is not None
    ]
    results: list[tuple[str, list[Level]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or str(write_tiny_run(Path(tmp) / "tiny_run"))
        for extra in ([*device_args, *batching], [*device_args, "--max_batch_size", "1"]):
            with Server(checkpoint, extra, Path(tmp) / f"server-{len(results)}.log") as server:
                meta = requests.get(f"{server.url}/metadata", timeout=10).json()
                levels = [measure(server, body, c, args.requests, args.max_seconds) for c in args.concurrency]
            results.append((f"batch {meta['max_batch_size']}, wait {meta['max_wait_ms']:g} ms", levels))

    print(
        f"\nPolicy server: {meta['model_id']} on {meta['device']} ({meta['dtype']}), "
        f"{args.image_size}x{args.image_size} images, up to {args.requests} requests or {args.max_seconds:.0f} s "
        "per level\n"
    )
    print(
        f"{'server':<24}{'concurrency':>12}{'requests':>10}{'req/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'mean batch':>12}"
    )
    failures: list[str] = []
    for mode, levels in results:
        for level in levels:
            failures += level.failures
            print(
                f"{mode:<24}{level.concurrency:>12}{level.completed:>10}{level.requests_per_s:>9.1f}"
                f"{level.percentile(50):>9.1f}{level.percentile(90):>9.1f}{level.mean_batch:>12.1f}"
            )
    top = max(range(len(args.concurrency)), key=lambda i: args.concurrency[i])
    batched, unbatched = (levels[top].requests_per_s for _, levels in results)
    print(
        f"\nAt concurrency {args.concurrency[top]}, dynamic batching serves {batched / unbatched:.1f}x the "
        "requests/s of --max_batch_size 1."
    )
    if failures:
        print(f"{len(failures)} request(s) failed; the first answer: {failures[0]}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
