"""`benchmarks/bench_gpu.py --device cpu` (the tiny ids) keeps working: it runs training's set-up and `train_loop`
for each case and variant, then the policy, and reports finite figures in the documented fields. The FLOP count
per sample is checked against one counted here by hand from the tiny model's sizes."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_bench_gpu_runs_the_tiny_cases_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks/bench_gpu.py"),
        "--device",
        "cpu",
        "--cases",
        "lora-tiny",
        "l1-chunk-tiny",
        "--variants",
        "before",
        "new+sac-ops+prefetch",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--predict_repeats",
        "3",
        "--predict_warmup",
        "1",
        "--predict_batch_sizes",
        "1",
        "2",
        "--json_out",
        str(out),
        "--print_losses",
        "--set",
        "enable_mixed_precision_training=false",
        "--profile",
        "1",
        "--profile_dir",
        str(tmp_path / "traces"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in out.read_text().splitlines()]
    training = [r for r in results if "variant" in r]
    assert [(r["case"], r["variant"]) for r in training] == [
        ("lora-tiny", "before"),
        ("lora-tiny", "new+sac-ops+prefetch"),
        ("l1-chunk-tiny", "before"),
        ("l1-chunk-tiny", "new+sac-ops+prefetch"),
    ]
    for r in training:
        assert r["ms_per_step"] > 0 and r["model_tflops"] > 0 and math.isfinite(r["last_loss"])
        assert (
            r["samples_per_s"] == round(4 * 1000 / r["ms_per_step"], 2)
            or abs(r["samples_per_s"] - 4000 / r["ms_per_step"]) < 0.05 * r["samples_per_s"]
        )
        assert r["host_syncs_per_step"] == 0 and r["mfu_pct"] is None  # CPU: no device to wait for, no peak
        assert isinstance(r["aten_ops_per_step"], int) and r["aten_ops_per_step"] > 100
        assert r["compiled"] is False  # `auto` compiles on CUDA only (the LoRA case's blocks there)
        assert r["cudagraph_skips"] is None  # counted on `+cudagraphs` rows only
    # What each row recomputed by: `before` every layer whole, `+sac-ops` the named policy.
    assert [r["checkpointing"] for r in training] == ["full", "selective-ops"] * 2
    # The plan each row trained with, made by training's resolver (what a run's speed_plan.json records): `before`
    # turns every speed flag off; `new` leaves them at `auto`, off on CPU, and `+sac-ops+prefetch` names two.
    for r in training:
        plan, before = r["speed_plan"], r["variant"] == "before"
        assert (plan["train_strategy"], plan["device"], plan["compile_mode"]) == (
            "fsdp-full-shard",
            "cpu",
            None,
        )
        assert plan["optimizer_impl"] == ("for-loop" if before else "default")
        assert plan["prefetch_batches"] == (0 if before else 2)
        assert plan["checkpointing_policy"] == r["checkpointing"] and plan["pad_to_multiple"] == 1
        assert not (plan["logits_at_labels"] or plan["causal_mask_only"] or plan["overlap_steps"])
    # Selective checkpointing keeps the matmuls' outputs: the backward re-runs fewer ops than full recomputation.
    assert training[1]["aten_ops_per_step"] < training[0]["aten_ops_per_step"]
    assert training[3]["aten_ops_per_step"] < training[2]["aten_ops_per_step"]
    # The same seed and batches: the speed flags off and on train to the same loss on CPU ("auto" = off there;
    # selective checkpointing recomputes the same numbers; the prefetch thread makes the same batches).
    assert training[0]["last_loss"] == training[1]["last_loss"]
    assert training[2]["last_loss"] == training[3]["last_loss"]
    # --print_losses: one line per step (1 warm-up + 1 sync-count + 2 timed + 1 profiled) per case and variant;
    # the last timed one of each run is the loss it reports.
    step_lines = [line for line in done.stdout.splitlines() if line.strip().startswith("step ")]
    assert len(step_lines) == 5 * len(training)
    printed = [float(step_lines[5 * i + 3].split("loss ")[1].split(",")[0]) for i in range(len(training))]
    assert all(abs(p - r["last_loss"]) <= 1e-4 for p, r in zip(printed, training, strict=True))
    predict = {r["case"]: r for r in results if "variant" not in r}
    for mode in ("KV cache, static + CUDA graphs", "KV cache, dynamic", "re-running"):
        assert (
            0 < predict[f"predict_action ({mode})"]["p50_ms"] <= predict[f"predict_action ({mode})"]["p90_ms"]
        )
        assert predict[f"predict_action ({mode})"]["warmup_s"] >= 0  # capture / compile time, printed apart
    for batch in (1, 2):
        for mode in ("static + CUDA graphs", "dynamic"):
            row = predict[f"predict_action_batch {batch} ({mode})"]
            assert row["actions_per_s"] > 0
            assert row["pixel_values_ms"]["host"] > 0 and row["pixel_values_ms"]["on_device"] > 0
    # --profile 1: one more step (one more call) per row, profiled; on CPU the ATen ops' own time by kind.
    for r in results:
        profile = r["profile"]
        assert profile["units"] == 1 and profile["device_busy_ms"] is None
        assert profile["ms_by_kind"]["matmul"] > 0 and profile["launches_by_kind"]["matmul"] >= 1
        assert sum(profile["ms_by_kind"].values()) <= profile["wall_ms"] * 1.01
        assert profile["top"] and all(t["ms"] > 0 for t in profile["top"])
        assert f"profile {r['case']}" in done.stdout
    # Every row but the first was timed after a profiled one (slower on an H100): each is marked so.
    assert [r.get("after_profile", False) for r in results] == [False] + [True] * (len(results) - 1)
    traces = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert "lora-tiny-new+sac-ops+prefetch.json" in traces and len(traces) == len(results)
    assert "traceEvents" in json.loads((tmp_path / "traces" / traces[0]).read_text())


def test_bench_gpu_under_torchrun_reports_once_for_all_ranks(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node N benchmarks/bench_gpu.py` times the training cases on N ranks (each on its own
    GPU on a GPU machine): one line per row, from rank 0; samples/s over all ranks; FSDP2 and DDP train the same
    frames to the same loss (FP32)."""
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [str(REPO / "benchmarks/bench_gpu.py"), "--device", "cpu", "--cases", "lora-tiny"]
    cmd += ["--variants", "new+fsdp", "new+ddp", "--steps", "1", "--warmup", "1", "--json_out", str(out)]
    cmd += ["--set", "enable_mixed_precision_training=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert printed == [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["variant"], r["strategy"], r["world_size"]) for r in printed] == [
        ("new+fsdp", "FSDPStrategy", 2),
        ("new+ddp", "DDPStrategy", 2),
    ]
    for r in printed:
        assert abs(r["samples_per_s"] - 2 * 4 * 1000 / r["ms_per_step"]) <= 0.01 * r["samples_per_s"]
    assert abs(printed[0]["last_loss"] - printed[1]["last_loss"]) <= 1e-4
    assert "predict" not in done.stdout.split("only the training cases run")[1]


# tiny-vit-64px (timm vit_base_patch16 at 64 px, width 48, depth 3): 16 patches + a class token, blocks 0-1 run
# (features come from the second-to-last block); gelu-mlp projector 48 -> 64 -> 64; tiny-llama: width 64, 2 layers,
# 4 heads of 16 with 2 key/value heads, MLP 128. Each matmul's weights, by hand from those sizes.
PATCH_EMBED = 3 * 16 * 16 * 48
VIT_BLOCK = 48 * 3 * 48 + 48 * 48 + 48 * 4 * 48 + 4 * 48 * 48  # qkv, proj, fc1, fc2
PROJECTOR = (48 * 64, 64 * 64)
LLM_LAYER = 64 * 64 + 2 * (64 * 32) + 64 * 64 + 3 * (64 * 128)  # q, k and v, o, gate / up / down


@pytest.mark.parametrize("stage", ["vla-train", "vla-last-layer-train"])
def test_model_flops_count_what_a_sample_computes(stage: str) -> None:
    """A sample's matmul FLOPs: 2 per weight and row forward, 2 more for an input's gradient where something before
    it trains and 2 for the weight's where it trains; no embedding look-up, no ViT block after the feature layer,
    the LM head at the 8 labelled positions only, whatever `logits_at_labels` says, no padding."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import torch
    from model_flops import model_flops_per_sample

    from prismatic.models import build_vlm
    from prismatic.models.action_heads import ActionSpec, build_action_head
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets.synthetic import synthetic_collator, synthetic_frames

    torch.manual_seed(0)
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.freeze_backbones(stage)
    spec = ActionSpec(action_dim=7)
    vlm.attach_action_modules(spec)
    head = build_action_head(spec, ActionTokenizer(vlm.llm_backbone.tokenizer), vlm.num_prefix_tokens)
    head.logits_at_labels = False
    frames = synthetic_frames(vlm, head, 8, seed=0)
    lengths = [frame["input_ids"].numel() for frame in frames]
    assert len(set(lengths)) < len(lengths) > 1  # frames of the same kind run once and count for each

    vocab = vlm.llm_backbone.llm.get_output_embeddings().weight.shape[0]
    vision = 2 * 16 * PATCH_EMBED + 2 * 2 * 17 * VIT_BLOCK  # frozen, nothing before it trains: forward only
    if stage == "vla-train":  # projector and LLM train, the projector's input needs no gradient
        projector = 4 * 16 * PROJECTOR[0] + 6 * 16 * PROJECTOR[1]
        layers = (6, 6)
    else:  # embeddings, the last layer and the LM head train: layer 0 passes gradients back to the embeddings
        projector = 2 * 16 * sum(PROJECTOR)
        layers = (4, 6)
    lm_head = 6 * 8 * 64 * vocab
    per_frame = [
        vision + projector + sum(k * (16 + n) * LLM_LAYER for k in layers) + lm_head for n in lengths
    ]
    expected = sum(per_frame) / len(frames)

    strategy = SimpleNamespace(
        vlm=vlm,
        to_device=lambda batch: batch,
        autocast=contextlib.nullcontext,
        causal_attention=lambda batch: contextlib.nullcontext(),
    )
    rng = torch.get_rng_state()
    assert model_flops_per_sample(strategy, head, frames, synthetic_collator(vlm)) == expected
    assert head.logits_at_labels is False
    assert all(p.grad is None for p in vlm.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_bench_gpu_refuses_an_unknown_variant_before_building_anything(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(REPO / "benchmarks/bench_gpu.py"),
        "--device",
        "cpu",
        "--variants",
        "new+turbo",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert "unknown variant 'new+turbo'" in done.stderr and "+sac-ops" in done.stderr
    assert "bench_gpu on" not in done.stdout  # refused before the run started


def test_set_and_variants_give_the_config_fields_they_name() -> None:
    """`--set` keeps text fields as typed (YAML would read `on` as true, which no speed flag accepts) and reads
    the others as YAML; `+ddp` / `+grad-op` pick the strategy."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_gpu import CPU_CASES, _vla, parse_overrides, parse_variant

    assert parse_overrides(
        ["speed.causal_mask_only=on", "lora_rank=8", "enable_gradient_checkpointing=false"]
    ) == {
        "speed.causal_mask_only": "on",
        "lora_rank": 8,
        "enable_gradient_checkpointing": False,
    }
    with pytest.raises(SystemExit, match="speed.<name> for the speed group's"):
        parse_overrides(["causal_mask_only=on"])  # the flag's old, flat name
    assert parse_variant("new+ddp+sac-ops") == (
        False,
        {"train_strategy": "ddp", "speed.checkpointing_policy": "selective-ops"},
        False,
    )
    assert parse_variant("before+grad-op")[1] == {"train_strategy": "fsdp-shard-grad-op"}
    assert parse_variant("new+no-cudagraphs")[1] == {"speed.compile_mode": "default"}
    assert parse_variant("new+cudagraphs")[1] == {
        "speed.compile": "on",
        "speed.compile_mode": "reduce-overhead",
    }
    # `before` turns every speed switch off; a modifier and `--set` override one field, of the group or not.
    vla = _vla(CPU_CASES["lora-tiny"], "before+compile", 3, {"speed.prefetch_batches": 2, "lora_rank": 8})
    assert (vla.speed.compile, vla.speed.optimizer_impl, vla.speed.checkpointing_policy) == (
        "on",
        "for-loop",
        "full",
    )
    assert (vla.speed.prefetch_batches, vla.lora_rank, vla.train_strategy) == (2, 8, "fsdp-full-shard")


def test_cudagraphs_rows_count_the_graphs_inductor_skipped(tmp_path: Path) -> None:
    """`+cudagraphs` compiles the blocks for CUDA graphs and reports how many compiled graphs ran without them: on
    CPU inductor skips every one (on a GPU the count says whether the blocks replay); other rows report none (the
    tiny cases' test above)."""
    out = tmp_path / "results.jsonl"
    # The one-ViT full fine-tune: fewer distinct blocks to compile than the fused-ViT LoRA case (24 against 38 s).
    cmd = [sys.executable, str(REPO / "benchmarks/bench_gpu.py"), "--device", "cpu", "--cases", "full-tiny"]
    cmd += ["--variants", "new+ddp+cudagraphs", "--steps", "1", "--warmup", "1", "--no_predict"]
    cmd += ["--set", "enable_mixed_precision_training=false", "--json_out", str(out)]
    # A compile cache of its own: graphs that other runs left in the shared cache (the compile-mode tests' tiny
    # LLM layers) load without inductor counting their skips, and the count read 0 after them. One compile thread:
    # no pool of compile workers to start for these few kernels.
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    [graphs] = [json.loads(line) for line in out.read_text().splitlines()]
    assert "error" not in graphs, graphs
    assert graphs["compiled"] is True and graphs["cudagraph_skips"] >= 1


def test_narrow_cases_keep_every_layer_and_block_of_the_real_architecture(tmp_path: Path) -> None:
    """`lora-7b-narrow` is `prism-dinosiglip-224px+7b` at width 64: Llama-2-7B's 32 decoder layers, DINOv2-L's 24
    and SigLIP-so400m's 27 ViT blocks (the published depths), each at width 64, with the real vocabulary (which
    the GPU cases build the same way: not the in-repo tiny tokenizer's 1,025 ids)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import torch
    from bench_gpu import CPU_CASES, random_vlm

    from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer

    case = CPU_CASES["lora-7b-narrow"]
    load_tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    vlm = random_vlm(case.base_vlm, torch.device("cpu"), tmp_path / "tokenizer", case.width)
    config = vlm.llm_backbone.llm.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (32, 64, 4)
    assert config.intermediate_size == 64 * 11008 // 4096
    assert vlm.llm_backbone.llm.get_input_embeddings().weight.shape == (
        32064,
        64,
    )  # 32000 + <PAD>, padded to 64
    vits = vlm.vision_backbone.featurizers
    assert {name: len(vit.blocks) for name, vit in vits.items()} == {"dino": 24, "siglip": 27}
    assert {vit.embed_dim for vit in vits.values()} == {64}
    # The ~1B case: Qwen2.5-0.5B's 24 layers and its 151,936-token vocabulary (+1, padded to a multiple of 64).
    case = CPU_CASES["full-1b-narrow"]
    llm = random_vlm(case.base_vlm, torch.device("cpu"), tmp_path / "tokenizer", case.width).llm_backbone.llm
    assert llm.config.num_hidden_layers == 24 and llm.get_input_embeddings().weight.shape == (152000, 64)


def test_bench_gpu_refuses_a_negative_profile(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_gpu import main

    assert main(["--device", "cpu", "--profile", "-1"]) == 2
    captured = capsys.readouterr()
    assert "--profile takes a number of steps >= 0, got -1." in captured.err
    assert "bench_gpu on" not in captured.out  # refused before the run started
