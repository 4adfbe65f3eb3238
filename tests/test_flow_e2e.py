"""The flow-matching head end to end through `vla_scripts/train.py`: a short run of the tiny flow preset, the same run
resumed from its middle checkpoint, then its run folder as a policy and behind the server.

The flow head draws a time and a noise chunk for every training row and samples with seeded noise at validation, so a
resume reproduces the uninterrupted run (`==`) only if the generators continue where the saved run left them. One
process each: the distributed paths are the other heads' (tests/test_train_e2e.py, tests/test_resume_e2e.py); the
expert's FSDP units are tests/training/test_strategy_builds.py's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from train_runs import checkpoints, consolidated, run_train, tiny_args

K, D, P = 8, 7, 8  # the tiny flow preset's chunk, the toy data's action and proprio widths
STEPS, SAVE = 4, 2


def flow_args(data_root: Path, run_root: Path, *extra: str) -> list[str]:
    args = tiny_args(data_root, run_root, "flow", "--eval.interval", str(SAVE), "--eval.num_batches", "1")
    args[args.index("tiny+mx-toy")] = "tiny-flow+mx-toy"
    args[args.index("--vla.max_steps") + 1] = str(STEPS)
    args[args.index("--save_interval") + 1] = str(SAVE)
    return [*args, "--vla.expected_world_size", "1", "--vla.global_batch_size", "8", *extra]


@pytest.fixture(scope="module")
def runs(toy_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the uninterrupted run, the run resumed at step SAVE from a copy holding no later checkpoint)."""
    root = tmp_path_factory.mktemp("flow")
    proc = run_train(flow_args(toy_data_root, root / "full"), nproc=None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    full = root / "full" / "flow"
    resumed = root / "resumed" / "flow"
    shutil.copytree(full, resumed)
    shutil.rmtree(checkpoints(resumed)[STEPS])
    proc = run_train(flow_args(toy_data_root, root / "resumed", "--resume"), nproc=None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert f"Training steps {SAVE + 1} to {STEPS}" in proc.stderr, proc.stderr[-3000:]
    return full, resumed


def test_a_resumed_flow_run_reproduces_the_uninterrupted_one(runs: tuple[Path, Path], tmp_path: Path) -> None:
    from prismatic.training.trackers import read_metrics

    full, resumed = runs
    expected, got = read_metrics(full), read_metrics(resumed)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    # Every logged figure but the timings, validation's too: it samples chunks from seeded noise, so the held-out L1
    # of the sampled chunks is the same only if that noise is.
    timing = ("time", "_per_s", "memory", "_mb", "_gb")
    for a, b in zip(expected, got, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if not any(part in key for part in timing):
                assert b[key] == a[key], (a["step"], key, a[key], b[key])
    assert {"loss", "learning_rate", "grad_norm", "val/loss", "val/l1_loss"} <= set(expected[SAVE - 1])
    assert expected[-1]["val/l1_loss"] >= 0.0 and expected[-1]["loss"] < expected[0]["loss"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    end_full = consolidated(checkpoints(full)[STEPS], tmp_path / "a")
    end_again = consolidated(checkpoints(resumed)[STEPS], tmp_path / "b")
    expert = [key for key in end_full["model"] if "action_head" in key or "head_module" in key]
    assert expert, sorted(end_full["model"])[:20]  # the expert's weights are in the checkpoint
    assert end_full["model"].keys() == end_again["model"].keys()
    for key, value in end_full["model"].items():
        assert torch.equal(end_again["model"][key], value), key
    for name, moments in end_full["optimizer"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(end_again["optimizer"]["state"][name][key], moments[key]), (name, key)


def test_the_flow_run_is_a_seeded_policy_and_serves_its_chunks(runs: tuple[Path, Path]) -> None:
    import json_numpy
    from fastapi.testclient import TestClient

    import prismatic
    from prismatic.inference.server import create_app

    policy = prismatic.load_policy(runs[1])
    assert policy.action_spec.head == "flow" and policy.is_chunked
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    proprio = np.linspace(-0.5, 0.5, P)
    chunk = policy.predict_action(image, "pick up the block", unnorm_key="toy_pick_place", proprio=proprio)
    assert chunk.shape == (K, D) and np.isfinite(chunk).all()
    again = policy.predict_action(image, "pick up the block", unnorm_key="toy_pick_place", proprio=proprio)
    assert np.array_equal(again, chunk)  # the same seed, the same noise, the same actions
    with TestClient(create_app(policy, max_request_bytes=1_000_000)) as client:
        payload = {"image": image, "instruction": "pick up the block", "unnorm_key": "toy_pick_place"}
        answer = client.post("/act", content=json_numpy.dumps({**payload, "proprio": proprio.tolist()}))
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(json_numpy.loads(answer.text), chunk, rtol=1e-5, atol=1e-6)


def test_both_exports_of_a_flow_run_answer_as_the_run(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """The HF OpenVLA folder and the model-only safetensors folder (`export_hf.py --format hf|safetensors`) hold
    the expert and its options: loaded as policies, they sample the run's chunk from the same seed."""
    from scripts import import_script

    import prismatic

    export = import_script("export_hf")
    checkpoint = str(checkpoints(runs[1])[STEPS])
    for fmt in ("hf", "safetensors"):
        argv = [
            "--checkpoint",
            checkpoint,
            "--out_dir",
            str(tmp_path / fmt),
            "--format",
            fmt,
            "--dtype",
            "float32",
        ]
        assert export.main(argv) == 0
    image = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    proprio = np.linspace(0.5, -0.5, P)
    chunks = [
        prismatic.load_policy(folder).predict_action(image, "push", unnorm_key="toy_push", proprio=proprio)
        for folder in (runs[1], tmp_path / "hf", tmp_path / "safetensors")
    ]
    for fmt, chunk in zip(("hf", "safetensors"), chunks[1:], strict=True):
        assert prismatic.load_policy(tmp_path / fmt).action_spec.head == "flow", fmt
        np.testing.assert_allclose(chunk, chunks[0], rtol=1e-5, atol=1e-6, err_msg=fmt)
