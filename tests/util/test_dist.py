"""`run_once_per_node`: one rank per node fills a cache while the others wait, without hanging on failure."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from prismatic.util.dist import DistInfo, run_once_per_node

WORLD = 2


def _worker(rank: int, store: str, log: str, fail: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    info = DistInfo(rank, rank, WORLD, 1, torch.device("cpu"))

    def fill_cache() -> None:
        with open(log, "a") as f:
            f.write(json.dumps({"ran_on": rank, "start": time.time()}) + "\n")
        time.sleep(1.5)
        if fail:
            raise RuntimeError("statistics pass failed")
        with open(log, "a") as f:
            f.write(json.dumps({"done_on": rank, "end": time.time()}) + "\n")

    error = None
    try:
        run_once_per_node(fill_cache, info)
    except RuntimeError as e:
        error = str(e)
    with open(log, "a") as f:
        f.write(json.dumps({"returned_on": rank, "at": time.time(), "error": error}) + "\n")
    dist.destroy_process_group()


def _run(tmp_path: Path, fail: bool) -> list[dict]:
    log = tmp_path / "log.jsonl"
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(log), fail), nprocs=WORLD, join=True)
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_local_rank_zero_runs_once_and_the_others_wait_for_it(tmp_path: Path) -> None:
    events = _run(tmp_path, fail=False)
    assert [e["ran_on"] for e in events if "ran_on" in e] == [0]
    (done,) = [e for e in events if "done_on" in e]
    returned = {e["returned_on"]: e for e in events if "returned_on" in e}
    assert set(returned) == {0, 1} and all(e["error"] is None for e in returned.values())
    assert returned[1]["at"] >= done["end"]  # rank 1 went on only once the cache was filled


def test_a_failure_on_rank_zero_releases_the_others(tmp_path: Path) -> None:
    events = _run(tmp_path, fail=True)
    returned = {e["returned_on"]: e for e in events if "returned_on" in e}
    assert returned[0]["error"] == "statistics pass failed"
    assert returned[1]["error"] is None  # released by the barrier, not left waiting for the 12 h timeout


def test_a_worker_whose_launcher_dies_exits_instead_of_training_on(tmp_path):
    """kill -9 of the launcher (torchrun): its orphaned worker notices and exits with code 70, saying why."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file, err_file = tmp_path / "worker.pid", tmp_path / "worker.err"
    worker = (
        "import os, time; from prismatic.util.dist import exit_when_launcher_dies; "
        f"exit_when_launcher_dies(poll_s=0.05); open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    # The launcher starts the worker and waits for it, as torchrun does.
    launcher_code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {worker!r}], stderr=open({str(err_file)!r}, 'w'))"
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code])
    deadline = time.monotonic() + 600  # a hang guard only: a loaded machine may take minutes to start Python
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    worker_pid = int(pid_file.read_text())
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    # Past its 60 s sleep the worker ends anyway; whether the launcher's death ended it is the err file's to say.
    deadline = time.monotonic() + 120
    while True:
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            break
        status = Path(f"/proc/{worker_pid}/status")
        if status.exists() and "State:\tZ" in status.read_text():
            break  # exited; its new parent has not reaped it yet
        assert time.monotonic() < deadline, "the orphaned worker is still running"
        time.sleep(0.05)
    assert "The launcher (pid" in err_file.read_text() and "exit code 70" in err_file.read_text()
