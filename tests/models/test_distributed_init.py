"""Start-up with one copy of the weights (`prismatic.models.distributed_init`): rank 0 loads, rank 1 builds on the
meta device, and after wrapping both hold exactly what a normally loaded model holds.

The distributed checks run once, in one `torchrun --nproc-per-node 2` of this file (its `__main__` is the worker),
over scenarios that mirror the strategies: FSDP2 full-shard in FP32 and under bf16 mixed precision (frozen weights
stored in bf16), FSDP2 shard-grad-op with LoRA and activation checkpointing, and DDP's plain module (checked before
DDP wraps it, since DDP broadcasts on its own). Each rank compares against a model loaded the ordinary way from
the same seed: the gathered full state dict, every buffer (non-persistent ones too), `requires_grad`, dtypes,
the loss and gradients of one step on the same batch. Two scenarios use a tiny Llama with tied embeddings
(registered in the worker only), whose tie `to_empty` would break.
"""

from __future__ import annotations

import copy
import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

BASE = "tiny-vit+tiny-llama"
TIED = "tiny-vit+tiny-llama-tied"
SEED = 7
# name: (base VLM, wrapper, stage, reshard_after_forward, bf16 mixed precision, LoRA, activation checkpointing)
SCENARIOS = {
    "fsdp-full-shard": (BASE, "fsdp", "vla-train", True, False, False, False),
    "fsdp-full-shard-bf16": (BASE, "fsdp", "vla-train", True, True, False, False),
    "fsdp-shard-grad-op-lora": (BASE, "fsdp", "vla-full-train", False, False, True, True),
    "ddp": (BASE, "ddp", "vla-sandwich-train", None, False, False, False),
    "fsdp-full-shard-tied": (TIED, "fsdp", "vla-full-train", True, False, False, False),
    "ddp-tied": (TIED, "ddp", "vla-full-train", None, False, False, False),
}


# === The worker (runs under torchrun) =============================================================================


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "")


def _register_tied() -> None:
    import dataclasses

    from prismatic.models.backbones.llm.registry import LLM_BACKBONES, register_llm_backbone
    from prismatic.models.registry import BASE_VLMS, register_base_vlm

    llm = LLM_BACKBONES["tiny-llama"]
    register_llm_backbone(
        "tiny-llama-tied", dataclasses.replace(llm, config={**llm.config, "tie_word_embeddings": True})
    )
    register_base_vlm(TIED, dataclasses.replace(BASE_VLMS[BASE], llm_backbone_id="tiny-llama-tied"))


def _tied(vlm) -> bool:
    llm = vlm.llm_backbone.llm
    return llm.get_input_embeddings().weight is llm.get_output_embeddings().weight


def _reference(base: str, stage: str, bf16: bool, lora: bool):
    """The same model loaded the ordinary way, on every rank, from the same seed."""
    from prismatic.models import load
    from prismatic.models.lora import LoraSettings, apply_lora
    from prismatic.models.parallelize import cast_frozen_params_to_bf16

    torch.manual_seed(SEED)
    ref = load(base)
    ref.freeze_backbones(stage)
    if lora:
        apply_lora(ref, LoraSettings(rank=4))
    if bf16:
        cast_frozen_params_to_bf16(ref)
    return ref


def _batch(vlm) -> dict:
    """Two right-padded prompts with labels and random images (seeded), as the collator would give them."""
    generator = torch.Generator().manual_seed(0)
    encoded = vlm.llm_backbone.tokenizer(
        ["In: pick up the can\nOut: ", "In: push\nOut: "], padding=True, return_tensors="pt"
    )
    labels = encoded.input_ids.clone()
    labels[:, :3] = -100
    labels[encoded.attention_mask == 0] = -100
    size = vlm.vision_backbone.default_image_resolution
    return {
        "input_ids": encoded.input_ids,
        "attention_mask": encoded.attention_mask,
        "pixel_values": torch.rand((2, *size), generator=generator),
        "labels": labels,
    }


def _run_scenario(name: str, mesh) -> list[str]:
    """Build, wrap and materialize as the strategy would; return what differs from the reference (empty: none)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    from prismatic.models.distributed_init import full_state_on_rank0, load_on_rank0, materialize_from_rank0
    from prismatic.models.lora import LoraSettings, apply_lora
    from prismatic.models.parallelize import (
        apply_fsdp,
        apply_llm_activation_checkpointing,
        cast_frozen_params_to_bf16,
        mixed_precision_policy,
    )
    from prismatic.models.vlms.prismatic import PrismaticVLM

    base, wrapper, stage, reshard, bf16, lora, checkpointing = SCENARIOS[name]
    rank = dist.get_rank()
    errors: list[str] = []

    torch.manual_seed(SEED)
    vlm = load_on_rank0(base)
    on_meta = all(t.is_meta for t in [*vlm.parameters(), *vlm.buffers()])
    if on_meta != (rank != 0):
        errors.append(f"rank {rank}: model on meta is {on_meta}")
    vlm.freeze_backbones(stage)
    if lora:
        apply_lora(vlm, LoraSettings(rank=4))
    if checkpointing:
        apply_llm_activation_checkpointing(vlm)
    if wrapper == "fsdp":
        if bf16:
            cast_frozen_params_to_bf16(vlm)
        full = full_state_on_rank0(vlm)
        model = apply_fsdp(vlm, mesh, mixed_precision_policy(bf16, True), reshard_after_forward=reshard)
        materialize_from_rank0(model, full, "cpu")
    else:
        materialize_from_rank0(vlm, None, "cpu")
        model = vlm
    rng_after = torch.get_rng_state()

    ref = _reference(base, stage, bf16, lora)
    if not torch.equal(rng_after, torch.get_rng_state()):
        errors.append("RNG state differs from a normal load's")
    if _tied(vlm) != _tied(ref) or _tied(ref) != (base == TIED):
        errors.append(f"embeddings tied: {_tied(vlm)}, in the reference: {_tied(ref)}")
    ref_state = ref.state_dict()

    left_on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left_on_meta:
        errors.append(f"still on meta: {left_on_meta[:3]}")
    params = {_clean(n): p for n, p in model.named_parameters()}
    ref_params = dict(ref.named_parameters())
    if sorted(params) != sorted(ref_params):
        errors.append("parameter names differ")
    for n, p in ref_params.items():
        if n in params and (params[n].requires_grad, params[n].dtype) != (p.requires_grad, p.dtype):
            errors.append(
                f"{n}: requires_grad/dtype {params[n].requires_grad}/{params[n].dtype} vs {p.dtype}"
            )
    buffers = {_clean(n): b for n, b in model.named_buffers()}
    ref_buffers = dict(ref.named_buffers())
    if sorted(buffers) != sorted(ref_buffers) or not ref_buffers:
        errors.append(f"buffer names differ: {sorted(buffers)} vs {sorted(ref_buffers)}")
    errors += [f"buffer {n} differs" for n, b in ref_buffers.items() if not torch.equal(buffers.get(n), b)]

    # Values: every rank's own tensors (plain module), or the shards gathered on rank 0 (FSDP, collective).
    if wrapper == "fsdp":
        if not any(isinstance(p, DTensor) for p in model.parameters()):
            errors.append("the FSDP model holds no DTensor")
        full_state = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
    else:
        full_state = {_clean(k): v for k, v in model.state_dict().items()}
    if rank == 0 or wrapper != "fsdp":
        if sorted(full_state) != sorted(ref_state):
            errors.append("state dict keys differ")
        for key, value in ref_state.items():
            got = full_state.get(key)
            if got is None or got.dtype != value.dtype or not torch.equal(got, value):
                errors.append(f"state {key} differs")

    # One step on the same batch (FSDP: collective; DDP: now wrapped, as the strategy does).
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    batch = _batch(ref)
    loss = model(**batch).loss
    loss.backward()
    reference = copy.deepcopy(ref)
    if bf16:  # what FSDP's bf16 policy computes with: bf16 parameters, FP32 buffers, bf16 inputs
        for param in reference.parameters():
            param.data = param.data.to(torch.bfloat16)
        batch["pixel_values"] = batch["pixel_values"].to(torch.bfloat16)
    ref_loss = reference(**batch).loss
    ref_loss.backward()
    # The same weights through the same kernels (FSDP all-gathers them whole; the two ranks hold the same batch,
    # so averaging their gradients changes no bit): loss and FP32 gradients are equal exactly.
    if not torch.equal(loss.detach().float(), ref_loss.detach().float()):
        errors.append(f"loss {loss.item()} vs reference {ref_loss.item()}")
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    for n, p in model.named_parameters():
        n = _clean(n).removeprefix("module.")
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        if (grad is None) != (ref_grads[n] is None):
            errors.append(f"gradient presence of {n} differs")
        elif grad is not None and not bf16 and not torch.equal(grad, ref_grads[n]):
            errors.append(f"gradient of {n} differs")
    assert isinstance(ref, PrismaticVLM)
    return errors


def _run_misuse(mesh) -> dict[str, str]:
    """A sharded model without rank 0's full state, and ranks that froze differently: every rank raises."""
    import torch.distributed as dist

    from prismatic.models.distributed_init import load_on_rank0, materialize_from_rank0
    from prismatic.models.parallelize import apply_fsdp, mixed_precision_policy

    out = {}
    for case in ("no-full-state", "different-freezing"):
        vlm = load_on_rank0(BASE)
        vlm.freeze_backbones(
            "vla-train" if case == "no-full-state" or dist.get_rank() == 0 else "vla-full-train"
        )
        model = apply_fsdp(vlm, mesh, mixed_precision_policy(False, True), reshard_after_forward=True)
        try:
            materialize_from_rank0(model, None, "cpu")
            out[case] = "no error"
        except RuntimeError as err:
            out[case] = str(err)
    return out


def _worker(out_dir: Path) -> None:
    import huggingface_hub.constants
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    torch.set_num_threads(1)
    _register_tied()
    # A collective that one rank misses fails after a minute instead of hanging the test.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    results: dict = {name: _run_scenario(name, mesh) for name in SCENARIOS}
    results["misuse"] = _run_misuse(mesh)
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


# === The tests ====================================================================================================


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    from train_runs import run_torchrun_worker

    out = tmp_path_factory.mktemp("distributed_init")
    run_torchrun_worker(__file__, out, timeout=300)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_materialized_model_equals_a_normally_loaded_one(results: list[dict], scenario: str) -> None:
    assert results[0][scenario] == []
    assert results[1][scenario] == []


def test_misuse_raises_on_every_rank_instead_of_hanging(results: list[dict]) -> None:
    for rank in (0, 1):
        assert "rank 0 passed no full_state" in results[rank]["misuse"]["no-full-state"]
        assert "rank 1:" in results[rank]["misuse"]["different-freezing"]
        assert "here but" in results[rank]["misuse"]["different-freezing"]


def test_single_process_is_a_normal_load() -> None:
    from prismatic.models import load
    from prismatic.models.distributed_init import full_state_on_rank0, load_on_rank0, materialize_from_rank0

    torch.manual_seed(SEED)
    vlm = load_on_rank0(BASE)
    assert full_state_on_rank0(vlm) is None
    materialize_from_rank0(vlm, None, "cpu")
    torch.manual_seed(SEED)
    expected = load(BASE).state_dict()
    got = vlm.state_dict()
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def _corrupt(paths: list[Path]) -> None:
    """Weight files no reader can open: anything that reads one fails."""
    assert paths
    for path in paths:
        path.write_bytes(b"not a weight file")


def _layout(vlm) -> dict:
    tensors = [*vlm.named_parameters(), *vlm.named_buffers()]
    return {n: (tuple(t.shape), t.dtype, getattr(t, "requires_grad", None)) for n, t in tensors}


def _assert_same_model_on_meta(meta, loaded) -> None:
    assert all(t.is_meta for t in [*meta.parameters(), *meta.buffers()])
    assert _layout(meta) == _layout(loaded)
    assert str(meta) == str(loaded) and meta.model_id == loaded.model_id
    assert type(meta.llm_backbone.tokenizer) is type(loaded.llm_backbone.tokenizer)
    assert meta.llm_backbone.tokenizer.get_vocab() == loaded.llm_backbone.tokenizer.get_vocab()
    assert meta.llm_backbone.prompt_builder_fn is loaded.llm_backbone.prompt_builder_fn


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_meta_load_of_a_run_folder_reads_no_weights(tmp_path: Path, dtype) -> None:
    from prismatic.models import build_vlm, load_vla

    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"vla": {"type": "tiny+mx-toy", "base_vlm": BASE}}))
    weights = {
        key: getattr(vlm, key).state_dict() for key in ("vision_backbone", "projector", "llm_backbone")
    }
    checkpoint = run / "checkpoints" / "step-000010-epoch-00-loss=1.0000.pt"
    torch.save({"model": weights}, checkpoint)
    stats = {"toy": {"action": {"q01": [0.0] * 7, "q99": [1.0] * 7, "mask": [True] * 7}}}
    (run / "dataset_statistics.json").write_text(json.dumps(stats))
    loaded = load_vla(run, dtype=dtype)

    _corrupt([checkpoint])
    with pytest.raises(Exception):  # noqa: B017 (any reader error: the file is garbage)
        load_vla(run)
    for source in (run, checkpoint):
        meta = load_vla(source, dtype=dtype, device="meta")
        _assert_same_model_on_meta(meta.vlm, loaded.vlm)
        assert meta.norm_stats == loaded.norm_stats


def test_meta_load_of_an_hf_folder_reads_no_weights(tmp_path: Path) -> None:
    from prismatic.models import build_vlm, load_vla
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import spec_of

    torch.manual_seed(0)
    vlm = build_vlm("tiny-dinosiglip+tiny-llama")
    stats = {"toy": {"action": {"q01": [0.0] * 7, "q99": [1.0] * 7, "mask": [True] * 7}}}
    folder = export_hf_openvla(
        vlm, spec_of(vlm), tmp_path / "hf", norm_stats=stats, dtype="float32", max_shard_size=200_000
    )
    loaded = load_vla(folder)
    _corrupt([*folder.glob("*.safetensors")])
    with pytest.raises(Exception):  # noqa: B017 (any reader error: the shards are garbage)
        load_vla(folder)
    meta = load_vla(folder, device="meta")
    _assert_same_model_on_meta(meta.vlm, loaded.vlm)
    assert meta.norm_stats == loaded.norm_stats


def test_meta_load_of_a_cached_hub_id_fetches_no_weights(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub
    import huggingface_hub.constants

    from prismatic.models import build_vlm, load_vla
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import spec_of

    # A Hub id in the local cache, as a previous online run would have left it.
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--test-org--openvla-tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    folder = export_hf_openvla(
        vlm, spec_of(vlm), repo / "snapshots" / commit, norm_stats=None, dtype="float32"
    )
    loaded = load_vla("test-org/openvla-tiny")

    patterns: list[str] = []
    real_snapshot_download = huggingface_hub.snapshot_download

    def snapshot_download(repo_id, **kwargs):
        patterns.extend(kwargs.get("allow_patterns") or ["*"])
        return real_snapshot_download(repo_id, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    _corrupt([*folder.glob("*.safetensors")])
    meta = load_vla("test-org/openvla-tiny", device="meta")
    _assert_same_model_on_meta(meta.vlm, loaded.vlm)
    assert patterns and not any(p.endswith((".safetensors", ".pt", "checkpoints/*")) for p in patterns)


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
