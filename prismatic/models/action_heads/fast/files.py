"""The FAST vocabulary in the run folder: fitted once per run by rank 0 on a seeded sample of the training data's
normalised chunks, saved beside `dataset_statistics.json`, then read back by every rank.

A resumed run reads the vocabulary its first start saved and never fits again (a refit on another sample would
change the meaning of every id the checkpoint learnt); a folder without it is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.models.action_heads.fast.options import FastOptions
from prismatic.models.action_heads.fast.tokenizer import (
    FAST_SETTINGS_FILE,
    FAST_TOKENIZER_FILE,
    FastActionTokenizer,
)
from prismatic.util.errors import ConfigError
from prismatic.util.files import atomic_write

logger = logging.getLogger(__name__)


def prepare_vocabulary(
    folder: Path,
    sample_chunks: Callable[[int], np.ndarray],
    dist_info: Any,
    options: FastOptions,
    *,
    resumed: bool,
    timeout: timedelta,
    base: Path | None = None,
) -> FastActionTokenizer:
    """The run's FAST vocabulary: on a new run, rank 0 fits it on `sample_chunks(options.fit_chunks)` (the training
    data's normalised chunks, a seeded sample: `prismatic.vla.datasets.builders.sample_training_chunks`) and saves
    it in `folder` while the other ranks wait at a gloo barrier (`timeout`); a resumed run fits nothing. A new run
    that starts from a FAST model (`base`: the run or export its weights come from, `train.starting_files_dir`,
    holding a vocabulary) copies that one instead: the model's weights learnt its ids. Every rank then reads it
    from `folder`. Collective.

    Raises:
        ConfigError: a resumed run whose folder holds no vocabulary (or a damaged one).
    """
    from prismatic.util.dist import call_and_agree, run_on_main

    folder = Path(folder)
    if resumed:
        missing = [n for n in (FAST_TOKENIZER_FILE, FAST_SETTINGS_FILE) if not (folder / n).is_file()]
        if missing:
            raise ConfigError(
                f"The run folder {folder} is resumed with --vla.action_head fast, but its FAST vocabulary "
                f"({', '.join(missing)}) is missing: a run fits it once, at its first start, and a resume must "
                f"read that one (a new fit would change what the checkpoint's ids mean). Restore the files from "
                f"a copy of the run folder, or start a new run."
            )
    else:

        def fit_and_save() -> None:
            if base is not None and all(
                (Path(base) / n).is_file() for n in (FAST_TOKENIZER_FILE, FAST_SETTINGS_FILE)
            ):
                for name in (FAST_TOKENIZER_FILE, FAST_SETTINGS_FILE):  # the settings last, as `save` writes
                    with atomic_write(folder / name, "FAST vocabulary") as out:
                        out.write((Path(base) / name).read_bytes())
                logger.info("FAST vocabulary: the starting model's, copied from %s into %s", base, folder)
                return
            chunks = sample_chunks(options.fit_chunks)
            fast = FastActionTokenizer.fit(chunks, vocab_size=options.vocab_size, scale=options.scale)
            fast.save(folder)
            logger.info(
                "FAST vocabulary: %d ids fitted on %d training chunks [%d, %d] (scale %g), saved in %s",
                fast.vocab_size,
                len(chunks),
                fast.horizon,
                fast.action_dim,
                options.scale,
                folder,
            )

        run_on_main(fit_and_save, dist_info, timeout=timeout)
    return call_and_agree(lambda: FastActionTokenizer.load(folder))
