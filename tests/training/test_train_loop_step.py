"""The train step of `train_loop`, in process on a one-weight model: the accumulated update equals the mean of the
micro-batch gradients (each micro-batch loss divided by their number), the counters and logged figures are the
step's, and evaluation, checkpoints and preemption happen at the steps they should. The expected weights are
computed by hand in the test (SGD on (w x - y)^2), not by the loop."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from types import SimpleNamespace

import pytest
import torch

from prismatic.training.metrics import PendingMetrics, StepMetrics
from prismatic.training.preemption import Preempted
from prismatic.training.profiling import StepProfiler
from prismatic.training.trainer import LoopHooks, LoopPlan, train_loop

LR = 0.1


class _Head:
    """loss = mean over the batch of (w x - y)^2; sums: (squared error, samples) per sample."""

    columns = ("sq", "n")
    ratios = {"loss": ("sq", "n"), "mse": ("sq", "n")}

    def __call__(self, model, batch):
        err = (model.w * batch["x"] - batch["y"]) ** 2
        sums = torch.stack([err.detach().double(), torch.ones_like(err, dtype=torch.float64)], dim=1)
        return SimpleNamespace(loss=err.mean(), sums=sums)


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))


class _Strategy:
    def __init__(self, n_micro: int, lr_lambda=lambda step: 1.0) -> None:
        self.model = _Model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda)
        self.grad_accumulation_steps = n_micro
        self.last_flags: list[bool] = []
        self.grads_at_clip: list[float] = []

    def begin_step(self) -> None:
        pass

    def to_device(self, batch):
        return batch

    @contextlib.contextmanager
    def accumulate(self, is_last_micro_batch: bool):
        self.last_flags.append(is_last_micro_batch)
        yield

    def autocast(self):
        return contextlib.nullcontext()

    def causal_attention(self, batch):
        return contextlib.nullcontext()

    def clip_grad_norm(self):
        self.grads_at_clip.append(self.model.w.grad.item())
        return self.model.w.grad.detach().abs()


class _Tracker:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []

    def log(self, step, metrics):
        self.logged.append((step, dict(metrics)))


class _Checkpoints:
    def __init__(self, interval: int) -> None:
        self.interval, self.polls, self.waited = interval, 0, False

    def should_save(self, step, is_last):
        return is_last or step % self.interval == 0

    def poll(self):
        self.polls += 1

    def wait(self):
        self.waited = True


class _Preemption:
    def __init__(self, at_step: int | None = None) -> None:
        self.at_step, self.calls = at_step, 0

    def votes(self):
        return torch.zeros(2, dtype=torch.float64)

    def agreed(self, ranks_per_signal):
        self.calls += 1
        return signal.SIGTERM if self.calls == self.at_step else 0


def _batches(xs, ys):
    for x, y in zip(xs, ys, strict=True):
        yield {"x": torch.tensor(x), "y": torch.tensor(y), "dataset_names": ["d"] * len(x)}


def _run(
    strategy,
    batches,
    *,
    start=0,
    steps=3,
    steps_per_epoch=2,
    gbs=4,
    eval_interval=2,
    validate=True,
    save_interval=2,
    preempt_at=None,
    counters=None,
    overlap=False,
    profiler=None,
):
    tracker, checkpoints, saves, evals = _Tracker(), _Checkpoints(save_interval), [], []
    counters = counters if counters is not None else {"step": start, "epoch": 0, "frames": 0}

    def save(blocking):
        saves.append((counters["step"], blocking))

    def run_validate():
        evals.append(counters["step"])
        return {"val_loss": 0.5}

    checkpoints.save = save
    last = train_loop(
        strategy,
        _Head(),
        batches,
        StepMetrics(["d"], _Head(), torch.device("cpu")),
        LoopPlan(
            start,
            steps,
            steps_per_epoch,
            gbs,
            eval_interval if validate else None,
            show_progress=False,
            overlap_steps=overlap,
        ),
        counters,
        LoopHooks(
            [tracker], checkpoints, _Preemption(preempt_at), run_validate if validate else None, profiler
        ),
    )
    return SimpleNamespace(
        last=last, tracker=tracker, checkpoints=checkpoints, saves=saves, evals=evals, counters=counters
    )


def _expected_weights(micro_batches, n_micro, steps):
    """Plain SGD by hand: grad of mean (w x - y)^2 is mean 2 x (w x - y); accumulated = mean over micro-batches."""
    w, out, it = 0.0, [], iter(micro_batches)
    for _ in range(steps):
        grads = []
        for _ in range(n_micro):
            xs, ys = next(it)
            grads.append(sum(2 * x * (w * x - y) for x, y in zip(xs, ys, strict=True)) / len(xs))
        w -= LR * sum(grads) / n_micro
        out.append(w)
    return out


def test_accumulated_update_is_the_mean_of_micro_batch_gradients():
    """Two micro-batches per step, three steps: the weight after the run and step 1's gradient, by hand."""
    xs = [[1.0, 2.0], [3.0], [0.5, 1.5], [2.0, 1.0], [1.0], [4.0, 0.0]]
    ys = [[2.0, 1.0], [0.0], [1.0, -1.0], [0.5, 0.5], [3.0], [2.0, 1.0]]
    strategy = _Strategy(n_micro=2)
    result = _run(strategy, _batches(xs, ys), steps=3)
    weights = _expected_weights(list(zip(xs, ys, strict=True)), n_micro=2, steps=3)
    assert strategy.model.w.item() == pytest.approx(weights[-1], rel=1e-6)
    # gradient at clip time of step 1 (w = 0): mean over micro-batches of mean 2 x (-y)
    g1 = ((2 * 1 * -2 + 2 * 2 * -1) / 2 + (2 * 3 * 0) / 1) / 2
    assert strategy.grads_at_clip[0] == pytest.approx(g1, rel=1e-6)
    assert strategy.last_flags == [False, True] * 3  # only the last micro-batch syncs gradients
    assert strategy.model.w.grad is None  # gradients are freed after each step
    # the logged loss of step 1 is the mean of its two micro-batch losses at w = 0
    assert result.tracker.logged[0][1]["loss"] == pytest.approx(((4 + 1) / 2 + 0 / 1) / 2, rel=1e-9)
    assert result.tracker.logged[0][1]["mse"] == pytest.approx((4 + 1 + 0) / 3, rel=1e-9)


def test_counters_and_logged_figures_per_step():
    """Start at step 1 of 4, 2 steps per epoch, 4 frames per step: steps 2..4, epochs 1, 1, 2, frames 4, 8, 12."""
    xs, ys = [[1.0]] * 3, [[1.0]] * 3
    strategy = _Strategy(n_micro=1, lr_lambda=lambda step: 1.0 / (step + 1))
    began = time.perf_counter()
    result = _run(strategy, _batches(xs, ys), start=1, steps=4, steps_per_epoch=2, gbs=4, validate=False)
    elapsed = time.perf_counter() - began
    steps = [s for s, _ in result.tracker.logged]
    assert steps == [2, 3, 4]
    assert [m["epoch"] for _, m in result.tracker.logged] == [1, 1, 2]
    assert [m["frames"] for _, m in result.tracker.logged] == [4, 8, 12]
    assert result.counters == {"step": 4, "epoch": 2, "frames": 12}
    # the learning rate a step used: the scheduler's value before that step's scheduler.step()
    assert [m["learning_rate"] for _, m in result.tracker.logged] == pytest.approx([LR, LR / 2, LR / 3])
    for _, m in result.tracker.logged:
        assert 0 < m["step_time_s"] <= elapsed  # each step's own duration, within the run's
        assert m["samples_per_s"] * m["step_time_s"] == pytest.approx(4, rel=1e-9)
    assert result.last == result.tracker.logged[-1][1]


@pytest.mark.parametrize("overlap", [False, True], ids=["in-step", "overlapped"])
def test_eval_and_checkpoints_at_their_intervals_and_the_last_step(overlap: bool):
    """5 steps, eval every 2 and at the end; saves every 2 (async) and at the end (blocking); with overlapped
    steps too, each at its own step's counters."""
    xs, ys = [[1.0]] * 5, [[0.0]] * 5
    result = _run(
        _Strategy(n_micro=1), _batches(xs, ys), steps=5, eval_interval=2, save_interval=2, overlap=overlap
    )
    assert result.evals == [2, 4, 5]
    assert [("val_loss" in m) for _, m in result.tracker.logged] == [False, True, False, True, True]
    assert result.saves == [(2, False), (4, False), (5, True)]
    assert result.checkpoints.polls == 5 and result.checkpoints.waited


@pytest.mark.parametrize(("overlap", "stop"), [(False, 3), (True, 4)], ids=["in-step", "overlapped"])
def test_preemption_saves_a_blocking_checkpoint_then_stops(overlap: bool, stop: int):
    """SIGTERM in step 3's votes, no interval save due: one blocking save, every step up to it logged, then
    Preempted(SIGTERM). Overlapped, the ranks read step 3's votes after step 4 was queued: they stop at 4."""
    xs, ys = [[1.0]] * 6, [[0.0]] * 6
    strategy, tracker, checkpoints, saves = _Strategy(n_micro=1), _Tracker(), _Checkpoints(10), []
    counters = {"step": 0, "epoch": 0, "frames": 0}
    checkpoints.save = lambda blocking: saves.append((counters["step"], blocking))
    with pytest.raises(Preempted) as info:
        train_loop(
            strategy,
            _Head(),
            _batches(xs, ys),
            StepMetrics(["d"], _Head(), torch.device("cpu")),
            LoopPlan(0, 6, 6, 1, None, show_progress=False, overlap_steps=overlap),
            counters,
            LoopHooks([tracker], checkpoints, _Preemption(at_step=3)),
        )
    assert saves == [(stop, True)]
    assert info.value.step == stop and info.value.signum == signal.SIGTERM
    assert [step for step, _ in tracker.logged] == list(range(1, stop + 1))
    assert strategy.model.w.grad is None and len(strategy.grads_at_clip) == stop


def _figures(logged):
    """The logged records without the two timing figures (which differ from run to run)."""
    return [
        (step, {k: v for k, v in m.items() if k not in ("step_time_s", "samples_per_s")})
        for step, m in logged
    ]


def test_overlapped_steps_log_the_same_records_and_weights():
    """`overlap_steps` changes when a step is read, not what: the same records in the same order, the same
    weights, evaluations and checkpoints at the same steps."""
    xs = [[1.0, 2.0], [3.0], [0.5, 1.5], [2.0, 1.0], [1.0], [4.0, 0.0], [1.0], [2.0], [0.5], [1.5]]
    ys = [[2.0, 1.0], [0.0], [1.0, -1.0], [0.5, 0.5], [3.0], [2.0, 1.0], [1.0], [0.0], [2.0], [1.0]]
    runs = {}
    for overlap in (False, True):
        strategy = _Strategy(n_micro=2, lr_lambda=lambda step: 1.0 / (step + 1))
        result = _run(strategy, _batches(xs, ys), steps=5, eval_interval=3, save_interval=4, overlap=overlap)
        runs[overlap] = (strategy.model.w.item(), _figures(result.tracker.logged), result.evals, result.saves)
    assert [step for step, _ in runs[True][1]] == [1, 2, 3, 4, 5]
    assert runs[True] == runs[False]


@pytest.mark.parametrize("overlap", [False, True])
def test_profiled_steps_train_as_without_the_profiler(overlap: bool, tmp_path):
    """Steps 2-3 of 5 under `StepProfiler` (`--profile.start_step 2 --profile.num_steps 2`): the same records,
    weights, evaluations and checkpoints as without it; the window's trace and summary hold steps 2 and 3."""
    xs = [[1.0, 2.0], [3.0], [0.5, 1.5], [2.0, 1.0], [1.0], [4.0, 0.0], [1.0], [2.0], [0.5], [1.5]]
    ys = [[2.0, 1.0], [0.0], [1.0, -1.0], [0.5, 0.5], [3.0], [2.0, 1.0], [1.0], [0.0], [2.0], [1.0]]
    runs = {}
    for profiled in (False, True):
        profiler = StepProfiler(tmp_path, 0, torch.device("cpu"), 2, 2) if profiled else None
        strategy = _Strategy(n_micro=2)
        result = _run(
            strategy,
            _batches(xs, ys),
            steps=5,
            eval_interval=3,
            save_interval=4,
            overlap=overlap,
            profiler=profiler,
        )
        runs[profiled] = (
            strategy.model.w.item(),
            _figures(result.tracker.logged),
            result.evals,
            result.saves,
        )
    assert runs[True] == runs[False]
    trace, summary = profiler.written
    assert (trace.name, summary.name) == (
        "rank00000-steps-000002-000003.trace.json",
        "rank00000-steps-000002-000003.summary.json",
    )
    report = json.loads(summary.read_text())
    assert report["steps"] == [2, 3] and report["units"] == 2
    # Each micro-batch squares its error once and back-propagates through it once (its backward calls `pow` too):
    # 2 micro-batches x 2 steps. Steps 1, 4 and 5 are outside the window.
    names = [e.get("name") for e in json.loads(trace.read_text())["traceEvents"]]
    assert names.count("PowBackward0") == 4 and names.count("aten::pow") == 4 + 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile"]
    assert len(list((tmp_path / "profile").iterdir())) == 2  # no partial file left beside them


def test_a_run_that_ends_inside_the_window_writes_the_steps_it_ran(tmp_path):
    xs, ys = [[1.0]] * 3, [[1.0]] * 3
    profiler = StepProfiler(tmp_path, 3, torch.device("cpu"), 2, 5)
    _run(_Strategy(n_micro=1), _batches(xs, ys), steps=3, validate=False, profiler=profiler)
    assert [p.name for p in profiler.written] == [
        "rank00003-steps-000002-000003.trace.json",
        "rank00003-steps-000002-000003.summary.json",
    ]
    assert json.loads(profiler.written[1].read_text())["units"] == 2


class _CountingTracker(_Tracker):
    """Also notes how many optimizer steps the loop had run when each record arrived."""

    def __init__(self, strategy: _Strategy) -> None:
        super().__init__()
        self.strategy, self.steps_run = strategy, []

    def log(self, step, metrics):
        super().log(step, metrics)
        self.steps_run.append(len(self.strategy.grads_at_clip))


def test_overlap_reads_a_step_after_queuing_the_next_except_where_it_evaluates_or_saves():
    """5 steps, eval at 2 and 5, saves at 4 and 5: steps 1 and 3 are read once steps 2 and 4 ran; 2, 4 and 5
    are read before anything else runs (their evaluation and checkpoint see their own state)."""
    xs, ys = [[1.0]] * 5, [[0.0]] * 5
    for overlap, expected in ((False, [1, 2, 3, 4, 5]), (True, [2, 2, 4, 4, 5])):
        strategy = _Strategy(n_micro=1)
        tracker, checkpoints = _CountingTracker(strategy), _Checkpoints(4)
        checkpoints.save = lambda blocking: None
        train_loop(
            strategy,
            _Head(),
            _batches(xs, ys),
            StepMetrics(["d"], _Head(), torch.device("cpu")),
            LoopPlan(0, 5, 5, 1, 2, show_progress=False, overlap_steps=overlap),
            {"step": 0, "epoch": 0, "frames": 0},
            LoopHooks([tracker], checkpoints, _Preemption(), lambda: {"val_loss": 0.0}),
        )
        assert [step for step, _ in tracker.logged] == [1, 2, 3, 4, 5]
        assert tracker.steps_run == expected, overlap


@pytest.mark.parametrize("done", [True, False], ids=["its-work-done", "its-work-not-done"])
def test_a_failing_step_still_logs_the_overlapped_step_before_it(
    done: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """The batch of step 3 fails to load: step 2, queued and not yet read, is logged before the error goes up,
    unless its work is not back from the device (a failed collective): then it is not waited for."""
    if not done:  # what an unfinished CUDA event says
        monkeypatch.setattr(PendingMetrics, "ready", lambda self: False)

    def batches():
        yield from _batches([[1.0], [2.0]], [[1.0], [0.0]])
        raise OSError("shard 7 is unreadable")

    tracker = _Tracker()
    with pytest.raises(OSError, match="shard 7"):
        train_loop(
            _Strategy(n_micro=1),
            _Head(),
            batches(),
            StepMetrics(["d"], _Head(), torch.device("cpu")),
            LoopPlan(0, 5, 5, 1, None, show_progress=False, overlap_steps=True),
            {"step": 0, "epoch": 0, "frames": 0},
            LoopHooks([tracker], _Checkpoints(10), _Preemption()),
        )
    if not done:
        assert [step for step, _ in tracker.logged] == [1]
        assert "Step 2's metrics are not back from the device; not logged." in caplog.text
        return
    assert [step for step, _ in tracker.logged] == [1, 2]
    # step 1 at w = 0: gradient 2 * 1 * (0 - 1) = -2, so w = 0.2; step 2's loss (0.2 * 2 - 0)^2
    assert tracker.logged[1][1]["loss"] == pytest.approx(0.16, rel=1e-6)
