"""Print (and optionally save) the action / proprio statistics of every dataset of a mixture.

    python vla_scripts/dataset_stats.py --data_root_dir /path/to/rlds --data_mix oxe_magic_soup_plus \
        [--output_dir runs/stats] [--skip_missing_datasets] [--num_workers 8]

Statistics come from each dataset's cache beside the data (`<name>/<version>/dataset_statistics_<hash>.json`,
the same file training reads), or are computed over the train split and cached there. The output has the
layout of a run folder's `dataset_statistics.json` (OpenVLA's `norm_stats`): `--output_dir` writes that file.
Datasets are read in parallel threads, one per core by default.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_root_dir", type=Path, required=True, help="folder holding <name>/<version>/")
    parser.add_argument("--data_mix", required=True, help="mixture name or single dataset name")
    parser.add_argument(
        "--output_dir", type=Path, default=None, help="write <output_dir>/dataset_statistics.json"
    )
    parser.add_argument(
        "--skip_missing_datasets", action="store_true", help="warn about, then skip, missing sets"
    )
    parser.add_argument(
        "--num_workers", type=int, default=None, help="datasets processed at once (default: cores)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from prismatic.util.errors import ConfigError
    from prismatic.vla.datasets.rlds.dataset import mixture_statistics
    from prismatic.vla.datasets.rlds.statistics import save_dataset_statistics

    try:
        statistics = mixture_statistics(
            args.data_root_dir,
            args.data_mix,
            skip_missing_datasets=args.skip_missing_datasets,
            num_workers=args.num_workers,
        )
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(statistics, indent=2))
    if args.output_dir is not None:
        print(f"wrote {save_dataset_statistics(statistics, args.output_dir)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
