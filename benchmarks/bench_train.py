"""Training throughput benchmark: runs `vla_scripts/train.py` under torchrun and prints samples/s and step time.

    python benchmarks/bench_train.py [--vla tiny+mx-toy] [--nproc 2] [--steps 60] [--strategy fsdp-full-shard] \
        [--action_head tokens|l1-chunk] [--chunk_size 8]

Builds the toy RLDS mixture in a temporary folder if `--data_root_dir` is not given. Figures are medians over
the steps after `--warmup`, read from the run's metrics.jsonl (what training itself measured), plus the wall
time of the whole launch (start-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vla", default="tiny+mx-toy")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--strategy", default="fsdp-full-shard")
    parser.add_argument("--data_root_dir", type=Path, default=None)
    parser.add_argument("--action_head", default="tokens", help="tokens or l1-chunk (--vla.action_head)")
    parser.add_argument("--chunk_size", type=int, default=None, help="default: 1 for tokens, 8 for l1-chunk")
    args = parser.parse_args()
    chunk_size = args.chunk_size or (1 if args.action_head == "tokens" else 8)

    with tempfile.TemporaryDirectory() as tmp:
        data_root = args.data_root_dir or Path(tmp) / "data"
        if args.data_root_dir is None:
            subprocess.run(
                [
                    sys.executable,
                    str(REPO / "vla_scripts/build_toy_dataset.py"),
                    "--data_root_dir",
                    str(data_root),
                ],
                check=True,
                capture_output=True,
            )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(args.nproc),
            str(REPO / "vla_scripts/train.py"),
            "--vla.type",
            args.vla,
            "--vla.expected_world_size",
            str(args.nproc),
            "--vla.max_steps",
            str(args.steps),
            "--vla.train_strategy",
            args.strategy,
            "--vla.action_head",
            args.action_head,
            "--vla.chunk_size",
            str(chunk_size),
            "--data_root_dir",
            str(data_root),
            "--run_root_dir",
            str(Path(tmp) / "runs"),
            "--run_id",
            "bench",
            "--trackers",
            "[jsonl]",
            "--save_interval",
            str(10 * args.steps),
        ]
        start = time.perf_counter()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"}
        )
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            return proc.returncode
        lines = (Path(tmp) / "runs/bench/metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines][args.warmup :]
    step_s = statistics.median(r["step_time_s"] for r in records)
    sps = statistics.median(r["samples_per_s"] for r in records)
    print(
        f"bench-train {args.vla} {args.strategy} head={args.action_head} K={chunk_size} nproc={args.nproc}: "
        f"{sps:.1f} samples/s, "
        f"{step_s * 1000:.1f} ms/step (median of {len(records)} steps), launch wall {wall:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
