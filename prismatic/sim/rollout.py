"""Closed-loop episodes of any benchmark, many at once: N simulators step together and their observations are
batched into one policy call.

One episode follows OpenVLA's `run_libero_eval.py` (OFT's for chunk heads), with the benchmark's numbers:

    reset (the benchmark seeds it from the episode's spec)
    t = 0; while t < max_steps + num_steps_wait:
        t < num_steps_wait: step the benchmark's dummy action (objects settle), t += 1
        else: when the action queue is empty, ask the policy (views, [proprio]) about the observation the last
              step returned and queue its chunk (open loop: `open_loop_steps` actions run before the next query);
              step the next action, converted to the controller's convention; success ends the episode, else t += 1
    a simulator error ends the episode as a failure (OpenVLA catches it the same way)

So the first policy action is step `num_steps_wait` of the episode, taken on the observation the last wait step
returned (LIBERO: the 10th no-op's; Meta-World, with no wait steps: the reset's).

Episodes are independent (each is seeded on its own) and handed to free simulators in order, so which simulator
runs which episode, and how many run at once, changes no result.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prismatic.sim.actions import ActionSource, PolicyQuery
from prismatic.sim.images import policy_image
from prismatic.sim.pool import EnvPool, EpisodeSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutSettings:
    """How observations become queries and chunks become steps (from the policy and the run it came from)."""

    unnorm_key: str  # statistics the actions are un-normalised with
    image_size: tuple[int, int]  # (H, W) of the model's images
    center_crop: bool  # the run trained with image augmentation
    num_images: int = 1  # camera views sent, the benchmark's first ones (LIBERO: agent view, then wrist)
    use_proprio: bool = False  # send the benchmark's state (LIBERO: OFT's 8-d; Meta-World: hand xyz, gripper)
    open_loop_steps: int = 1  # actions of each chunk executed before the next query (the chunk size)
    max_steps: int = 220  # policy steps per episode (the benchmark's limit for the suite)
    num_steps_wait: int = 0  # dummy-action steps before the first query (the benchmark's: LIBERO 10)
    keep_frames: bool = False  # keep each step's primary-camera frame (for videos)


@dataclass
class EpisodeResult:
    """One finished episode."""

    spec: EpisodeSpec
    instruction: str  # the task's language instruction, as the policy was prompted
    success: bool
    steps: int  # simulator steps taken, the settling steps included
    error: str | None = None  # the simulator error that ended it, if any
    seconds: float = 0.0
    actions_digest: str = ""  # SHA-1 of every action stepped (float64 bytes): equal digests, equal episodes
    final_eef_pos: tuple[float, ...] = ()  # where the end effector was last observed (metres, world frame)
    invalid_chunks: int | None = None  # chunks that did not decode (stand-ins); None: the source does not say
    frames: list[np.ndarray] = field(default_factory=list, repr=False)


@dataclass
class _Running:
    spec: EpisodeSpec
    instruction: str
    observation: Any  # the benchmark's observation (`SimObservation`'s fields)
    started: float
    t: int = 0
    queue: deque[np.ndarray] = field(default_factory=deque)
    frames: list[np.ndarray] = field(default_factory=list)
    digest: Any = field(default_factory=hashlib.sha1)
    invalid_chunks: int | None = None


def _query(observation: Any, instruction: str, settings: RolloutSettings) -> PolicyQuery:
    views = list(observation.views)[: settings.num_images]
    prepared = tuple(policy_image(v, settings.image_size, settings.center_crop) for v in views)
    proprio = np.asarray(observation.proprio, np.float32) if settings.use_proprio else None
    return PolicyQuery(prepared, instruction, proprio)


def run_episodes(
    pool: EnvPool,
    episodes: Sequence[EpisodeSpec],
    source: ActionSource,
    settings: RolloutSettings,
    on_result: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Run `episodes` on `pool`'s simulators with actions from `source`; results in the order of `episodes`.

    `on_result` is called as each episode ends (progress bars, logs).
    """
    pending = deque(enumerate(episodes))
    running: dict[int, tuple[int, _Running]] = {}  # simulator slot -> (episode index, state)
    results: dict[int, EpisodeResult] = {}

    def finish(slot: int, success: bool, error: str | None = None) -> None:
        index, state = running.pop(slot)
        result = EpisodeResult(
            state.spec,
            state.instruction,
            success,
            state.t,
            error,
            time.perf_counter() - state.started,
            state.digest.hexdigest(),
            tuple(float(x) for x in state.observation.eef_pos),
            state.invalid_chunks,
            state.frames,
        )
        results[index] = result
        if on_result is not None:
            on_result(result)

    while pending or running:
        free = [slot for slot in range(pool.num_envs) if slot not in running][: len(pending)]
        if free:
            starts = {slot: pending.popleft() for slot in free}
            observations = pool.reset({slot: spec for slot, (_, spec) in starts.items()})
            for slot, (index, spec) in starts.items():
                instruction = pool.language(spec.suite, spec.task_id)
                running[slot] = (index, _Running(spec, instruction, observations[slot], time.perf_counter()))
        _refill_queues(running, source, settings, pool.benchmark.action_to_env)
        dummy = np.asarray(pool.benchmark.dummy_action, dtype=np.float64)
        actions = {slot: _next_action(state, settings, dummy) for slot, (_, state) in running.items()}
        for slot, action in actions.items():
            running[slot][1].digest.update(np.ascontiguousarray(action, dtype=np.float64).tobytes())
        for slot, outcome in pool.step(actions).items():
            _, state = running[slot]
            state.t += 1
            if outcome.error is not None:
                logger.warning("Episode %s ended by a simulator error: %s", state.spec, outcome.error)
                finish(slot, False, outcome.error)
                continue
            state.observation = outcome.observation
            # A settling step's success is not looked at (OpenVLA's loop `continue`s past it): only the policy's counts.
            if outcome.success and state.t > settings.num_steps_wait:
                finish(slot, True)
            elif state.t >= settings.max_steps + settings.num_steps_wait:
                finish(slot, False)
    return [results[i] for i in range(len(episodes))]


def _refill_queues(
    running: dict[int, tuple[int, _Running]],
    source: ActionSource,
    settings: RolloutSettings,
    to_env: Callable[[np.ndarray], np.ndarray],
) -> None:
    """One policy call for every episode past its settling steps whose chunk is used up."""
    asking = [s for _, s in running.values() if s.t >= settings.num_steps_wait and not s.queue]
    if not asking:
        return
    queries = [_query(s.observation, s.instruction, settings) for s in asking]
    chunks = source.act(queries, settings.unnorm_key)
    valid = getattr(chunks, "valid", None)  # a `Chunks` answer says which chunks decoded
    for i, (state, chunk) in enumerate(zip(asking, chunks, strict=True)):
        state.queue.extend(to_env(chunk[: settings.open_loop_steps]))
        if valid is not None:
            state.invalid_chunks = (state.invalid_chunks or 0) + (not valid[i])


def _next_action(state: _Running, settings: RolloutSettings, dummy: np.ndarray) -> np.ndarray:
    if settings.keep_frames and state.t >= settings.num_steps_wait:
        state.frames.append(state.observation.views[0])
    if state.t < settings.num_steps_wait:
        return dummy.copy()
    return state.queue.popleft()
