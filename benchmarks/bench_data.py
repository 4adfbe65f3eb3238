"""Data-path benchmark: frames/s delivered as collated torch batches, and peak host memory (RSS).

    .venv/bin/python benchmarks/bench_data.py [--data_root_dir data/toy --data_mix toy]
    .venv/bin/python benchmarks/bench_data.py --bridge_like data/bench_bridge   # 256x256 JPEG, bridge_orig layout
    .venv/bin/python benchmarks/bench_data.py --bridge_like data/bench_bridge --bridge_like_datasets 2  # + 1 dataset
    make bench-data [DATA_ROOT=... MIX=...]

Runs the real training path: `RLDSDataset` (tf.data pipeline, shuffle buffer, decode + resize to 224x224) ->
`RLDSBatchTransform` (prompt tokenisation, action tokens, image transform of a resize-naive 224 ViT with SigLIP's
normalisation) -> `PaddedCollatorForActionPrediction`, batch 16, `DataLoader(num_workers=0)` as train.py uses it.
Frames/s is measured after `--warmup_batches` (which also fill the shuffle buffer); peak RSS is the process's
high-water mark (`ru_maxrss`), so it includes TensorFlow, torch and the tokenizer. Their share is printed
separately: "floor" is the RSS once every library, the tokenizer and the image transform are loaded and before
the pipeline is built (torch, torchvision and TensorFlow), and "data path" is peak minus floor, next to the
pipeline's own estimate of its shuffle buffer.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BRIDGE_LIKE_NAME = "bridge_orig"
BRIDGE_LIKE_STEPS = 38  # Bridge V2's mean episode length


def build_bridge_like(root: Path, num_frames: int, seed: int = 0) -> Path:
    """A synthetic dataset in Bridge V2's raw layout (`bridge_orig`): 256x256 JPEG `image_0`, state[7], action[7],
    instruction; textured images so the JPEGs are Bridge-sized (~15-20 KB). Skipped when already built."""
    from prismatic.vla.datasets.rlds.writer import (
        rlds_episode_features,
        rlds_step_features,
        rlds_step_flags,
        write_rlds_dataset,
    )

    num_episodes = max(2, num_frames // BRIDGE_LIKE_STEPS)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:256, 0:256]
    base = np.stack([xx, yy, (xx + yy) // 2], -1).astype(np.float32)
    noise = rng.normal(0, 12, size=(64, 64, 3)).astype(
        np.float32
    )  # tiled: stays textured, keeps the size real

    def episode(index: int) -> dict[str, Any]:
        local = np.random.default_rng([seed, index])
        actions = local.normal(0, 0.02, size=(BRIDGE_LIKE_STEPS, 7)).astype(np.float32)
        actions[:, 6] = (np.arange(BRIDGE_LIKE_STEPS) // 10) % 2
        state = np.cumsum(actions, 0).astype(np.float32)
        steps = []
        for t in range(BRIDGE_LIKE_STEPS):
            shift = (index * 7 + t * 3) % 256
            image = np.roll(base, shift, axis=1) + np.tile(noise, (4, 4, 1))
            steps.append(
                {
                    "observation": {"image_0": np.clip(image, 0, 255).astype(np.uint8), "state": state[t]},
                    "action": actions[t],
                    "language_instruction": f"put the {['spoon', 'cup', 'carrot', 'towel'][index % 4]} in the pot",
                    **rlds_step_flags(t, BRIDGE_LIKE_STEPS),
                }
            )
        return {"steps": steps, "episode_metadata": {"file_path": f"bench://{index}"}}

    def features(tfds: Any) -> Any:
        f = tfds.features
        step = {
            "observation": f.FeaturesDict(
                {
                    "image_0": f.Image(shape=(256, 256, 3), dtype=np.uint8, encoding_format="jpeg"),
                    "state": f.Tensor(shape=(7,), dtype=np.float32),
                }
            ),
            "action": f.Tensor(shape=(7,), dtype=np.float32),
            "language_instruction": f.Text(),
            **rlds_step_features(f),
        }
        return rlds_episode_features(f, step)

    return write_rlds_dataset(
        root,
        BRIDGE_LIKE_NAME,
        features,
        {"train": lambda: (episode(i) for i in range(num_episodes))},
        num_shards=8,
    )


def current_rss_gb() -> float:
    """Resident set size now (Linux `/proc/self/statm`), else the high-water mark."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**30
    except OSError:
        return peak_rss_gb()


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def image_transform_224() -> Any:
    """What a resize-naive 224px SigLIP backbone's `get_image_transform()` returns (built by the models package's
    own function, without loading the ViT)."""
    from prismatic.models.backbones.vision.transforms import build_image_transform

    data_cfg = {
        "input_size": (3, 224, 224),
        "interpolation": "bicubic",
        "mean": (0.5, 0.5, 0.5),
        "std": (0.5, 0.5, 0.5),
        "crop_pct": 1.0,
    }
    return build_image_transform(data_cfg, "resize-naive")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_root_dir", type=Path, default=Path("data/toy"))
    parser.add_argument("--data_mix", default="toy")
    parser.add_argument(
        "--bridge_like", type=Path, default=None, help="build / use Bridge-like data here instead"
    )
    parser.add_argument("--bridge_like_frames", type=int, default=12_000)
    parser.add_argument(
        "--bridge_like_datasets",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: read the Bridge-like data as a two-dataset mixture (bridge_orig + bridge_dataset, Bridge V2's "
        "two registered names with one layout) to measure what each extra dataset of a mixture costs",
    )
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--shuffle_buffer_size", type=int, default=10_000)
    parser.add_argument("--warmup_batches", type=int, default=20)
    parser.add_argument("--num_batches", type=int, default=150)
    parser.add_argument("--image_aug", action="store_true")
    args = parser.parse_args(argv)

    from torch.utils.data import DataLoader

    from prismatic.models.backbones.llm.prompting.base_prompter import PurePromptBuilder
    from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer
    from prismatic.util.tf import import_tensorflow
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import (
        PaddedCollatorForActionPrediction,
        RLDSBatchTransform,
        RLDSDataset,
        StreamSpec,
    )

    data_root, mix = args.data_root_dir, args.data_mix
    if args.bridge_like is not None:
        data_root, mix = args.bridge_like, "bridge"
        start = time.perf_counter()
        built = build_bridge_like(data_root, args.bridge_like_frames)
        if args.bridge_like_datasets == 2:
            from prismatic.vla.datasets.rlds.mixtures import MIXTURES, register_mixture

            twin = data_root / "bridge_dataset"
            if not twin.exists():
                twin.symlink_to(built.parent.name, target_is_directory=True)  # same files, second name
            mix = "bench_bridge_x2"
            if mix not in MIXTURES:
                register_mixture(mix, [(BRIDGE_LIKE_NAME, 1.0), ("bridge_dataset", 1.0)])
        print(f"bridge-like data: {data_root} ({time.perf_counter() - start:.1f} s to build / find)")
    elif mix == "toy":
        from prismatic.vla.datasets.rlds.toy import build_toy_datasets

        build_toy_datasets(data_root)

    tokenizer = load_tiny_tokenizer()
    transform = RLDSBatchTransform(
        ActionTokenizer(tokenizer), tokenizer, image_transform_224(), PurePromptBuilder
    )
    import_tensorflow()
    floor_gb = current_rss_gb()
    start = time.perf_counter()
    dataset = RLDSDataset(
        StreamSpec(
            data_root,
            mix,
            (args.resolution, args.resolution),
            args.shuffle_buffer_size,
            image_aug=args.image_aug,
        ),
        transform,
    )
    build_s = time.perf_counter() - start  # each rank pays it at start-up (plus statistics on a first run)
    collator = PaddedCollatorForActionPrediction(tokenizer.model_max_length, tokenizer.pad_token_id)
    loader = iter(DataLoader(dataset, batch_size=args.batch_size, num_workers=0, collate_fn=collator))

    start = time.perf_counter()
    for _ in range(args.warmup_batches):
        next(loader)
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.num_batches):
        batch = next(loader)
    elapsed = time.perf_counter() - start
    assert batch["pixel_values"].shape == (args.batch_size, 3, args.resolution, args.resolution)

    frames_per_s = args.num_batches * args.batch_size / elapsed
    peak_gb = peak_rss_gb()
    print(
        f"data_mix={mix} batch={args.batch_size} res={args.resolution} buffer={args.shuffle_buffer_size} "
        f"warm-up {warmup_s:.1f} s"
    )
    print(f"pipeline build: {build_s:.2f} s")
    print(f"frames/s: {frames_per_s:.1f}")
    print(f"peak RSS: {peak_gb:.2f} GiB")
    print(
        f"  floor (libraries loaded, before the pipeline): {floor_gb:.2f} GiB; data path (peak - floor): "
        f"{peak_gb - floor_gb:.2f} GiB, of which the shuffle buffer ~{dataset.shuffle_buffer_gb:.2f} GiB (estimate)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
