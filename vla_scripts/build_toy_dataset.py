"""Build the toy RLDS datasets (`toy_pick_place`, `toy_push`) under a data root, if they are not there yet.

    python vla_scripts/build_toy_dataset.py --data_root_dir data/rlds [--seed 0] [--libero true]

Takes a few seconds on a CPU; running it again is a no-op. Train on them with `--data_mix toy`. `--libero true`
also builds LIBERO-shaped toys named as OpenVLA's LIBERO datasets (`libero_spatial_no_noops`, ...), which the
tiny LIBERO presets (`--vla.type tiny+libero_spatial`, `tiny-oft+libero_spatial`, ...) train on.
"""

# No `from __future__ import annotations`: with it, @dataclass needs this module in sys.modules, which a test
# loading the file by path does not give; real annotations need nothing (Python >= 3.10).
import sys
from dataclasses import dataclass
from pathlib import Path

from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError


@dataclass
class ToyConfig:
    """Flags of vla_scripts/build_toy_dataset.py (example above)."""

    data_root_dir: Path  # folder that will hold <name>/<version>/
    seed: int = 0  # seed of the generated data (same seed, same data), >= 0
    libero: bool = False  # also build the LIBERO-shaped toys, libero_{spatial,object,goal,10}_no_noops

    def __post_init__(self) -> None:
        if self.data_root_dir.is_file():
            raise ConfigError(f"--data_root_dir '{self.data_root_dir}' is a file; pass a folder.")
        if self.seed < 0:
            raise ConfigError(f"--seed={self.seed} is out of range: it must be an integer >= 0.")


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them) and build the toy datasets; a mistake exits 2 in one paragraph."""
    cfg = parse_config(ToyConfig, argv, doc=__doc__)

    # lazy: importing the dataset tables takes time, spared to --help and flag errors
    from prismatic.vla.datasets.rlds.toy import build_libero_toy_datasets, build_toy_datasets, toy_dataset_dir

    names = build_toy_datasets(cfg.data_root_dir, seed=cfg.seed)
    if cfg.libero:
        names += build_libero_toy_datasets(cfg.data_root_dir, seed=cfg.seed)
    for name in names:
        print(f"{name}: {toy_dataset_dir(cfg.data_root_dir, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
