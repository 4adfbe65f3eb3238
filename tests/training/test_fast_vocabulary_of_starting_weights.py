"""A new FAST run started from another run's checkpoint (`--pretrained_checkpoint <run>/checkpoints/step-*
--is_resume false`) reuses that run's vocabulary, byte for byte, instead of fitting one: the weights learnt its ids.
In process, through the training entry's own choice of folder (`train.starting_files_dir`) and the head's
`prepare_files`; no training launch."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from prismatic.conf.train import TrainConfig
from prismatic.util.cli import parse_config

NAMES = ("fast_tokenizer.json", "fast_tokenizer_settings.json")
K, D = 8, 7  # tiny-fast+mx-toy's chunk: tiny-oft's 8 actions of the toy data's 7 numbers
OPTIONS = {"vocab_size": 512, "scale": 10.0, "fit_chunks": 64, "max_decode_tokens": 64}


def chunks(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.cumsum(rng.normal(0.0, 0.15, (n, K, D)), axis=1), -1.0, 1.0)


def config(*flags: str) -> TrainConfig:
    return parse_config(TrainConfig, ["--vla.type", "tiny-fast+mx-toy", "--trackers", "jsonl", *flags])


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    """A FAST run's folder as training leaves it: the vocabulary beside its checkpoints."""
    from prismatic.models.action_heads.fast import FastActionTokenizer

    run = tmp_path / "old"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    FastActionTokenizer.fit(chunks(0, 64), vocab_size=OPTIONS["vocab_size"], scale=10.0).save(run)
    return run


def prepare(new_run: Path, base: Path | None, asked: list[int]) -> None:
    """What train() does with the head's files on a new run (one rank)."""
    from prismatic.models.action_heads.fast.files import prepare_vocabulary
    from prismatic.models.action_heads.fast.options import FastOptions
    from prismatic.util.dist import DistInfo

    def sample(n: int) -> np.ndarray:
        asked.append(n)
        return chunks(1, n)

    one = DistInfo(rank=0, local_rank=0, world_size=1, num_nodes=1, device=torch.device("cpu"))
    prepare_vocabulary(
        new_run, sample, one, FastOptions(**OPTIONS), resumed=False, timeout=timedelta(seconds=10), base=base
    )


def test_a_checkpoint_s_run_vocabulary_is_reused_by_a_new_run(old_run: Path, tmp_path: Path) -> None:
    from prismatic.training.train import starting_files_dir

    checkpoint = old_run / "checkpoints" / "step-000002"
    cfg = config("--pretrained_checkpoint", str(checkpoint), "--is_resume", "false")
    # The checkpoint's run wins over the folder the base VLM came from (its weights are the ones trained).
    vlm = SimpleNamespace(run_files_dir=tmp_path / "some-base-export")
    assert starting_files_dir(cfg, vlm) == old_run.resolve()
    new_run, asked = tmp_path / "new", []
    prepare(new_run, starting_files_dir(cfg, vlm), asked)
    assert asked == []  # nothing fitted
    assert all((new_run / n).read_bytes() == (old_run / n).read_bytes() for n in NAMES)


def test_without_starting_weights_of_a_fast_run_the_vocabulary_is_fitted(
    old_run: Path, tmp_path: Path
) -> None:
    from prismatic.models.action_heads.fast import FastActionTokenizer
    from prismatic.training.train import starting_files_dir

    # A checkpoint file outside any checkpoints/ folder: the folder holding it (here one without a vocabulary).
    loose = tmp_path / "loose" / "step-000002.pt"
    loose.parent.mkdir()
    loose.write_bytes(b"")
    cfg = config("--pretrained_checkpoint", str(loose), "--is_resume", "false")
    assert starting_files_dir(cfg, SimpleNamespace()) == loose.parent.resolve()
    new_run, asked = tmp_path / "new", []
    prepare(new_run, starting_files_dir(cfg, SimpleNamespace()), asked)
    assert asked == [OPTIONS["fit_chunks"]]
    expected = tmp_path / "expected"
    FastActionTokenizer.fit(chunks(1, 64), vocab_size=OPTIONS["vocab_size"], scale=10.0).save(expected)
    assert all((new_run / n).read_bytes() == (expected / n).read_bytes() for n in NAMES)
    # No checkpoint: the --vla.base_vlm run or export the model was loaded from (None for a plain base VLM).
    assert starting_files_dir(config(), SimpleNamespace(run_files_dir=old_run)) == old_run
    assert starting_files_dir(config(), SimpleNamespace()) is None
    # Continuing the checkpoint's own run (--is_resume true) reads that run's files as a resume: no base.
    resumed = config("--pretrained_checkpoint", str(old_run / "checkpoints" / "step-000002"))
    assert starting_files_dir(resumed, SimpleNamespace()) is None
