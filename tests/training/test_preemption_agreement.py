"""Preemption without a collective of its own: the ranks' signal votes ride on the metrics' per-step all-reduce.

Two gloo ranks (`torch.multiprocessing.spawn`) run the real `train_loop` with the real `PreemptionHandler` and
`StepMetrics` on a one-weight model; only one rank receives the signal (sent to itself mid-step). Both must stop
after the same step with the same signal (so the same exit code), and the only collective a step issues is the
metrics' one all-reduce on the default group: no process group is created, no other collective runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from prismatic.training.metrics import StepMetrics
from prismatic.training.preemption import Preempted, PreemptionHandler, exit_code
from prismatic.training.trainer import LoopHooks, LoopPlan, train_loop

WORLD, STEPS = 2, 6
# (signal, the rank that receives it, the step during which it arrives)
CASES = {"sigterm-on-rank-1": (signal.SIGTERM, 1, 3), "sigint-on-rank-0": (signal.SIGINT, 0, 2)}
COLLECTIVES = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_object", "reduce", "new_group")


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))


class _Strategy:
    def __init__(self) -> None:
        self.model = _Model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)
        self.grad_accumulation_steps = 1

    def begin_step(self) -> None:
        pass

    def to_device(self, batch):
        return batch

    def accumulate(self, is_last_micro_batch: bool):
        return contextlib.nullcontext()

    def autocast(self):
        return contextlib.nullcontext()

    def causal_attention(self, batch):
        return contextlib.nullcontext()

    def clip_grad_norm(self):
        return self.model.w.grad.detach().abs()


class _Head:
    columns = ("sq", "n")
    ratios = {"loss": ("sq", "n"), "mse": ("sq", "n")}

    def __init__(self, signum: int, at_step: int) -> None:
        self.signum, self.at_step, self.calls = signum, at_step, 0

    def __call__(self, model, batch):
        self.calls += 1
        if self.calls == self.at_step:  # this rank alone is signalled, in the middle of the step
            os.kill(os.getpid(), self.signum)
        err = (model.w * batch["x"] - 1.0) ** 2
        sums = torch.stack([err.detach().double(), torch.ones_like(err, dtype=torch.float64)], dim=1)
        return SimpleNamespace(loss=err.mean(), sums=sums)


class _Checkpoints:
    def __init__(self) -> None:
        self.saves: list[bool] = []

    def should_save(self, step, is_last):
        return False

    def save(self, blocking):
        self.saves.append(blocking)

    def poll(self):
        pass

    def wait(self):
        pass


def _count_collectives(calls: list[str]) -> None:
    """Record every collective (and group creation) this process issues from now on, by name and group."""
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def counted(*args, _name=name, _real=real, **kwargs):
            group = kwargs.get("group")
            calls.append(_name if group is None else f"{_name}@{group}")
            return _real(*args, **kwargs)

        setattr(dist, name, counted)


def _run_case(rank: int, signum: int, signalled_rank: int, at_step: int) -> dict:
    head = _Head(signum if rank == signalled_rank else 0, at_step)
    checkpoints, calls = _Checkpoints(), []
    _count_collectives(calls)
    with PreemptionHandler() as preemption:
        batches = ({"x": torch.tensor([1.0, 2.0]), "dataset_names": ["d", "d"]} for _ in range(STEPS))
        try:
            train_loop(
                _Strategy(),
                head,
                batches,
                StepMetrics(["d"], head, torch.device("cpu")),
                LoopPlan(0, STEPS, STEPS, 2 * WORLD, None, show_progress=False),
                {"step": 0, "epoch": 0, "frames": 0},
                LoopHooks([], checkpoints, preemption),
            )
            stopped = None
        except Preempted as stop:
            stopped = {"step": stop.step, "signum": stop.signum, "exit_code": exit_code(stop.signum)}
    for name in COLLECTIVES:  # the real functions again for the next case
        setattr(dist, name, getattr(dist.distributed_c10d, name))
    return {"stopped": stopped, "saves": checkpoints.saves, "calls": calls, "steps_run": head.calls}


def _worker(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    results = {case: _run_case(rank, *spec) for case, spec in CASES.items()}
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def test_one_signalled_rank_stops_every_rank_at_the_same_step_without_a_collective_of_its_own(
    tmp_path: Path,
) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    expected_codes = {"sigterm-on-rank-1": 128 + 15, "sigint-on-rank-0": 128 + 2}
    for case, (signum, _, at_step) in CASES.items():
        for rank, results in enumerate(ranks):
            got = results[case]
            # The signal arrives during step `at_step`; its vote rides on that step's all-reduce.
            assert got["stopped"] == {
                "step": at_step,
                "signum": int(signum),
                "exit_code": expected_codes[case],
            }, (
                case,
                rank,
            )
            assert got["saves"] == [True], (case, rank)  # one blocking preemption checkpoint, on every rank
            assert got["steps_run"] == at_step, (case, rank)
            # One collective per step: the metrics' all-reduce on the default group; no group is made.
            assert got["calls"] == ["all_reduce"] * at_step, (case, rank)


def test_votes_count_ranks_per_signal_and_sigterm_outranks_sigint() -> None:
    handler = PreemptionHandler()
    assert handler.votes().tolist() == [0.0, 0.0] and handler.votes().dtype == torch.float64
    handler.signum = signal.SIGINT
    assert handler.votes().tolist() == [0.0, 1.0]
    handler.signum = signal.SIGTERM
    assert handler.votes().tolist() == [1.0, 0.0]
    assert handler.agreed(torch.tensor([0.0, 0.0], dtype=torch.float64)) == 0
    assert handler.agreed(torch.tensor([0.0, 3.0], dtype=torch.float64)) == signal.SIGINT
    assert handler.agreed(torch.tensor([1.0, 7.0], dtype=torch.float64)) == signal.SIGTERM


def test_the_votes_ride_on_the_metrics_reduction_without_changing_the_metrics() -> None:
    """In one process the sum over ranks is the rank's own vote; the reported metrics are those without it."""
    head = _Head(0, 0)
    plain, voting = (StepMetrics(["d"], head, torch.device("cpu")) for _ in range(2))
    sums = torch.tensor([[4.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    for metrics in (plain, voting):
        metrics.update(torch.tensor(2.5), sums, ["d", "d"])
    votes = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert voting.reduce(torch.tensor(0.5), also_sum=votes) == plain.reduce(torch.tensor(0.5))
    assert votes.tolist() == [1.0, 0.0]
