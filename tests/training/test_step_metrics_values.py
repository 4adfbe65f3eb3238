"""StepMetrics' reported numbers on hand-made per-sample sums: the loss is the mean over micro-batches, every
other metric a ratio of sums over the whole step (per dataset only when there are several), and `reduce` starts
the next step from zero. The head is a stand-in with two ratios, so the expected values are plain arithmetic."""

from __future__ import annotations

import pytest
import torch

from prismatic.training.metrics import StepMetrics


class _Head:
    """What StepMetrics reads from an action head: its sum columns and which ratios of them are reported."""

    columns = ("hits", "tokens", "err")
    ratios = {"loss": ("err", "tokens"), "accuracy": ("hits", "tokens"), "error": ("err", "tokens")}


def _metrics(names):
    return StepMetrics(names, _Head(), torch.device("cpu"))


def _sums(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_loss_is_the_mean_of_micro_batch_losses_and_ratios_pool_all_samples():
    """Three micro-batches of unequal size: loss (0.5 + 1.0 + 3.0) / 3, accuracy 6 hits / 10 tokens."""
    m = _metrics(["only"])
    m.update(torch.tensor(0.5), _sums([[1, 2, 0.5], [2, 3, 1.0]]), ["only", "only"])
    m.update(torch.tensor(1.0), _sums([[3, 4, 2.0]]), ["only"])
    m.update(torch.tensor(3.0), _sums([[0, 1, 4.0]]), ["only"])
    out = m.reduce(torch.tensor(2.5))
    assert out == {"loss": 4.5 / 3, "accuracy": 6 / 10, "error": 7.5 / 10, "grad_norm": 2.5}


def test_one_micro_batch_loss_is_its_own_loss():
    m = _metrics(["only"])
    m.update(torch.tensor(0.75), _sums([[1, 1, 0.0]]), ["only"])
    assert m.reduce()["loss"] == 0.75


def test_a_ratio_with_a_zero_denominator_is_zero_and_a_denominator_of_one_divides_by_one():
    """No action tokens: 0 / max(0, 1) = 0, not NaN; one token: the numerator itself."""
    m = _metrics(["only"])
    m.update(torch.tensor(1.0), _sums([[0, 0, 0.0]]), ["only"])
    assert m.reduce()["accuracy"] == 0.0
    m.update(torch.tensor(1.0), _sums([[1, 1, 0.25]]), ["only"])
    out = m.reduce()
    assert out["accuracy"] == 1.0 and out["error"] == 0.25


def test_an_empty_step_reports_zero_loss():
    assert _metrics(["only"]).reduce()["loss"] == 0.0


def test_per_dataset_figures_only_for_datasets_with_samples():
    """Datasets a (2 samples), b (1 sample), c (none): per-dataset ratios and sample counts by hand."""
    m = _metrics(["a", "b", "c"])
    m.update(torch.tensor(1.0), _sums([[1, 2, 1.0], [0, 1, 3.0], [3, 3, 0.0]]), ["a", "b", "a"])
    out = m.reduce()
    assert out["accuracy"] == 4 / 6 and out["error"] == 4 / 6
    assert out["a/accuracy"] == 4 / 5 and out["a/error"] == 1 / 5 and out["a/samples"] == 2
    assert out["b/accuracy"] == 0 / 1 and out["b/error"] == 3 / 1 and out["b/samples"] == 1
    assert not any(k.startswith("c/") for k in out)
    assert "loss" in out and "a/loss" not in out  # the head's own loss ratio is not reported as a metric


def test_a_single_dataset_reports_no_per_dataset_keys():
    m = _metrics(["only"])
    m.update(torch.tensor(1.0), _sums([[1, 2, 1.0]]), ["only"])
    assert set(m.reduce()) == {"loss", "accuracy", "error"}


def test_reduce_starts_the_next_step_from_zero():
    m = _metrics(["a", "b"])
    m.update(torch.tensor(4.0), _sums([[2, 2, 2.0]]), ["a"])
    m.reduce()
    m.update(torch.tensor(1.0), _sums([[0, 4, 1.0]]), ["b"])
    out = m.reduce()
    assert out["loss"] == 1.0 and out["accuracy"] == 0.0 and out["error"] == 0.25
    assert "a/samples" not in out and out["b/samples"] == 1


def test_unknown_dataset_name_is_refused():
    with pytest.raises(KeyError):
        _metrics(["a"]).update(torch.tensor(1.0), _sums([[1, 1, 1.0]]), ["zz"])


def test_a_dataset_whose_sums_are_all_zero_still_reports_its_samples():
    """Dataset b's one sample has no tokens and no error: it is still reported (0 / max(0, 1) = 0, 1 sample)."""
    m = _metrics(["a", "b"])
    m.update(torch.tensor(1.0), _sums([[1, 2, 1.0], [0, 0, 0.0]]), ["a", "b"])
    out = m.reduce()
    assert out["b/accuracy"] == 0.0 and out["b/error"] == 0.0 and out["b/samples"] == 1
    assert out["a/samples"] == 1


def test_a_started_step_reads_its_own_sums_while_the_next_step_accumulates():
    """`start` hands the step over and begins the next from zero: step 1 read after step 2 was added (what
    `--vla.speed.overlap_steps` does) still gives step 1's figures, and its votes' sums land in its own tensor."""
    m = _metrics(["only"])
    m.update(torch.tensor(0.5), _sums([[1, 2, 0.5]]), ["only"])
    votes1 = torch.tensor([1.0, 0.0], dtype=torch.float64)
    first = m.start(torch.tensor(3.0), also_sum=votes1)
    m.update(torch.tensor(2.0), _sums([[0, 4, 1.0]]), ["only"])
    votes2 = torch.tensor([0.0, 1.0], dtype=torch.float64)
    second = m.start(torch.tensor(4.0), also_sum=votes2)
    assert first.result() == {"loss": 0.5, "accuracy": 1 / 2, "error": 0.5 / 2, "grad_norm": 3.0}
    assert second.result() == {"loss": 2.0, "accuracy": 0 / 4, "error": 1.0 / 4, "grad_norm": 4.0}
    assert votes1.tolist() == [1.0, 0.0] and votes2.tolist() == [0.0, 1.0]
