"""Resuming an older single-file checkpoint (`step-*.pt`: consolidated weights and full optimizer state) into a model
sharded by FSDP2 over 2 ranks (`restore_from_file`, the path train.py takes for such a checkpoint).

The expected values are a plain, unsharded model trained by torch's AdamW alone in this file: one step, saved as the
old single-file layout, a second step. The sharded run restores the file and takes the same second step; its
gathered weights and AdamW moments must equal the plain model's, and the schedule and train state must be the saved
ones. One `torchrun --nproc-per-node 2` of this file (its `__main__` is the worker); the tests read what it wrote.
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

REPO = Path(__file__).resolve().parents[2]
BASE = "tiny-vit+tiny-llama"
SEED, LR = 5, 1e-3


# === The worker (runs under torchrun) =============================================================================


def _batch(vlm: Any, step: int) -> dict[str, torch.Tensor]:
    """Two right-padded prompts with labels on their last tokens and seeded random images."""
    g = torch.Generator().manual_seed(step)
    encoded = vlm.llm_backbone.tokenizer(
        ["In: pick up the red can\nOut: ", "In: push\nOut: "], padding=True, return_tensors="pt"
    )
    labels = encoded.input_ids.clone()
    labels[:, :3] = -100
    labels[encoded.attention_mask == 0] = -100
    return {
        "input_ids": encoded.input_ids,
        "attention_mask": encoded.attention_mask,
        "pixel_values": torch.rand((2, *vlm.vision_backbone.default_image_resolution), generator=g),
        "labels": labels,
    }


def _model(on_meta: bool = False) -> Any:
    from prismatic.models import load

    torch.manual_seed(SEED)
    vlm = load(BASE, device="meta" if on_meta else None)
    vlm.freeze_backbones("vla-train")
    return vlm


def _adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """The project's optimizer layout (decay on matrices only), built here by name."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay = [p for n, p in params.items() if p.ndim > 1 and not n.endswith(".bias")]
    rest = [p for n, p in params.items() if not (p.ndim > 1 and not n.endswith(".bias"))]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=LR
    )


def _reference(out_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Plain training: step 1, the old single-file checkpoint (written by rank 0), step 2."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from prismatic.models.checkpoint_format import group_by_module

    vlm = _model()
    optimizer = _adamw(vlm)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    for step in (1, 2):
        vlm(**_batch(vlm, step)).loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 1 and int(os.environ["RANK"]) == 0:
            full_optimizer = get_optimizer_state_dict(
                vlm, optimizer, options=StateDictOptions(full_state_dict=True)
            )
            ckpt = {
                "model": group_by_module(vlm.state_dict()),
                "optimizer": full_optimizer,
                "lr_scheduler": scheduler.state_dict(),
                "train_state": {"step": 1, "epoch": 0, "frames": 2},
            }
            torch.save(ckpt, out_dir / "step-000001-epoch-00-loss=1.0000.pt")
    weights = {n: p.detach().clone() for n, p in vlm.named_parameters() if p.requires_grad}
    moments = {
        n: {k: optimizer.state[p][k].clone() for k in ("exp_avg", "exp_avg_sq")}
        for n, p in vlm.named_parameters()
        if p.requires_grad
    }
    return weights, moments


def _worker(out_dir: Path) -> None:
    import huggingface_hub.constants
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from prismatic.models.distributed_init import full_state_on_rank0, materialize_from_rank0
    from prismatic.models.parallelize import apply_fsdp, mixed_precision_policy
    from prismatic.training.checkpointing import restore_from_file

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    weights, moments = _reference(out_dir)
    dist.barrier()  # the checkpoint file is written

    vlm = _model(on_meta=rank != 0)
    full = full_state_on_rank0(vlm)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = apply_fsdp(vlm, mesh, mixed_precision_policy(False, True), reshard_after_forward=True)
    materialize_from_rank0(model, full, "cpu")
    optimizer = _adamw(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    path = out_dir / "step-000001-epoch-00-loss=1.0000.pt"
    train_state = restore_from_file(model, optimizer, scheduler, torch.load(path, weights_only=False), path)
    resumed_lr = scheduler.get_last_lr()[0]
    model(
        **_batch(vlm, 2)
    ).loss.backward()  # both ranks hold the same batch: the averaged gradient is its own
    optimizer.step()

    def whole(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if isinstance(t, DTensor) else t

    got = {n: whole(p.detach()) for n, p in model.named_parameters() if p.requires_grad}
    got_moments = {
        n: {k: whole(optimizer.state[p][k]) for k in ("exp_avg", "exp_avg_sq")}
        for n, p in model.named_parameters()
        if p.requires_grad
    }
    if rank == 0:
        worst = max((got[n] - w).abs().max().item() for n, w in weights.items())
        worst_moment = max(
            (got_moments[n][k] - m[k]).abs().max().item()
            for n, m in moments.items()
            for k in ("exp_avg", "exp_avg_sq")
        )
        result = {
            "names_match": sorted(got) == sorted(weights),
            "sharded": any(isinstance(p, DTensor) for p in model.parameters()),
            "max_weight_diff": worst,
            "max_moment_diff": worst_moment,
            "train_state": train_state,
            "resumed_lr": resumed_lr,
        }
        (out_dir / "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


# === The tests ====================================================================================================


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from train_runs import run_torchrun_worker

    out = tmp_path_factory.mktemp("legacy_resume")
    run_torchrun_worker(__file__, out, timeout=300)
    return json.loads((out / "result.json").read_text())


def test_sharded_resume_from_a_single_file_takes_the_plain_models_next_step(result: dict[str, Any]) -> None:
    """The same weights and AdamW moments after the resumed step as without sharding (FP32: rounding only)."""
    assert result["sharded"] and result["names_match"]
    assert result["max_weight_diff"] <= 1e-6, result
    assert result["max_moment_diff"] <= 1e-7, result


def test_schedule_and_train_state_come_back(result: dict[str, Any]) -> None:
    """The LambdaLR continues at step 1 (lr / 2), and the saved counters are returned."""
    assert result["resumed_lr"] == LR / 2
    assert result["train_state"] == {"step": 1, "epoch": 0, "frames": 2}


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _worker(Path(sys.argv[1]))
