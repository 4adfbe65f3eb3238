"""π0-FAST's action tokenizer (Pertsch et al. 2025): a chunk of normalised actions -> a short list of BPE ids.

Encoding, as Physical Intelligence's `physical-intelligence/fast` processor does it:
    1. a DCT-II (`norm="ortho"`) of each action dimension over the chunk's time axis: `[H, D]` coefficients;
    2. multiply by `scale` and round to integers (`np.around`: halves to even), shift by `-min_token` (the
       smallest rounded coefficient of the fitting data) and clip below at 0;
    3. flatten row-major (all dimensions of frequency 0, then of frequency 1, ...), one character per integer
       (`chr`), and encode that string with a byte-level BPE fitted on the training chunks.
Decoding inverts it: BPE ids -> string -> `ord` + `min_token` -> `[H, D]` -> `/ scale` -> inverse DCT. A sequence
that does not decode to exactly `H * D` coefficients is invalid and decodes to zeros, as π0-FAST does (openpi
reads actions through the same processor); so is one whose bytes are not UTF-8 (see `decode`).

The vocabulary is fitted once on the training data's chunks (`FastActionTokenizer.fit`), deterministically: the
same chunks give the same vocabulary, byte for byte. It lives in the run folder beside the dataset statistics as
two files (`save` / `load`): `tokenizers`' own JSON and a small JSON of our settings.

One departure from the FAST processor, in what the BPE starts from. FAST seeds the trainer with the characters
`chr(0) .. chr(max - min)`, but its byte-level pre-tokenizer turns every string into byte characters before the
BPE sees it, so many of those seeds can never occur (dead ids, more as the range grows), while a byte that the
fitting chunks happen not to contain is missing from the vocabulary and silently dropped when a later chunk holds
it (the sequence then decodes to the wrong length or to garbage). Here the BPE starts from the 256 byte
characters: no dead ids, and every chunk's characters encode losslessly.

Usage:
    tokenizer = FastActionTokenizer.fit(chunks_NHD, vocab_size=1024, scale=10.0)
    ids = tokenizer.encode(chunk_HD)
    actions_HD, valid = tokenizer.decode(ids, horizon=H, action_dim=D)
    tokenizer.save(run_dir); FastActionTokenizer.load(run_dir)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from scipy.fft import dct, idct
from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from prismatic.run_layout import FAST_SETTINGS_FILE, FAST_TOKENIZER_FILE
from prismatic.util.errors import ConfigError
from prismatic.util.files import write_text_atomic

__all__ = ["FAST_SETTINGS_FILE", "FAST_TOKENIZER_FILE", "FastActionTokenizer"]

_FORMAT = "prismatic-fast-action-tokenizer"
_VERSION = 1

DEFAULT_VOCAB_SIZE = 1024  # the FAST processor's defaults
DEFAULT_SCALE = 10.0
# The byte-level pre-tokenizer's 256 characters: the BPE's starting alphabet, so every string is encodable.
_BYTE_ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())
# A BPE pair must occur at least this often to be merged; FAST's trainer setting.
_MIN_FREQUENCY = 2
# FAST lets a merged token grow to any length a chunk allows.
_MAX_TOKEN_LENGTH = 10000
# The Unicode replacement character: what the byte-level decoder writes for bytes that are not UTF-8.
_REPLACEMENT_CHAR = "\ufffd"


def _check_chunk_array(array: object, ndim: int, what: str, shape_names: str) -> np.ndarray:
    """`array` as a float64 array of `ndim` non-empty axes with finite values, or a `ConfigError` saying why not."""
    if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.number):
        raise ConfigError(
            f"The FAST action tokenizer needs {what} as a numeric numpy array {shape_names}; got "
            f"{type(array).__name__}{'' if not isinstance(array, np.ndarray) else f' of dtype {array.dtype}'}. "
            f"Pass actions normalised to [-1, 1] as a float array."
        )
    if array.ndim != ndim or 0 in array.shape:
        raise ConfigError(
            f"The FAST action tokenizer needs {what} of shape {shape_names} with no empty axis; got shape "
            f"{tuple(array.shape)}. Stack the action chunks along the first axis (time second, action "
            f"dimensions last)."
            if ndim == 3
            else f"The FAST action tokenizer needs {what} of shape {shape_names} with no empty axis; got shape "
            f"{tuple(array.shape)}. Encode one chunk at a time (time first, action dimensions last)."
        )
    if not np.all(np.isfinite(array)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
        raise ConfigError(
            f"The FAST action tokenizer got a non-finite value ({array[bad]}) in {what} at index {bad}. "
            f"Normalise the actions with the dataset statistics first, and check the data for NaN or inf."
        )
    return array.astype(np.float64, copy=False)


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"The FAST action tokenizer's {name} must be a positive integer; got {value!r}.")
    return int(value)


def _new_bpe() -> Tokenizer:
    """An empty byte-level BPE set up as the FAST processor's (`tokenizers`' `ByteLevelBPETokenizer` defaults):
    GPT-2's byte-level pre-tokenizer without a prefix space, its decoder, no normaliser, no special tokens."""
    bpe = Tokenizer(BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    return bpe


class FastActionTokenizer:
    """A fitted FAST tokenizer: the BPE plus the quantisation settings the ids only make sense with.

    Build one with `fit` (from training chunks) or `load` (from a run folder).
    """

    def __init__(
        self, bpe: Tokenizer, *, scale: float, min_token: int, horizon: int, action_dim: int
    ) -> None:
        self.bpe = bpe
        self.scale = float(scale)
        self.min_token = int(min_token)  # the smallest rounded, scaled coefficient of the fitting data
        self.horizon = int(horizon)  # the chunk shape it was fitted on, [horizon, action_dim]
        self.action_dim = int(action_dim)

    @property
    def vocab_size(self) -> int:
        """How many ids the BPE can emit (ids are 0 .. vocab_size - 1)."""
        return self.bpe.get_vocab_size()

    # ----- fitting -----

    @classmethod
    def fit(
        cls, chunks: np.ndarray, vocab_size: int = DEFAULT_VOCAB_SIZE, scale: float = DEFAULT_SCALE
    ) -> FastActionTokenizer:
        """Fit the BPE on training chunks: the same chunks give the same vocabulary, byte for byte.

        Args:
            chunks: `[N, H, D]` action chunks normalised to [-1, 1] (time second, action dimensions last).
            vocab_size: the BPE's size (the FAST processor's default: 1024): the 256 byte characters plus the
                merges learnt (fewer when the chunks offer fewer pairs seen twice).
            scale: the coefficients are multiplied by it before rounding: a larger scale keeps more precision and
                needs a larger vocabulary (a chunk's rounding error is at most `sqrt(H) * 0.5 / scale` per action
                dimension, in L2).

        Raises:
            ConfigError: `chunks` is not a finite `[N, H, D]` array, or a setting is out of range.
        """
        chunks = _check_chunk_array(chunks, 3, "the chunks to fit on", "[num_chunks, horizon, action_dim]")
        vocab_size = _positive_int(vocab_size, "vocab_size")
        if vocab_size <= len(_BYTE_ALPHABET):
            raise ConfigError(
                f"The FAST action tokenizer's vocab_size must exceed the {len(_BYTE_ALPHABET)} byte characters its "
                f"BPE starts from, to leave room for merges (FAST's default: {DEFAULT_VOCAB_SIZE}); got "
                f"{vocab_size}."
            )
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not math.isfinite(scale)
            or scale <= 0
        ):
            raise ConfigError(
                f"The FAST action tokenizer's scale must be a positive number (FAST's default: {DEFAULT_SCALE}); "
                f"got {scale!r}."
            )
        rounded = np.around(dct(chunks, axis=1, norm="ortho") * scale).astype(np.int64)  # [N, H, D]
        min_token = int(rounded.min())

        def strings() -> Iterator[str]:
            for chunk in rounded:
                yield "".join(map(chr, (chunk.reshape(-1) - min_token).tolist()))

        bpe = _new_bpe()
        trainer = BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=_MIN_FREQUENCY,
            show_progress=False,
            special_tokens=[],
            initial_alphabet=_BYTE_ALPHABET,  # see the module docstring: FAST seeds chr(0 .. max - min)
            max_token_length=_MAX_TOKEN_LENGTH,
        )
        bpe.train_from_iterator(strings(), trainer=trainer, length=len(rounded))
        _, horizon, action_dim = chunks.shape
        return cls(bpe, scale=scale, min_token=min_token, horizon=horizon, action_dim=action_dim)

    # ----- encoding and decoding -----

    def encode(self, chunk: np.ndarray) -> list[int]:
        """The BPE ids of one `[H, D]` chunk of normalised actions (the shape the tokenizer was fitted on).

        Coefficients below the fitted range are clipped to its minimum, as FAST does; those above it are kept
        (characters past the fitted ones, which the byte alphabet still encodes and decodes exactly).

        Raises:
            ConfigError: `chunk` is not a finite array of the fitted shape.
        """
        chunk = _check_chunk_array(chunk, 2, "a chunk", "[horizon, action_dim]")
        if chunk.shape != (self.horizon, self.action_dim):
            raise ConfigError(
                f"This FAST action tokenizer was fitted on chunks of shape [{self.horizon}, {self.action_dim}] "
                f"([horizon, action_dim]); got a chunk of shape {list(chunk.shape)}. Use the tokenizer fitted "
                f"for this run's chunk size and action space, or fit one on chunks of this shape."
            )
        rounded = np.around(dct(chunk, axis=0, norm="ortho") * self.scale).astype(np.int64)
        shifted = np.maximum(rounded.reshape(-1) - self.min_token, 0)
        return self.bpe.encode("".join(map(chr, shifted.tolist()))).ids

    def decode(self, ids: Sequence[int], horizon: int, action_dim: int) -> tuple[np.ndarray, bool]:
        """Actions `[horizon, action_dim]` (float32, normalised units) from BPE ids, and whether they were valid.

        As π0-FAST decodes: a sequence whose characters are not exactly `horizon * action_dim` coefficients, or
        that the BPE cannot decode, gives all-zero actions and `valid=False`. Stricter than FAST in two cases:
        an id past the vocabulary is invalid (FAST's BPE skips it, which is invalid unless the rest happens to
        have the right length), and so are ids whose bytes are not UTF-8 (a merged token cut mid-character,
        which a model can emit), where FAST would read the replacement character as a coefficient of 65533.

        Raises:
            ConfigError: `horizon` or `action_dim` is not a positive integer.
        """
        horizon = _positive_int(horizon, "horizon")
        action_dim = _positive_int(action_dim, "action_dim")
        zeros = np.zeros((horizon, action_dim), np.float32)
        ids = [int(i) for i in ids]
        # FAST: `tokenizers` raises on a negative id and skips an unknown one (the sequence then comes up short).
        if any(i < 0 or i >= self.vocab_size for i in ids):
            return zeros, False
        text = self.bpe.decode(ids, skip_special_tokens=False)
        if len(text) != horizon * action_dim or _REPLACEMENT_CHAR in text:
            return zeros, False
        coefficients = (np.fromiter(map(ord, text), np.int64, len(text)) + self.min_token).reshape(
            horizon, action_dim
        )
        return idct(coefficients / self.scale, axis=0, norm="ortho").astype(np.float32), True

    # ----- the files in the run folder -----

    def settings(self) -> dict[str, object]:
        """What `save` writes beside the BPE: the quantisation and the fitted chunk shape."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "scale": self.scale,
            "min_token": self.min_token,
            "horizon": self.horizon,
            "action_dim": self.action_dim,
        }

    def save(self, directory: str | Path) -> tuple[Path, Path]:
        """Write `fast_tokenizer.json` (the BPE) and `fast_tokenizer_settings.json` into `directory`.

        Each file is written atomically (a temporary file, then a rename), so a crash never leaves half a file.
        The settings file is written last: `load` needs both, so a folder with only the first one is refused.

        Returns:
            The two paths written.

        Raises:
            ConfigError: a file could not be written (read-only folder, full disk).
        """
        directory = Path(directory)
        bpe_path = write_text_atomic(
            directory / FAST_TOKENIZER_FILE, self.bpe.to_str(pretty=True) + "\n", "FAST action tokenizer"
        )
        settings_path = write_text_atomic(
            directory / FAST_SETTINGS_FILE,
            json.dumps(self.settings(), indent=2, sort_keys=True) + "\n",
            "FAST action tokenizer settings",
        )
        return bpe_path, settings_path

    @classmethod
    def load(cls, directory: str | Path) -> FastActionTokenizer:
        """Read a tokenizer that `save` wrote into `directory`.

        Raises:
            ConfigError: a file is missing or unreadable, or is not what `save` writes.
        """
        directory = Path(directory)
        bpe_path, settings_path = directory / FAST_TOKENIZER_FILE, directory / FAST_SETTINGS_FILE
        for path in (bpe_path, settings_path):
            if not path.is_file():
                raise ConfigError(
                    f"No FAST action tokenizer in {directory}: {path.name} is missing. A run with FAST action "
                    f"tokens writes {FAST_TOKENIZER_FILE} and {FAST_SETTINGS_FILE} into its run folder beside "
                    f"dataset_statistics.json; point at that run folder (or copy both files)."
                )
        try:
            settings = json.loads(settings_path.read_text(encoding="utf-8"))
            bpe = Tokenizer.from_str(bpe_path.read_text(encoding="utf-8"))
        except Exception as e:  # OSError, bad JSON, and `tokenizers`' own bare Exception for a malformed BPE
            raise ConfigError(
                f"Could not read the FAST action tokenizer in {directory}: {type(e).__name__}: {e}. The files "
                f"{FAST_TOKENIZER_FILE} and {FAST_SETTINGS_FILE} must be the ones a run wrote; fit it again "
                f"if they were edited or truncated."
            ) from e
        keys = ("scale", "min_token", "horizon", "action_dim")
        if (
            not isinstance(settings, dict)
            or settings.get("format") != _FORMAT
            or settings.get("version") != _VERSION
            or any(not isinstance(settings.get(k), (int, float)) for k in keys)
        ):
            raise ConfigError(
                f"{settings_path} is not a FAST action tokenizer settings file of version {_VERSION} (it needs "
                f"format '{_FORMAT}', version and {', '.join(keys)}). Use the files a run wrote, or fit the "
                f"tokenizer again."
            )
        return cls(bpe, **{k: settings[k] for k in keys})
