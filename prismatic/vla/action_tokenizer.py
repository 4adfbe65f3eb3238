"""Continuous robot actions <-> token ids at the end of an LLM's vocabulary (OpenVLA's exact scheme).

Each action dimension is clipped to [min_action, max_action] and discretised with `np.digitize` against
`np.linspace(min_action, max_action, bins)`; bin index i (1..bins) maps to token id `vocab_size - i`. Users who
fine-tune released OpenVLA checkpoints rely on these ids being identical, so the ids are exposed as integers and
put into `input_ids`/`labels` directly, never through a decode/re-encode round trip of text.
"""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerBase


class ActionTokenizer:
    """Discretise actions into `bins` uniform bins mapped onto the last `bins` ids of `tokenizer.vocab_size`."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        bins: int = 256,
        min_action: float = -1.0,
        max_action: float = 1.0,
    ) -> None:
        if bins < 2 or bins >= tokenizer.vocab_size:
            raise ValueError(f"bins={bins} must be in [2, vocab_size={tokenizer.vocab_size}).")
        self.tokenizer, self.n_bins = tokenizer, bins
        self.min_action, self.max_action = float(min_action), float(max_action)
        self.vocab_size = int(tokenizer.vocab_size)
        # `bins` edges; digitize against them gives indices 1..bins for clipped values.
        self.bins = np.linspace(self.min_action, self.max_action, self.n_bins)
        self.bin_centers = (self.bins[:-1] + self.bins[1:]) / 2.0
        # Every id strictly greater than this is an action token (OpenVLA's `action_token_begin_idx`).
        self.action_token_begin_idx = int(self.vocab_size - (self.n_bins + 1))

    def encode_to_ids(self, action: np.ndarray) -> np.ndarray:
        """Map actions (any shape) to integer token ids of the same shape."""
        action = np.clip(np.asarray(action, dtype=np.float64), self.min_action, self.max_action)
        return (self.vocab_size - np.digitize(action, self.bins)).astype(np.int64)

    def decode_ids(self, token_ids: np.ndarray) -> np.ndarray:
        """Map action token ids back to continuous actions (the centre of each bin).

        OpenVLA's rule: `vocab_size - id` is the 1-based digitize index; it is shifted to 0-based and clipped to
        the last bin centre, because the top index (exactly `max_action`) has no upper neighbour.
        """
        indices = self.vocab_size - np.asarray(token_ids, dtype=np.int64)
        indices = np.clip(indices - 1, a_min=0, a_max=self.bin_centers.shape[0] - 1)
        return self.bin_centers[indices]

    def __call__(self, action: np.ndarray) -> str | list[str]:
        """Text form of the action tokens (for display only; training uses `encode_to_ids`)."""
        ids = self.encode_to_ids(action)
        if ids.ndim == 1:
            return self.tokenizer.decode(list(ids))
        return self.tokenizer.batch_decode(ids.tolist())
