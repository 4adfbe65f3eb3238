"""`prismatic/util/kernel_profile.py`: the kinds read from real kernel and op names, the device's busy time (overlaps
counted once) and the per-step table, on profiler events made here with hand-set times, so every expected
figure is worked out in the test."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from prismatic.util.kernel_profile import cuda_syncs, format_profile, kind_of, summarize, union_us


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # Kernel names as an H100 / H200 profile shows them.
        ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "matmul"),
        ("triton_tem_fused_mm_0", "matmul"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>", "attention"),
        (
            "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<>::Params)",
            "attention",
        ),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
            "namespace)::TensorListMetadata<5>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 5>>",
            "optimizer",
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
            "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::UnaryOpFunctor<c10::BFloat16, 2, 1, "
            "1>, at::native::(anonymous namespace)::Copy<c10::BFloat16, float>>",
            "copy",
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
            "namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::LpNormFunctor<float, 2>>",
            "optimizer",
        ),
        ("triton_poi_fused__to_copy_add_mul_rsqrt_3", "inductor"),
        ("triton_red_fused_mean_pow_1", "inductor"),
        ("Memcpy DtoD (Device -> Device)", "copy"),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
            "copy",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
            "other",
        ),
        # ATen ops, as a CPU profile names them.
        ("aten::mm", "matmul"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
        ("aten::_foreach_norm", "optimizer"),
        ("aten::_foreach_copy_", "copy"),
        ("aten::copy_", "copy"),
        ("aten::mul", "other"),
    ],
)
def test_kinds_of_real_names(name: str, kind: str) -> None:
    assert kind_of(name) == kind


def test_host_events_are_host_work_only_on_the_host() -> None:
    assert kind_of("PythonSubclass", on_host=True) == "host"  # DTensor dispatch
    assert kind_of("MmBackward0", on_host=True) == "host"  # an autograd node's own time
    assert kind_of("aten::mul", on_host=True) == "other"
    assert kind_of("aten::mm", on_host=True) == "matmul"
    assert kind_of("PythonSubclass") == "other"  # a device kernel is never host work


def test_union_counts_overlaps_once() -> None:
    # [0, 10] and [5, 15] cover 15; [20, 25] adds 5; [21, 22] lies inside it; [15, 16] touches the first.
    assert union_us([(20, 25), (0, 10), (21, 22), (5, 15), (15, 16)]) == 15 + 5 + 1
    assert union_us([]) == 0


def _event(
    name: str, device: DeviceType, start: float, end: float, self_us: float = 0.0, annotation: bool = False
) -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        device_type=device,
        time_range=SimpleNamespace(start=start, end=end),
        self_cpu_time_total=self_us,
        is_user_annotation=annotation,
        activity_type="gpu_user_annotation" if annotation else "kernel",
    )


def test_device_summary_per_step() -> None:
    """Two steps in 4 ms of wall time: kernels busy 0-1000, 900-1500 (overlapping) and 3000-3500 us, so 2,000 us
    of busy time, 1 ms a step, 50 % idle."""
    cuda, cpu = DeviceType.CUDA, DeviceType.CPU
    events = [
        _event("nvjet_gemm_a", cuda, 0, 1000),
        _event("flash_fwd_kernel", cuda, 900, 1500),
        _event("nvjet_gemm_a", cuda, 3000, 3500),
        # record_function scopes drawn on the device's timeline (torch 2.11 on an H100): no kernels, no busy time.
        _event("DistributedDataParallel.forward", cuda, 0, 3600, annotation=True),
        _event("aten::mm", cuda, 0, 1000, annotation=True),
        _event("aten::mm", cpu, 0, 50, self_us=40),
        _event("PythonSubclass", cpu, 50, 400, self_us=300),
    ]
    summary = summarize(events, units=2, wall_s=4e-3, on_device=True, top=5)
    assert summary["wall_ms"] == 2.0
    assert summary["device_busy_ms"] == 1.0
    assert summary["device_idle_pct"] == 50.0
    assert summary["launches"] == 1.5
    assert summary["ms_by_kind"]["matmul"] == 0.75 and summary["launches_by_kind"]["matmul"] == 1.0
    assert summary["ms_by_kind"]["attention"] == 0.3 and summary["launches_by_kind"]["attention"] == 0.5
    assert summary["ms_by_kind"]["host"] == 0.0  # on a GPU the kinds are the kernels'
    assert [(t["name"], t["ms"], t["n"]) for t in summary["top"]] == [
        ("nvjet_gemm_a", 0.75, 1.0),
        ("flash_fwd_kernel", 0.3, 0.5),
    ]
    assert [(t["name"], t["kind"], t["ms"]) for t in summary["host_top"]] == [
        ("PythonSubclass", "host", 0.15),
        ("aten::mm", "matmul", 0.02),
    ]
    text = format_profile("lora-7b new", summary)
    assert "device busy 1.0 ms (idle 50.0 %)" in text and "matmul 0.8 ms / 1" in text


def test_cpu_summary_is_the_ops_own_time() -> None:
    cpu = DeviceType.CPU
    events = [
        _event("aten::mm", cpu, 0, 900, self_us=600),
        _event("aten::mm", cpu, 900, 1300, self_us=400),
        _event("aten::copy_", cpu, 1300, 1400, self_us=100),
        _event("MmBackward0", cpu, 1400, 1500, self_us=50),
        _event("aten::linear", cpu, 0, 1300, self_us=0),  # no time of its own: not counted
    ]
    summary = summarize(events, units=1, wall_s=2e-3, on_device=False)
    assert (
        summary["device_busy_ms"] is None and summary["device_idle_pct"] is None and "host_top" not in summary
    )
    assert summary["ms_by_kind"]["matmul"] == 1.0 and summary["launches_by_kind"]["matmul"] == 2
    assert summary["ms_by_kind"]["copy"] == 0.1 and summary["ms_by_kind"]["host"] == 0.05
    assert summary["launches"] == 3  # host work is no op call


def test_cuda_syncs_are_the_waits_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """`set_sync_debug_mode("warn")` also warns, once per process, that the mode is a prototype: that warning is no
    sync (an H100 run counted it as one in every benchmark's first row). The texts are torch 2.11's."""
    modes = []

    def set_mode(mode: object) -> None:
        modes.append(mode)
        if mode == "warn":
            warnings.warn(
                "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
                "operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)",
                stacklevel=2,
            )

    def step() -> None:
        warnings.warn(
            "called a synchronizing CUDA operation (Triggered internally at CUDAFunctions.h:150.)",
            stacklevel=2,
        )
        warnings.warn(
            "called a synchronizing CUDA operation (Triggered internally at CUDAFunctions.h:150.)",
            stacklevel=2,
        )
        warnings.warn("an unrelated warning", stacklevel=2)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    assert len(cuda_syncs(step)) == 2
    assert modes == ["warn", 0]  # the mode is put back
