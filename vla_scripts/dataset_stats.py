r"""Print (and optionally save) the action / proprio statistics of every dataset of a mixture.

    python vla_scripts/dataset_stats.py --data_root_dir /path/to/rlds --data_mix oxe_magic_soup_plus \
        [--output_dir runs/stats] [--skip_missing_datasets] [--num_workers 8]

Statistics come from each dataset's cache beside the data (`<name>/<version>/dataset_statistics_<hash>.json`,
the same file training reads), or are computed as OpenVLA computes them (every split by default;
`--data.statistics_split train` for train frames only) and cached there; `--recompute_stats` recomputes.
Own datasets: `--plugins my_robot.py` (docs/own_data.md). For one dataset's trajectories and statistics from
Python, see `prismatic.vla.datasets.rlds.reading`. The output has the
layout of a run folder's `dataset_statistics.json` (OpenVLA's `norm_stats`): `--output_dir` writes that file.
Datasets are read in parallel threads, one per core by default.
"""

# No `from __future__ import annotations`: with it, @dataclass needs this module in sys.modules, which a test
# loading the file by path does not give; real annotations need nothing (Python >= 3.10).
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from prismatic.conf.data import DataOptions
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError


@dataclass
class StatsConfig:
    """Flags of vla_scripts/dataset_stats.py (example above)."""

    data_root_dir: Path  # folder holding <name>/<version>/
    data_mix: str  # mixture name or single dataset name
    output_dir: Path | None = None  # also write <output_dir>/dataset_statistics.json
    skip_missing_datasets: bool = False  # warn about, then skip, datasets missing from data_root_dir
    num_workers: int | None = None  # datasets processed at once, >= 1 (default: one per core)
    recompute_stats: bool = False  # compute again, ignoring (and overwriting) the caches
    # Statistics split, NaN / inf handling, proprio (defaults as OpenVLA; docs/data_pipeline.md)
    data: DataOptions = field(default_factory=DataOptions)

    def __post_init__(self) -> None:
        # Checked while parsing, before TensorFlow loads.
        if not self.data_root_dir.is_dir():
            raise ConfigError(
                f"--data_root_dir '{self.data_root_dir}' does not exist or is not a folder: pass the folder holding "
                "<name>/<version>/ RLDS datasets."
            )
        if self.num_workers is not None and self.num_workers < 1:
            raise ConfigError(
                f"--num_workers={self.num_workers} is out of range: it must be an integer >= 1."
            )
        if self.output_dir is not None and self.output_dir.is_file():
            raise ConfigError(f"--output_dir '{self.output_dir}' is a file; pass a folder.")


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them), print the statistics as JSON on stdout; a mistake exits 2."""
    cfg = parse_config(StatsConfig, argv, doc=__doc__)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    # lazy: importing the dataset tables takes time, spared to --help and flag errors
    from prismatic.vla.datasets.rlds import mixture_statistics, save_dataset_statistics

    statistics = mixture_statistics(
        cfg.data_root_dir,
        cfg.data_mix,
        skip_missing_datasets=cfg.skip_missing_datasets,
        num_workers=cfg.num_workers,
        options=cfg.data,
        recompute=cfg.recompute_stats,
    )
    print(json.dumps(statistics, indent=2))
    if cfg.output_dir is not None:
        print(f"wrote {save_dataset_statistics(statistics, cfg.output_dir)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
