"""A pytest fork server: the per-mutant test command of `mutation/run.py`, without re-importing torch each time.

`serve` imports pytest and the heavy third-party packages once (torch, transformers, ...; never `prismatic`),
then for every request forks a child that runs `pytest.main(args)` in the requested folder. The child imports
`prismatic` (and the tests) afresh, so it sees the mutant cosmic-ray has just written to disk; the server stays
clean. `run` is the client cosmic-ray calls as its test command: it sends the request, prints the child's
output and exits with pytest's status (124 when the server killed a child that ran past the time limit).

    python mutation/forkserver.py serve SOCKET [MODULE ...]
    python mutation/forkserver.py run SOCKET TIMEOUT_S -- PYTEST_ARGS ...
    python mutation/forkserver.py stop SOCKET
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys
import tempfile
import time


def _recv_line(conn: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data.decode() or "{}")


def _run_child(args: list[str], cwd: str, log: str) -> int:
    os.setsid()  # its own process group: a timeout kills what the tests spawned too
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(cwd)
    import pytest

    try:
        return int(pytest.main(args))
    except BaseException:  # noqa: BLE001 (anything the mutant raises at import is a failed run)
        import traceback

        traceback.print_exc()
        return 99
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve(sock_path: str, preload: list[str]) -> None:
    sys.dont_write_bytecode = True  # a stale .pyc must never stand in for a mutant
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    import pytest  # noqa: F401

    for name in preload:
        importlib.import_module(name)
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(1)
    print(f"forkserver ready ({', '.join(preload) or 'pytest only'})", flush=True)
    while True:
        conn, _ = server.accept()
        request = _recv_line(conn)
        if request.get("stop"):
            conn.close()
            break
        pid = os.fork()
        if pid == 0:
            server.close()
            conn.close()
            os._exit(_run_child(request["args"], request["cwd"], request["log"]))
        deadline = time.monotonic() + float(request["timeout"])
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rc = 124
                break
            time.sleep(0.02)
        conn.sendall(json.dumps({"rc": rc}).encode() + b"\n")
        conn.close()
    server.close()
    os.unlink(sock_path)


def _request(sock_path: str, request: dict) -> dict:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(sock_path)
    client.sendall(json.dumps(request).encode() + b"\n")
    reply = _recv_line(client)
    client.close()
    return reply


def run(sock_path: str, timeout: float, args: list[str]) -> int:
    fd, log = tempfile.mkstemp(prefix="mutant-", suffix=".log")
    os.close(fd)
    try:
        reply = _request(sock_path, {"args": args, "cwd": os.getcwd(), "log": log, "timeout": timeout})
        with open(log, errors="replace") as f:
            sys.stdout.write(f.read()[-4000:])
    finally:
        os.unlink(log)
    if reply["rc"] == 124:
        print("TIMEOUT")
    return int(reply["rc"])


def main(argv: list[str]) -> int:
    command, sock_path = argv[0], argv[1]
    if command == "serve":
        serve(sock_path, argv[2:])
        return 0
    if command == "stop":
        _request(sock_path, {"stop": True})
        return 0
    if command == "run":
        rest = argv[3:]
        if rest and rest[0] == "--":
            rest = rest[1:]
        return run(sock_path, float(argv[2]), rest)
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
