"""Data-resume benchmark: time to restore a rank's data stream after N frames, via snapshot and via skipping.

    .venv/bin/python benchmarks/bench_data_resume.py --data_root_dir data/toy
    .venv/bin/python benchmarks/bench_data_resume.py --data_root_dir data/toy --shuffle_buffer_size 256000
    .venv/bin/python benchmarks/bench_data_resume.py --bridge_like data/bench_bridge --points 2000 10000

One writer `RLDSDataset` streams to the largest point, saving its state (`save_stream_state`) at every point and
recording the frames that follow. Then, per point and path, a fresh `RLDSDataset` is built and resumed
(`resume_from(N, state)` for "snapshot", `resume_from(N, None)` for "skip"); the time from construction to its
first frame is printed, with the ratio between the largest and the smallest point (bounded: ~1; linear: ~16 for
160k / 10k), and the resumed frames are checked against the writer's. Frames are the pipeline's raw frames (an
identity batch transform): the model's transform costs the same on both paths. The snapshot holds positions, not
frames (tf.data's symbolic iterator state over the window shuffle, `prismatic/vla/datasets/rlds/shuffle.py`), so
its bytes depend on the number of datasets, not on `shuffle_buffer_size` or the frames: run with
`--shuffle_buffer_size 256000` for OpenVLA's buffer (its RAM, printed, is that of the frames held, not of the
snapshot). A snapshot resume re-reads one shuffle window (`shuffle_buffer_size / 2` encoded frames).
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _key(frame: dict[str, Any]) -> bytes:
    return frame["action"].tobytes() + frame["observation"]["image_primary"].tobytes()


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_root_dir", type=Path, default=Path("data/toy"))
    parser.add_argument("--data_mix", default="toy")
    parser.add_argument(
        "--bridge_like", type=Path, default=None, help="build / use Bridge-like data here instead"
    )
    parser.add_argument("--bridge_like_frames", type=int, default=12_000)
    parser.add_argument(
        "--points", type=int, nargs="+", default=[10_000, 160_000], help="frames to resume at"
    )
    parser.add_argument(
        "--resolution",
        type=int,
        default=64,
        help="64: the toy images' own size, so streaming to 160k is quick",
    )
    parser.add_argument("--shuffle_buffer_size", type=int, default=10_000)
    parser.add_argument("--image_aug", action="store_true")
    parser.add_argument(
        "--state_dir", type=Path, default=None, help="where snapshots go (default: a temp dir)"
    )
    parser.add_argument(
        "--check_frames", type=int, default=32, help="resumed frames compared with the writer's"
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=("snapshot", "skip"),
        default=["snapshot", "skip"],
        help="resume paths timed (skip alone is slow at large points)",
    )
    args = parser.parse_args(argv)
    points = sorted(set(args.points))

    from prismatic.util.tf import import_tensorflow
    from prismatic.vla.datasets import RLDSDataset, StreamSpec

    data_root, mix = args.data_root_dir, args.data_mix
    if args.bridge_like is not None:
        from bench_data import build_bridge_like

        data_root, mix = args.bridge_like, "bridge"
        build_bridge_like(data_root, args.bridge_like_frames)
    elif mix == "toy":
        from prismatic.vla.datasets.rlds.toy import build_toy_datasets

        build_toy_datasets(data_root)
    import_tensorflow()
    logging.basicConfig(level=logging.WARNING)

    def dataset() -> RLDSDataset:
        return RLDSDataset(
            StreamSpec(
                data_root,
                mix,
                (args.resolution, args.resolution),
                args.shuffle_buffer_size,
                image_aug=args.image_aug,
            ),
            lambda frame: frame,
        )

    with tempfile.TemporaryDirectory() as tmp:
        state_root = args.state_dir or Path(tmp)
        writer = dataset()  # also warms up the process (first graph tracing) before anything is timed
        stream = iter(writer)
        following: dict[int, list[bytes]] = {}
        save_s: dict[int, float] = {}
        start = time.perf_counter()
        for point in points:
            for _ in range(point - writer.frames_consumed):
                next(stream)
            begin = time.perf_counter()
            writer.save_stream_state(state_root / str(point))
            save_s[point] = time.perf_counter() - begin
            following[point] = [_key(next(stream)) for _ in range(args.check_frames)]
        print(
            f"data_mix={mix} res={args.resolution} buffer={args.shuffle_buffer_size} image_aug={args.image_aug}: "
            f"streamed {writer.frames_consumed} frames in {time.perf_counter() - start:.1f} s (saves included)"
        )
        writer_buffer_gb = writer.shuffle_buffer_gb
        # A live iterator keeps decoding into its prefetch buffer: stop it, or it steals cores from what is timed.
        del stream, writer
        gc.collect()

        seconds: dict[tuple[str, int], float] = {}
        all_same = True
        for point in points:
            for path in args.paths:
                begin = time.perf_counter()
                resumed = dataset()
                got = resumed.resume_from(point, state_root / str(point) if path == "snapshot" else None)
                frames = iter(resumed)
                first = next(frames)
                seconds[path, point] = time.perf_counter() - begin
                keys = [_key(first)] + [_key(next(frames)) for _ in range(args.check_frames - 1)]
                del frames, resumed
                gc.collect()
                all_same &= keys == following[point] and got == path
                same = "identical" if keys == following[point] else "DIFFERENT"
                print(
                    f"resume after {point:>7} frames via {path:<8}: {seconds[path, point]:6.2f} s to the first "
                    f"frame (resume_from -> {got!r}; next {args.check_frames} frames {same})"
                )
        low, high = points[0], points[-1]
        for path in args.paths:
            ratio = seconds[path, high] / seconds[path, low]
            print(f"{path:<8} {high}/{low}: {ratio:.2f}x")

        for point in points:
            folder = state_root / str(point)
            parts = ", ".join(
                f"{p.name.split('.', 1)[1]} {p.stat().st_size:,}" for p in sorted(folder.iterdir())
            )
            print(
                f"snapshot at {point}: {_folder_bytes(folder):,} bytes ({parts}); save {save_s[point]:.2f} s"
            )
        print(
            f"snapshot bytes per rank at a {args.shuffle_buffer_size:,}-frame buffer: "
            f"{max(_folder_bytes(state_root / str(p)) for p in points):,} at most (positions, no frames); the "
            f"buffer itself holds ~{writer_buffer_gb:.2f} GiB of encoded frames in RAM (the pipeline's estimate)"
        )
    return 0 if all_same else 1  # a resume path that gives other frames than the writer's is a failure


if __name__ == "__main__":
    sys.exit(main())
