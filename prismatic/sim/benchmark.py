"""The simulator benchmarks a policy is evaluated in, behind one interface, and their registry.

A benchmark module (`prismatic/sim/<name>/benchmark.py`) defines one `Benchmark` object, `BENCHMARK`, and one line in
`BENCHMARKS` below makes it known to `vla_scripts/eval_sim.py --benchmark <name>`, the subprocess pool and the
rollout loop. What a benchmark decides (its suites and tasks, its simulator, the wait steps at the start of an
episode, the action its controller takes, the statistics key) lives in its module; what every benchmark shares (the
worker processes, chunk execution, step limits, the report) lives beside this file.

This module imports no simulator, torch or TensorFlow: `--help` and the refusals of a bad suite or task stay instant.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from prismatic.util.errors import ConfigError, did_you_mean

# name -> the module whose `BENCHMARK` implements it (imported when chosen).
BENCHMARKS: dict[str, str] = {
    "libero": "prismatic.sim.libero.benchmark",
    "metaworld": "prismatic.sim.metaworld.benchmark",
}


@dataclass(frozen=True)
class SimObservation:
    """What the policy side reads from one simulator step, whatever the benchmark."""

    views: tuple[
        np.ndarray, ...
    ]  # (H, W, 3) uint8 camera images, primary first, upright as training data stored them
    proprio: np.ndarray  # float32 state, as the benchmark's demonstrations recorded it
    eef_pos: np.ndarray  # (3,) float64 end-effector position in world coordinates (metres)


class TaskEnv(Protocol):
    """One task's simulator. An episode depends only on (task, `episode_idx`, `seed`)."""

    suite: str
    task_id: int
    language: str  # the instruction the policy is prompted with

    def reset(self, episode_idx: int, seed: int = 0) -> Any:
        """Start an episode; returns its first observation (a `SimObservation` or one with the same fields)."""
        ...

    def step(self, action: np.ndarray) -> tuple[Any, bool]:
        """Apply one action in the controller's convention; returns the observation and whether the task is done."""
        ...

    def close(self) -> None:
        """Free the simulator and its rendering context."""
        ...


class Benchmark(Protocol):
    """A family of simulated tasks and the protocol its published evaluations follow."""

    name: str  # the registry's key (`--benchmark`)
    title: str  # how messages and tables name it ("LIBERO", "Meta-World")
    action_dim: int  # numbers per action the controller takes
    proprio_dim: int  # numbers of the state a proprio-reading policy gets
    num_views: int  # camera views rendered per step (primary first)
    num_steps_wait: int  # steps of `dummy_action` at the start of each episode, before the policy is asked
    dummy_action: tuple[float, ...]  # the action of those steps (no motion)
    default_resolution: int  # square render size, in pixels
    suites: Sequence[str]  # valid `--task_suite` values

    def check_install(self) -> None:
        """Raise ConfigError naming the install command when the simulator is missing; prepare its config."""
        ...

    def task_names(self, suite: str) -> list[str]:
        """The suite's tasks, in task-id order (raises ConfigError for an unknown suite)."""
        ...

    def task_language(self, suite: str, task_id: int) -> str:
        """The instruction of a task."""
        ...

    def max_steps(self, suite: str) -> int:
        """Policy steps per episode, the benchmark's published limit for `suite`."""
        ...

    def max_episodes_per_task(self, suite: str) -> int | None:
        """How many distinct episodes a task has (LIBERO: its fixed initial states), None when unbounded."""
        ...

    def make_env(self, suite: str, task_id: int, resolution: int, shadows: bool = True) -> TaskEnv:
        """A simulator for one task (in a worker process); `shadows=False` skips MuJoCo's shadow pass where the
        benchmark allows it (raises ConfigError where it does not)."""
        ...

    def action_to_env(self, actions: np.ndarray) -> np.ndarray:
        """Policy actions `[..., D]` as the controller executes them (a float64 copy)."""
        ...

    def unnorm_key(self, suite: str, available: Sequence[str]) -> str:
        """The statistics key a checkpoint trained for `suite` carries (raises ConfigError listing `available`)."""
        ...


def get_benchmark(name: str) -> Benchmark:
    """The registered benchmark `name` (its module is imported now; the simulator itself is not).

    Raises:
        ConfigError: `name` is not registered (with a did-you-mean and the valid choices).
    """
    if name not in BENCHMARKS:
        raise ConfigError(
            f"Unknown benchmark '{name}'.{did_you_mean(name, BENCHMARKS)} Valid choices: {', '.join(BENCHMARKS)}."
        )
    return importlib.import_module(BENCHMARKS[name]).BENCHMARK


def check_task_ids(benchmark: Benchmark, suite: str, task_ids: Sequence[int]) -> None:
    """Raises ConfigError when a task id is not one of `suite`'s (0 .. count - 1)."""
    count = len(benchmark.task_names(suite))
    bad = [t for t in task_ids if isinstance(t, bool) or t not in range(count)]
    if bad:
        raise ConfigError(
            f"Task id {', '.join(str(t) for t in bad)} is not in {benchmark.title} suite '{suite}': it has {count} "
            f"tasks, valid ids are 0-{count - 1}."
        )


def parse_tasks(benchmark: Benchmark, suite: str, text: str | None) -> list[int]:
    """`--tasks 0,3` or `--tasks reach-v3,push-v3` as sorted task ids of `suite` (every task when None).

    Raises:
        ConfigError: a value that is neither a task id nor a task name of the suite (did-you-mean for names).
    """
    names = benchmark.task_names(suite)
    if text is None:
        return list(range(len(names)))
    ids = []
    for part in str(text).replace(" ", "").split(","):
        if part.lstrip("-").isdigit() and 0 <= int(part) < len(names):
            ids.append(int(part))
        elif part in names:
            ids.append(names.index(part))
        else:
            hint = "" if part.lstrip("-").isdigit() else did_you_mean(part, names)
            raise ConfigError(
                f"--tasks: '{part}' is not a task id of this suite ({benchmark.title} '{suite}').{hint} Choose from: "
                f"valid ids are 0..{len(names) - 1}, or the task names "
                f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''} (comma-separated, e.g. --tasks 0,3)."
            )
    return sorted(set(ids))
