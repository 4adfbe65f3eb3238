"""`vla_scripts/serve.py` in a subprocess for tests: on a port the OS picks (`--port 0`), read back from its log, so
no test depends on a fixed port being free or races another for one a helper found free.

    with served(["--checkpoint", str(run)], tmp_path / "serve.log") as url:
        requests.get(f"{url}/health")
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[1]
SERVE = REPO / "vla_scripts" / "serve.py"
# A deadline for a stuck start-up, not a speed requirement: loading the tiny run takes seconds, but 2 cores are
# shared with the rest of the suite.
STARTUP_TIMEOUT_S = 300
_SERVING = re.compile(r"Serving on http://[^\s:]+:(\d+) ")


@contextlib.contextmanager
def served(args: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Base URL (http://127.0.0.1:<port>) of `serve.py ARGS --port 0` once `/health` answers 200; its stdout and
    stderr go to `log_path`; terminated on exit."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(SERVE), *args, "--port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        url = None
        while True:
            if proc.poll() is not None:
                pytest.fail(f"serve.py exited with {proc.returncode}:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"serve.py not healthy after {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()}")
            if url is None:
                match = _SERVING.search(log_path.read_text(errors="replace"))
                url = f"http://127.0.0.1:{match.group(1)}" if match else None
            if url is not None:
                try:
                    if requests.get(f"{url}/health", timeout=5).status_code == 200:
                        break
                except requests.RequestException:
                    pass
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
