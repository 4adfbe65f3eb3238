"""FAST action tokens (π0-FAST): a chunk of actions compressed to a few BPE ids by a DCT, rounding and a byte-level
BPE fitted on the training chunks (`tokenizer.py`).

Loads numpy, scipy and `tokenizers` (not torch) on import.
"""

from prismatic.models.action_heads.fast.tokenizer import (
    FAST_SETTINGS_FILE,
    FAST_TOKENIZER_FILE,
    FastActionTokenizer,
)

__all__ = ["FAST_SETTINGS_FILE", "FAST_TOKENIZER_FILE", "FastActionTokenizer"]
