"""The episode loop's protocol pinned by behaviour (`prismatic/sim/rollout.py` with the settings
`prismatic/sim/evaluation.py` derives): when the first policy action is stepped and on which observation the policy
was asked, how a chunk's actions follow one another, the controller's conversion, where an episode ends, and which
image the policy is handed, for LIBERO's and Meta-World's benchmark objects.

A fake pool stands in for the simulators (the loop's duck-typed interface: `num_envs`, `benchmark`, `reset`, `step`,
`language`): each observation says which step it comes from (its proprio is `[steps taken, episode, 0, ...]`, its
frames differ at every step), and a fake action source records every query and answers known chunks. No simulator,
no model: the expected values are OpenVLA's and LeRobot's loops restated here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch  # noqa: F401  (torch before TensorFlow in every process)

from prismatic.sim.actions import PolicyFacts, PolicyQuery
from prismatic.sim.benchmark import SimObservation
from prismatic.sim.evaluation import EvalSimConfig, rollout_settings
from prismatic.sim.images import center_crop, resize_image
from prismatic.sim.libero.benchmark import BENCHMARK as LIBERO
from prismatic.sim.metaworld.benchmark import BENCHMARK as METAWORLD
from prismatic.sim.pool import EpisodeSpec, StepOutcome
from prismatic.sim.rollout import run_episodes

# OpenVLA's run_libero_eval.py: `num_steps_wait = 10` no-op steps, each `get_libero_dummy_action()`
# = [0, 0, 0, 0, 0, 0, -1] (no motion, gripper open in LIBERO's convention).
OPENVLA_NUM_STEPS_WAIT = 10
OPENVLA_DUMMY_ACTION = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]
FRAME_SIDE = 32  # the fake renders' size; the policy's images are IMAGE_SIZE (a real resize)
IMAGE_SIZE = (24, 24)
# Policy gripper values of a chunk's actions and what LIBERO's controller must get for each: OpenVLA's
# normalize_gripper_action(binarize=True) (2g - 1, then sign) and invert_gripper_action (times -1).
POLICY_GRIPPER = [1.0, 0.0, 0.7, 0.2, 0.5, 0.9, 0.1, 1.0]
LIBERO_GRIPPER = [-1.0, 1.0, -1.0, 1.0, 0.0, -1.0, 1.0, -1.0]


def frame(episode: int, steps: int, view: int) -> np.ndarray:
    """The fake render of `view` after `steps` steps of `episode`: a gradient (JPEG keeps it) whose blue channel and
    noise change with every step, episode and view."""
    rng = np.random.default_rng(10_000 * view + 100 * episode + steps)
    y, x = np.mgrid[0:FRAME_SIDE, 0:FRAME_SIDE]
    base = np.stack([x * 8, y * 8, np.full_like(x, (37 * steps + 90 * episode) % 200)], axis=-1)
    return np.clip(base + rng.integers(0, 30, base.shape), 0, 255).astype(np.uint8)


def observation(benchmark, episode: int, steps: int) -> SimObservation:
    proprio = np.zeros(benchmark.proprio_dim, np.float32)
    proprio[:2] = (steps, episode)
    views = tuple(frame(episode, steps, v) for v in range(benchmark.num_views))
    return SimObservation(views, proprio, np.array([steps, episode, 0.0]))


@dataclass
class Stepped:
    episode: int
    steps_before: int  # the episode's steps taken before this one
    action: np.ndarray


class FakePool:
    """`EnvPool`'s interface over fake simulators; `success_at[episode] = n`: the step that brings the episode to n
    steps reports success; `error_at[episode] = n`: that step raises in the simulator."""

    def __init__(self, benchmark, num_envs: int = 1, success_at=None, error_at=None) -> None:
        self.benchmark, self.num_envs = benchmark, num_envs
        self.success_at, self.error_at = success_at or {}, error_at or {}
        self.episode: dict[int, int] = {}  # slot -> episode running there
        self.steps: dict[int, int] = {}  # episode -> steps taken
        self.stepped: list[Stepped] = []
        self.resets: list[int] = []

    def reset(self, specs):
        out = {}
        for slot, spec in specs.items():
            self.episode[slot] = spec.episode_idx
            self.steps[spec.episode_idx] = 0
            self.resets.append(spec.episode_idx)
            out[slot] = observation(self.benchmark, spec.episode_idx, 0)
        return out

    def step(self, actions):
        out = {}
        for slot, action in actions.items():
            episode = self.episode[slot]
            assert np.asarray(action).shape == (self.benchmark.action_dim,)
            self.stepped.append(Stepped(episode, self.steps[episode], np.array(action, dtype=np.float64)))
            self.steps[episode] += 1
            n = self.steps[episode]
            if self.error_at.get(episode) == n:
                out[slot] = StepOutcome(None, False, "RuntimeError: the fake simulator broke")
                continue
            out[slot] = StepOutcome(
                observation(self.benchmark, episode, n), self.success_at.get(episode) == n
            )
        return out

    def language(self, suite: str, task_id: int) -> str:
        return f"do task {task_id} of {suite}"

    def actions_of(self, episode: int) -> list[Stepped]:
        return [s for s in self.stepped if s.episode == episode]


@dataclass
class Asked:
    query: PolicyQuery
    unnorm_key: str
    steps_before: dict[int, int]  # every episode's steps taken when the policy was asked


@dataclass
class FakeSource:
    """Answers chunk number q (counted over every query) with rows `chunk_row(q, k)`; records every query."""

    facts: PolicyFacts
    pool: FakePool
    asked: list[Asked] = field(default_factory=list)

    def act(self, queries, unnorm_key):
        chunks = []
        for query in queries:
            q = len(self.asked)
            self.asked.append(Asked(query, unnorm_key, dict(self.pool.steps)))
            chunks.append(
                np.stack([chunk_row(self.pool.benchmark, q, k) for k in range(self.facts.chunk_size)])
            )
        return chunks

    def close(self) -> None:
        pass


def chunk_row(benchmark, q: int, k: int) -> np.ndarray:
    """Action k of chunk q, in the policy's convention: it says which chunk and which row it is."""
    if benchmark.action_dim == 7:  # LIBERO: the gripper in [0, 1], 1 = open
        return np.array([q, k, 0.25, -0.5, 0.125, 0.0, POLICY_GRIPPER[k % 8]])
    return np.array([0.1 * q, 0.01 * k, 1.5, -2.0])  # Meta-World: two values outside the controller's [-1, 1]


def facts(
    benchmark,
    chunk_size: int,
    proprio: bool,
    num_images: int = 1,
    image_aug: bool | None = True,
) -> PolicyFacts:
    key = "libero_spatial_no_noops" if benchmark is LIBERO else "metaworld_mt10"
    return PolicyFacts(
        image_size=IMAGE_SIZE,
        num_images=num_images,
        proprio_dim=benchmark.proprio_dim if proprio else 0,
        chunk_size=chunk_size,
        unnorm_keys=(key,),
        trained_with_image_aug=image_aug,
        action_dims={key: benchmark.action_dim},
    )


def run(benchmark, policy: PolicyFacts, num_episodes: int = 1, num_envs: int = 1, **pool_kwargs):
    """The settings `rollout_settings` derives (max_steps 20), episodes 0..n-1 of the suite's task 0."""
    suite = "libero_spatial" if benchmark is LIBERO else "MT10"
    cfg = EvalSimConfig(
        benchmark=benchmark.name, policy_url="http://127.0.0.1:9", task_suite=suite, max_steps=20
    )
    settings = rollout_settings(cfg, benchmark, policy)
    pool = FakePool(benchmark, num_envs, **pool_kwargs)
    source = FakeSource(policy, pool)
    episodes = [EpisodeSpec(suite, 0, i) for i in range(num_episodes)]
    return run_episodes(pool, episodes, source, settings), pool, source


def prepared(image: np.ndarray, crop: bool) -> np.ndarray:
    """OpenVLA's steps, composed here: resize through JPEG + Lanczos, then the centre crop when asked."""
    resized = resize_image(image, IMAGE_SIZE)
    return center_crop(resized) if crop else resized


def assert_asked_on(asked: Asked, episode: int, steps: int, crop: bool = True) -> None:
    """The query was made on the observation `episode` returned after `steps` steps (its state and its frames)."""
    if asked.query.proprio is not None:
        assert asked.query.proprio[:2].tolist() == [steps, episode]
    for view, image in enumerate(asked.query.views):
        assert np.array_equal(image, prepared(frame(episode, steps, view), crop)), (episode, steps, view)


# --- LIBERO ------------------------------------------------------------------------------------------------------


def test_libero_chunk_head_first_query_on_the_tenth_no_op_observation() -> None:
    (result,), pool, source = run(LIBERO, facts(LIBERO, chunk_size=8, proprio=True, num_images=2))
    stepped = pool.actions_of(0)
    # Exactly 10 no-op steps first, each OpenVLA's dummy action; then the policy's.
    assert [s.action.tolist() for s in stepped[:OPENVLA_NUM_STEPS_WAIT]] == [OPENVLA_DUMMY_ACTION] * 10
    assert stepped[OPENVLA_NUM_STEPS_WAIT].action.tolist() != OPENVLA_DUMMY_ACTION
    # The first query: after the 10th no-op, on the observation that step returned (not the reset's, not the 11th's).
    assert source.asked[0].steps_before == {0: 10}
    assert_asked_on(source.asked[0], episode=0, steps=10)
    assert len(source.asked[0].query.views) == 2  # agent view and wrist, both from step 10
    # Chunk q's action k is stepped at t = 10 + 8q + k, with LIBERO's gripper convention.
    for s in stepped[10:]:
        q, k = divmod(s.steps_before - 10, 8)
        expected = [q, k, 0.25, -0.5, 0.125, 0.0, LIBERO_GRIPPER[k]]
        assert s.action.tolist() == expected, s
    # The next query after the chunk's 8th action, on the latest observation; 20 policy steps: 3 queries.
    assert [a.steps_before[0] for a in source.asked] == [10, 18, 26]
    for asked, steps in zip(source.asked, [10, 18, 26], strict=True):
        assert_asked_on(asked, episode=0, steps=steps)
        assert asked.unnorm_key == "libero_spatial_no_noops"
    # The episode ends at max_steps + the no-ops, as a failure here.
    assert len(stepped) == 30 and result.steps == 30 and not result.success and result.error is None
    assert result.final_eef_pos == (30.0, 0.0, 0.0)  # from the last observation


def test_libero_tokens_head_asks_before_every_step_on_the_latest_observation() -> None:
    (result,), pool, source = run(LIBERO, facts(LIBERO, chunk_size=1, proprio=False))
    stepped = pool.actions_of(0)
    assert [s.action.tolist() for s in stepped[:10]] == [OPENVLA_DUMMY_ACTION] * 10
    assert [a.steps_before[0] for a in source.asked] == list(range(10, 30))
    for asked in source.asked[:3] + source.asked[-1:]:
        assert asked.query.proprio is None and len(asked.query.views) == 1
        assert_asked_on(asked, episode=0, steps=asked.steps_before[0])
    # Query q's only action is stepped right after it, at t = 10 + q.
    assert [s.action.tolist() for s in stepped[10:]] == [
        [q, 0, 0.25, -0.5, 0.125, 0.0, LIBERO_GRIPPER[0]] for q in range(20)
    ]
    assert result.steps == 30 and len(stepped) == 30


def test_libero_episode_ends_at_the_first_success() -> None:
    """Success at the step that makes 13 steps (the 3rd policy action): nothing more is stepped or asked."""
    (result,), pool, source = run(LIBERO, facts(LIBERO, chunk_size=8, proprio=True), success_at={0: 13})
    assert result.success and result.steps == 13 and len(pool.actions_of(0)) == 13
    assert len(source.asked) == 1


def test_libero_success_during_the_no_ops_is_not_the_policys() -> None:
    """OpenVLA's loop steps the no-ops and `continue`s without looking at `done`: a scene that reads as solved while
    objects settle is not a success of the policy, which is asked at step 10 as always (here the task reads as
    solved after 5 steps, then never again)."""
    (result,), pool, source = run(LIBERO, facts(LIBERO, chunk_size=8, proprio=True), success_at={0: 5})
    assert not result.success and result.steps == 30 and len(pool.actions_of(0)) == 30
    assert [a.steps_before[0] for a in source.asked] == [10, 18, 26]


def test_libero_simulator_error_ends_the_episode_as_a_failure() -> None:
    (result,), pool, _ = run(LIBERO, facts(LIBERO, chunk_size=8, proprio=True), error_at={0: 12})
    assert not result.success and result.steps == 12 and "fake simulator broke" in result.error
    assert len(pool.actions_of(0)) == 12


def test_every_episode_settles_on_its_own_when_a_freed_simulator_takes_the_next() -> None:
    """Two simulators, three episodes: episode 0 succeeds after 12 steps, so episode 2 starts on its simulator
    while episode 1 is past its no-ops; episode 2 still gets its 10 no-ops and its first query on its own step 10."""
    results, pool, source = run(
        LIBERO, facts(LIBERO, chunk_size=8, proprio=True), num_episodes=3, num_envs=2, success_at={0: 12}
    )
    assert pool.resets == [0, 1, 2]
    assert [r.steps for r in results] == [12, 30, 30]
    for episode in (1, 2):
        stepped = pool.actions_of(episode)
        assert [s.action.tolist() for s in stepped[:10]] == [OPENVLA_DUMMY_ACTION] * 10
        assert stepped[10].action[1] == 0  # the first action of a chunk
    # Every query is made on its own episode's latest observation.
    firsts = {}
    for asked in source.asked:
        episode = int(asked.query.proprio[1])
        assert_asked_on(asked, episode, asked.steps_before[episode])
        firsts.setdefault(episode, asked.steps_before[episode])
    assert firsts == {0: 10, 1: 10, 2: 10}


# --- Meta-World --------------------------------------------------------------------------------------------------


def test_metaworld_first_query_on_the_reset_observation_and_first_action_is_step_0() -> None:
    """LeRobot's loop: `observation = env.reset()`, then `policy.select_action(observation)` and `env.step` from
    step 0; no settling steps."""
    (result,), pool, source = run(METAWORLD, facts(METAWORLD, chunk_size=4, proprio=True))
    stepped = pool.actions_of(0)
    assert source.asked[0].steps_before == {0: 0}
    assert_asked_on(source.asked[0], episode=0, steps=0)
    assert source.asked[0].query.proprio.tolist() == [0.0, 0.0, 0.0, 0.0]  # the 4-d state of the reset
    assert source.asked[0].unnorm_key == "metaworld_mt10"
    # Step t runs action t % 4 of chunk t // 4, clipped to the controller's [-1, 1].
    assert [s.action.tolist() for s in stepped] == [
        [0.1 * (t // 4), 0.01 * (t % 4), 1.0, -1.0] for t in range(20)
    ]
    assert [a.steps_before[0] for a in source.asked] == [0, 4, 8, 12, 16]
    for asked in source.asked:
        assert_asked_on(asked, episode=0, steps=asked.steps_before[0])
    assert result.steps == 20 and not result.success


def test_metaworld_episode_ends_at_the_first_success() -> None:
    (result,), pool, _ = run(METAWORLD, facts(METAWORLD, chunk_size=1, proprio=False), success_at={0: 1})
    assert result.success and result.steps == 1 and len(pool.actions_of(0)) == 1


# --- The image the policy is handed, for every checkpoint kind ---------------------------------------------------


@pytest.mark.parametrize(
    ("image_aug", "crop"),
    [
        (True, True),  # a run folder trained with image augmentation
        (False, False),  # one trained without it
        (
            None,
            True,
        ),  # no record (an HF export, a Hub id, an older server): OpenVLA's default, center_crop=True
    ],
    ids=["run-aug", "run-no-aug", "no-record"],
)
@pytest.mark.parametrize("benchmark", [LIBERO, METAWORLD], ids=["libero", "metaworld"])
def test_policy_is_handed_the_centre_crop_when_the_run_augmented_or_does_not_say(
    benchmark, image_aug: bool | None, crop: bool
) -> None:
    (result,), _, source = run(benchmark, facts(benchmark, chunk_size=20, proprio=False, image_aug=image_aug))
    (asked,) = source.asked
    first = OPENVLA_NUM_STEPS_WAIT if benchmark is LIBERO else 0
    cropped = center_crop(resize_image(frame(0, first, 0), IMAGE_SIZE))
    resized = resize_image(frame(0, first, 0), IMAGE_SIZE)
    assert not np.array_equal(cropped, resized)
    assert np.array_equal(asked.query.views[0], cropped if crop else resized)
