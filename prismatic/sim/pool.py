"""N simulators of one benchmark in worker processes, stepped in parallel: rendering costs tenths of a second of CPU
per step, so episodes run side by side while the policy answers all of them in one batch.

    with EnvPool(get_benchmark("libero"), num_envs=2) as pool:
        observations = pool.reset({0: EpisodeSpec("libero_spatial", 0, episode_idx=0), 1: ...})
        outcomes = pool.step({0: action_0, 1: action_1})   # {slot: StepOutcome}

Slots are numbered 0 .. num_envs - 1; `reset` and `step` take any subset of them, so an episode that ends early
frees its slot for the next one while the others go on. Each worker keeps its task's simulator between episodes
and builds a new one when a different task comes. An episode depends only on its `EpisodeSpec` (the benchmark's
environment seeds each reset), so which worker runs it, in which order, and how many workers there are change no
observation.

A worker that dies raises `EnvWorkerError` instead of hanging; leaving the `with` block (Ctrl-C included) stops
the workers. Workers ignore Ctrl-C themselves, so the interrupt reaches only this process, which closes them.

Workers are spawned, fresh interpreters: MuJoCo's software rendering must not share a process with TensorFlow. A
spawned worker re-imports the main script, so the script must start the pool under `if __name__ == "__main__":`
and keep TensorFlow out of its top-level imports.
"""

from __future__ import annotations

import multiprocessing
import signal
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from prismatic.sim.benchmark import Benchmark, TaskEnv, check_task_ids, get_benchmark
from prismatic.util.errors import ConfigError

REPLY_TIMEOUT_S = 900.0  # a worker that neither answers nor dies for this long is reported as hung
CLOSE_TIMEOUT_S = 10.0  # how long a closing worker gets before it is terminated


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode: the benchmark's `suite`, task id, the episode's number (LIBERO: the task's fixed initial state),
    and the seed of its reset."""

    suite: str
    task_id: int
    episode_idx: int
    seed: int = 0


@dataclass(frozen=True)
class StepOutcome:
    """One simulator step: the observation and task success, or the simulator's error (the episode then ends as a
    failure, as OpenVLA's evaluation loop treats an exception)."""

    observation: Any | None  # the benchmark's observation (`SimObservation`'s fields)
    success: bool
    error: str | None = None


class EnvWorkerError(RuntimeError):
    """A simulator worker died, hung or failed unexpectedly (not a user error)."""


def _serve(conn: Connection, benchmark_name: str, resolution: int, shadows: bool) -> None:
    """Worker loop: one simulator, rebuilt only when the task changes; answers ("ok" | "config" | "error", value)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it closes the workers
    benchmark = get_benchmark(benchmark_name)
    env: TaskEnv | None = None
    try:
        while True:
            command, payload = conn.recv()
            if command == "close":
                break
            try:
                if command == "reset":
                    if env is None or (env.suite, env.task_id) != (payload.suite, payload.task_id):
                        if env is not None:
                            env.close()
                        env = None
                        env = benchmark.make_env(payload.suite, payload.task_id, resolution, shadows=shadows)
                    reply: tuple[str, Any] = (
                        "ok",
                        (env.reset(payload.episode_idx, payload.seed), env.language),
                    )
                else:
                    try:
                        observation, success = env.step(payload)
                        reply = ("ok", StepOutcome(observation, success))
                    except Exception as exc:  # a simulator error ends the episode, not the evaluation
                        reply = ("ok", StepOutcome(None, False, f"{type(exc).__name__}: {exc}"))
            except ConfigError as exc:
                reply = ("config", str(exc))
            except Exception:
                reply = ("error", traceback.format_exc())
            conn.send(reply)
    except EOFError:  # the parent is gone
        pass
    finally:
        if env is not None:
            env.close()


class EnvPool:
    """`num_envs` simulators of `benchmark` in worker processes (spawned: safe beside CUDA and threads), rendering
    `resolution`-square images (default: the benchmark's), with MuJoCo's shadow pass unless `shadows` is False (the
    bulk of a software-rendered frame; render as the policy's demonstrations were). Use as a context manager, or
    call `close()`. Call
    `render.check_render_backend()` and the benchmark's `check_install()` before creating it: the workers inherit
    the environment they set."""

    def __init__(
        self, benchmark: Benchmark, num_envs: int, resolution: int | None = None, shadows: bool = True
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ConfigError(f"The number of simulators must be a whole number >= 1, got {num_envs!r}.")
        self.benchmark = benchmark
        self.num_envs = num_envs
        resolution = benchmark.default_resolution if resolution is None else resolution
        self._languages: dict[tuple[str, int], str] = {}
        self._episodes: dict[int, EpisodeSpec] = {}  # slot -> the episode it runs (reset and not failed)
        self._workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        context = multiprocessing.get_context("spawn")
        try:
            for slot in range(num_envs):
                parent_end, child_end = context.Pipe()
                process = context.Process(
                    target=_serve,
                    args=(child_end, benchmark.name, resolution, shadows),
                    name=f"{benchmark.name}-sim-{slot}",
                    daemon=True,
                )
                process.start()
                child_end.close()
                self._workers.append((process, parent_end))
        except BaseException:
            self.close()
            raise

    @property
    def worker_pids(self) -> list[int | None]:
        """Process ids of the workers, by slot."""
        return [process.pid for process, _ in self._workers]

    def reset(self, specs: Mapping[int, EpisodeSpec] | Sequence[EpisodeSpec]) -> dict[int, Any]:
        """Start `specs[slot]` on each given slot (a sequence means slots 0, 1, ...), all in parallel; a worker
        builds its simulator first when the task changes (~5 s). Returns {slot: first observation}.

        Raises:
            ConfigError: an unknown suite, task id or episode number.
            EnvWorkerError: a worker died, hung or failed.
        """
        specs = self._by_slot(specs)
        for spec in specs.values():
            check_task_ids(self.benchmark, spec.suite, [spec.task_id])
        replies = self._call({slot: ("reset", spec) for slot, spec in specs.items()}, "reset")
        observations = {}
        for slot, (observation, language) in replies.items():
            self._episodes[slot] = specs[slot]
            self._languages[(specs[slot].suite, specs[slot].task_id)] = language
            observations[slot] = observation
        return observations

    def step(self, actions: Mapping[int, np.ndarray] | Sequence[np.ndarray]) -> dict[int, StepOutcome]:
        """Apply `actions[slot]` (the controller's convention) on each given slot, all in parallel. Returns
        {slot: StepOutcome}; a slot whose step failed must be reset before it steps again.

        Raises:
            EnvWorkerError: a worker died, hung or failed.
        """
        actions = self._by_slot(actions)
        requests = {}
        for slot, action in actions.items():
            if slot not in self._episodes:
                raise ValueError(
                    f"Simulator slot {slot} has no episode running: reset it before stepping it."
                )
            action = np.asarray(action, dtype=np.float64)
            if action.shape != (self.benchmark.action_dim,):
                raise ValueError(
                    f"A {self.benchmark.title} action has shape ({self.benchmark.action_dim},), got {action.shape} "
                    f"for slot {slot}."
                )
            requests[slot] = ("step", action)
        outcomes = self._call(requests, "step")
        for slot, outcome in outcomes.items():
            if outcome.error is not None:
                del self._episodes[slot]
        return outcomes

    def language(self, suite: str, task_id: int) -> str:
        """The instruction of a task (as a worker's simulator read it, else from the benchmark's task table)."""
        key = (suite, task_id)
        if key not in self._languages:
            self._languages[key] = self.benchmark.task_language(suite, task_id)
        return self._languages[key]

    def close(self) -> None:
        """Stop every worker: ask, wait up to CLOSE_TIMEOUT_S, then terminate. Safe to call twice."""
        for _, conn in self._workers:
            try:
                conn.send(("close", None))
            except (OSError, ValueError):  # already gone or closed
                pass
        for process, conn in self._workers:
            process.join(CLOSE_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(CLOSE_TIMEOUT_S)
            conn.close()
        self._workers = []
        self._episodes.clear()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _by_slot(self, items: Mapping[int, Any] | Sequence[Any]) -> dict[int, Any]:
        by_slot = dict(items) if isinstance(items, Mapping) else dict(enumerate(items))
        bad = [slot for slot in by_slot if slot not in range(self.num_envs)]
        if bad:
            raise ValueError(
                f"Simulator slots {bad} do not exist: this pool has slots 0-{self.num_envs - 1}."
            )
        if not self._workers:
            raise EnvWorkerError("This EnvPool is closed.")
        return by_slot

    def _call(self, requests: dict[int, tuple[str, Any]], what: str) -> dict[int, Any]:
        """Send every request, then collect every reply; a dead or hung worker raises instead of blocking."""
        for slot, request in requests.items():
            try:
                self._workers[slot][1].send(request)
            except OSError as exc:
                raise self._dead(slot, what) from exc
        replies, config_errors, failures = {}, [], []
        for slot in requests:  # read every reply before raising, so no pipe is left holding an old one
            process, conn = self._workers[slot]
            if not wait([conn, process.sentinel], REPLY_TIMEOUT_S):
                raise EnvWorkerError(
                    f"{self.benchmark.title} simulator {slot} (pid {process.pid}) did not answer {what} within {REPLY_TIMEOUT_S:.0f} s."
                )
            try:
                status, value = conn.recv()
            except (EOFError, OSError) as exc:
                raise self._dead(slot, what) from exc
            if status == "config":
                config_errors.append(value)
            elif status == "error":
                failures.append(f"{self.benchmark.title} simulator {slot} failed during {what}:\n{value}")
            else:
                replies[slot] = value
        if failures:
            raise EnvWorkerError(failures[0])
        if config_errors:
            raise ConfigError(config_errors[0])
        return replies

    def _dead(self, slot: int, what: str) -> EnvWorkerError:
        process = self._workers[slot][0]
        process.join(1.0)
        return EnvWorkerError(
            f"{self.benchmark.title} simulator {slot} (pid {process.pid}) died during {what} (exit code {process.exitcode}); a "
            f"negative code is the signal that ended it (-9: killed, e.g. out of memory). Its episode is lost."
        )
