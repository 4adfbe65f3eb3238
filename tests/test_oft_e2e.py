"""OpenVLA-OFT's recipe end to end: the tiny preset trained with the l1-chunk head, proprio and K = 8 under torchrun
(FSDP2, 2 processes), then its chunks through Python, the server and offline evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from train_runs import run_train, tiny_args

K = 8
STEPS = 40


@pytest.fixture(scope="module")
def oft_run(toy_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_root = tmp_path_factory.mktemp("oft")
    args = tiny_args(
        toy_data_root,
        run_root,
        "oft",
        "--eval.interval",
        str(STEPS),
        "--eval.num_batches",
        "1",
    )
    args[args.index("tiny+mx-toy")] = "tiny-oft+mx-toy"
    args[args.index("--vla.max_steps") + 1] = str(STEPS)
    args[args.index("--save_interval") + 1] = str(STEPS)
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return run_root / "oft"


def test_l1_loss_falls_and_metrics_are_the_heads(oft_run: Path) -> None:
    from prismatic.training.trackers import read_metrics

    records = read_metrics(oft_run)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    first = np.mean([r["l1_loss"] for r in records[:3]])
    last = np.mean([r["l1_loss"] for r in records[-5:]])
    assert last < 0.85 * first, (first, last)
    # The L1 head's loss is its L1 (micro-batch means in float32 vs the step's float64 ratio of sums).
    assert all(r["loss"] == pytest.approx(r["l1_loss"], rel=1e-5) for r in records)
    assert "action_accuracy" not in records[0] and {f"l1_dim{d}" for d in range(7)} <= set(records[0])
    assert records[-1]["val/loss"] == records[-1]["val/l1_loss"] and "val/toy_push/l1_dim6" in records[-1]
    spec = json.loads((oft_run / "action_model.json").read_text())
    assert spec == {"head": "l1-chunk", "chunk_size": K, "action_dim": 7, "proprio_dim": 8, "num_images": 1}


def test_policy_server_and_evaluation_answer_chunks(oft_run: Path, toy_data_root: Path) -> None:
    import json_numpy
    from fastapi.testclient import TestClient

    import prismatic
    from prismatic.inference.evaluation import EvalSpec, evaluate
    from prismatic.inference.server import create_app

    policy = prismatic.load_policy(oft_run)
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    proprio = np.linspace(-0.5, 0.5, 8)
    chunk = policy.predict_action(image, "pick up the block", unnorm_key="toy_pick_place", proprio=proprio)
    assert chunk.shape == (K, 7) and np.isfinite(chunk).all()

    with TestClient(create_app(policy, max_request_bytes=1_000_000)) as client:
        payload = {"image": image, "instruction": "pick up the block", "unnorm_key": "toy_pick_place"}
        answer = client.post("/act", content=json_numpy.dumps({**payload, "proprio": proprio.tolist()}))
        assert answer.status_code == 200
        served = json_numpy.loads(answer.text)
        assert served.shape == (K, 7)
        np.testing.assert_allclose(served, chunk, rtol=1e-5, atol=1e-6)
        missing = client.post("/act", content=json_numpy.dumps(payload))
        assert missing.status_code == 422 and "proprio" in missing.json()["error"]
        assert client.get("/metadata").json()["chunk_size"] == K

    summary = evaluate(policy, EvalSpec(toy_data_root, "toy", split="val", batch_size=16, max_frames=32))
    overall = summary["overall"]
    assert overall["num_frames"] == 32 and overall["action_token_accuracy"] is None
    positions = overall["l1_per_chunk_position"]
    assert len(positions) == K
    assert np.mean(positions) == pytest.approx(overall["l1_mean"], rel=1e-9)
