"""`call_and_agree`: work some ranks do alone (rank 0 reads a checkpoint) either succeeds everywhere or raises on
every rank, so no rank goes on into a collective that waits for one that stopped. Two gloo ranks (spawned)."""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from prismatic.util.dist import call_and_agree
from prismatic.util.errors import ConfigError

WORLD = 2


def _outcome(fn) -> dict:
    try:
        return {"value": call_and_agree(fn)}
    except Exception as e:
        return {"raised": type(e).__name__, "message": str(e)}


def _fail(error: Exception):
    def fn():
        raise error

    return fn


def _worker(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    results = {
        "ok": _outcome(lambda: rank * 10),
        "config-error-on-0": _outcome(
            _fail(ConfigError("Checkpoint 'x.pt' does not exist.")) if rank == 0 else list
        ),
        "value-error-on-1": _outcome(_fail(ValueError("bad shape")) if rank == 1 else list),
    }
    dist.barrier()  # every case left both ranks in step: the group still works
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def test_a_failure_on_one_rank_raises_on_every_rank(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert (zero["ok"], one["ok"]) == ({"value": 0}, {"value": 10})
    expected = {"raised": "ConfigError", "message": "Checkpoint 'x.pt' does not exist."}
    assert zero["config-error-on-0"] == one["config-error-on-0"] == expected
    assert one["value-error-on-1"] == {"raised": "ValueError", "message": "bad shape"}
    assert zero["value-error-on-1"] == {
        "raised": "RuntimeError",
        "message": "rank 1 failed (ValueError: bad shape), so this rank stops too",
    }


def test_one_process_just_calls() -> None:
    assert call_and_agree(lambda: 3) == 3
