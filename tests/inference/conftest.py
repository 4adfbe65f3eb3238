"""Fixtures for inference tests: tiny run folders in the training layout, made without training (seconds).

A run folder here is exactly what `vla_scripts/train.py` writes and `load_policy` reads: `config.json` naming the
base VLM, `checkpoints/step-*.pt` with the consolidated module state dicts, `dataset_statistics.json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

BASE_VLM = "tiny-vit+tiny-llama"


def hand_stats(action_dim: int = 7, shift: float = 0.0) -> dict[str, Any]:
    """Action statistics in OpenVLA's layout with distinct, hand-picked values per dimension (gripper unmasked)."""
    q01 = [-0.5 - 0.1 * d + shift for d in range(action_dim)]
    q99 = [0.25 + 0.2 * d + shift for d in range(action_dim)]
    return {
        "action": {
            "mean": [0.0] * action_dim,
            "std": [1.0] * action_dim,
            "min": [v - 1 for v in q01],
            "max": [v + 1 for v in q99],
            "q01": q01,
            "q99": q99,
            "mask": [True] * (action_dim - 1) + [False],
        },
        "proprio": {k: [0.0] * 8 for k in ("mean", "std", "min", "max", "q01", "q99")},
        "num_transitions": 100,
        "num_trajectories": 5,
    }


def write_run_folder(
    folder: Path, norm_stats: Mapping[str, Any] | None, base_vlm: str = BASE_VLM, seed: int = 0
) -> Path:
    """Build `base_vlm` (random weights from `seed`) and write it as a training run folder; returns the folder."""
    from prismatic.models import build_vlm

    torch.manual_seed(seed)
    vlm = build_vlm(base_vlm)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"vla": {"type": "tiny+mx-toy", "base_vlm": base_vlm}}))
    weights = {
        key: getattr(vlm, key).state_dict() for key in ("vision_backbone", "projector", "llm_backbone")
    }
    (folder / "checkpoints").mkdir(exist_ok=True)
    torch.save({"model": weights}, folder / "checkpoints" / "step-000010-epoch-00-loss=1.0000.pt")
    if norm_stats is not None:
        (folder / "dataset_statistics.json").write_text(json.dumps(norm_stats))
    return folder


@pytest.fixture(scope="module", autouse=True)
def hub_offline() -> Iterator[None]:
    """Any Hub request fails at once instead of retrying without a network."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="session")
def policy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run folder with two datasets' statistics ("ds_a", "ds_b")."""
    root = tmp_path_factory.mktemp("policy_run")
    return write_run_folder(root / "run", {"ds_a": hand_stats(), "ds_b": hand_stats(shift=0.3)})


@pytest.fixture(scope="session")
def single_key_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run folder with one dataset's statistics ("only")."""
    root = tmp_path_factory.mktemp("policy_run1")
    return write_run_folder(root / "run", {"only": hand_stats()})


@pytest.fixture(scope="session")
def fused_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run folder of the fused (DINO + SigLIP) backbone, one dataset ("only")."""
    root = tmp_path_factory.mktemp("policy_run_fused")
    return write_run_folder(root / "run", {"only": hand_stats()}, base_vlm="tiny-dinosiglip+tiny-llama")
