"""End to end: `torchrun --nproc-per-node 2 vla_scripts/train.py` on the toy mixture, then resume.

The resumed run must reproduce the uninterrupted run exactly: same per-step losses and learning rates after
the resume point, and the same final weights and optimizer moments. That can only hold if the model, optimizer,
LR schedule and data position were all restored.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prismatic.training.trackers import read_metrics

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "vla_scripts" / "train.py")
STEPS, SAVE_EVERY = 6, 3


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_train(args: list[str], nproc: int | None = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    if nproc is None:
        # A plain process joins a group of one on MASTER_PORT (29500 by default): pick a free port so that
        # concurrent test runs on the same machine do not collide (torchrun --standalone picks its own).
        env["MASTER_PORT"] = str(free_port())
        cmd = [sys.executable, TRAIN, *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(nproc),
            TRAIN,
            *args,
        ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def tiny_args(data_root: Path, run_root: Path, run_id: str, *extra: str) -> list[str]:
    return [
        "--vla.type",
        "tiny+mx-toy",
        "--data_root_dir",
        str(data_root),
        "--run_root_dir",
        str(run_root),
        "--run_id",
        run_id,
        "--vla.max_steps",
        str(STEPS),
        "--save_interval",
        str(SAVE_EVERY),
        *extra,
    ]


def checkpoints(run_dir: Path) -> dict[int, Path]:
    return {int(p.name[5:11]): p for p in (run_dir / "checkpoints").glob("step-*.pt")}


@pytest.fixture(scope="module")
def full_run(toy_data_root: Path, tmp_path_factory) -> Path:
    run_root = tmp_path_factory.mktemp("runs")
    proc = run_train(tiny_args(toy_data_root, run_root, "full"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return run_root / "full"


def test_run_folder_contents(full_run: Path):
    config = json.loads((full_run / "config.json").read_text())
    assert config["vla"]["type"] == "tiny+mx-toy" and config["vla"]["max_steps"] == STEPS
    assert (full_run / "config.yaml").read_text().startswith("vla:")

    stats = json.loads((full_run / "dataset_statistics.json").read_text())
    assert set(stats) == {"toy_pick_place", "toy_push"}
    for entry in stats.values():
        assert {"mean", "std", "min", "max", "q01", "q99", "mask"} <= set(entry["action"])
        assert len(entry["action"]["q99"]) == 7 and entry["num_transitions"] > 0

    records = read_metrics(full_run)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for key in (
        "loss",
        "action_accuracy",
        "l1_loss",
        "learning_rate",
        "step_time_s",
        "samples_per_s",
        "toy_pick_place/action_accuracy",
        "toy_push/l1_loss",
    ):
        assert key in records[-1], key
    assert records[-1]["loss"] < records[0]["loss"]

    assert sorted(checkpoints(full_run)) == [3, 6]
    wandb_id = (full_run / "wandb_run_id.txt").read_text().strip()
    offline = list((full_run / "wandb").glob(f"offline-run-*-{wandb_id}"))
    assert len(offline) == 1 and (offline[0] / f"run-{wandb_id}.wandb").stat().st_size > 0


def test_checkpoint_loads_without_distributed_setup(full_run: Path):
    from prismatic.models import build_vlm

    ckpt = torch.load(checkpoints(full_run)[6], map_location="cpu", weights_only=True)
    assert set(ckpt["model"]) == {"vision_backbone", "projector", "llm_backbone"}
    assert ckpt["train_state"]["step"] == 6 and ckpt["train_state"]["world_size"] == 2
    vlm = build_vlm("tiny-vit+tiny-llama")
    flat = {f"{m}.{k}": v for m, sd in ckpt["model"].items() for k, v in sd.items()}
    result = vlm.load_state_dict(flat, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert all(v.dtype == torch.float32 for v in flat.values())


def test_trained_run_folder_is_a_policy(full_run: Path):
    """What `make demo` then `load_policy("runs/demo")` does: the newest checkpoint, with the run's statistics."""
    import numpy as np

    from prismatic.inference import load_policy

    policy = load_policy(full_run)
    stats = json.loads((full_run / "dataset_statistics.json").read_text())
    assert policy.unnorm_keys == ["toy_pick_place", "toy_push"] and policy.norm_stats == stats
    newest = torch.load(checkpoints(full_run)[6], map_location="cpu", weights_only=True)["model"]
    assert torch.equal(
        policy.vlm.projector.state_dict()["projector.0.weight"], newest["projector"]["projector.0.weight"]
    )
    image = np.full((64, 64, 3), (200, 40, 40), dtype=np.uint8)
    for key in policy.unnorm_keys:
        action = policy.predict_action(image, "pick up the red block", unnorm_key=key)
        low, high = np.array(stats[key]["action"]["q01"]), np.array(stats[key]["action"]["q99"])
        mask = np.array(stats[key]["action"]["mask"])
        assert (
            action.shape == (7,) and (action[mask] >= low[mask]).all() and (action[mask] <= high[mask]).all()
        )


def test_resume_continues_exactly_like_an_uninterrupted_run(
    full_run: Path, toy_data_root: Path, tmp_path: Path
):
    # A copy of the run as it stood after step 3 (later checkpoints removed, logs kept: they must be cut back).
    resumed = tmp_path / "resumed"
    shutil.copytree(full_run, resumed)
    for step, path in checkpoints(resumed).items():
        if step > SAVE_EVERY:
            path.unlink()
    ckpt = checkpoints(resumed)[SAVE_EVERY]
    args = tiny_args(
        toy_data_root,
        tmp_path,
        "ignored",
        "--pretrained_checkpoint",
        str(ckpt),
        "--resume_step",
        str(SAVE_EVERY),
        "--resume_epoch",
        ckpt.name[18:20],
    )
    args[args.index("--run_id") : args.index("--run_id") + 2] = []  # resume into the checkpoint's run folder
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    full, again = read_metrics(full_run), read_metrics(resumed)
    assert [r["step"] for r in again] == list(range(1, STEPS + 1))  # log continued, not restarted
    for a, b in zip(full[SAVE_EVERY:], again[SAVE_EVERY:], strict=True):
        assert b["learning_rate"] == pytest.approx(a["learning_rate"], rel=1e-12)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
        assert b["action_accuracy"] == pytest.approx(a["action_accuracy"], abs=1e-9)

    end_full = torch.load(checkpoints(full_run)[STEPS], weights_only=True)
    end_again = torch.load(checkpoints(resumed)[STEPS], weights_only=True)
    for name, moments in end_full["optimizer"]["state"].items():
        assert int(end_again["optimizer"]["state"][name]["step"]) == STEPS
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                end_again["optimizer"]["state"][name][key], moments[key], rtol=1e-4, atol=1e-7
            )
    for module, sd in end_full["model"].items():
        for key, value in sd.items():
            torch.testing.assert_close(end_again["model"][module][key], value, rtol=1e-4, atol=1e-6)
    assert end_again["lr_scheduler"]["last_epoch"] == STEPS
    assert (resumed / "wandb_run_id.txt").read_text() == (full_run / "wandb_run_id.txt").read_text()


def test_restored_optimizer_state_equals_the_saved_one(full_run: Path, tmp_path: Path):
    """Load a checkpoint into a fresh model + optimizer the way resume does, and read the state back."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from prismatic.models import build_vlm
    from prismatic.training.checkpointing import Checkpointer, load_checkpoint_file
    from prismatic.training.optim import build_lr_scheduler, build_optimizer

    path = checkpoints(full_run)[SAVE_EVERY]
    ckpt = load_checkpoint_file(path)
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.freeze_backbones("vla-full-train")
    opt = build_optimizer(vlm, 1e-3, 0.01)
    sched = build_lr_scheduler(opt, "linear-warmup+cosine-decay", STEPS, 0.1)
    Checkpointer.load_model_weights(vlm, ckpt, path)
    state = Checkpointer.load_training_state(vlm, opt, sched, ckpt, path)
    assert state["step"] == SAVE_EVERY and state["samples_per_rank"] == SAVE_EVERY * 8
    restored = get_optimizer_state_dict(vlm, opt, options=StateDictOptions(full_state_dict=True))
    for name, saved in ckpt["optimizer"]["state"].items():
        assert torch.equal(restored["state"][name]["exp_avg"], saved["exp_avg"])
        assert torch.equal(restored["state"][name]["exp_avg_sq"], saved["exp_avg_sq"])
        assert float(restored["state"][name]["step"]) == SAVE_EVERY
    assert sched.last_epoch == SAVE_EVERY
    assert sched.get_last_lr()[0] == pytest.approx(read_metrics(full_run)[SAVE_EVERY]["learning_rate"])


def test_ddp_with_gradient_accumulation_matches_fsdp(full_run: Path, toy_data_root: Path, tmp_path: Path):
    """DDP, 2 micro-batches of 4 per step: the same samples per step as FSDP's 1 x 8, so the same losses."""
    proc = run_train(
        tiny_args(
            toy_data_root,
            tmp_path,
            "ddp",
            "--vla.train_strategy",
            "ddp",
            "--vla.per_device_batch_size",
            "4",
            "--vla.max_steps",
            "3",
            "--save_interval",
            "100",
        )
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ddp, fsdp = read_metrics(tmp_path / "ddp"), read_metrics(full_run)
    assert [r["step"] for r in ddp] == [1, 2, 3]
    # lr differs (3-step vs 6-step cosine), so only step 1 is comparable exactly; later steps stay close.
    assert ddp[0]["loss"] == pytest.approx(fsdp[0]["loss"], rel=1e-4)
    assert ddp[0]["action_accuracy"] == pytest.approx(fsdp[0]["action_accuracy"], abs=1e-9)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vla.type", "tiny+mx-tyo"], "Unknown --vla.type 'tiny+mx-tyo'. Did you mean 'tiny+mx-toy'?"),
        (["--vla.type", "tiny+mx-toy", "--data_root_dir", "/nonexistent/data"], "expected_world_size=2"),
        (
            [
                "--vla.type",
                "tiny+mx-toy",
                "--vla.expected_world_size",
                "1",
                "--vla.global_batch_size",
                "8",
                "--data_root_dir",
                "/nonexistent/data",
            ],
            "data_root_dir '/nonexistent/data' does not exist",
        ),
    ],
)
def test_bad_input_exits_with_a_clear_message(args, message):
    proc = run_train(args, nproc=None)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_resume_step_mismatch_is_a_clear_error(full_run: Path, toy_data_root: Path, tmp_path: Path):
    ckpt = checkpoints(full_run)[SAVE_EVERY]
    proc = run_train(
        [
            "--vla.type",
            "tiny+mx-toy",
            "--vla.expected_world_size",
            "1",
            "--vla.global_batch_size",
            "8",
            "--data_root_dir",
            str(toy_data_root),
            "--pretrained_checkpoint",
            str(ckpt),
            "--resume_step",
            "4",
            "--resume_epoch",
            "0",
        ],
        nproc=None,
    )
    assert proc.returncode == 2
    assert f"do not match checkpoint '{ckpt.name}'" in proc.stderr and "Traceback" not in proc.stderr


def test_mixture_dataset_missing_from_data_root_is_a_clear_error(toy_data_root: Path, tmp_path: Path):
    partial = tmp_path / "data"
    partial.mkdir()
    (partial / "toy_pick_place").symlink_to(toy_data_root / "toy_pick_place")
    proc = run_train(
        [
            "--vla.type",
            "tiny+mx-toy",
            "--vla.expected_world_size",
            "1",
            "--vla.global_batch_size",
            "8",
            "--data_root_dir",
            str(partial),
            "--run_root_dir",
            str(tmp_path / "runs"),
        ],
        nproc=None,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "toy_push" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("strategy", ["fsdp-full-shard", "fsdp-shard-grad-op"])
def test_fsdp_bf16_with_gradient_accumulation(strategy: str, toy_data_root: Path, tmp_path: Path):
    """FSDP + bf16 + 4 accumulated micro-batches (2 x 2 processes x 8 = 32): the ViT block after the feature layer
    never runs, and sharding it as its own unit crashed the first no-sync backward. Its weights still reach the
    checkpoint, untrained."""
    from prismatic.models import build_vlm

    args = tiny_args(toy_data_root, tmp_path, "accum", "--vla.global_batch_size", "32")
    args += ["--vla.max_steps", "2", "--vla.train_strategy", strategy]
    args += ["--vla.enable_mixed_precision_training", "true", "--trackers", "jsonl"]
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = read_metrics(tmp_path / "accum")
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] == r["loss"] for r in records)
    vision = torch.load(checkpoints(tmp_path / "accum")[2], weights_only=True)["model"]["vision_backbone"]
    torch.manual_seed(7)  # the run's seed: the same initial weights
    built = build_vlm("tiny-vit+tiny-llama").vision_backbone
    assert set(vision) == set(built.state_dict())
    unused = {
        name
        for name, p in built.named_parameters()
        if any(p is q for m in built.unused_modules() for q in m.parameters())
    }
    # Frozen weights are kept in bf16 under mixed precision, so they come back bf16-rounded.
    initial = {name: built.state_dict()[name].to(torch.bfloat16).float() for name in unused}
    assert unused and all(torch.equal(vision[name], initial[name]) for name in unused)


def test_fused_backbone_shard_grad_op_bf16_last_layer(toy_data_root: Path, tmp_path: Path):
    """The other code paths: fused DINO+SigLIP backbone, ZeRO-2 sharding, bf16 mixed precision, frozen stages."""
    proc = run_train(
        [
            "--vla.type",
            "tiny-dinosiglip+mx-toy",
            "--data_root_dir",
            str(toy_data_root),
            "--run_root_dir",
            str(tmp_path),
            "--run_id",
            "fused",
            "--vla.max_steps",
            "2",
            "--vla.train_strategy",
            "fsdp-shard-grad-op",
            "--vla.enable_mixed_precision_training",
            "true",
            "--vla.freeze_vision_backbone",
            "true",
            "--vla.freeze_llm_backbone",
            "true",
            "--vla.unfreeze_last_llm_layer",
            "true",
            "--trackers",
            "[jsonl]",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = read_metrics(tmp_path / "fused")
    assert len(records) == 2 and all(r["loss"] == r["loss"] for r in records)  # finite, not NaN
    ckpt = torch.load(checkpoints(tmp_path / "fused")[2], weights_only=True)
    assert all(t.dtype == torch.float32 for sd in ckpt["model"].values() for t in sd.values())
    trained = set(ckpt["optimizer"]["state"])
    assert trained and all(name.startswith("llm_backbone.") for name in trained)
    # Frozen parts are stored in bf16 next to FP32 trainable ones inside the same FSDP units (the root unit holds the
    # frozen projector and the trainable embeddings), and the start-up report says so.
    (memory,) = [line for line in proc.stderr.splitlines() if "Parameter memory:" in line]
    assert "bfloat16" in memory and "float32" in memory, memory
    bf16_part = memory.split("bfloat16 ")[1]
    assert bf16_part.split(" (")[1].startswith("0.00 MB trainable"), memory


def test_export_hf_then_fine_tune_from_it(full_run: Path, toy_data_root: Path, tmp_path: Path):
    """A run's checkpoint -> HF OpenVLA folder (vla_scripts/export_hf.py) -> `--vla.base_vlm <folder>` trains on."""
    from prismatic.models import load_vla

    hf_dir = tmp_path / "hf"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "vla_scripts" / "export_hf.py"),
            "--checkpoint",
            str(checkpoints(full_run)[STEPS]),
            "--out_dir",
            str(hf_dir),
            "--dtype",
            "float32",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    config = json.loads((hf_dir / "config.json").read_text())
    stats = json.loads((full_run / "dataset_statistics.json").read_text())
    assert config["model_type"] == "openvla" and config["norm_stats"] == stats

    # The exported weights are the checkpoint's.
    ckpt = torch.load(checkpoints(full_run)[STEPS], weights_only=True)
    exported = load_vla(hf_dir).vlm.state_dict()
    for module, sd in ckpt["model"].items():
        for key, value in sd.items():
            assert torch.equal(exported[f"{module}.{key}"], value), key

    # Run folders as base VLMs go through the same loader (tests/models/test_checkpoint_io.py covers them).
    for base in (hf_dir,):
        run_id = f"from-{base.name}"
        proc = run_train(
            [
                "--vla.type",
                "tiny+mx-toy",
                "--vla.base_vlm",
                str(base),
                "--vla.expected_world_size",
                "1",
                "--vla.global_batch_size",
                "2",
                "--vla.per_device_batch_size",
                "2",
                "--vla.max_steps",
                "2",
                "--data_root_dir",
                str(toy_data_root),
                "--run_root_dir",
                str(tmp_path),
                "--run_id",
                run_id,
                "--trackers",
                "[jsonl]",
            ],
            nproc=None,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        records = read_metrics(tmp_path / run_id)
        # Started from the trained weights, not from scratch: the first loss is already far below ln(vocab).
        assert len(records) == 2 and records[0]["loss"] < read_metrics(full_run)[0]["loss"]


def _tiny_batch(vlm) -> dict:
    tokenizer = vlm.llm_backbone.tokenizer
    encoded = tokenizer(
        ["In: What action should the robot take to push the can?\nOut: "], return_tensors="pt"
    )
    generator = torch.Generator().manual_seed(0)
    return {
        "input_ids": encoded.input_ids,
        "attention_mask": encoded.attention_mask,
        "pixel_values": torch.randn(1, *vlm.vision_backbone.default_image_resolution, generator=generator),
    }


def test_lora_fsdp_resume_merge_and_ddp(toy_data_root: Path, tmp_path: Path):
    """LoRA through the same loop: FSDP2 run, exact resume, adapters in the checkpoint, merge = adapter model."""
    from prismatic.models import build_vlm, load_vla
    from prismatic.models.lora import LoraSettings, apply_lora

    def lora_args(run_id: str, *extra: str) -> list[str]:
        args = tiny_args(toy_data_root, tmp_path, run_id, "--trackers", "[jsonl]", *extra)
        # Small batches keep the four runs short; bf16 mixed precision as OpenVLA trains.
        args += ["--vla.enable_mixed_precision_training", "true"]
        args += ["--vla.per_device_batch_size", "2", "--vla.global_batch_size", "4"]
        args[1] = "tiny-lora+mx-toy"
        args[args.index("--vla.max_steps") + 1], args[args.index("--save_interval") + 1] = "4", "2"
        return args

    # bf16 mixed precision: frozen base weights are stored in bf16 beside FP32 adapters in the same FSDP units.
    proc = run_train(lora_args("lora"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (memory,) = [line for line in proc.stderr.splitlines() if "Parameter memory:" in line]
    assert "bfloat16" in memory, memory
    run = tmp_path / "lora"
    ckpt = torch.load(checkpoints(run)[4], weights_only=True)
    flat = {f"{m}.{k}": v for m, sd in ckpt["model"].items() for k, v in sd.items()}
    assert any(".lora_A.default." in k for k in flat) and any(".base_layer." in k for k in flat)
    assert ckpt["optimizer"]["state"] and all(".lora_" in name for name in ckpt["optimizer"]["state"])

    # Resume from step 2 in a copy of the run: the same losses as the uninterrupted run.
    resumed = tmp_path / "resumed" / "lora"
    shutil.copytree(run, resumed)
    checkpoints(resumed)[4].unlink()
    args = lora_args("lora", "--pretrained_checkpoint", str(checkpoints(resumed)[2]))
    args += ["--resume_step", "2", "--resume_epoch", checkpoints(resumed)[2].name[18:20]]
    args[args.index("--run_root_dir") + 1] = str(tmp_path / "resumed")
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for a, b in zip(read_metrics(run)[2:], read_metrics(resumed)[2:], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)

    # The adapter model (built fresh, checkpoint loaded strictly) and the merged run folder give the same logits.
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "vla_scripts" / "merge_lora.py"),
            "--checkpoint",
            str(checkpoints(run)[4]),
        ]
        + [
            "--out_dir",
            str(tmp_path / "merged"),
            "--hf_out_dir",
            str(tmp_path / "hf"),
            "--hf_dtype",
            "float32",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    adapter_model = build_vlm("tiny-vit+tiny-llama")
    adapter_model.freeze_backbones("vla-full-train")
    apply_lora(adapter_model, LoraSettings(rank=8, alpha=16.0))
    adapter_model.load_state_dict(flat, strict=True)
    merged = load_vla(tmp_path / "merged")
    assert set(merged.vlm.state_dict()) == set(build_vlm("tiny-vit+tiny-llama").state_dict())
    assert merged.norm_stats == json.loads((run / "dataset_statistics.json").read_text())
    batch = _tiny_batch(adapter_model)
    with torch.no_grad():
        expected = adapter_model.eval()(
            batch["input_ids"], batch["attention_mask"], batch["pixel_values"]
        ).logits
        for model in (merged.vlm, load_vla(tmp_path / "hf").vlm):
            got = model.eval()(batch["input_ids"], batch["attention_mask"], batch["pixel_values"]).logits
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    # DDP (with bf16 autocast) trains the same adapters.
    args = lora_args(
        "lora-ddp", "--vla.train_strategy", "ddp", "--vla.enable_mixed_precision_training", "true"
    )
    args[args.index("--vla.max_steps") + 1] = "2"
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert [r["step"] for r in read_metrics(tmp_path / "lora-ddp")] == [1, 2]
