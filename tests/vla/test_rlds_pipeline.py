"""The tf.data pipeline and `RLDSDataset`: determinism, rank sharding, resume, val, mixing, bad input."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from rlds_helpers import frame_key

from prismatic.conf.data import DataOptions
from prismatic.models.backbones.llm.prompting.base_prompter import PurePromptBuilder
from prismatic.util.errors import ConfigError
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets import PaddedCollatorForActionPrediction, RLDSBatchTransform, RLDSDataset
from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset
from prismatic.vla.datasets.stream_spec import StreamSpec

PIPELINE = {"resize_resolution": (32, 32), "shuffle_buffer_size": 64}


def _frames(root: Path, k: int, **kwargs: object) -> list[dict]:
    pipeline = make_interleaved_dataset(StreamSpec(root, "toy", **{**PIPELINE, **kwargs}))
    return list(itertools.islice(pipeline.dataset.as_numpy_iterator(), k))


def test_stream_is_deterministic_per_seed_rank_world(toy_data_root: Path) -> None:
    kwargs = {"seed": 3, "world_size": 2, "image_aug": True}
    first = [frame_key(f) for f in _frames(toy_data_root, 300, rank=0, **kwargs)]
    assert first == [frame_key(f) for f in _frames(toy_data_root, 300, rank=0, **kwargs)]
    other_seed = [
        frame_key(f) for f in _frames(toy_data_root, 300, rank=0, seed=4, world_size=2, image_aug=True)
    ]
    assert other_seed != first
    # Ranks read disjoint trajectories: no action vector appears in both streams.
    other_rank = _frames(toy_data_root, 300, rank=1, **kwargs)
    assert not {k[2] for k in first} & {f["action"].tobytes() for f in other_rank}


def test_start_sample_drops_exactly_that_many_frames(toy_data_root: Path) -> None:
    kwargs = {"seed": 5, "image_aug": True}
    full = [frame_key(f) for f in _frames(toy_data_root, 250, **kwargs)]
    resumed = [frame_key(f) for f in _frames(toy_data_root, 250 - 77, start_sample=77, **kwargs)]
    assert resumed == full[77:]


def test_frames_have_the_documented_format(toy_data_root: Path) -> None:
    plain = _frames(toy_data_root, 40, seed=1)
    augmented = _frames(toy_data_root, 40, seed=1, image_aug=True)
    frame = plain[0]
    assert set(frame) == {"observation", "task", "action", "dataset_name"}
    assert set(frame["observation"]) == {"image_primary"}  # proprio only with load_proprio, as OpenVLA
    assert frame["observation"]["image_primary"].shape == (32, 32, 3)
    assert frame["observation"]["image_primary"].dtype == np.uint8
    assert frame["action"].shape == (7,) and frame["action"].dtype == np.float32
    assert frame["dataset_name"] in (b"toy_pick_place", b"toy_push")
    # Augmentation changes pixels but not which frames come out.
    assert [f["action"].tobytes() for f in plain] == [f["action"].tobytes() for f in augmented]
    assert any(
        not np.array_equal(a["observation"]["image_primary"], b["observation"]["image_primary"])
        for a, b in zip(plain, augmented, strict=True)
    )


def test_mixture_is_sampled_by_balanced_weights(toy_data_root: Path) -> None:
    pipeline = make_interleaved_dataset(StreamSpec(toy_data_root, "toy", seed=0, **PIPELINE))
    # Sizes from statistics over every split, as OpenVLA: 28 episodes of 20 and of 16 steps.
    assert pipeline.sample_weights == pytest.approx({"toy_pick_place": 560 / 1008, "toy_push": 448 / 1008})
    assert pipeline.num_transitions == 1008
    names = [f["dataset_name"] for f in itertools.islice(pipeline.dataset.as_numpy_iterator(), 3000)]
    assert names.count(b"toy_pick_place") / len(names) == pytest.approx(560 / 1008, abs=0.03)


def test_val_is_one_deterministic_pass(toy_data_root: Path) -> None:
    a = list(
        make_interleaved_dataset(
            StreamSpec(toy_data_root, "toy", train=False, **PIPELINE)
        ).dataset.as_numpy_iterator()
    )
    b = list(
        make_interleaved_dataset(
            StreamSpec(toy_data_root, "toy", train=False, **PIPELINE)
        ).dataset.as_numpy_iterator()
    )
    assert len(a) == 4 * 20 + 4 * 16
    assert [frame_key(f) for f in a] == [frame_key(f) for f in b]
    halves = [
        make_interleaved_dataset(
            StreamSpec(toy_data_root, "toy", train=False, rank=r, world_size=2, **PIPELINE)
        ).dataset
        for r in range(2)
    ]
    assert sorted(frame_key(f) for h in halves for f in h.as_numpy_iterator()) == sorted(
        frame_key(f) for f in a
    )


def test_bad_input_raises_config_error(toy_data_root: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=f"data_root_dir '{missing}' does not exist"):
        make_interleaved_dataset(StreamSpec(missing, "toy", **PIPELINE))
    with pytest.raises(ConfigError, match="Unknown dataset mixture 'toy_mix'"):
        make_interleaved_dataset(StreamSpec(toy_data_root, "toy_mix", **PIPELINE))
    with pytest.raises(
        ConfigError, match=r"'bridge_orig' not found under .*Datasets present: toy_pick_place, toy_push"
    ):
        make_interleaved_dataset(StreamSpec(toy_data_root, "bridge", **PIPELINE))
    with pytest.raises(ConfigError, match="4 trajectories in split 'val', fewer than world_size=5"):
        make_interleaved_dataset(
            StreamSpec(toy_data_root, "toy", train=False, rank=0, world_size=5, **PIPELINE)
        )
    with pytest.raises(ConfigError, match="rank"):
        make_interleaved_dataset(StreamSpec(toy_data_root, "toy", rank=2, world_size=2, **PIPELINE))


def test_rlds_dataset_feeds_the_collator(toy_data_root: Path, tiny_tokenizer) -> None:
    transform = RLDSBatchTransform(
        ActionTokenizer(tiny_tokenizer),
        tiny_tokenizer,
        image_transform=lambda img: torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255,
        prompt_builder_fn=PurePromptBuilder,
    )
    dataset = RLDSDataset(StreamSpec(toy_data_root, "toy", (32, 32), 64, seed=0, start_sample=5), transform)
    assert len(dataset) == 1008  # transitions of every split, as OpenVLA's dataset length
    assert sorted(dataset.dataset_statistics) == ["toy_pick_place", "toy_push"]
    collator = PaddedCollatorForActionPrediction(64, tiny_tokenizer.pad_token_id)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=collator, num_workers=0)
    batch = next(iter(loader))
    assert batch["pixel_values"].shape == (4, 3, 32, 32)
    assert batch["actions"].shape == (4, 7) and batch["actions"].dtype == torch.float32
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    assert ((batch["labels"] != -100).sum(1) == 8).all()  # 7 action tokens + EOS per sample
    assert set(batch["dataset_names"]) <= {"toy_pick_place", "toy_push"}
    # Re-iterating restarts the same stream.
    again = next(iter(torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=collator)))
    assert torch.equal(batch["input_ids"], again["input_ids"])


def test_file_order_is_reshuffled_per_epoch_and_replayable(toy_data_root: Path) -> None:
    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    from prismatic.vla.datasets.rlds.configs import get_dataset_config
    from prismatic.vla.datasets.rlds.discovery import find_dataset_dir
    from prismatic.vla.datasets.rlds.trajectories import trajectory_dataset

    builder = tfds.builder_from_directory(str(find_dataset_dir(toy_data_root, "toy_push")))
    assert builder.info.splits["train"].num_shards > 1
    trajectories = trajectory_dataset(
        builder, "train", get_dataset_config("toy_push"), DataOptions(), repeat_seed=11
    )

    def first_actions(n: int) -> list[bytes]:
        return [t["action"][0].tobytes() for t in itertools.islice(trajectories.as_numpy_iterator(), n)]

    three_epochs = first_actions(72)
    epochs = [three_epochs[i * 24 : (i + 1) * 24] for i in range(3)]
    assert len(set(epochs[0])) == 24 and all(sorted(e) == sorted(epochs[0]) for e in epochs)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]  # a new file order per epoch
    assert first_actions(72) == three_epochs  # iterating the same dataset again replays the stream


def test_rlds_dataset_yields_exactly_the_pipelines_frames(toy_data_root: Path) -> None:
    # RLDSDataset fetches frames from tf.data in groups; the val pass from frame 5 on (139 frames, not a multiple
    # of the group size) must still come out frame for frame, in order, with nothing dropped at the end.
    kwargs = {"train": False, "start_sample": 5, **PIPELINE}
    expected = list(
        make_interleaved_dataset(StreamSpec(toy_data_root, "toy", **kwargs)).dataset.as_numpy_iterator()
    )
    got = list(RLDSDataset(StreamSpec(toy_data_root, "toy", **kwargs), lambda frame: frame))
    assert len(got) == len(expected) == 144 - 5
    for mine, theirs in zip(got, expected, strict=True):
        assert frame_key(mine) == frame_key(theirs)
        np.testing.assert_array_equal(
            mine["observation"]["image_primary"], theirs["observation"]["image_primary"]
        )
        assert "proprio" not in mine["observation"]


def test_epoch_length_is_openvlas(toy_data_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prismatic.vla.datasets.rlds import mixtures

    monkeypatch.setitem(mixtures.MIXTURES, "toy_half", [("toy_pick_place", 1.0), ("toy_push", 0.5)])
    pipeline = make_interleaved_dataset(StreamSpec(toy_data_root, "toy_half", train=False, **PIPELINE))
    # Sizes 560 and 448 (every split); balanced weights 560 : 224 of 784. OpenVLA's length counts frames until
    # the weight-1.0 dataset is seen once: 560 / (560 / 784) = 784, not 560 + 448.
    assert pipeline.num_transitions == 1008 and pipeline.dataset_length == 784
