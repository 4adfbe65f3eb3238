"""Toy RLDS datasets, written by real `tfds` builders, for CPU presets and tests.

Two datasets with different raw layouts, so the standardisation path is exercised:

- `toy_pick_place`: steps/observation/{image (jpeg 64x64x3), wrist_image (jpeg 64x64x3), state float32[8]},
  steps/action float32[7] (gripper already absolute, 1 = open), steps/language_instruction; 20 steps per episode.
- `toy_push`: steps/observation/{agentview_rgb (jpeg 64x64x3), robot_state float32[7]} (no wrist camera, so a
  mixture of both exercises the padding of missing views), steps/action as a dict
  {world_vector[3], rotation_delta[3], gripper_closedness_action[1] in [-1, 1], +1 = close}; the instruction is
  stored once per episode in episode_metadata/instruction; 16 steps per episode.

Both have the usual RLDS step fields (is_first / is_last / is_terminal / reward / discount), episode_metadata/
file_path, and `train` (24 episodes) and `val` (4 episodes) splits of 4 files each. The data is learnable by a tiny model: the
instruction names one of four tasks, the image background colour encodes the task and a white square's position
encodes the timestep (the wrist camera: the complementary colour, with a black bar whose height encodes the
timestep, in the left half while the gripper is open, the right half while closed), and each action is a smooth
function of (task, timestep) plus small noise. Everything is drawn from `seed`, so the same seed gives
byte-identical files. Build with `build_toy_datasets(root)` or
`python vla_scripts/build_toy_dataset.py --data_root_dir DIR`.

LIBERO-shaped toys (`build_libero_toy_datasets`, or the script's `--libero` flag): one dataset per LIBERO suite,
named as OpenVLA's real one (`libero_spatial_no_noops`, ...) so a run's statistics key is the one a LIBERO
evaluation looks up, in the layout of OpenVLA's `modified_libero_rlds`: steps/observation/{image, wrist_image
(jpeg 256x256x3), state float32[8] (eef position, axis-angle, 2 gripper finger positions), joint_state
float32[7]}, steps/action float32[7] (gripper last, -1 = open, +1 = close), steps/language_instruction, and a
`train` split only (the pipeline holds out train[95%:], as for the real data). The instructions are those of each
suite's tasks 0-3; the pictures follow the same learnable scheme as above.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.vla.datasets.rlds.configs import LIBERO_SUITES
from prismatic.vla.datasets.rlds.discovery import import_tfds
from prismatic.vla.datasets.rlds.writer import (
    rlds_episode_features,
    rlds_step_features,
    rlds_step_flags,
    write_rlds_dataset,
)

TOY_VERSION = "1.0.0"
IMAGE_SIZE = 64
NUM_EPISODES = {"train": 24, "val": 4}
NUM_SHARDS = 4  # per split: more than one file, so per-epoch file shuffling and rank slicing are exercised
ACTION_NOISE_STD = 1e-4  # ~0.1-0.5 action-token bins after normalisation: tokens stay nearly deterministic


@dataclass(frozen=True)
class ToyTask:
    instruction: str
    color: tuple[int, int, int]  # image background, RGB


@dataclass(frozen=True)
class ToySpec:
    name: str
    num_steps: int
    tasks: tuple[ToyTask, ...]


TOY_SPECS: dict[str, ToySpec] = {
    spec.name: spec
    for spec in (
        ToySpec(
            "toy_pick_place",
            num_steps=20,
            tasks=(
                ToyTask("pick up the red block", (200, 40, 40)),
                ToyTask("pick up the blue cup", (40, 60, 200)),
                ToyTask("put the green bowl on the plate", (40, 170, 60)),
                ToyTask("lift the sponge", (210, 190, 40)),
            ),
        ),
        ToySpec(
            "toy_push",
            num_steps=16,
            tasks=(
                ToyTask("push the red block to the left", (220, 90, 90)),
                ToyTask("push the blue cup to the right", (70, 90, 220)),
                ToyTask("push the can to the left", (150, 150, 150)),
                ToyTask("push the green bowl to the right", (70, 200, 120)),
            ),
        ),
    )
}
TOY_DATASET_NAMES = tuple(TOY_SPECS)


# === Episode generation (pure NumPy; what the builders write) ===


def _task_params(name: str, task_index: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed per-task amplitudes and phases of the 6 arm action dims (independent of the build seed)."""
    rng = np.random.default_rng([zlib.crc32(name.encode()), task_index])
    amplitude = rng.uniform(0.02, 0.05, size=6) * rng.choice([-1.0, 1.0], size=6)
    phase = rng.uniform(0, np.pi, size=6)
    return amplitude, phase


def _render(color: np.ndarray, t: int, num_steps: int, row: int) -> np.ndarray:
    """Background colour (task) + a white square whose x position encodes the timestep."""
    image = np.empty((IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    image[:] = color
    x = round(4 + t * (IMAGE_SIZE - 14) / (num_steps - 1))
    image[row : row + 10, x : x + 10] = 255
    return image


def _render_wrist(color: np.ndarray, t: int, num_steps: int, gripper_open: float) -> np.ndarray:
    """The wrist camera: complementary background, a black bar whose height encodes the timestep, on the left
    half while the gripper is open and the right half while it is closed (unlike any primary image)."""
    image = np.empty((IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    image[:] = 255 - color
    height = round(6 + t * (IMAGE_SIZE - 12) / (num_steps - 1))
    left = 4 if gripper_open else IMAGE_SIZE // 2 + 4
    image[IMAGE_SIZE - height :, left : left + IMAGE_SIZE // 2 - 8] = 0
    return image


def generate_toy_episode(name: str, split: str, index: int, seed: int = 0) -> dict[str, Any]:
    """One raw episode of toy dataset `name`, in the exact layout its builder writes (steps as a list).

    Task = index % 4, so every split covers all tasks. Deterministic in (name, split, index, seed).
    """
    spec = TOY_SPECS[name]
    task_index = index % len(spec.tasks)
    task = spec.tasks[task_index]
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), zlib.crc32(split.encode()), index])
    num_steps = spec.num_steps
    amplitude, phase = _task_params(name, task_index)

    t = np.arange(num_steps)
    angle = np.pi * t[:, None] / (num_steps - 1) + phase[None, :]
    arm = np.concatenate(
        [amplitude[:3] * np.sin(angle[:, :3]), 0.3 * amplitude[3:] * np.cos(angle[:, 3:])], 1
    )
    arm = (arm + rng.normal(0.0, ACTION_NOISE_STD, size=arm.shape)).astype(np.float32)
    # Gripper: open, closed for a task-dependent stretch, then open again (1 = open).
    close_from, close_until = 3 + task_index, 3 + task_index + num_steps // 2
    gripper_open = np.where((t >= close_from) & (t < close_until), 0.0, 1.0).astype(np.float32)
    # State before each action: exclusive cumulative sum of the arm deltas from a jittered start pose.
    start = rng.uniform(-0.1, 0.1, size=6).astype(np.float32)
    pose = (start + np.concatenate([np.zeros((1, 6)), np.cumsum(arm, 0)[:-1]], 0)).astype(np.float32)
    gripper_state = np.concatenate([[1.0], gripper_open[:-1]]).astype(np.float32)
    color = np.clip(np.asarray(task.color) + rng.integers(-10, 11, size=3), 0, 255).astype(np.uint8)
    images = [_render(color, i, num_steps, row=8 + 12 * task_index) for i in range(num_steps)]

    def rlds_fields(i: int) -> dict[str, Any]:
        return rlds_step_flags(i, num_steps)

    file_path = f"toy://{name}/{split}/{index:04d}"
    if name == "toy_pick_place":
        state = np.concatenate([pose, np.zeros((num_steps, 1), np.float32), gripper_state[:, None]], 1)
        wrist = [_render_wrist(color, i, num_steps, gripper_state[i]) for i in range(num_steps)]
        steps = [
            {
                "observation": {"image": images[i], "wrist_image": wrist[i], "state": state[i]},
                "action": np.concatenate([arm[i], gripper_open[i : i + 1]]).astype(np.float32),
                "language_instruction": task.instruction,
                **rlds_fields(i),
            }
            for i in range(num_steps)
        ]
        return {"steps": steps, "episode_metadata": {"file_path": file_path}}
    if name == "toy_push":
        robot_state = np.concatenate([pose, gripper_state[:, None]], 1).astype(np.float32)
        closedness = (1.0 - 2.0 * gripper_open).astype(np.float32)  # +1 = close, -1 = open
        steps = [
            {
                "observation": {"agentview_rgb": images[i], "robot_state": robot_state[i]},
                "action": {
                    "world_vector": arm[i, :3],
                    "rotation_delta": arm[i, 3:],
                    "gripper_closedness_action": closedness[i : i + 1],
                },
                **rlds_fields(i),
            }
            for i in range(num_steps)
        ]
        return {"steps": steps, "episode_metadata": {"file_path": file_path, "instruction": task.instruction}}
    raise KeyError(name)


# === tfds builders ===


def _features(tfds: Any, name: str) -> Any:
    """The tfds feature spec of toy dataset `name`."""
    f = tfds.features

    def image() -> Any:
        return f.Image(shape=(IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8, encoding_format="jpeg")

    rlds_fields = rlds_step_features(f)
    if name == "toy_pick_place":
        step = {
            "observation": f.FeaturesDict(
                {"image": image(), "wrist_image": image(), "state": f.Tensor(shape=(8,), dtype=np.float32)}
            ),
            "action": f.Tensor(shape=(7,), dtype=np.float32),
            "language_instruction": f.Text(),
            **rlds_fields,
        }
        metadata = {"file_path": f.Text()}
    else:
        step = {
            "observation": f.FeaturesDict(
                {"agentview_rgb": image(), "robot_state": f.Tensor(shape=(7,), dtype=np.float32)}
            ),
            "action": f.FeaturesDict(
                {
                    "world_vector": f.Tensor(shape=(3,), dtype=np.float32),
                    "rotation_delta": f.Tensor(shape=(3,), dtype=np.float32),
                    "gripper_closedness_action": f.Tensor(shape=(1,), dtype=np.float32),
                }
            ),
            **rlds_fields,
        }
        metadata = {"file_path": f.Text(), "instruction": f.Text()}
    return rlds_episode_features(f, step, metadata)


@functools.cache
def _builder_classes() -> dict[str, type]:
    """Define the builder classes on first use (tfds needs TensorFlow, which must not load at import time).

    `skip_registration=True` keeps them out of tfds's global name registry: no side effects, no clashes.
    """
    tfds = import_tfds()

    class ToyRLDSBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version(TOY_VERSION)
        RELEASE_NOTES = {TOY_VERSION: "Initial release."}
        # Nothing is downloaded, so there is no checksums file to locate beside the code (tfds's look-up of
        # the code's folder also needs `importlib_resources`, which not every environment has).
        code_path = None

        def __init__(self, *, seed: int = 0, **kwargs: Any) -> None:
            self.seed = seed
            super().__init__(**kwargs)

        def _info(self) -> Any:
            return tfds.core.DatasetInfo(
                builder=self,
                description=f"Toy RLDS dataset {self.name} (prismatic/vla/datasets/rlds/toy.py).",
                features=_features(tfds, self.name),
            )

        def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
            return {split: self._generate_examples(split) for split in NUM_EPISODES}

        def _generate_examples(self, split: str) -> Any:
            for index in range(NUM_EPISODES[split]):
                yield f"{split}_{index:04d}", generate_toy_episode(self.name, split, index, self.seed)

    classes = {}
    for name in TOY_DATASET_NAMES:
        classes[name] = type(
            name, (ToyRLDSBuilder,), {"name": name, "__module__": __name__}, skip_registration=True
        )
    return classes


def toy_dataset_dir(data_root_dir: Path, name: str) -> Path:
    """Where toy dataset `name` lives: `<data_root_dir>/<name>/<version>`."""
    return Path(data_root_dir) / name / TOY_VERSION


def build_toy_datasets(data_root_dir: Path, seed: int = 0) -> list[str]:
    """Build every toy dataset missing under `data_root_dir` (idempotent); return all toy dataset names.

    A dataset counts as present when `<data_root_dir>/<name>/<version>/dataset_info.json` exists; tfds writes
    into a temporary folder and renames it when done, so an interrupted build leaves nothing half-written.
    """
    tfds = import_tfds()

    data_root_dir = Path(data_root_dir)
    data_root_dir.mkdir(parents=True, exist_ok=True)
    for name, cls in _builder_classes().items():
        if (toy_dataset_dir(data_root_dir, name) / "dataset_info.json").exists():
            continue
        # tfds would otherwise leave an empty `downloads/` folder beside the datasets.
        download_dir = Path(tempfile.mkdtemp(prefix="toy_rlds_downloads_"))
        try:
            builder = cls(data_dir=str(data_root_dir), seed=seed)
            builder.download_and_prepare(
                download_dir=str(download_dir),
                download_config=tfds.download.DownloadConfig(try_download_gcs=False, num_shards=NUM_SHARDS),
            )
        finally:
            shutil.rmtree(download_dir, ignore_errors=True)
    return list(TOY_DATASET_NAMES)


# === LIBERO-shaped toys: OpenVLA's LIBERO RLDS layout and names, tiny contents ===

LIBERO_TOY_IMAGE_SIZE = 256  # LIBERO's render size; the pipeline resizes to the model's input
LIBERO_TOY_NUM_STEPS = 24  # longer than OpenVLA-OFT's 8-action chunk
LIBERO_TOY_NUM_EPISODES = 20  # train only: train[95%:], what evaluation holds out, is one episode
LIBERO_TOY_NUM_SHARDS = 2
# Tasks 0-3 of each suite in LIBERO's order, as its benchmark names them (the instruction an evaluation sends).
LIBERO_TOY_INSTRUCTIONS: dict[str, tuple[str, ...]] = {
    "spatial": (
        "pick up the black bowl between the plate and the ramekin and place it on the plate",
        "pick up the black bowl next to the ramekin and place it on the plate",
        "pick up the black bowl from table center and place it on the plate",
        "pick up the black bowl on the cookie box and place it on the plate",
    ),
    "object": (
        "pick up the alphabet soup and place it in the basket",
        "pick up the cream cheese and place it in the basket",
        "pick up the salad dressing and place it in the basket",
        "pick up the bbq sauce and place it in the basket",
    ),
    "goal": (
        "open the middle drawer of the cabinet",
        "put the bowl on the stove",
        "put the wine bottle on top of the cabinet",
        "open the top drawer and put the bowl inside",
    ),
    "10": (
        "put both the alphabet soup and the tomato sauce in the basket",
        "put both the cream cheese box and the butter in the basket",
        "turn on the stove and put the moka pot on it",
        "put the black bowl in the bottom drawer of the cabinet and close it",
    ),
}
_LIBERO_TOY_COLORS = ((190, 60, 50), (50, 80, 190), (60, 160, 70), (200, 180, 60))
_GRIPPER_OPEN_QPOS, _GRIPPER_CLOSED_QPOS = 0.039, 0.012  # finger positions (m); the fingers mirror each other


def libero_toy_dataset_name(suite: str) -> str:
    """The dataset (and statistics key) of LIBERO suite `suite` ("spatial", "object", "goal", "10")."""
    if suite not in LIBERO_SUITES:
        raise KeyError(f"Unknown LIBERO suite '{suite}'; valid: {', '.join(LIBERO_SUITES)}.")
    return f"libero_{suite}_no_noops"


def _upscale(image: np.ndarray) -> np.ndarray:
    """A 64x64 toy picture at LIBERO's 256x256 (nearest neighbour)."""
    factor = LIBERO_TOY_IMAGE_SIZE // IMAGE_SIZE
    return image.repeat(factor, axis=0).repeat(factor, axis=1)


def generate_libero_toy_episode(suite: str, index: int, seed: int = 0) -> dict[str, Any]:
    """One raw episode of the LIBERO-shaped toy of `suite`, in the layout its dataset holds (steps as a list).

    Task = index % 4; deterministic in (suite, index, seed). Actions are smooth per-task curves in LIBERO's
    scaled delta range, and the state integrates them, as a LIBERO episode's eef pose follows its actions.
    """
    name = libero_toy_dataset_name(suite)
    instructions = LIBERO_TOY_INSTRUCTIONS[suite]
    task_index = index % len(instructions)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), index])
    num_steps = LIBERO_TOY_NUM_STEPS
    amplitude, phase = _task_params(name, task_index)

    t = np.arange(num_steps)
    angle = np.pi * t[:, None] / (num_steps - 1) + phase[None, :]
    # x10: LIBERO's actions are scaled controller deltas, a few tenths each (the other toys' are metres).
    arm = 10.0 * np.concatenate(
        [amplitude[:3] * np.sin(angle[:, :3]), amplitude[3:] * np.cos(angle[:, 3:])], 1
    )
    arm = (arm + rng.normal(0.0, 10 * ACTION_NOISE_STD, size=arm.shape)).astype(np.float32)
    close_from, close_until = 4 + task_index, 4 + task_index + num_steps // 2
    closing = (t >= close_from) & (t < close_until)
    gripper_action = np.where(closing, 1.0, -1.0).astype(np.float32)  # LIBERO: -1 = open, +1 = close
    # State before each action: eef position (m) and axis-angle (near LIBERO's gripper-down pose) integrating the
    # scaled deltas; the fingers follow the previous gripper command.
    start = np.concatenate([rng.uniform(-0.1, 0.1, size=3), [np.pi, 0.0, 0.0]]).astype(np.float32)
    pose = start + 0.01 * np.concatenate([np.zeros((1, 6)), np.cumsum(arm, 0)[:-1]], 0)
    was_closing = np.concatenate([[False], closing[:-1]])
    finger = np.where(was_closing, _GRIPPER_CLOSED_QPOS, _GRIPPER_OPEN_QPOS)
    state = np.concatenate([pose, finger[:, None], -finger[:, None]], 1).astype(np.float32)
    joints = (rng.uniform(-0.5, 0.5, size=7) + 0.05 * np.sin(angle[:, :1] + np.arange(7))).astype(np.float32)
    color = np.clip(np.asarray(_LIBERO_TOY_COLORS[task_index]) + rng.integers(-10, 11, size=3), 0, 255)
    color = color.astype(np.uint8)
    steps = [
        {
            "observation": {
                "image": _upscale(_render(color, i, num_steps, row=8 + 12 * task_index)),
                "wrist_image": _upscale(_render_wrist(color, i, num_steps, not was_closing[i])),
                "state": state[i],
                "joint_state": joints[i],
            },
            "action": np.concatenate([arm[i], gripper_action[i : i + 1]]).astype(np.float32),
            "language_instruction": instructions[task_index],
            **rlds_step_flags(i, num_steps),
        }
        for i in range(num_steps)
    ]
    return {"steps": steps, "episode_metadata": {"file_path": f"toy://{name}/train/{index:04d}"}}


def libero_toy_features(tfds: Any) -> Any:
    """The tfds feature spec of OpenVLA's LIBERO RLDS datasets (`modified_libero_rlds`)."""
    f = tfds.features
    size = LIBERO_TOY_IMAGE_SIZE

    def image() -> Any:
        return f.Image(shape=(size, size, 3), dtype=np.uint8, encoding_format="jpeg")

    step = {
        "observation": f.FeaturesDict(
            {
                "image": image(),
                "wrist_image": image(),
                "state": f.Tensor(shape=(8,), dtype=np.float32),
                "joint_state": f.Tensor(shape=(7,), dtype=np.float32),
            }
        ),
        "action": f.Tensor(shape=(7,), dtype=np.float32),
        "language_instruction": f.Text(),
        **rlds_step_features(f),
    }
    return rlds_episode_features(f, step)


def build_libero_toy_datasets(
    data_root_dir: Path, suites: tuple[str, ...] = LIBERO_SUITES, seed: int = 0
) -> list[str]:
    """Build the LIBERO-shaped toy of each suite missing under `data_root_dir` (idempotent); return their names.

    Each lands at `<data_root_dir>/libero_<suite>_no_noops/1.0.0/`, where `--data_mix libero_<suite>_no_noops`
    (the LIBERO presets' mixture) reads it. Raises KeyError for a suite outside LIBERO_SUITES.
    """
    names = [libero_toy_dataset_name(suite) for suite in suites]
    for suite, name in zip(suites, names, strict=True):

        def episodes(suite: str = suite) -> Any:
            return (generate_libero_toy_episode(suite, i, seed) for i in range(LIBERO_TOY_NUM_EPISODES))

        write_rlds_dataset(
            Path(data_root_dir),
            name,
            libero_toy_features,
            {"train": episodes},
            version=TOY_VERSION,
            num_shards=LIBERO_TOY_NUM_SHARDS,
            description=f"LIBERO-shaped toy dataset {name} (prismatic/vla/datasets/rlds/toy.py).",
        )
    return names
