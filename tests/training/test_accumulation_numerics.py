"""Gradient accumulation and clipping, through the real strategies and `train_loop` on 2 ranks (gloo, CPU, FP32).

For FSDP2 full-shard, FSDP2 shard-grad-op and DDP (gradients copied into its buckets one by one, and a bucket at a
time with `--vla.speed.batched_grad_copy on`), each with and without LoRA: K micro-batches of B frames per rank must
give the same optimiser steps as one batch of K * B frames, and both must equal a reference computed in this file
without any of the code under test: a plain model from the same seed, the loss of each rank's K * B frames
averaged over the ranks (what data parallelism means), the global gradient norm and clip factor computed by hand,
and torch's own AdamW. Clipping acts on every step (`max_grad_norm` below every step's norm), and the unclipped
reference is shown to end elsewhere, so a loop or strategy that skipped clipping, scaled the loss by the wrong
number of micro-batches, or reported the norm after clipping fails here.

Everything distributed runs once, in one `torchrun --nproc-per-node 2` of this file (its `__main__` is the worker);
the worker writes what it measured and the tests compare.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
BASE = "tiny-vit+tiny-llama"
SEED = 3
STEPS, K, B = 3, 2, 2  # optimiser steps; micro-batches per step and frames per micro-batch, per rank
LR, WEIGHT_DECAY, MAX_NORM, EPS = 3e-3, 0.01, 0.05, 1e-6  # EPS: the clip formula's, max / (norm + 1e-6)
# (strategy, LoRA, DDP's batched gradient copies)
SCENARIOS = [
    (s, lora, False) for s in ("fsdp-full-shard", "fsdp-shard-grad-op", "ddp") for lora in (False, True)
]
SCENARIOS += [("ddp", lora, True) for lora in (False, True)]
INSTRUCTIONS = ["pick up the red block", "push the can", "open the top drawer of the cabinet", "wipe"]
# Losses and norms: FP32 sums in another order (per micro-batch vs per batch, sharded vs whole), ~5e-7 relative
# seen. Weights after 3 AdamW steps of lr 3e-3: AdamW divides by sqrt(v), so on entries whose gradient is near 0 the
# same rounding moves an update by a sliver of lr (2.3e-6 at most seen); a missing clip moves weights by 7.6e-3
# (asserted below: far outside the tolerance, not assumed).
RTOL, ATOL = 1e-5, 1e-5


def _name(strategy: str, lora: bool, batched: bool) -> str:
    return f"{strategy}{'+batched-copy' if batched else ''}{'+lora' if lora else ''}"


# === The worker (runs under torchrun) =============================================================================


def _frames(vlm: Any, rank: int, step: int) -> list[dict[str, Any]]:
    """The K * B frames rank `rank` trains on at `step`: prompts of different lengths, 7 random action tokens + EOS
    (labels on those), random images. Deterministic in (rank, step), so rank 0 can rebuild every rank's frames."""
    tokenizer = vlm.llm_backbone.tokenizer
    vocab = tokenizer.vocab_size
    frames = []
    for i in range(K * B):
        g = torch.Generator().manual_seed(1000 * rank + 10 * step + i)
        instruction = INSTRUCTIONS[(rank + step + i) % len(INSTRUCTIONS)]
        prefix = tokenizer(f"In: What action should the robot take to {instruction}?\nOut:").input_ids
        actions = torch.randint(vocab - 256, vocab, (7,), generator=g).tolist()
        input_ids = torch.tensor([*prefix, *actions, tokenizer.eos_token_id])
        labels = input_ids.clone()
        labels[: len(prefix)] = -100
        pixels = torch.rand(vlm.vision_backbone.default_image_resolution, generator=g)
        frames.append({"input_ids": input_ids, "labels": labels, "pixel_values": pixels})
    return frames


def _collate(frames: list[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """Right padding with an attention mask and -100 labels, as the project's collator does (written here)."""
    length = max(len(f["input_ids"]) for f in frames)
    input_ids = torch.full((len(frames), length), pad_id)
    labels = torch.full((len(frames), length), -100)
    mask = torch.zeros((len(frames), length), dtype=torch.bool)
    for row, frame in enumerate(frames):
        n = len(frame["input_ids"])
        input_ids[row, :n], labels[row, :n], mask[row, :n] = frame["input_ids"], frame["labels"], True
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "labels": labels,
        "pixel_values": torch.stack([f["pixel_values"] for f in frames]),
        "dataset_names": ["d"] * len(frames),
    }


def _build(lora: bool, on_meta: bool) -> Any:
    from prismatic.models import load
    from prismatic.models.lora import LoraSettings, apply_lora

    torch.manual_seed(SEED)
    vlm = load(BASE, device="meta" if on_meta else None)
    vlm.freeze_backbones("vla-full-train")
    if lora:
        apply_lora(vlm, LoraSettings(rank=8, alpha=16.0))
    return vlm


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every trainable parameter, whole (collective for FSDP), names without wrapper prefixes."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            value = param.full_tensor() if isinstance(param, DTensor) else param
            out[name.replace("_checkpoint_wrapped_module.", "").removeprefix("module.")] = (
                value.detach().clone()
            )
    return out


class _Recorder:
    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append({k: metrics[k] for k in ("loss", "grad_norm", "action_accuracy")})


class _NoCheckpoints:
    def should_save(self, step: int, is_last: bool) -> bool:
        return False

    def poll(self) -> None: ...

    def wait(self) -> None: ...


class _NoPreemption:
    def votes(self) -> torch.Tensor:
        return torch.zeros(2, dtype=torch.float64)

    def agreed(self, ranks_per_signal: torch.Tensor) -> int:
        return 0


def _train(
    strategy_id: str, lora: bool, batched: bool, per_device: int, rank: int, world: int
) -> dict[str, Any]:
    """`STEPS` optimiser steps through the project's strategy and loop; per-step metrics and final weights."""
    from prismatic.conf.vla import get_vla_config
    from prismatic.models.action_heads import ActionSpec, build_action_head
    from prismatic.training.metrics import StepMetrics
    from prismatic.training.strategies import get_train_strategy
    from prismatic.training.trainer import LoopHooks, LoopPlan, train_loop
    from prismatic.util.dist import DistInfo
    from prismatic.vla.action_tokenizer import ActionTokenizer

    vla = get_vla_config("tiny+mx-toy")
    vla.train_strategy, vla.per_device_batch_size = strategy_id, per_device
    vla.global_batch_size = K * B * world
    vla.learning_rate, vla.weight_decay, vla.max_grad_norm = LR, WEIGHT_DECAY, MAX_NORM
    vla.lr_scheduler_type, vla.warmup_ratio = "constant", 0.0
    vla.speed.batched_grad_copy = "on" if batched else "auto"  # auto: off on CPU
    vla.check_values()

    vlm = _build(lora, on_meta=rank != 0)  # rank 0 loads, the others receive its weights (as train.py)
    spec = ActionSpec()
    vlm.attach_action_modules(spec)
    strategy = get_train_strategy(vlm, vla, DistInfo(rank, rank, world, 1, torch.device("cpu")))
    strategy.setup(STEPS)
    assert strategy.grad_accumulation_steps == K * B // per_device
    tokenizer = vlm.llm_backbone.tokenizer
    head = build_action_head(spec, ActionTokenizer(tokenizer), vlm.num_prefix_tokens)

    def batches():
        for step in range(1, STEPS + 1):
            frames = _frames(vlm, rank, step)
            for start in range(0, len(frames), per_device):
                yield _collate(frames[start : start + per_device], tokenizer.pad_token_id)

    recorder = _Recorder()
    train_loop(
        strategy,
        head,
        batches(),
        StepMetrics(["d"], head, torch.device("cpu")),
        LoopPlan(0, STEPS, STEPS, K * B * world, None, show_progress=False),
        {"step": 0, "epoch": 0, "frames": 0},
        LoopHooks([recorder], _NoCheckpoints(), _NoPreemption()),
    )
    return {"metrics": recorder.rows, "weights": _trainable(strategy.model)}


def _reference(lora: bool, world: int, clip: bool) -> dict[str, Any]:
    """The same training by hand: loss averaged over ranks, global norm and clip factor, torch's AdamW."""
    vlm = _build(lora, on_meta=False)
    params = {n: p for n, p in vlm.named_parameters() if p.requires_grad}
    decay = [p for n, p in params.items() if p.ndim > 1 and not n.endswith(".bias")]
    no_decay = [p for n, p in params.items() if not (p.ndim > 1 and not n.endswith(".bias"))]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}], lr=LR
    )
    pad_id = vlm.llm_backbone.tokenizer.pad_token_id
    rows = []
    vlm.train()
    for step in range(1, STEPS + 1):
        losses = [vlm(**_model_inputs(_collate(_frames(vlm, r, step), pad_id))).loss for r in range(world)]
        loss = sum(losses) / world
        loss.backward()
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params.values() if p.grad is not None))
        if clip:
            factor = min(1.0, MAX_NORM / (norm.item() + EPS))
            for p in params.values():
                if p.grad is not None:
                    p.grad.mul_(factor)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rows.append({"loss": loss.item(), "grad_norm": norm.item()})
    return {"metrics": rows, "weights": {n: p.detach().clone() for n, p in params.items()}}


def _model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: batch[k] for k in ("input_ids", "attention_mask", "pixel_values", "labels")}


def _compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Largest absolute and relative-excess difference between two weight sets with the same names."""
    worst, excess = 0.0, 0.0
    for name, value in a.items():
        diff = (value - b[name]).abs()
        worst = max(worst, diff.max().item())
        excess = max(excess, (diff - (ATOL + RTOL * b[name].abs())).max().item())
    return {"same_names": sorted(a) == sorted(b), "max_abs": worst, "within_tolerance": excess <= 0}


def _worker(out_dir: Path) -> None:
    import huggingface_hub.constants
    import torch.distributed as dist

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict[str, Any] = {}
    weights: dict[str, dict[str, torch.Tensor]] = {}
    for strategy_id, lora, batched in SCENARIOS:
        accumulated = _train(strategy_id, lora, batched, B, rank, world)  # K micro-batches of B
        whole = _train(strategy_id, lora, batched, K * B, rank, world)  # one batch of K * B
        if rank == 0:
            name = _name(strategy_id, lora, batched)
            results[name] = _measure(lora, world, accumulated, whole)
            weights[name] = accumulated["weights"]
            if batched:  # dividing by 2 after the copy or multiplying by 1/2 during it: the same bits
                one_by_one = weights[_name(strategy_id, lora, False)]
                results[name]["equals_one_by_one"] = sorted(one_by_one) == sorted(weights[name]) and all(
                    torch.equal(value, one_by_one[n]) for n, value in weights[name].items()
                )
        dist.barrier()  # rank 1 waits while rank 0 computes the references
    if rank == 0:
        (out_dir / "results.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def _measure(lora: bool, world: int, accumulated: dict[str, Any], whole: dict[str, Any]) -> dict[str, Any]:
    reference = _reference(lora, world, clip=True)
    unclipped = _reference(lora, world, clip=False)
    return {
        "accumulated": accumulated["metrics"],
        "whole": whole["metrics"],
        "reference": reference["metrics"],
        "accumulated_vs_whole": _compare(accumulated["weights"], whole["weights"]),
        "accumulated_vs_reference": _compare(accumulated["weights"], reference["weights"]),
        "whole_vs_reference": _compare(whole["weights"], reference["weights"]),
        "accumulated_vs_unclipped": _compare(accumulated["weights"], unclipped["weights"]),
        "lora_params": sum(".lora_" in n for n in accumulated["weights"]),
        "trained_params": len(accumulated["weights"]),
    }


# === The tests ====================================================================================================


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from train_runs import run_torchrun_worker

    out = tmp_path_factory.mktemp("accumulation")
    run_torchrun_worker(__file__, out, timeout=400)
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("scenario", [_name(*scenario) for scenario in SCENARIOS])
def test_micro_batches_give_the_update_of_one_large_batch(results: dict[str, Any], scenario: str) -> None:
    """K micro-batches of B == one batch of K * B == the hand-computed reference: weights after 3 steps, and every
    step's loss and pre-clip gradient norm."""
    got = results[scenario]
    assert got["accumulated_vs_whole"]["same_names"], "the two runs train different parameters"
    assert got["accumulated_vs_whole"]["within_tolerance"], got["accumulated_vs_whole"]
    assert got["accumulated_vs_reference"]["within_tolerance"], got["accumulated_vs_reference"]
    assert got["whole_vs_reference"]["within_tolerance"], got["whole_vs_reference"]
    for run in ("accumulated", "whole"):
        for key in ("loss", "grad_norm"):
            assert [r[key] for r in got[run]] == pytest.approx(
                [r[key] for r in got["reference"]], rel=RTOL
            ), (run, key)
    if scenario.endswith("+lora"):
        assert got["lora_params"] > 0 and got["lora_params"] == got["trained_params"]
    else:
        assert got["lora_params"] == 0
    if "+batched-copy" in scenario:
        assert got["equals_one_by_one"], "batched copies changed the weights DDP's per-parameter copies give"


@pytest.mark.parametrize("scenario", [_name(*scenario) for scenario in SCENARIOS])
def test_clipping_acts_and_the_reported_norm_is_before_clipping(
    results: dict[str, Any], scenario: str
) -> None:
    """Every step's norm is above max_grad_norm (so the clip changes the gradient), the logged norm is the unclipped
    one (above max_grad_norm, equal to the reference's), and the weights end where the clipped reference ends, far
    from where the unclipped one does."""
    got = results[scenario]
    assert all(r["grad_norm"] > 2 * MAX_NORM for r in got["reference"]), got["reference"]
    assert all(r["grad_norm"] > 2 * MAX_NORM for r in got["accumulated"])
    assert not got["accumulated_vs_unclipped"]["within_tolerance"]
    assert got["accumulated_vs_unclipped"]["max_abs"] > 100 * max(
        got["accumulated_vs_reference"]["max_abs"], ATOL
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _worker(Path(sys.argv[1]))
