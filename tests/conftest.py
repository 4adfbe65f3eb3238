"""Session fixtures shared by the test suite: the toy RLDS datasets (built once) and the tiny tokenizer."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer


def _once_per_run(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, build: Callable[[Path], object]
) -> Path:
    """`build(folder)` once per pytest run, also under `pytest -n` (pytest-xdist's pattern): the first worker to
    need it builds it under a file lock in the workers' shared temp folder, the others wait and reuse it. A build
    that fails leaves nothing behind, so the next worker tries again (and fails the same way)."""
    if worker_id == "master":  # not under xdist
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    from filelock import FileLock

    folder = tmp_path_factory.getbasetemp().parent / name
    done = folder.parent / f"{name}.done"
    with FileLock(str(folder) + ".lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder


@pytest.fixture(scope="session")
def toy_data_root(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A folder holding `toy_pick_place/1.0.0/` and `toy_push/1.0.0/`, built once per test run (seed 0). Tests
    only read it (and the statistics caches the pipeline writes beside each dataset)."""
    from prismatic.vla.datasets.rlds.toy import build_toy_datasets

    return _once_per_run(tmp_path_factory, worker_id, "rlds", lambda root: build_toy_datasets(root, seed=0))


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny byte-level BPE tokenizer (vocab 1024 + `<PAD>` = 1024, BOS 1, EOS 2)."""
    return load_tiny_tokenizer()


@pytest.fixture(scope="session")
def full_run(toy_data_root: Path, tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The uninterrupted reference run: tiny preset, 2 processes, 6 steps of 8 frames, checkpoints at 3 and 6,
    evaluation at 3 and 6 (tests/train_runs.py), built once per test run. Tests copy it before changing it."""
    from train_runs import run_train, tiny_args

    def build(run_root: Path) -> None:
        extra = ("--eval.interval", "3", "--eval.num_batches", "1")
        proc = run_train(tiny_args(toy_data_root, run_root, "full", *extra, trackers=("jsonl", "wandb")))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    return _once_per_run(tmp_path_factory, worker_id, "runs", build) / "full"


# `make test` runs `pytest -n 2 --dist loadfile --no-loadscope-reorder`: a module stays on one worker, so its
# module-scoped fixtures (toy runs, servers, simulators, tiny models) are built once, and modules are handed out in
# collection order, which this hook sorts by the list below (the modules whose set-up takes minutes first, so that
# the many short ones fill both workers at the end instead of one long module finishing alone);
# benchmarks/results/2026-11-29-cpu-test-suite.md and 2026-11-29-cpu-test-suite-cost.md have the measurements.
LONGEST_FIRST = (
    "test_metaworld_learning.py",
    "test_train_e2e.py",
    "test_resume_e2e.py",
    "test_eval_libero.py",
    "test_oft_e2e.py",
    "test_fast_e2e.py",
    "test_flow_e2e.py",
    "test_validation.py",
    "test_new_model_family.py",
    "test_rlds_open_x.py",
    "test_accumulation_numerics.py",
    "test_evaluate.py",
    "test_data_resume.py",
    "test_resume_randomness_e2e.py",
    "test_own_data_doc.py",
    "test_distributed_init.py",
    "test_hf_interop.py",
    "test_cli_errors.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
