"""End to end: `torchrun --nproc-per-node 2 vla_scripts/train.py` on the toy mixture, then resume.

The resumed run must reproduce the uninterrupted run exactly: the same per-step losses and learning rates after
the resume point (`==`), and the same final weights and optimizer moments. That can only hold if the model,
optimizer, LR schedule and data position were all restored: tests/test_resume_e2e.py resumes after kill -9 mid-save
and after SIGTERM, on another world size and on two "nodes" on one machine; tests/test_resume_randomness_e2e.py
resumes a LoRA run with dropout, image augmentation, accumulation and bf16 mixed precision.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scripts import import_script
from train_runs import (
    REPO,
    SAVE_EVERY,
    STEPS,
    assert_same_training_curve,
    checkpoints,
    consolidated,
    parameter_memory_line,
    run_train,
    tiny_args,
)

from prismatic.models.checkpoint_format import load_checkpoint_file, newest_checkpoint
from prismatic.training.trackers import read_metrics


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
    assert [r["frames"] for r in records] == [16 * step for step in range(1, STEPS + 1)]
    # Teacher-forced evaluation on the held-out split at --eval.interval and at the end, overall and per dataset.
    evaluated = [r["step"] for r in records if "val/loss" in r]
    assert evaluated == [3, 6]
    for key in (
        "val/loss",
        "val/action_accuracy",
        "val/l1_loss",
        "val/toy_push/loss",
        "val/toy_pick_place/l1_loss",
    ):
        assert key in records[2] and records[2][key] == records[2][key], key

    assert sorted(checkpoints(full_run)) == [3, 6]
    assert newest_checkpoint(full_run / "checkpoints") == checkpoints(full_run)[6]
    assert (full_run / "checkpoints" / "latest").read_text().strip() == "step-000006-epoch-00"
    state = json.loads((checkpoints(full_run)[6] / "train_state.json").read_text())
    assert (state["step"], state["frames"], state["world_size"], state["seed"]) == (6, 96, 2, 7)
    # Every rank wrote its own shard files and its data-stream snapshot; nothing was gathered on rank 0.
    assert len(list(checkpoints(full_run)[6].glob("*.distcp"))) == 2
    wandb_id = (full_run / "wandb_run_id.txt").read_text().strip()
    offline = list((full_run / "wandb").glob(f"offline-run-*-{wandb_id}"))
    assert len(offline) == 1 and (offline[0] / f"run-{wandb_id}.wandb").stat().st_size > 0


def test_overlapped_and_profiled_steps_train_like_the_reference_run(
    full_run: Path, toy_data_root: Path, tmp_path: Path
):
    """`--vla.speed.overlap_steps on` (CUDA's default) on 2 CPU processes: each step read after the next one is queued,
    except at evaluations and saves; and steps 2-3 profiled (`--profile.*`). Every logged figure, the
    evaluations, the checkpoints and the final weights are the reference run's (`==`), and each rank wrote its own
    trace and summary of the two profiled steps."""
    extra = ("--eval.interval", "3", "--eval.num_batches", "1", "--vla.speed.overlap_steps", "on")
    extra += ("--profile.start_step", "2", "--profile.num_steps", "2")
    proc = run_train(tiny_args(toy_data_root, tmp_path, "overlapped", *extra))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "steps overlapped on" in proc.stderr
    run_dir = tmp_path / "overlapped"
    full, overlapped = read_metrics(full_run), read_metrics(run_dir)
    assert_same_training_curve(full, overlapped)
    assert [r.get("val/loss") for r in overlapped] == [r.get("val/loss") for r in full]
    assert sorted(checkpoints(run_dir)) == [3, 6]
    for step in (3, 6):
        assert load_checkpoint_file(checkpoints(run_dir)[step])["train_state"]["step"] == step
    ours = consolidated(checkpoints(run_dir)[STEPS], tmp_path)["model"]
    for key, value in consolidated(checkpoints(full_run)[STEPS], tmp_path)["model"].items():
        assert torch.equal(ours[key], value), key
    profiled = sorted(p.name for p in (run_dir / "profile").iterdir())
    assert profiled == [
        f"rank{rank:05d}-steps-000002-000003.{kind}.json" for rank in (0, 1) for kind in ("summary", "trace")
    ]
    for rank in (0, 1):
        summary = json.loads(
            (run_dir / "profile" / f"rank{rank:05d}-steps-000002-000003.summary.json").read_text()
        )
        assert summary["steps"] == [2, 3] and summary["units"] == 2
        assert summary["ms_by_kind"]["matmul"] > 0 and summary["launches_by_kind"]["collective"] >= 1
        trace = json.loads(
            (run_dir / "profile" / f"rank{rank:05d}-steps-000002-000003.trace.json").read_text()
        )
        assert any(event.get("name") == "aten::mm" for event in trace["traceEvents"])
    assert "rank 0, steps 2-3" in proc.stderr  # the summary, logged


def test_checkpoint_loads_without_distributed_setup(full_run: Path):
    from prismatic.models import build_vlm

    ckpt = load_checkpoint_file(checkpoints(full_run)[6])
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
    newest = load_checkpoint_file(checkpoints(full_run)[6])["model"]
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


def test_fsdp_bf16_with_gradient_accumulation(toy_data_root: Path, tmp_path: Path):
    """FSDP + bf16 + 4 accumulated micro-batches (2 x 2 processes x 8 = 32), gradients reduced once per step
    (`--grad_sync auto`: they fit here), so the first micro-batch's backward runs without a reduction: the ViT block
    after the feature layer never runs, and sharding it as its own unit crashed that no-sync backward. Its weights
    still reach the checkpoint, untrained. (ZeRO-2 with a reduction after every micro-batch, what `auto` picks when
    the unsharded gradients would not fit: the fused-backbone run below.)"""
    from prismatic.models import build_vlm

    args = tiny_args(toy_data_root, tmp_path, "accum", "--vla.global_batch_size", "32")
    args += ["--vla.max_steps", "2", "--vla.train_strategy", "fsdp-full-shard"]
    args += ["--vla.enable_mixed_precision_training", "true", "--grad_sync", "auto"]
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "Gradient accumulation over 2 micro-batches: gradients reduced once per step" in proc.stderr
    records = read_metrics(tmp_path / "accum")
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] == r["loss"] for r in records)
    vision = load_checkpoint_file(checkpoints(tmp_path / "accum")[2])["model"]["vision_backbone"]
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
    """The other code paths: fused DINO+SigLIP backbone, ZeRO-2 sharding, bf16 mixed precision, frozen stages, and
    2 accumulated micro-batches (2 x 2 processes x 8 = 32) with gradients reduce-scattered after every one."""
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
            "--checkpoint.export_final",
            "true",
            "--checkpoint.data_snapshot",
            "false",
            "--vla.global_batch_size",
            "32",
            "--grad_sync",
            "micro-batch",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert (
        "Gradient accumulation over 2 micro-batches: gradients reduced after every micro-batch" in proc.stderr
    )
    # --checkpoint.data_snapshot false: the checkpoint holds no data-stream snapshot (a resume then skips frames).
    assert sorted(checkpoints(tmp_path / "fused")) == [2]
    assert not (checkpoints(tmp_path / "fused")[2] / "data").exists()
    # --checkpoint.export_final: the HF OpenVLA export of the last checkpoint, beside the run's checkpoints.
    exported = json.loads((tmp_path / "fused" / "hf" / "config.json").read_text())
    assert exported["model_type"] == "openvla" and set(exported["norm_stats"]) == {
        "toy_pick_place",
        "toy_push",
    }
    records = read_metrics(tmp_path / "fused")
    assert len(records) == 2 and all(r["loss"] == r["loss"] for r in records)  # finite, not NaN
    ckpt = consolidated(checkpoints(tmp_path / "fused")[2], tmp_path)
    assert {t.dtype for t in ckpt["model"].values()} == {
        torch.float32,
        torch.bfloat16,
    }  # frozen parts in bf16
    trained = set(ckpt["optimizer"]["state"])
    assert trained and all(name.startswith("llm_backbone.") for name in trained)
    # Frozen parts are stored in bf16 next to FP32 trainable ones inside the same FSDP units (the root unit holds the
    # frozen projector and the trainable embeddings), and the start-up report says so.
    memory = parameter_memory_line(proc.stderr)
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
    ckpt = load_checkpoint_file(checkpoints(full_run)[STEPS])
    exported = load_vla(hf_dir).vlm.state_dict()
    for module, sd in ckpt["model"].items():
        for key, value in sd.items():
            assert torch.equal(exported[f"{module}.{key}"], value), key

    # The model-only export (the script's main, in this process: the command line ran just above): one safetensors
    # file that loads as the same model, with the run's statistics.
    st_dir = tmp_path / "st"
    argv = ["--checkpoint", str(checkpoints(full_run)[STEPS]), "--out_dir", str(st_dir)]
    assert import_script("export_hf").main([*argv, "--format", "safetensors", "--dtype", "float32"]) == 0
    assert sorted(p.name for p in st_dir.rglob("*") if p.is_file()) == [
        "config.json",
        "dataset_statistics.json",
        "model.safetensors",
    ]
    loaded = load_vla(st_dir)
    assert loaded.norm_stats == stats
    for name, value in loaded.vlm.state_dict().items():
        module, _, key = name.partition(".")
        assert torch.equal(value, ckpt["model"][module][key]), name

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


def test_lora_fsdp_merge_and_ddp(toy_data_root: Path, tmp_path: Path):
    """LoRA through the same loop: FSDP2 run, adapters in the checkpoint, merge = adapter model, DDP. (Its exact
    resume, with bf16 and LoRA dropout: tests/test_resume_randomness_e2e.py.)"""
    from prismatic.models import build_vlm, load_vla
    from prismatic.models.lora import LoraSettings, apply_lora

    def lora_args(run_id: str, *extra: str) -> list[str]:
        args = tiny_args(toy_data_root, tmp_path, run_id, *extra)
        # Small batches keep the four runs short; bf16 mixed precision as OpenVLA trains.
        args += ["--vla.enable_mixed_precision_training", "true"]
        args += ["--vla.per_device_batch_size", "2", "--vla.global_batch_size", "4"]
        args[1] = "tiny-lora+mx-toy"
        args[args.index("--vla.max_steps") + 1], args[args.index("--save_interval") + 1] = "4", "4"
        return args

    # bf16 mixed precision: frozen base weights are stored in bf16 beside FP32 adapters in the same FSDP units.
    proc = run_train(lora_args("lora"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    memory = parameter_memory_line(proc.stderr)
    assert "bfloat16" in memory, memory
    run = tmp_path / "lora"
    ckpt = consolidated(checkpoints(run)[4], tmp_path)
    flat = {k: v.float() for k, v in ckpt["model"].items()}
    assert any(".lora_A.default." in k for k in flat) and any(".base_layer." in k for k in flat)
    assert ckpt["optimizer"]["state"] and all(".lora_" in name for name in ckpt["optimizer"]["state"])

    # The adapter model (built fresh, checkpoint loaded strictly) and the merged run folder give the same logits.
    # merge_lora.py's main runs in this process (its command line's refusals: tests/test_cli_errors.py).
    argv = ["--checkpoint", str(checkpoints(run)[4]), "--out_dir", str(tmp_path / "merged")]
    argv += ["--hf_out_dir", str(tmp_path / "hf"), "--hf_dtype", "float32"]
    assert import_script("merge_lora").main(argv) == 0
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

    # DDP (with bf16 autocast) trains the same adapters through train.py, here in one process with 2 micro-batches
    # of 1 per step (tests/training/test_accumulation_numerics.py checks DDP's accumulated update on 2 ranks, with
    # LoRA and autocast, by value).
    args = lora_args(
        "lora-ddp", "--vla.train_strategy", "ddp", "--vla.enable_mixed_precision_training", "true"
    )
    args[args.index("--vla.max_steps") + 1] = "2"
    args[args.index("--vla.per_device_batch_size") + 1] = "1"
    args[args.index("--vla.global_batch_size") + 1] = "2"
    args += ["--vla.expected_world_size", "1"]
    proc = run_train(args, nproc=None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "Gradient accumulation over 2 micro-batches: gradients reduced once per step" in proc.stderr
    records = read_metrics(tmp_path / "lora-ddp")
    assert [r["step"] for r in records] == [1, 2] and [r["frames"] for r in records] == [2, 4]
    assert load_checkpoint_file(checkpoints(tmp_path / "lora-ddp")[2])["train_state"]["world_size"] == 1
