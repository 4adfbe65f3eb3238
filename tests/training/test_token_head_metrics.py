"""Action accuracy, L1 and per-dataset figures of the tokens head, on logits whose predictions are chosen by hand.

The expected numbers are plain arithmetic written here: OpenVLA's metric rule (finetune.py) is that logit position
`num_prefix_tokens + j - 1` predicts text token j, only label ids above `vocab_size - 257` are action tokens (EOS
and prompt are not), accuracy is exact id matches over action tokens, and L1 is between bin centres, where id t
decodes to centre index `clip(vocab_size - t - 1, 0, 254)` and centre k is `-1 + (k + 0.5) * 2 / 255`.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from prismatic.models.action_heads import ActionSpec, build_action_head
from prismatic.training.metrics import StepMetrics
from prismatic.vla.action_tokenizer import ActionTokenizer

V, P, HIGH = 1000, 3, 5.0  # vocabulary, prefix tokens (patches) after BOS, the chosen logit's value
EOS, PAD = 2, 0


def _center(token_id: int) -> float:
    index = min(max(V - token_id - 1, 0), 254)
    return -1.0 + (index + 0.5) * 2.0 / 255.0


def _ce(target: int, predicted: int) -> float:
    """Cross-entropy of a logit row that is HIGH at `predicted` and 0 elsewhere."""
    return math.log(V + 4 - 1 + math.exp(HIGH)) - (HIGH if target == predicted else 0.0)


# Per sample: text tokens (BOS, 2 prompt ids, 3 action ids, EOS), and what the model predicts for each label.
SAMPLES = [
    # dataset a: one exact, one 2 bins off, one 10 bins off; EOS right (not an action token)
    {"text": [1, 11, 12, 900, 950, 990, EOS], "pred": {900: 900, 950: 952, 990: 980, EOS: EOS}, "ds": "a"},
    # dataset b: one exact, one predicted as a non-action id (decodes to the last bin centre), EOS wrong
    {"text": [1, 13, 14, 800, 760, 999, EOS], "pred": {800: 800, 760: 5, 999: 998, EOS: 7}, "ds": "b"},
    # dataset a, right-padded by one: the pad is ignored
    {"text": [1, 15, 745, 746, 747, EOS], "pred": {745: 745, 746: 746, 747: 747, EOS: EOS}, "ds": "a"},
    # dataset b, the edges: id 744 (digitize index 256) shares the last centre with 745; id V - 257 is supervised
    # but no action token (OpenVLA: ids > vocab_size - 257); V + 2 is a padded-vocabulary row (LLM embeddings are
    # often padded past the tokenizer), which decodes to the first centre
    {
        "text": [1, 16, 744, V - 257, 999, EOS],
        "pred": {744: 745, V - 257: V - 257, 999: V + 2, EOS: EOS},
        "ds": "b",
    },
]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(s["text"]) for s in SAMPLES)
    labels = torch.full((len(SAMPLES), length), -100)
    logits = torch.zeros((len(SAMPLES), P + length, V + 4))
    for row, sample in enumerate(SAMPLES):
        text = sample["text"]
        n_prompt = 3 if len(text) == 7 else 2
        for j in range(n_prompt, len(text)):  # supervised: actions and EOS
            labels[row, j] = text[j]
            logits[row, P + j - 1, sample["pred"][text[j]]] = HIGH
        # unsupervised positions predict something else, which must not count
        logits[row, P, 900] = HIGH if n_prompt == 3 else 0.0
    return logits, labels


def _expected(samples: list[dict]) -> dict[str, float]:
    ce, supervised, correct, actions, l1 = 0.0, 0, 0, 0, 0.0
    for sample in samples:
        for target, predicted in sample["pred"].items():
            ce, supervised = ce + _ce(target, predicted), supervised + 1
            if target > V - 257:
                actions += 1
                correct += target == predicted
                l1 += abs(_center(predicted) - _center(target))
    return {"ce": ce, "supervised": supervised, "correct": correct, "actions": actions, "l1": l1}


@pytest.fixture
def head():
    tokenizer = SimpleNamespace(vocab_size=V)
    return build_action_head(ActionSpec(), ActionTokenizer(tokenizer), P)


def test_per_sample_sums_by_hand(head) -> None:
    logits, labels = _batch()
    sums = head.sums(logits, labels)
    assert head.columns == ("ce_sum", "supervised", "correct", "action_tokens", "l1_sum")
    for row, sample in enumerate(SAMPLES):
        e = _expected([sample])
        assert sums[row, 0].item() == pytest.approx(e["ce"], rel=1e-6)
        assert sums[row, 1:4].tolist() == [e["supervised"], e["correct"], e["actions"]]
        assert sums[row, 4].item() == pytest.approx(e["l1"], rel=1e-12, abs=1e-15)
    # the hand figures themselves: 2 bins and 10 bins off in sample 0; id 5 decodes to the last centre
    assert _expected([SAMPLES[0]])["l1"] == pytest.approx(12 * 2 / 255, rel=1e-12)
    assert _expected([SAMPLES[1]])["l1"] == pytest.approx(abs(_center(5) - _center(760)) + 2 / 255, rel=1e-12)
    # 744 and 745 share the last centre (l1 0); V + 2 decodes to centre 0, as 999 does (l1 0)
    assert _expected([SAMPLES[3]])["l1"] == 0.0 and _expected([SAMPLES[3]])["actions"] == 2


def test_sums_carry_no_autograd_graph(head) -> None:
    """Metrics are bookkeeping: they must not keep the step's activations alive through a graph."""
    logits, labels = _batch()
    assert not head.sums(logits.requires_grad_(True), labels).requires_grad


def test_step_figures_pool_samples_and_split_by_dataset(head) -> None:
    """Two micro-batches (samples 0-1, then 2-3): accuracy and L1 pooled over action tokens, per dataset too."""
    logits, labels = _batch()
    metrics = StepMetrics(["a", "b"], head, torch.device("cpu"))
    sums = head.sums(logits, labels)
    metrics.update(torch.tensor(0.25), sums[:2], ["a", "b"])
    metrics.update(torch.tensor(0.75), sums[2:], ["a", "b"])
    out = metrics.reduce(torch.tensor(1.5))
    everything, a, b = _expected(SAMPLES), _expected(SAMPLES[0::2]), _expected(SAMPLES[1::2])
    assert everything["actions"] == 11 and everything["correct"] == 5
    assert out["loss"] == 0.5 and out["grad_norm"] == 1.5
    assert out["action_accuracy"] == 5 / 11
    assert out["l1_loss"] == pytest.approx(everything["l1"] / 11, rel=1e-12)
    assert out["a/action_accuracy"] == a["correct"] / a["actions"] == 4 / 6
    assert out["b/action_accuracy"] == 1 / 5
    assert out["a/l1_loss"] == pytest.approx(a["l1"] / 6, rel=1e-12)
    assert out["b/l1_loss"] == pytest.approx(b["l1"] / 5, rel=1e-12)
    assert out["a/samples"] == 2 and out["b/samples"] == 2


def test_the_loss_ratio_is_the_models_token_mean(head) -> None:
    """ce_sum / supervised equals the cross-entropy the LLM trains on (mean over supervised tokens)."""
    logits, labels = _batch()
    sums = head.sums(logits, labels).sum(0)
    e = _expected(SAMPLES)
    assert (sums[0] / sums[1]).item() == pytest.approx(e["ce"] / e["supervised"], rel=1e-6)
