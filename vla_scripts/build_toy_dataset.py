"""Build the toy RLDS datasets (`toy_pick_place`, `toy_push`) under a data root, if they are not there yet.

    python vla_scripts/build_toy_dataset.py --data_root_dir data/rlds [--seed 0]

Takes a few seconds on a CPU; running it again is a no-op. Train on them with `--data_mix toy`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data_root_dir", type=Path, required=True, help="folder that will hold <name>/<version>/"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the generated data (same seed, same data)"
    )
    args = parser.parse_args(argv)

    from prismatic.vla.datasets.rlds.toy import build_toy_datasets, toy_dataset_dir

    names = build_toy_datasets(args.data_root_dir, seed=args.seed)
    for name in names:
        print(f"{name}: {toy_dataset_dir(args.data_root_dir, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
