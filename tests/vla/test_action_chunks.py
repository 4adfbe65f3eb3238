"""The l1-chunk head's targets are the pipeline's future-action window (prismatic/models/action_heads/,
rlds/chunking.py): expectations read straight from the dataset files and normalised in NumPy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from prismatic.vla.datasets.stream_spec import StreamSpec

K, D = 4, 7


def test_chunk_targets_are_the_pipelines_future_window(toy_data_root: Path) -> None:
    """What the head trains on (the collated `actions`) is each frame's next K actions of its own episode,
    normalised as OpenVLA does (q01 / q99 of the masked dims), read here straight from the dataset files."""
    from rlds_helpers import q99_normalize, raw_actions_and_proprio

    from prismatic.models.action_heads import ActionSpec, build_action_head
    from prismatic.models.backbones.llm.prompting import PurePromptBuilder
    from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import PaddedCollatorForActionPrediction, RLDSBatchTransform, RLDSDataset
    from prismatic.vla.datasets.rlds.discovery import load_builder, split_name

    tokenizer = load_tiny_tokenizer()
    head = build_action_head(ActionSpec(head="l1-chunk", chunk_size=K), ActionTokenizer(tokenizer), 0)
    transform = RLDSBatchTransform(
        ActionTokenizer(tokenizer),
        tokenizer,
        lambda image: torch.zeros(3, 1, 1),
        PurePromptBuilder,
        layout=head.layout,
    )
    dataset = RLDSDataset(
        StreamSpec(toy_data_root, "toy_pick_place", (8, 8), 0, train=False, future_action_window_size=K - 1),
        transform,
    )
    directory = toy_data_root / "toy_pick_place" / "1.0.0"
    episode = raw_actions_and_proprio(directory, split_name(load_builder(directory), train=False))[0][
        "action"
    ]
    stats = dataset.dataset_statistics["toy_pick_place"]["action"]
    expected = q99_normalize(
        episode, np.array(stats["q01"]), np.array(stats["q99"]), np.array(stats["mask"])
    ).astype(np.float32)
    frames = [frame for _, frame in zip(range(len(episode)), iter(dataset), strict=False)]
    batch = PaddedCollatorForActionPrediction(512, tokenizer.pad_token_id)(frames)
    assert batch["actions"].shape == (len(episode), K, D)
    assert batch["action_mask"].sum(1).tolist() == [K * D] * len(episode)
    for t in range(
        len(episode) - K + 1
    ):  # windows inside the episode (padding is pinned in test_data_parity)
        np.testing.assert_allclose(batch["actions"][t].numpy(), expected[t : t + K], rtol=0, atol=2e-7)


def test_two_views_are_stacked_on_the_channel_axis(toy_data_root: Path) -> None:
    """`--vla.num_images 2`: the transform puts the primary image's channels first and the wrist image's after,
    the layout `PrismaticVLM.prefix_embeddings` splits; proprio is the frame's own (the window's last)."""
    from prismatic.conf.data import DataOptions
    from prismatic.models.action_heads import ActionSpec, build_action_head
    from prismatic.models.backbones.llm.prompting import PurePromptBuilder
    from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import RLDSBatchTransform, RLDSDataset
    from prismatic.vla.datasets.batch_transform import views_for

    tokenizer = load_tiny_tokenizer()

    def to_tensor(image):  # the image as it arrives, channels first (PIL path: not a recognised transform)
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)

    head = build_action_head(ActionSpec(head="l1-chunk", chunk_size=2), ActionTokenizer(tokenizer), 0)
    transform = RLDSBatchTransform(
        ActionTokenizer(tokenizer),
        tokenizer,
        to_tensor,
        PurePromptBuilder,
        layout=head.layout,
        views=views_for(2),
        use_proprio=True,
    )
    stream = {"train": False, "future_action_window_size": 1, "options": DataOptions(load_proprio=True)}
    raw = RLDSDataset(
        StreamSpec(toy_data_root, "toy_pick_place", (8, 8), 0, image_views=("primary", "wrist"), **stream),
        lambda f: f,
    )
    frames = [f for _, f in zip(range(3), iter(raw), strict=False)]
    for frame in frames:
        out = transform(frame)
        observation = frame["observation"]
        assert out["pixel_values"].shape == (6, 8, 8)
        assert torch.equal(out["pixel_values"][:3], to_tensor(observation["image_primary"][-1]))
        assert torch.equal(out["pixel_values"][3:], to_tensor(observation["image_wrist"][-1]))
        assert not torch.equal(out["pixel_values"][:3], out["pixel_values"][3:])
        np.testing.assert_array_equal(out["proprio"], observation["proprio"][-1])
