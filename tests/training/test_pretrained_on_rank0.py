"""`--pretrained_checkpoint X --is_resume false` under torchrun: rank 0 alone reads the file, every rank ends with
its weights (FSDP2 shards or DDP replicas), and a file that cannot be used stops every rank with the same error
instead of leaving the others waiting in the broadcast.

The reads are counted by wrapping the loader `Checkpointer.restore` uses (`load_checkpoint_file`) in each rank. The
expected weights are the file's own, written by the test from a model built with another seed than the training
one. One `torchrun --nproc-per-node 2` of this file (its `__main__` is the worker), on one node (1-D mesh).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

BASE, VLA = "tiny-vit+tiny-llama", "tiny+mx-toy"
STRATEGIES = ("fsdp-full-shard", "ddp")


def _vlm(seed: int) -> Any:
    from prismatic.models import build_vlm
    from prismatic.models.action_heads import ActionSpec

    torch.manual_seed(seed)
    vlm = build_vlm(BASE)
    vlm.attach_action_modules(ActionSpec())
    return vlm


def write_pretrained(folder: Path) -> None:
    """`pretrained.pt` (seed 5, the single-file layout), and `misfit.pt`: the same with one tensor's shape cut."""
    from prismatic.models.checkpoint_format import group_by_module

    weights = _vlm(seed=5).state_dict()
    torch.save({"model": group_by_module(weights)}, folder / "pretrained.pt")
    name = next(n for n, t in weights.items() if t.ndim == 2)
    weights[name] = weights[name][:-1]
    torch.save({"model": group_by_module(weights)}, folder / "misfit.pt")


def _restore(strategy_id: str, path: Path, reads: list[str]) -> Any:
    """A strategy set up on the tiny model (seed 0), then `Checkpointer.restore(None, path)` as train.py calls it."""
    from prismatic.conf.vla import get_vla_config
    from prismatic.training import checkpointing
    from prismatic.training.strategies import get_train_strategy
    from prismatic.util.dist import DistInfo

    vla = get_vla_config(VLA)
    vla.train_strategy, vla.per_device_batch_size, vla.global_batch_size = strategy_id, 2, 4
    rank, world = dist.get_rank(), dist.get_world_size()
    strategy = get_train_strategy(_vlm(seed=0), vla, DistInfo(rank, rank, world, 1, torch.device("cpu")))
    strategy.setup(2)
    real = checkpointing.load_checkpoint_file

    def counted(p: Path) -> Any:
        reads.append(Path(p).name)
        return real(p)

    checkpointing.load_checkpoint_file = counted
    try:
        manager = checkpointing.CheckpointManager(
            path.parent, save_interval=1, keep_last=None, async_save=False, rank=rank
        )
        state = {"model": checkpointing.ModelState(strategy.model)}
        checkpointing.Checkpointer(manager, state, {}, {}, None).restore(None, path)
    finally:
        checkpointing.load_checkpoint_file = real
    return strategy.model


def _max_difference(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Largest |weight - file's| over every parameter, gathered whole (collective for FSDP)."""
    from torch.distributed.tensor import DTensor

    worst, names = 0.0, 0
    for name, param in model.named_parameters():
        whole = param.full_tensor() if isinstance(param, DTensor) else param
        key = name.replace("_checkpoint_wrapped_module.", "").removeprefix("module.")
        worst = max(worst, (whole.detach().float() - expected[key].float()).abs().max().item())
        names += 1
    return {"max_abs": worst, "params": names}


def _worker(out_dir: Path) -> None:
    import huggingface_hub.constants

    from prismatic.util.errors import ConfigError

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    torch.set_num_threads(1)
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    dist.init_process_group(
        "gloo", timeout=timedelta(seconds=60)
    )  # a rank left waiting fails within a minute
    rank = dist.get_rank()
    expected = {
        f"{module}.{name}": t
        for module, sd in torch.load(out_dir / "pretrained.pt", weights_only=True)["model"].items()
        for name, t in sd.items()
    }
    results: dict[str, Any] = {}
    for strategy_id in STRATEGIES:
        reads: list[str] = []
        model = _restore(strategy_id, out_dir / "pretrained.pt", reads)
        results[strategy_id] = {"reads": reads, **_max_difference(model, expected)}
    for case in ("misfit.pt", "missing.pt"):
        reads = []
        try:
            _restore("fsdp-full-shard", out_dir / case, reads)
            results[case] = {"error": None, "reads": reads}
        except ConfigError as e:
            results[case] = {"error": str(e), "reads": reads}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from train_runs import run_torchrun_worker

    out = tmp_path_factory.mktemp("pretrained_on_rank0")
    write_pretrained(out)
    run_torchrun_worker(__file__, out, timeout=300)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("strategy_id", STRATEGIES)
def test_rank_zero_alone_reads_and_every_rank_gets_the_weights(
    two_ranks: list[dict[str, Any]], strategy_id: str
) -> None:
    assert two_ranks[0][strategy_id]["reads"] == ["pretrained.pt"]
    assert two_ranks[1][strategy_id]["reads"] == []
    for results in two_ranks:
        assert results[strategy_id]["params"] > 10
        assert results[strategy_id]["max_abs"] == 0.0  # FP32 on CPU: the file's values exactly


def test_a_checkpoint_that_does_not_fit_stops_every_rank_with_rank_zeros_message(
    two_ranks: list[dict[str, Any]],
) -> None:
    first, second = (results["misfit.pt"] for results in two_ranks)
    assert first["error"] == second["error"]
    assert (
        "misfit.pt' does not fit this model" in first["error"]
        and "names or shapes differ for 1 tensors" in (first["error"])
    )
    assert (first["reads"], second["reads"]) == (["misfit.pt"], [])


def test_a_missing_checkpoint_stops_every_rank(two_ranks: list[dict[str, Any]]) -> None:
    first, second = (results["missing.pt"] for results in two_ranks)
    assert first["error"] == second["error"] and first["error"].endswith("missing.pt' does not exist.")


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
