"""FAST action tokens (π0-FAST): a chunk of actions compressed to a few BPE ids by a DCT, rounding and a byte-level
BPE fitted on the training chunks (`tokenizer.py`), the head that puts those ids on the LLM's vocabulary and
decodes them autoregressively (`head.py`, `--vla.action_head fast`), its constrained decoding (`decoding.py`), the
vocabulary's file in the run folder (`files.py`) and its options (`options.py`, torch-free: the config reads them).
Names load lazily: the config reads the options without numpy's neighbours, scipy, `tokenizers` or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.models.action_heads.fast.head import FastActionHead
    from prismatic.models.action_heads.fast.options import FastOptions
    from prismatic.models.action_heads.fast.tokenizer import (
        FAST_SETTINGS_FILE,
        FAST_TOKENIZER_FILE,
        FastActionTokenizer,
    )

_TOKENIZER = "prismatic.models.action_heads.fast.tokenizer"
_LAZY = {
    **dict.fromkeys(("FAST_SETTINGS_FILE", "FAST_TOKENIZER_FILE", "FastActionTokenizer"), _TOKENIZER),
    "FastActionHead": "prismatic.models.action_heads.fast.head",
    "FastOptions": "prismatic.models.action_heads.fast.options",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "FAST_SETTINGS_FILE",
    "FAST_TOKENIZER_FILE",
    "FastActionHead",
    "FastActionTokenizer",
    "FastOptions",
]
