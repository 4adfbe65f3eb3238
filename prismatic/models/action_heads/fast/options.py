"""The FAST head's options (`--vla.head.fast.*`), torch-free: the config reads them before torch loads.

The vocabulary's size and the coefficients' scale are π0-FAST's (the `physical-intelligence/fast` processor's
defaults: 1024 ids, scale 10); `fit_chunks` bounds the sample of training chunks the vocabulary is fitted on, and
`max_decode_tokens` caps how many tokens decoding emits before it gives up on a chunk (counted invalid).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prismatic.util.errors import ConfigError

BYTE_ALPHABET_SIZE = 256  # the BPE's starting alphabet (`tokenizer.py`): a vocabulary must exceed it


@dataclass
class FastOptions:
    """π0-FAST's action tokens (`--vla.head.fast.*`)."""

    vocab_size: int = 1024  # BPE ids at most (the 256 bytes plus merges); π0-FAST: 1024
    scale: float = 10.0  # DCT coefficients are multiplied by it, then rounded; π0-FAST: 10
    fit_chunks: int = 10_000  # training chunks (a seeded sample) the vocabulary is fitted on, once per run
    max_decode_tokens: int = 256  # tokens decoded per chunk at most (π0-FAST: 256); cut: often invalid

    def __post_init__(self) -> None:
        for name in ("vocab_size", "fit_chunks", "max_decode_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"--vla.head.fast.{name}={value!r} is out of range: it must be an integer >= 1."
                )
        if self.vocab_size <= BYTE_ALPHABET_SIZE:
            raise ConfigError(
                f"--vla.head.fast.vocab_size={self.vocab_size} is out of range: it must exceed the "
                f"{BYTE_ALPHABET_SIZE} byte characters the BPE starts from (π0-FAST's: 1024)."
            )
        scale = self.scale
        if (
            isinstance(scale, bool)
            or not isinstance(scale, int | float)
            or not math.isfinite(scale)
            or scale <= 0
        ):
            raise ConfigError(
                f"--vla.head.fast.scale={scale!r} is out of range: it must be a positive number (π0-FAST's: 10)."
            )
