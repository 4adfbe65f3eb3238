"""Logging set-up, called explicitly by entry points (importing the library configures nothing)."""

from __future__ import annotations

import logging
import warnings


def setup_logging(rank: int) -> None:
    """INFO on rank 0, warnings only elsewhere, with the rank in every line (TensorFlow's C++ logs are quieted by
    `prismatic.util.tf.import_tensorflow`)."""
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    for noisy in ("absl", "tensorflow", "h5py", "urllib3", "PIL", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
