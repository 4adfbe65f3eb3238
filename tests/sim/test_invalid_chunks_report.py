"""Chunks that did not decode (FAST's zeros) reach the closed-loop report: a source that says which of its chunks
are stand-ins (`Chunks.valid`) has them counted per episode, per task and overall in `results.json`'s rows and the
printed table; a source that says nothing leaves the key out.

Fake simulators and a fake source; the expected counts follow from the hand-written invalid set below.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch  # noqa: F401  (torch before TensorFlow in every process)

from prismatic.sim.actions import Chunks, InProcessSource
from prismatic.sim.benchmark import SimObservation
from prismatic.sim.metaworld.benchmark import BENCHMARK as METAWORLD
from prismatic.sim.pool import EpisodeSpec, StepOutcome
from prismatic.sim.report import format_table, summarize
from prismatic.sim.rollout import RolloutSettings, run_episodes

CHUNK, MAX_STEPS = 2, 4  # every episode asks twice: at steps 0 and 2 (none succeeds)
# (task, episode, step) of the queries answered with a stand-in chunk.
INVALID = {(0, 1, 0), (0, 1, 2), (1, 0, 2)}


def observation(task: int, episode: int, steps: int) -> SimObservation:
    """The proprio carries (task, episode, steps), so the source knows who asks."""
    proprio = np.array([task, episode, steps, 0.0], np.float32)
    return SimObservation((np.zeros((16, 16, 3), np.uint8),), proprio, np.zeros(3))


class Pool:
    """`EnvPool`'s interface over simulators that never succeed."""

    benchmark = METAWORLD

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.running: dict[int, list] = {}  # slot -> [task, episode, steps]

    def reset(self, specs):
        for slot, spec in specs.items():
            self.running[slot] = [spec.task_id, spec.episode_idx, 0]
        return {slot: observation(*self.running[slot]) for slot in specs}

    def step(self, actions):
        for slot in actions:
            self.running[slot][2] += 1
        return {slot: StepOutcome(observation(*self.running[slot]), False) for slot in actions}

    def language(self, suite: str, task_id: int) -> str:
        return f"task {task_id}"


class Source:
    """Zeros for every query; `marks`: answer a `Chunks` saying which are stand-ins (`INVALID`), else a list."""

    def __init__(self, marks: bool) -> None:
        self.marks, self.asked = marks, []

    def act(self, queries, unnorm_key):
        who = [tuple(int(x) for x in q.proprio[:3]) for q in queries]
        self.asked += who
        chunks = [np.zeros((CHUNK, METAWORLD.action_dim)) for _ in queries]
        return Chunks(chunks, [w not in INVALID for w in who]) if self.marks else chunks

    def close(self) -> None:
        pass


def run(source: Source):
    settings = RolloutSettings(
        unnorm_key="metaworld_mt10",
        image_size=(8, 8),
        center_crop=False,
        use_proprio=True,
        open_loop_steps=CHUNK,
        max_steps=MAX_STEPS,
    )
    episodes = [EpisodeSpec("MT10", 0, 0), EpisodeSpec("MT10", 0, 1), EpisodeSpec("MT10", 1, 0)]
    return run_episodes(Pool(num_envs=2), episodes, source, settings)


def test_stand_in_chunks_are_counted_per_episode_task_and_overall() -> None:
    source = Source(marks=True)
    summary = summarize(run(source))
    assert sorted(source.asked) == sorted(
        (task, episode, step) for task, episode in [(0, 0), (0, 1), (1, 0)] for step in (0, 2)
    )
    assert [e["invalid_chunks"] for e in summary["episodes"]] == [0, 2, 1]
    assert [t["invalid_chunks"] for t in summary["tasks"]] == [2, 1]
    assert summary["overall"]["invalid_chunks"] == 3
    lines = format_table(summary).splitlines()
    assert "invalid" in lines[0].split()
    assert lines[1].split()[6] == "2" and lines[2].split()[6] == "1" and lines[3].split()[-1] == "3"


def test_a_source_that_says_nothing_leaves_the_count_out() -> None:
    summary = summarize(run(Source(marks=False)))
    assert "invalid_chunks" not in summary["overall"]
    assert all("invalid_chunks" not in row for row in [*summary["tasks"], *summary["episodes"]])
    assert "invalid" not in format_table(summary).splitlines()[0].split()


def test_the_in_process_source_passes_the_policy_s_validity_on() -> None:
    spec = SimpleNamespace(num_images=1, proprio_dim=0, chunk_size=CHUNK)
    answers = {"valid": np.array([True, False]), "actions": np.zeros((2, CHUNK, 4))}

    class Policy:
        action_spec, image_size, unnorm_keys = spec, (8, 8), ["metaworld_mt10"]

        def action_dim(self, key):
            return 4

        def decode_batch(self, images, instructions, unnorm_key=None, *, proprio=None):
            return SimpleNamespace(**answers)

    source = InProcessSource(Policy(), trained_with_image_aug=False)
    query = SimpleNamespace(views=(np.zeros((8, 8, 3), np.uint8),), instruction="x", proprio=None)
    chunks = source.act([query, query], "metaworld_mt10")
    assert chunks.valid == [True, False] and len(chunks) == 2
    answers["valid"] = None  # a head whose answers always decode: a plain list
    assert not hasattr(source.act([query, query], "metaworld_mt10"), "valid")
