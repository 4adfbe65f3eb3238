"""Chunks that did not decode (FAST's zeros) reach the offline evaluation's summary: the FAST head marks them in
`HeadPrediction.valid`, `EvalMetrics` counts them per dataset and overall (through the all-reduce packing), and
`format_summary` shows them; heads whose answers always decode leave the key out.

Expected counts are read off the hand-written validity masks below.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from prismatic.inference.evaluation import EvalMetrics, evaluate_frames, format_summary

K, A = 2, 3  # chunk size, action width


def frames(names: list[str]) -> list[dict]:
    return [
        {
            "dataset_name": name,
            "image": np.zeros((8, 8, 3), np.uint8),
            "views": {},
            "instruction": f"task {i}",
            "action": np.zeros((K, A), np.float32),
            "raw_action": np.full((K, A), 0.5, np.float32),
        }
        for i, name in enumerate(names)
    ]


class MarkingPolicy:
    """A chunk policy whose head reports which rows decoded: row i of the stream is invalid iff i is in `invalid`
    (None: a head that reports nothing)."""

    is_chunked = True
    views = ("primary",)
    action_spec = SimpleNamespace(proprio_dim=0)

    def __init__(self, invalid: set[int] | None) -> None:
        self.invalid, self.seen = invalid, 0

    def decode_batch(self, images, instructions, unnorm_key=None, *, proprio=None):
        rows = range(self.seen, self.seen + len(images))
        self.seen += len(images)
        valid = None if self.invalid is None else np.array([i not in self.invalid for i in rows])
        actions = np.zeros((len(images), K, A))
        return SimpleNamespace(token_ids=np.zeros((len(images), 0), np.int64), actions=actions, valid=valid)


def test_invalid_chunks_are_counted_per_dataset_and_overall() -> None:
    names = ["a", "b", "a", "a", "b"]  # stream rows 0..4, decoded in batches of 2 (the last batch has one)
    metrics = EvalMetrics(["a", "b"], A, chunk_size=K, has_tokens=False)
    evaluated = evaluate_frames(MarkingPolicy({1, 2, 4}), frames(names), metrics, batch_size=2)
    assert evaluated == 5
    summary = metrics.summary()
    # invalid rows 1 (b), 2 (a), 4 (b): a 1 of 3, b 2 of 2.
    assert summary["datasets"]["a"]["invalid_chunks"] == 1
    assert summary["datasets"]["b"]["invalid_chunks"] == 2
    assert summary["overall"]["invalid_chunks"] == 3
    # The zeros are scored like any prediction: |0 - 0.5| everywhere.
    assert summary["overall"]["l1_mean"] == pytest.approx(0.5)

    # What all_reduce sends and reads back keeps the counts (one rank: the identity).
    packed = metrics._packed()
    again = EvalMetrics(["a", "b"], A, chunk_size=K, has_tokens=False)
    again._unpack(packed * 2)  # as if two ranks had seen the same frames
    assert again.summary()["overall"]["invalid_chunks"] == 6
    assert again.summary()["datasets"]["b"]["invalid_chunks"] == 4

    table = format_summary(summary).splitlines()
    assert table[0].split()[-1] == "invalid"
    assert [line.split()[-1] for line in table[2:5]] == ["1", "2", "3"]  # a, b, overall


def test_a_head_that_reports_no_validity_has_no_invalid_key() -> None:
    metrics = EvalMetrics(["a"], A, chunk_size=K, has_tokens=False)
    evaluate_frames(MarkingPolicy(None), frames(["a", "a", "a"]), metrics, batch_size=2)
    summary = metrics.summary()
    assert "invalid_chunks" not in summary["overall"] and "invalid_chunks" not in summary["datasets"]["a"]
    assert "invalid" not in format_summary(summary).splitlines()[0]
    # All valid is a count of 0, not an absent key.
    metrics = EvalMetrics(["a"], A, chunk_size=K, has_tokens=False)
    evaluate_frames(MarkingPolicy(set()), frames(["a", "a"]), metrics, batch_size=2)
    assert metrics.summary()["overall"]["invalid_chunks"] == 0


def test_the_fast_head_marks_the_rows_that_did_not_decode() -> None:
    """The real FAST head on the tiny VLM whose LM head favours EOS: every row ends at once (an empty sequence,
    invalid), and `valid` says so row by row, beside the head's running counts."""
    from prismatic.models import build_vlm
    from prismatic.models.action_heads import ActionSpec, DecodeRequest, build_action_head
    from prismatic.models.action_heads.fast import FastActionTokenizer
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.prompt import action_prompt_ids

    torch.manual_seed(0)
    vlm = build_vlm("tiny-vit+tiny-llama")
    options = {"vocab_size": 300, "scale": 10.0, "fit_chunks": 64, "max_decode_tokens": 4}
    vlm.attach_action_modules(ActionSpec(head="fast", chunk_size=K, action_dim=A, head_options=options))
    vlm.eval()
    tokenizer = vlm.llm_backbone.tokenizer
    with torch.no_grad():
        lm_head = vlm.llm_backbone.llm.get_output_embeddings()
        biased = torch.nn.Linear(lm_head.in_features, lm_head.out_features, bias=True)
        biased.weight.copy_(lm_head.weight)
        biased.bias.zero_()
        biased.bias[tokenizer.eos_token_id] = 100.0
        vlm.llm_backbone.llm.lm_head = biased
    rng = np.random.default_rng(0)
    chunks = np.clip(np.cumsum(rng.normal(0.0, 0.15, (64, K, A)), axis=1), -1.0, 1.0)
    head = build_action_head(vlm.action_spec, ActionTokenizer(tokenizer), vlm.num_prefix_tokens)
    head.use_vocabulary(FastActionTokenizer.fit(chunks, vocab_size=300, scale=10.0))
    texts = ["pick", "push it"]
    _, height, width = vlm.vision_backbone.default_image_resolution
    predicted = head.predict(
        vlm,
        DecodeRequest(
            prompt_ids=[action_prompt_ids(tokenizer, vlm.llm_backbone.prompt_builder_fn, t) for t in texts],
            pixel_values=torch.zeros((2, 3, height, width)),
            proprio=None,
            action_dim=A,
            pad_id=tokenizer.pad_token_id,
            eos_id=tokenizer.eos_token_id,
            device=torch.device("cpu"),
            constrained=True,
        ),
    )
    assert predicted.valid is not None and predicted.valid.tolist() == [False, False]
    assert (predicted.normalized == 0).all() and (head.invalid_count, head.predicted_count) == (2, 2)
