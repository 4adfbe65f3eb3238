"""Data details a user relies on, pinned end to end on tiny RLDS datasets written here: RGB order through decode,
resize and the backbone's normalisation; each frame's prompt carrying its own instruction; transition-balanced
mixture sampling; the held-out 5% of a `train`-only dataset never trained on; `--vla.epochs N` runs.

Each raw step's action says where it came from (`[episode, timestep, 0, ...]`, read back as `raw_action`), so
every expectation below is written by hand or recomputed in NumPy, never taken from the code under test.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prismatic.util.constants import IGNORE_INDEX
from prismatic.vla.datasets.stream_spec import StreamSpec

PREFIX = "test_data_details_"
COLOURS, BIG, SMALL, MIX = (f"{PREFIX}{name}" for name in ("colours", "big", "small", "mix"))
NUM_STEPS = 5  # steps per episode of BIG and SMALL

# The colour dataset: one image per episode, 16 x 16 JPEG (as most RLDS data), upsampled to the backbone's 64.
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
# (left half, right half, instruction): mixed case, so the lower-casing shows. RLDS stores the instruction per step
# and OpenVLA prompts each frame with its own step's: the last episode's changes at every step.
COLOUR_EPISODES = (
    (RED, RED, "Pick up the RED block"),
    (GREEN, GREEN, "Open the Green drawer"),
    (BLUE, BLUE, "Push the blue CUP left"),
    (RED, BLUE, ("Wipe the Split Table", "Then fold the Towel", "Finally stack TWO cups")),
)
COLOUR_STEPS, COLOUR_SIZE, MODEL_SIZE = 3, 16, 64

# Mixture: BIG is ten times SMALL's transitions (every split, as OpenVLA counts them) and has weight 1, SMALL 2.5.
BIG_EPISODES = 40  # train split only: its held-out part is the last 5% of train, 2 episodes
SMALL_EPISODES = {"train": 3, "val": 1}
BIG_WEIGHT, SMALL_WEIGHT = 1.0, 2.5

# Mean / std of each backbone's normalisation, by hand (timm's configs): 0.5 for ViT-B/SigLIP, ImageNet for DINOv2.
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
BACKBONES = {"tiny-vit-64px": {None: HALF}, "tiny-dinosiglip-64px": {"dino": IMAGENET, "siglip": HALF}}
JPEG_LEVELS = 8  # uint8 levels JPEG and the resizes may move a colour by, away from edges (measured: 4)


# === Writing the datasets ===


def _features(tfds: Any, image_size: int) -> Any:
    """toy_pick_place's raw layout (so its identity standardisation reads it), at `image_size`."""
    from prismatic.vla.datasets.rlds.writer import rlds_episode_features, rlds_step_features

    f = tfds.features
    step = {
        "observation": f.FeaturesDict(
            {
                "image": f.Image(shape=(image_size, image_size, 3), dtype=np.uint8, encoding_format="jpeg"),
                "state": f.Tensor(shape=(8,), dtype=np.float32),
            }
        ),
        "action": f.Tensor(shape=(7,), dtype=np.float32),
        "language_instruction": f.Text(),
        **rlds_step_features(f),
    }
    return rlds_episode_features(f, step)


def _step_text(instruction: str | tuple[str, ...], t: int) -> str:
    """Step t's instruction: one string for the whole episode, or one per step."""
    return instruction if isinstance(instruction, str) else instruction[t]


def _episode(
    index: int, num_steps: int, image: np.ndarray, instruction: str | tuple[str, ...]
) -> dict[str, Any]:
    """One episode whose action at step t is `[index, t, 0, 0, 0, 0, 1]`: it names the episode and the step."""
    from prismatic.vla.datasets.rlds.writer import rlds_step_flags

    steps = [
        {
            "observation": {"image": image, "state": np.zeros(8, np.float32)},
            "action": np.array([index, t, 0, 0, 0, 0, 1], np.float32),
            "language_instruction": _step_text(instruction, t),
            **rlds_step_flags(t, num_steps),
        }
        for t in range(num_steps)
    ]
    return {"steps": steps, "episode_metadata": {"file_path": f"episode_{index}"}}


def _colour_image(left: tuple[int, int, int], right: tuple[int, int, int]) -> np.ndarray:
    image = np.empty((COLOUR_SIZE, COLOUR_SIZE, 3), np.uint8)
    image[:, : COLOUR_SIZE // 2], image[:, COLOUR_SIZE // 2 :] = left, right
    return image


def _grey(index: int) -> np.ndarray:
    return np.full((8, 8, 3), 10 + index, np.uint8)


def _write(root: Path, name: str, image_size: int, splits: dict[str, list[dict[str, Any]]]) -> None:
    from prismatic.vla.datasets.rlds.writer import write_rlds_dataset

    def make_features(tfds: Any) -> Any:
        return _features(tfds, image_size)

    episodes = {split: (lambda eps=eps: eps) for split, eps in splits.items()}
    write_rlds_dataset(root, name, make_features, episodes)


def _config(name: str) -> Any:
    from prismatic.vla.datasets.rlds.configs import ActionEncoding, RLDSDatasetConfig, StateEncoding

    return RLDSDatasetConfig(
        name=name,
        image_obs_keys={"primary": "image", "secondary": None, "wrist": None},
        state_obs_keys=("state",),
        state_encoding=StateEncoding.POS_EULER,
        action_encoding=ActionEncoding.EEF_POS,
        standardize_fn="toy_pick_place",
    )


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """COLOURS (train + val), BIG (train only), SMALL (train + val) and the mixture MIX, registered as a user's
    `--plugins` file would, and unregistered afterwards."""
    from prismatic.vla.datasets.rlds.configs import DATASET_CONFIGS, register_dataset
    from prismatic.vla.datasets.rlds.mixtures import MIXTURES, register_mixture

    root = tmp_path_factory.mktemp("details")
    colour_train = [
        _episode(i, COLOUR_STEPS, _colour_image(left, right), text)
        for i, (left, right, text) in enumerate(COLOUR_EPISODES)
    ]
    colour_val = [_episode(len(COLOUR_EPISODES), COLOUR_STEPS, _colour_image(GREEN, RED), "Close the lid")]
    _write(root, COLOURS, COLOUR_SIZE, {"train": colour_train, "val": colour_val})
    big = [_episode(i, NUM_STEPS, _grey(i), f"big task {i}") for i in range(BIG_EPISODES)]
    _write(root, BIG, 8, {"train": big})
    small, index = {}, 0
    for split, count in SMALL_EPISODES.items():
        small[split] = [_episode(index + i, NUM_STEPS, _grey(i), "small task") for i in range(count)]
        index += count
    _write(root, SMALL, 8, small)
    try:
        for name in (COLOURS, BIG, SMALL):
            register_dataset(_config(name))
        register_mixture(MIX, [(BIG, BIG_WEIGHT), (SMALL, SMALL_WEIGHT)])
        yield root
    finally:
        for name in (COLOURS, BIG, SMALL):
            DATASET_CONFIGS.pop(name, None)
        MIXTURES.pop(MIX, None)


def _stream(root: Path, data_mix: str, count: int | None, **kwargs: Any) -> list[dict[str, Any]]:
    """The first `count` frames (all when None) of an `RLDSDataset`, untransformed, with `raw_action`."""
    from prismatic.vla.datasets import RLDSDataset

    kwargs = {"resize_resolution": (8, 8), "shuffle_buffer_size": 16, "seed": 0, **kwargs}
    dataset = RLDSDataset(StreamSpec(root, data_mix, keep_raw_action=True, **kwargs), lambda frame: frame)
    return list(itertools.islice(iter(dataset), count))


def _episode_of(frame: dict[str, Any]) -> tuple[int, int]:
    """(episode, timestep) a frame came from, as written into its raw action."""
    episode, timestep = frame["raw_action"][:2]
    return int(episode), int(timestep)


@pytest.fixture(scope="module")
def colour_frames(data_root: Path) -> list[dict[str, Any]]:
    """Two epochs of COLOURS' shuffled train stream at the backbones' 64 x 64."""
    frames = _stream(
        data_root, COLOURS, 2 * len(COLOUR_EPISODES) * COLOUR_STEPS, resize_resolution=(MODEL_SIZE,) * 2
    )
    assert {_episode_of(f)[0] for f in frames} == set(range(len(COLOUR_EPISODES)))
    return frames


def _batch_transform(backbone_id: str) -> Any:
    """`RLDSBatchTransform` with a tiny backbone's real image transform and the tiny tokenizer, as training has."""
    from prismatic.models.backbones.llm.prompting import PurePromptBuilder
    from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer
    from prismatic.models.backbones.vision.registry import build_vision_backbone
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import RLDSBatchTransform

    backbone = build_vision_backbone(backbone_id, "resize-naive")
    assert backbone.default_image_resolution == (3, MODEL_SIZE, MODEL_SIZE)
    tokenizer = load_tiny_tokenizer()
    return RLDSBatchTransform(
        ActionTokenizer(tokenizer), tokenizer, backbone.get_image_transform(), PurePromptBuilder
    )


# === 1. RGB order ===


@pytest.mark.parametrize("backbone_id", sorted(BACKBONES))
def test_pixel_values_keep_rgb_order_through_decode_resize_and_normalisation(
    colour_frames: list[dict[str, Any]], backbone_id: str
) -> None:
    """A red image feeds the model a high red channel: (255 / 255 - mean_R) / std_R there and (0 - mean) / std in
    green and blue; a left-red, right-blue image keeps its halves (no channel swap, no transposition)."""
    transform = _batch_transform(backbone_id)
    for frame in colour_frames:
        episode = _episode_of(frame)[0]
        left, right, _ = COLOUR_EPISODES[episode]
        pixel_values = transform(frame)["pixel_values"]
        parts = pixel_values if isinstance(pixel_values, dict) else {None: pixel_values}
        assert set(parts) == set(BACKBONES[backbone_id])
        for part, values in parts.items():
            mean, std = (np.array(x, np.float32)[:, None, None] for x in BACKBONES[backbone_id][part])
            width = values.shape[-1]
            # Away from the middle, where the resizes blend the halves.
            for colour, columns in ((left, slice(0, width // 4)), (right, slice(3 * width // 4, width))):
                expected = (np.array(colour, np.float32)[:, None, None] / 255 - mean) / std
                got = values[:, :, columns].numpy()
                np.testing.assert_allclose(
                    got,
                    np.broadcast_to(expected, got.shape),
                    rtol=0,
                    atol=float((JPEG_LEVELS / 255 / std).max()),
                    err_msg=f"{backbone_id} {part or ''}: episode {episode} expects {colour} there",
                )


# === 2. Each frame's own instruction ===


def test_each_frames_prompt_carries_its_own_instruction(colour_frames: list[dict[str, Any]]) -> None:
    """Frames of different episodes interleave in the shuffled stream; each prompt asks OpenVLA's question with
    the instruction of the frame's own step (episode, and step where it changes within one), lower-cased, and no
    other."""
    from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    transform = _batch_transform("tiny-vit-64px")
    every = {_step_text(text, t) for _, _, text in COLOUR_EPISODES for t in range(COLOUR_STEPS)}
    assert len(every) == len(COLOUR_EPISODES) + COLOUR_STEPS - 1
    for frame in colour_frames:
        episode, t = _episode_of(frame)
        out = transform(frame)
        prompt = tokenizer.decode(out["input_ids"][out["labels"] == IGNORE_INDEX])
        own = _step_text(COLOUR_EPISODES[episode][2], t)
        assert f"What action should the robot take to {own.lower()}?" in prompt
        for other in every - {own}:
            assert other.lower() not in prompt.lower()


# === 3. Transition-balanced mixture weights ===


def test_mixture_samples_by_transitions_times_weight(data_root: Path) -> None:
    """BIG has 200 transitions at weight 1, SMALL 20 at weight 2.5: probabilities 200 : 50, i.e. 0.8 and 0.2.
    Ignoring the sizes would give 0.29 for BIG, ignoring the weights 0.91, swapping the weights 0.96."""
    from prismatic.vla.datasets import RLDSDataset

    big_n = BIG_EPISODES * NUM_STEPS
    small_n = sum(SMALL_EPISODES.values()) * NUM_STEPS
    total = big_n * BIG_WEIGHT + small_n * SMALL_WEIGHT
    expected = {BIG: big_n * BIG_WEIGHT / total, SMALL: small_n * SMALL_WEIGHT / total}
    assert expected == pytest.approx({BIG: 0.8, SMALL: 0.2})

    dataset = RLDSDataset(StreamSpec(data_root, MIX, (8, 8), 64, seed=3), lambda frame: frame["dataset_name"])
    assert dataset.sample_weights == pytest.approx(expected, abs=1e-12)
    names = Counter(itertools.islice(iter(dataset), 4000))
    # Binomial standard deviation at 4000 frames: 0.006; 0.03 is 5 of them and far from every wrong rule.
    assert names[BIG.encode()] / 4000 == pytest.approx(expected[BIG], abs=0.03)
    assert names[BIG.encode()] + names[SMALL.encode()] == 4000


# === 4. The held-out part of a train-only dataset ===


def _file_order(root: Path, name: str) -> list[int]:
    """Episode indices of `name`'s train split in the order tfds stored them (one file), read with tfds."""
    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(root / name / "1.0.0"))
    assert builder.info.splits["train"].num_shards == 1
    episodes = builder.as_dataset(split="train", shuffle_files=False)
    return [int(next(iter(e["steps"]))["action"][0]) for e in tfds.as_numpy(episodes)]


def test_train_only_dataset_never_trains_on_its_held_out_episodes(data_root: Path) -> None:
    """BIG has no `val` split: the last 5% of train as stored (2 of 40 episodes) are held out, as OpenVLA's
    `train[95%:]`. Training, over more than two epochs, never yields them; validation yields exactly them."""
    order = _file_order(data_root, BIG)
    assert sorted(order) == list(range(BIG_EPISODES))
    held_out = set(order[-BIG_EPISODES // 20 :])
    trained = set(order) - held_out
    assert len(held_out) == 2

    epoch = len(trained) * NUM_STEPS
    train_frames = [_episode_of(f) for f in _stream(data_root, BIG, 2 * epoch + 50)]
    leaked = {e for e, _ in train_frames} & held_out
    assert not leaked, f"trained on held-out episodes {sorted(leaked)} (held out: {sorted(held_out)})"
    assert set(train_frames) == {(e, t) for e in trained for t in range(NUM_STEPS)}

    val_frames = [_episode_of(f) for f in _stream(data_root, BIG, None, train=False)]
    assert sorted(val_frames) == sorted((e, t) for e in held_out for t in range(NUM_STEPS))


def test_too_few_train_episodes_to_hold_out_is_a_clear_error(tmp_path: Path) -> None:
    """6 train-only episodes: 5% of them rounds to none, so there is nothing to validate on; the error says why
    (no val split) and how to fix it, instead of a complaint about the number of ranks."""
    from prismatic.util.errors import ConfigError
    from prismatic.vla.datasets.rlds.configs import DATASET_CONFIGS, register_dataset
    from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset

    name = f"{PREFIX}tiny_train_only"
    _write(tmp_path, name, 8, {"train": [_episode(i, 3, _grey(i), "task") for i in range(6)]})
    register_dataset(_config(name))
    try:
        with pytest.raises(ConfigError, match=r"no 'val' split.*6 'train' trajectories.*--val_fraction"):
            make_interleaved_dataset(
                StreamSpec(tmp_path, name, train=False, resize_resolution=(8, 8), shuffle_buffer_size=4)
            )
    finally:
        DATASET_CONFIGS.pop(name, None)


# === 5. Epoch-based runs ===


def test_epochs_run_epochs_times_steps_per_epoch(tmp_path: Path) -> None:
    """`--vla.epochs 2` without max_steps: one epoch is OpenVLA's dataset length over the global batch (8
    transitions / 4 = 2 steps), so the run trains 2 * 2 = 4 steps and its epoch counter reads 0, 1, 1, 2 (epochs
    completed), ending in checkpoint step-000004-epoch-02."""
    from train_runs import run_train

    num_episodes, num_steps, global_batch, epochs = 2, 4, 4, 2
    episodes = [_episode(i, num_steps, _grey(i), "push the toy") for i in range(num_episodes)]
    _write(tmp_path / "data", "toy_pick_place", 8, {"train": episodes})
    steps_per_epoch = num_episodes * num_steps // global_batch
    args = ["--vla.type", "tiny+mx-toy", "--vla.data_mix", "toy_pick_place", "--vla.max_steps", "null"]
    args += ["--vla.epochs", str(epochs), "--vla.expected_world_size", "1", "--vla.shuffle_buffer_size", "8"]
    args += ["--vla.global_batch_size", str(global_batch), "--vla.per_device_batch_size", str(global_batch)]
    args += ["--data_root_dir", str(tmp_path / "data"), "--run_root_dir", str(tmp_path), "--run_id", "epochs"]
    done = run_train([*args, "--trackers", "jsonl"], nproc=None)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]

    run = tmp_path / "epochs"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4] == list(range(1, epochs * steps_per_epoch + 1))
    assert [r["epoch"] for r in records] == [0, 1, 1, 2]
    assert [p.name for p in (run / "checkpoints").glob("step-*")] == ["step-000004-epoch-02"]
