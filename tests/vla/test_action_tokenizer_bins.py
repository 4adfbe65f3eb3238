"""The action tokenizer's defaults (OpenVLA: 256 bins on [-1, 1]), the allowed bin counts, decoding of the ids at
both ends of the range, and the text form of one action and of a batch. Ids by hand: id = vocab_size - i where
i = digitize(x, linspace(-1, 1, 256)); the tiny tokenizer's vocab_size is 1024."""

from __future__ import annotations

import numpy as np
import pytest

from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer
from prismatic.vla.action_tokenizer import ActionTokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


def test_defaults_are_openvlas_256_bins_on_minus_one_to_one(tokenizer):
    at = ActionTokenizer(tokenizer)
    assert at.n_bins == 256 and at.min_action == -1.0 and at.max_action == 1.0
    # -1 -> i = 1; 0 -> i = 128; 1 -> i = 256; -0.999 -> i = 1; 0.999 -> i = 255 (edge 254/255 * 2 - 1 = 0.99216)
    assert at.encode_to_ids(np.array([-1.0, 0.0, 1.0, -0.999, 0.999])).tolist() == [1023, 896, 768, 1023, 769]
    assert at.action_token_begin_idx == 1024 - 257


@pytest.mark.parametrize("bins", [2, 1023])
def test_smallest_and_largest_bin_counts_are_accepted(tokenizer, bins):
    at = ActionTokenizer(tokenizer, bins=bins)
    assert at.encode_to_ids(np.array([-1.0, 1.0])).tolist() == [1023, 1024 - bins]


@pytest.mark.parametrize("bins", [1, 1024, 0])
def test_bin_counts_outside_two_to_vocab_size_are_refused(tokenizer, bins):
    with pytest.raises(ValueError, match="bins"):
        ActionTokenizer(tokenizer, bins=bins)


def test_decoding_the_end_ids_gives_the_end_bin_centres(tokenizer):
    """id 1024 (index 0, below the range) and 1023 both decode to the first centre, 768 to the last."""
    at = ActionTokenizer(tokenizer, bins=256)
    decoded = at.decode_ids(np.array([1024, 1023, 768, 700]))
    np.testing.assert_allclose(decoded, [-1 + 1 / 255, -1 + 1 / 255, 1 - 1 / 255, 1 - 1 / 255], atol=1e-12)


def test_text_form_of_one_action_and_of_a_batch(tokenizer):
    at = ActionTokenizer(tokenizer, bins=256)
    one = at(np.array([-1.0, 1.0]))
    assert one == tokenizer.decode([1023, 768])
    batch = at(np.array([[-1.0, 1.0], [0.0, 0.0]]))
    assert batch == [tokenizer.decode([1023, 768]), tokenizer.decode([896, 896])]
