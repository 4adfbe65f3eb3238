"""FAST action tokens (prismatic/models/action_heads/fast/): π0-FAST's DCT + rounding + BPE tokenizer.

Pinned here, with expectations computed in the test: the integers the ids stand for (a DCT-II matrix written out
from its formula, scaled, rounded, shifted by the fitting data's minimum, flattened time-major); the round trip
within the bound the scale implies; the fit deterministic to the byte; save / load; π0-FAST's handling of
invalid sequences (all-zero actions, flagged); and the one-paragraph errors for user mistakes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from prismatic.models.action_heads.fast import FAST_SETTINGS_FILE, FAST_TOKENIZER_FILE, FastActionTokenizer
from prismatic.util.errors import ConfigError

H, D = 10, 7  # horizon, action dimensions
VOCAB = 512


def smooth_chunks(seed: int, n: int, horizon: int = H, dim: int = D) -> np.ndarray:
    """Random-walk chunks clipped to [-1, 1]: smooth in time, as normalised robot actions are."""
    rng = np.random.default_rng(seed)
    return np.clip(np.cumsum(rng.normal(0.0, 0.15, (n, horizon, dim)), axis=1), -1.0, 1.0)


def dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II as a matrix, from its definition: C[k, i] = w_k cos(pi (2i + 1) k / 2n),
    w_0 = sqrt(1/n), w_k = sqrt(2/n)."""
    k, i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    weights = np.where(k == 0, math.sqrt(1.0 / n), math.sqrt(2.0 / n))
    return weights * np.cos(math.pi * (2 * i + 1) * k / (2 * n))


@pytest.fixture(scope="module")
def train_chunks() -> np.ndarray:
    return smooth_chunks(0, 64)


@pytest.fixture(scope="module")
def tokenizer(train_chunks: np.ndarray) -> FastActionTokenizer:
    return FastActionTokenizer.fit(train_chunks, vocab_size=VOCAB, scale=10.0)


def test_ids_stand_for_the_scaled_rounded_dct_coefficients(train_chunks, tokenizer):
    matrix = dct_matrix(H)
    coefficients = np.einsum("ki,nid->nkd", matrix, train_chunks) * 10.0  # [N, H, D], per dimension over time
    rounded = np.rint(coefficients).astype(int)
    assert tokenizer.min_token == rounded.min()
    held_out = smooth_chunks(1, 8)
    for chunk, expected in zip(
        held_out, np.rint(np.einsum("ki,nid->nkd", matrix, held_out) * 10), strict=True
    ):
        text = tokenizer.bpe.decode(tokenizer.encode(chunk))
        # Time-major: all dimensions of frequency 0 first; clipped below at the fitted minimum, as FAST does.
        want = np.maximum(expected.astype(int).reshape(-1) - rounded.min(), 0)
        assert [ord(c) for c in text] == want.tolist()
    # BPE compresses: a chunk is fewer ids than coefficients (H * D = 70 characters each).
    assert np.mean([len(tokenizer.encode(c)) for c in train_chunks]) < H * D / 2


@pytest.mark.parametrize("scale", [10.0, 50.0])
def test_round_trip_error_within_the_bound_the_scale_implies(scale):
    # Rounding moves each scaled coefficient by at most 0.5, so each coefficient by at most 0.5 / scale; the
    # orthonormal inverse DCT preserves L2 norms, so one dimension's H actions move by at most sqrt(H) * 0.5 / scale.
    bound = math.sqrt(H) * 0.5 / scale
    fitted = FastActionTokenizer.fit(smooth_chunks(0, 64), vocab_size=1024, scale=scale)
    for chunk in np.concatenate([smooth_chunks(0, 16), smooth_chunks(2, 16)]):  # training and held-out chunks
        actions, valid = fitted.decode(fitted.encode(chunk), horizon=H, action_dim=D)
        assert valid and actions.shape == (H, D) and actions.dtype == np.float32
        per_dimension_l2 = np.sqrt(((actions.astype(np.float64) - chunk) ** 2).sum(axis=0))
        assert per_dimension_l2.max() <= bound + 1e-6


def test_coefficients_beyond_the_fitted_range_still_round_trip():
    # Fitted on small actions, encoding actions offset by +1.2: their frequency-0 coefficients lie far above the
    # fitted maximum, characters past U+007F whose UTF-8 bytes the fitting data never held. The byte alphabet keeps
    # them encodable (FAST's alphabet, chr(0 .. max - min), would drop those bytes and the sequence come back short).
    scale = 40.0
    fitted = FastActionTokenizer.fit(smooth_chunks(3, 32) * 0.2, vocab_size=400, scale=scale)
    for chunk in smooth_chunks(4, 8) * 0.2 + 1.2:
        shifted = np.rint(dct_matrix(H) @ chunk * scale) - fitted.min_token
        assert shifted.min() >= 0 and shifted.max() >= 128  # nothing clipped; a two-byte character
        actions, valid = fitted.decode(fitted.encode(chunk), H, D)
        assert valid
        assert np.sqrt(((actions - chunk) ** 2).sum(axis=0)).max() <= math.sqrt(H) * 0.5 / scale + 1e-6


def test_fit_is_deterministic_to_the_byte(tmp_path, train_chunks):
    for name in ("a", "b"):
        FastActionTokenizer.fit(train_chunks.copy(), vocab_size=VOCAB, scale=10.0).save(tmp_path / name)
    for file in (FAST_TOKENIZER_FILE, FAST_SETTINGS_FILE):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    # And it depends on the data: other chunks give another vocabulary.
    FastActionTokenizer.fit(smooth_chunks(5, 64), vocab_size=VOCAB, scale=10.0).save(tmp_path / "c")
    assert (tmp_path / "c" / FAST_TOKENIZER_FILE).read_bytes() != (
        tmp_path / "a" / FAST_TOKENIZER_FILE
    ).read_bytes()


def test_save_load_round_trip(tmp_path, tokenizer):
    tokenizer.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [FAST_TOKENIZER_FILE, FAST_SETTINGS_FILE]
    )  # no temp files
    settings = json.loads((tmp_path / FAST_SETTINGS_FILE).read_text())
    assert (settings["scale"], settings["min_token"], settings["horizon"], settings["action_dim"]) == (
        10.0,
        tokenizer.min_token,
        H,
        D,
    )
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(tmp_path / FAST_TOKENIZER_FILE)).get_vocab_size() == tokenizer.vocab_size
    loaded = FastActionTokenizer.load(tmp_path)
    assert loaded.vocab_size == tokenizer.vocab_size
    for chunk in smooth_chunks(6, 8):
        ids = tokenizer.encode(chunk)
        assert loaded.encode(chunk) == ids
        np.testing.assert_array_equal(loaded.decode(ids, H, D)[0], tokenizer.decode(ids, H, D)[0])


def test_invalid_sequences_decode_to_zeros_and_are_flagged(tokenizer):
    bpe = tokenizer.bpe
    zeros = np.zeros((H, D), np.float32)
    ids = tokenizer.encode(smooth_chunks(7, 1)[0])
    one_char = chr(-tokenizer.min_token)  # the coefficient 0
    cases = {
        "empty": [],
        "one id short": ids[:-1],
        "a multiple of D, one row short": bpe.encode(one_char * ((H - 1) * D)).ids,
        "one row long": bpe.encode(one_char * ((H + 1) * D)).ids,
        "id past the vocabulary": [*ids, tokenizer.vocab_size],
        "negative id": [*ids[:-1], -1],
        # H * D characters, the last a lone UTF-8 lead byte (0xC3 is the byte character 'Ã'): FAST would read the
        # replacement character U+FFFD as the coefficient 65533.
        "bytes that are not UTF-8": [*bpe.encode(one_char * (H * D - 1)).ids, bpe.token_to_id("Ã")],
    }
    for name, bad in cases.items():
        actions, valid = tokenizer.decode(bad, horizon=H, action_dim=D)
        assert not valid, name
        np.testing.assert_array_equal(actions, zeros, err_msg=name)
    # The right count of coefficients is valid: H * D zeros decode to zero actions, flagged valid.
    actions, valid = tokenizer.decode(bpe.encode(one_char * (H * D)).ids, horizon=H, action_dim=D)
    assert valid
    np.testing.assert_allclose(actions, zeros, atol=1e-7)


def test_user_mistakes_raise_config_errors(tmp_path, train_chunks, tokenizer):
    def raises(match: str, call, *args, **kwargs) -> None:
        with pytest.raises(ConfigError, match=match) as info:
            call(*args, **kwargs)
        assert "\n" not in str(info.value)

    raises(
        r"shape \[num_chunks, horizon, action_dim\].*got shape \(10, 7\)",
        FastActionTokenizer.fit,
        train_chunks[0],
    )
    raises(r"got list", FastActionTokenizer.fit, train_chunks.tolist())
    nan = train_chunks.copy()
    nan[3, 2, 1] = np.nan
    raises(r"non-finite value \(nan\).*index \(3, 2, 1\)", FastActionTokenizer.fit, nan)
    raises(
        r"vocab_size must exceed the 256 byte characters.*got 200", FastActionTokenizer.fit, train_chunks, 200
    )
    raises(r"scale must be a positive number.*got 0", FastActionTokenizer.fit, train_chunks, VOCAB, 0)
    raises(r"got shape \(1, 10, 7\)", tokenizer.encode, train_chunks[:1])
    raises(
        r"fitted on chunks of shape \[10, 7\].*got a chunk of shape \[10, 6\]",
        tokenizer.encode,
        train_chunks[0, :, :6],
    )
    raises(r"horizon must be a positive integer; got 0", tokenizer.decode, [1], 0, D)
    raises(rf"{FAST_TOKENIZER_FILE} is missing", FastActionTokenizer.load, tmp_path / "nowhere")
    tokenizer.save(tmp_path)
    (tmp_path / FAST_SETTINGS_FILE).write_text('{"format": "something else"}')
    raises(r"is not a FAST action tokenizer settings file", FastActionTokenizer.load, tmp_path)
    (tmp_path / FAST_TOKENIZER_FILE).write_text('{"truncated": ')
    raises(r"Could not read the FAST action tokenizer", FastActionTokenizer.load, Path(tmp_path))
