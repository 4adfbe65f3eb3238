"""`evaluate.py` under torchrun: rank 0 alone reads the policy's weights (`load_policy_from_rank0`), every rank ends
with the checkpoint's values, and a checkpoint rank 0 cannot read stops every rank with its message.

Reads are counted by wrapping the loader the run-folder path uses (`prismatic.models.loading.load_checkpoint_file`)
in each rank; the expected weights are the checkpoint file's own. One `torchrun --nproc-per-node 2` of this file
(its `__main__` is the worker) on the tiny run folder of `policy_run` (tests/inference/conftest.py).
"""

from __future__ import annotations

import json
import shutil
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist


def _load(run: Path, reads: list[str]) -> Any:
    from prismatic.inference.evaluation import load_policy_from_rank0
    from prismatic.models import loading

    real = loading.load_checkpoint_file

    def counted(path: Path) -> Any:
        reads.append(Path(path).name)
        return real(path)

    loading.load_checkpoint_file = counted
    try:
        return load_policy_from_rank0(str(run), torch.device("cpu"), device="cpu", dtype="float32")
    finally:
        loading.load_checkpoint_file = real


def _worker(out_dir: Path) -> None:
    import huggingface_hub.constants

    from prismatic.util.errors import ConfigError

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", timeout=timedelta(seconds=60)
    )  # a rank left waiting fails within a minute
    rank = dist.get_rank()
    run = Path((out_dir / "run_path.txt").read_text())
    reads: list[str] = []
    policy = _load(run, reads)
    (checkpoint,) = (run / "checkpoints").glob("step-*.pt")
    saved = torch.load(checkpoint, weights_only=True)["model"]
    mine = policy.vlm.state_dict()
    differences = [
        (mine[f"{module}.{name}"] - value).abs().max().item()
        for module, weights in saved.items()
        for name, value in weights.items()
    ]
    results: dict[str, Any] = {
        "reads": reads,
        "compared": len(differences),
        "max_abs": max(differences),
        "norm_stats": sorted(policy.norm_stats),
    }
    bad_reads: list[str] = []
    try:
        _load(out_dir / "damaged_run", bad_reads)
        results["damaged"] = {"error": None, "reads": bad_reads}
    except ConfigError as e:
        results["damaged"] = {"error": str(e), "reads": bad_reads}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(policy_run: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from train_runs import run_torchrun_worker

    out = tmp_path_factory.mktemp("policy_from_rank0")
    (out / "run_path.txt").write_text(str(policy_run))
    damaged = out / "damaged_run"
    shutil.copytree(policy_run, damaged)
    (checkpoint,) = (damaged / "checkpoints").glob("step-*.pt")
    checkpoint.write_bytes(b"not a checkpoint")
    run_torchrun_worker(__file__, out, timeout=300)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_rank_zero_alone_reads_the_weights_and_every_rank_has_them(two_ranks: list[dict[str, Any]]) -> None:
    assert two_ranks[0]["reads"] == ["step-000010-epoch-00-loss=1.0000.pt"]
    assert two_ranks[1]["reads"] == []
    for results in two_ranks:
        assert (
            results["compared"] > 10 and results["max_abs"] == 0.0
        )  # FP32 on CPU: the file's values exactly
        assert results["norm_stats"] == ["ds_a", "ds_b"]


def test_a_checkpoint_rank_zero_cannot_read_stops_every_rank(two_ranks: list[dict[str, Any]]) -> None:
    first, second = (results["damaged"] for results in two_ranks)
    assert first["error"] is not None and first["error"] == second["error"]
    assert "is not a checkpoint written by this tool" in first["error"]
    assert (len(first["reads"]), second["reads"]) == (1, [])


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
