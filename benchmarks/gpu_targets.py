"""The speed targets `make bench-gpu` is run to check, read off its result rows: one verdict line per target.

The targets (issue "As fast as the GPU allows") hold for one H100 or H200 in bf16 with the defaults (variant `new`),
on the registry's 7B shape (`prism-dinosiglip-224px+7b`, LoRA r32, per-device batch 16) and the ~1B one (full
fine-tune), the predict rows on the 7B shape. A target whose row this run did not time (other cases, a narrowed
`--predict_batch_sizes`, a profiled or multi-rank run, a CPU) says "not timed" rather than guessing; the verdicts
are printed for whoever runs the benchmark, and a row's figures are the benchmark's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

PREDICT_7B = "prism-dinosiglip-224px+7b"
TARGET_DEVICES = ("H100", "H200")
BENCH_BUDGET_S = 300.0  # the whole default run on one H100


@dataclass(frozen=True)
class Verdict:
    """One target: what it asks, the figure this run measured (None: not timed here) and whether it meets it."""

    target: str
    figure: str | None
    met: bool | None

    def line(self) -> str:
        status = "not timed" if self.met is None else ("met" if self.met else "NOT met")
        return f"  {status:<9} {self.target}" + (f": {self.figure}" if self.figure is not None else "")


def _training_row(rows: Sequence[dict[str, Any]], case: str) -> dict[str, Any] | None:
    """The case's row with the defaults (`new`), timed alone on one rank and before any profiled row."""
    for row in rows:
        if (
            row.get("case") == case
            and row.get("variant") == "new"
            and row.get("world_size") == 1
            and "error" not in row
            and not row.get("after_profile")
            and row.get("mfu_pct") is not None
        ):
            return row
    return None


def _predict_rows(rows: Sequence[dict[str, Any]], prefix: str, key: str) -> dict[str, float]:
    """Mode -> figure of the predict rows whose case starts with `prefix` (e.g. `predict_action (`)."""
    found = {}
    for row in rows:
        case = row.get("case", "")
        if case.startswith(prefix) and key in row and not row.get("after_profile"):
            found[case[len(prefix) : -1]] = row[key]
    return found


def _at_least(
    value: float | None, goal: float, show: Callable[[float], str]
) -> tuple[str | None, bool | None]:
    return (None, None) if value is None else (show(value), value >= goal)


def check_targets(
    rows: Sequence[dict[str, Any]],
    device_name: str,
    predict_base_vlm: str,
    run_s: float | None,
    training_defaults: bool = True,
) -> list[Verdict]:
    """Each target's verdict from the benchmark's rows. `run_s`: the whole run's seconds when it ran with the default
    settings (None otherwise: a partial run says nothing of the full one's time). `training_defaults`: False when
    `--set` changed the training cases' config (FP32, say), whose rows then answer no target."""
    on_target_device = any(name in device_name for name in TARGET_DEVICES)
    if not on_target_device:
        rows = []  # the targets are the H100's / H200's: a figure from another device is no verdict
    verdicts = []
    training_rows = rows if training_defaults else []
    for case, goal, what in (
        ("lora-7b", 45.0, "7B LoRA r32, batch 16, MFU >= 45 %"),
        ("full-1b", 40.0, "~1B full fine-tune, MFU >= 40 %"),
    ):
        row = _training_row(training_rows, case)
        figure, met = _at_least(
            None if row is None else row["mfu_pct"],
            goal,
            lambda v, r=row: f"{v} % ({r['ms_per_step']} ms/step)",
        )
        verdicts.append(Verdict(what, figure, met))

    is_7b = predict_base_vlm == PREDICT_7B
    single = _predict_rows(rows, "predict_action (", "p50_ms") if is_7b else {}
    kv_modes = {mode: ms for mode, ms in single.items() if mode.startswith("KV cache, static")}
    if kv_modes:
        mode = min(kv_modes, key=kv_modes.get)
        verdicts.append(
            Verdict("one 7B action, p50 <= 50 ms", f"{kv_modes[mode]} ms ({mode})", kv_modes[mode] <= 50)
        )
    else:
        verdicts.append(Verdict("one 7B action, p50 <= 50 ms", None, None))

    batch = _predict_rows(rows, "predict_action_batch 64 (", "actions_per_s") if is_7b else {}
    best = max(batch, key=batch.get) if batch else None
    figure, met = _at_least(None if best is None else batch[best], 300.0, lambda v: f"{v} actions/s ({best})")
    verdicts.append(Verdict("7B batch of 64, >= 300 actions/s", figure, met))

    cached, rerun = single.get("KV cache, static + CUDA graphs"), single.get("re-running")
    ratio = None if cached is None or rerun is None else round(rerun / cached, 2)
    figure, met = _at_least(ratio, 2.0, lambda v: f"{v}x ({rerun} against {cached} ms)")
    verdicts.append(Verdict("7B KV cache at batch 1, >= 2x re-running", figure, met))

    timed_whole = run_s is not None and on_target_device
    verdicts.append(
        Verdict(
            f"the default run, <= {BENCH_BUDGET_S:.0f} s",
            f"{run_s:.0f} s" if timed_whole else None,
            (run_s <= BENCH_BUDGET_S) if timed_whole else None,
        )
    )
    return verdicts


def format_verdicts(verdicts: Sequence[Verdict], device_name: str) -> str:
    """The block `bench_gpu.py` prints last."""
    head = f"targets (one {' or '.join(TARGET_DEVICES)}, bf16, defaults; this run: {device_name}):"
    return "\n".join([head, *(v.line() for v in verdicts)])
