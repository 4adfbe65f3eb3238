"""Session fixtures shared by the test suite: the toy RLDS datasets (built once) and the tiny tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer


@pytest.fixture(scope="session")
def toy_data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding `toy_pick_place/1.0.0/` and `toy_push/1.0.0/`, built once per test session (seed 0)."""
    from prismatic.vla.datasets.rlds.toy import build_toy_datasets

    root = tmp_path_factory.mktemp("rlds")
    build_toy_datasets(root, seed=0)
    return root


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny byte-level BPE tokenizer (vocab 1024 + `<PAD>` = 1024, BOS 1, EOS 2)."""
    return load_tiny_tokenizer()


@pytest.fixture(scope="session")
def full_run(toy_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted reference run: tiny preset, 2 processes, 6 steps of 8 frames, checkpoints at 3 and 6,
    evaluation at 3 and 6 (tests/train_runs.py)."""
    from train_runs import run_train, tiny_args

    run_root = tmp_path_factory.mktemp("runs")
    args = tiny_args(toy_data_root, run_root, "full", "--eval.interval", "3", "--eval.num_batches", "1")
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return run_root / "full"


# `make test` runs `pytest -n 2 --dist loadfile`: a module stays on one worker, so its module-scoped fixtures (toy
# runs, servers, tiny models) are built once. The longest modules are handed out first, so neither worker is left
# running one of them alone at the end.
LONGEST_FIRST = (
    "test_resume_e2e.py",
    "test_train_e2e.py",
    "test_cli_errors.py",
    "test_resume_randomness_e2e.py",
    "test_evaluate.py",
    "test_accumulation_numerics.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
