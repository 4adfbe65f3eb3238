"""OpenVLA's action discretisation: exact ids, round-trip error, clipping."""

from __future__ import annotations

import numpy as np
import pytest

from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer
from prismatic.vla.action_tokenizer import ActionTokenizer


@pytest.fixture(scope="module")
def action_tokenizer() -> ActionTokenizer:
    return ActionTokenizer(load_tiny_tokenizer(), bins=256, min_action=-1, max_action=1)


def test_exact_ids_hand_computed(action_tokenizer):
    # Edges e_k = -1 + 2k/255. digitize gives i with e_{i-1} <= x < e_i (i = 256 at x = 1); id = 1024 - i.
    # x=-1 -> i=1; x=0 -> e_127 = -1/255 <= 0 < e_128 -> i=128; x=0.5 -> k <= 191.25 -> i=192; x=1 -> 256.
    ids = action_tokenizer.encode_to_ids(np.array([-1.0, 0.0, 0.5, 1.0]))
    assert ids.tolist() == [1023, 896, 832, 768]
    assert action_tokenizer.action_token_begin_idx == 1024 - 257
    assert (ids > action_tokenizer.action_token_begin_idx).all()


def test_decode_is_bin_centre(action_tokenizer):
    decoded = action_tokenizer.decode_ids(np.array([896, 1023, 768]))
    np.testing.assert_allclose(decoded, [0.0, -1 + 1 / 255, 1 - 1 / 255], atol=1e-12)


def test_round_trip_error_below_half_bin(action_tokenizer):
    x = np.random.default_rng(0).uniform(-1, 1, size=(1000, 7))
    err = np.abs(action_tokenizer.decode_ids(action_tokenizer.encode_to_ids(x)) - x)
    assert err.max() < (2 / 255) / 2 + 1e-9


def test_clipping(action_tokenizer):
    ids = action_tokenizer.encode_to_ids(np.array([-5.0, 7.0]))
    assert ids.tolist() == [1023, 768]


def test_action_ids_are_reserved_tokens_no_text_produces(action_tokenizer):
    tok = action_tokenizer.tokenizer
    text_ids = tok("In: What action should the robot take to wipe the table?\nOut: xyz 123 ÿ").input_ids
    assert max(text_ids) <= action_tokenizer.action_token_begin_idx


def test_tiny_tokenizer_is_rebuilt_identically():
    from prismatic.models.backbones.llm.tiny_tokenizer import TINY_TOKENIZER_PATH, build_tiny_tokenizer_json

    assert build_tiny_tokenizer_json() == TINY_TOKENIZER_PATH.read_text()
