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
from hand_stats import hand_stats

from prismatic.models.action_heads import ActionSpec
from prismatic.run_layout import ACTION_MODEL_FILE

BASE_VLM = "tiny-vit+tiny-llama"


def write_run_folder(
    folder: Path,
    norm_stats: Mapping[str, Any] | None,
    base_vlm: str = BASE_VLM,
    seed: int = 0,
    action_spec: ActionSpec | None = None,
) -> Path:
    """Build `base_vlm` (random weights from `seed`) and write it as a training run folder; returns the folder.
    With `action_spec`, the model carries that action side (head, proprio projector, camera views) as a run trained
    with it does: its modules' weights in the checkpoint, the spec in `action_model.json`."""
    from prismatic.models import build_vlm

    torch.manual_seed(seed)
    vlm = build_vlm(base_vlm)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"vla": {"type": "tiny+mx-toy", "base_vlm": base_vlm}}))
    if action_spec is not None:
        vlm.attach_action_modules(action_spec)
        (folder / ACTION_MODEL_FILE).write_text(json.dumps(action_spec.to_dict()))
    weights = {key: getattr(vlm, key).state_dict() for key in vlm.all_module_keys}
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


OFT_SPEC = ActionSpec(head="l1-chunk", chunk_size=4, action_dim=7, proprio_dim=8, num_images=2)


@pytest.fixture(scope="session")
def oft_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny OpenVLA-OFT-shaped run folder: l1-chunk head (chunks of 4), 8 proprio numbers, two camera views
    (primary, wrist), one dataset's statistics ("only") with a proprio range to normalise by."""
    stats = hand_stats()
    q01, q99 = [-1.0 - 0.1 * d for d in range(8)], [1.0 + 0.2 * d for d in range(8)]
    stats["proprio"] |= {"q01": q01, "q99": q99, "min": [v - 1 for v in q01], "max": [v + 1 for v in q99]}
    root = tmp_path_factory.mktemp("policy_run_oft")
    return write_run_folder(root / "run", {"only": stats}, action_spec=OFT_SPEC)
