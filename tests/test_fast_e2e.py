"""π0-FAST's action tokens end to end: the tiny FAST preset trained under torchrun (2 processes), then resumed, served,
loaded and evaluated from its run folder, all from one short run (and one resume of it).

The run's vocabulary is fitted by rank 0 and read by both ranks; the test fits it again in this one process from
the same flags and expects the same bytes (the sample depends on the data and the seed, not on the world size).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from train_runs import checkpoints, run_train, tiny_args

K, D, P = 8, 7, 8  # the tiny FAST preset's chunk, the toy data's action and proprio widths
STEPS, SAVE = 4, 2
FIT_CHUNKS = 128
FILES = ("fast_tokenizer.json", "fast_tokenizer_settings.json")


def fast_args(data_root: Path, run_root: Path, run_id: str, *extra: str) -> list[str]:
    args = tiny_args(data_root, run_root, run_id, "--eval.interval", str(STEPS), "--eval.num_batches", "1")
    args[args.index("tiny+mx-toy")] = "tiny-fast+mx-toy"
    args[args.index("--vla.max_steps") + 1] = str(STEPS)
    args[args.index("--save_interval") + 1] = str(SAVE)
    # A decoding cap below a chunk's length: the untrained model never ends its chunks, and validation decodes.
    return [
        *args,
        "--vla.head.fast.fit_chunks",
        str(FIT_CHUNKS),
        "--vla.head.fast.max_decode_tokens",
        "16",
        *extra,
    ]


@pytest.fixture(scope="module")
def fast_run(toy_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_root = tmp_path_factory.mktemp("fast")
    proc = run_train(fast_args(toy_data_root, run_root, "fast"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return run_root / "fast"


def records(run_dir: Path) -> list[dict]:
    from prismatic.training.trackers import read_metrics

    return read_metrics(run_dir)


def test_the_vocabulary_is_fitted_once_from_the_training_data_and_metrics_count_invalid_chunks(
    fast_run: Path, toy_data_root: Path, tmp_path: Path
) -> None:
    from prismatic.conf.train import TrainConfig
    from prismatic.models.action_heads.fast import FastActionTokenizer
    from prismatic.util.cli import parse_config
    from prismatic.vla.datasets.builders import sample_training_chunks

    cfg = parse_config(TrainConfig, fast_args(toy_data_root, tmp_path, "again"))
    chunks = sample_training_chunks(cfg, K, FIT_CHUNKS)
    assert chunks.shape == (FIT_CHUNKS, K, D) and np.abs(chunks).max() <= 1.0
    FastActionTokenizer.fit(chunks, vocab_size=512, scale=10.0).save(tmp_path)
    for name in FILES:
        assert (fast_run / name).read_bytes() == (tmp_path / name).read_bytes(), name

    rows = records(fast_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert {"loss", "action_accuracy"} <= set(rows[0]) and "l1_loss" not in rows[0]
    last = rows[-1]
    assert 0.0 <= last["val/invalid_rate"] <= 1.0 and last["val/l1_loss"] >= 0.0
    assert "val/toy_push/invalid_rate" in last
    spec = json.loads((fast_run / "action_model.json").read_text())
    assert (spec["head"], spec["chunk_size"], spec["head_options"]["fit_chunks"]) == ("fast", K, FIT_CHUNKS)


def test_a_resumed_run_reuses_the_vocabulary_and_reproduces_the_curve(
    fast_run: Path, toy_data_root: Path, tmp_path: Path
) -> None:
    resumed = tmp_path / "fast"
    shutil.copytree(fast_run, resumed)
    shutil.rmtree(checkpoints(resumed)[STEPS])
    written = {name: ((resumed / name).read_bytes(), (resumed / name).stat().st_mtime_ns) for name in FILES}
    proc = run_train(fast_args(toy_data_root, tmp_path, "fast", "--resume"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # Read, never refitted: same bytes, never rewritten.
    assert {
        name: ((resumed / name).read_bytes(), (resumed / name).stat().st_mtime_ns) for name in FILES
    } == written
    assert "FAST vocabulary" not in proc.stderr
    expected, got = records(fast_run), records(resumed)
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for a, b in zip(expected, got, strict=True):
        for key in ("loss", "action_accuracy", "learning_rate", "grad_norm", "val/loss", "val/invalid_rate"):
            assert b.get(key) == a.get(key), (a["step"], key)


def test_the_run_serves_loads_and_evaluates_as_a_fast_policy(fast_run: Path, toy_data_root: Path) -> None:
    import json_numpy
    from fastapi.testclient import TestClient

    import prismatic
    from prismatic.inference.evaluation import EvalSpec, evaluate
    from prismatic.inference.server import create_app

    policy = prismatic.load_policy(fast_run)
    assert policy.head.vocabulary.vocab_size <= 512 and policy.is_chunked
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    proprio = np.linspace(-0.5, 0.5, P)
    chunk = policy.predict_action(image, "pick up the block", unnorm_key="toy_pick_place", proprio=proprio)
    assert chunk.shape == (K, D) and np.isfinite(chunk).all()
    assert (policy.head.predicted_count, 0 <= policy.head.invalid_count <= 1) == (1, True)
    with TestClient(create_app(policy, max_request_bytes=1_000_000)) as client:
        payload = {"image": image, "instruction": "pick up the block", "unnorm_key": "toy_pick_place"}
        answer = client.post("/act", content=json_numpy.dumps({**payload, "proprio": proprio.tolist()}))
        assert answer.status_code == 200
        np.testing.assert_allclose(json_numpy.loads(answer.text), chunk, rtol=1e-5, atol=1e-6)
    summary = evaluate(policy, EvalSpec(toy_data_root, "toy", split="val", batch_size=8, max_frames=8))
    assert summary["overall"]["num_frames"] == 8 and len(summary["overall"]["l1_per_chunk_position"]) == K


def test_an_hf_export_carries_the_vocabulary_and_answers_as_the_run(fast_run: Path, tmp_path: Path) -> None:
    import prismatic
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import load_vla, spec_of
    from prismatic.util.errors import ConfigError

    loaded = load_vla(fast_run)
    out = export_hf_openvla(loaded.vlm, spec_of(loaded.vlm), tmp_path / "hf", norm_stats=loaded.norm_stats)
    for name in FILES:
        assert (out / name).read_bytes() == (fast_run / name).read_bytes(), name
    image = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    proprio = np.linspace(0.5, -0.5, P)
    chunks = [
        prismatic.load_policy(folder).predict_action(image, "push", unnorm_key="toy_push", proprio=proprio)
        for folder in (fast_run, out)
    ]
    np.testing.assert_allclose(chunks[1], chunks[0], rtol=1e-5, atol=1e-6)
    loaded.vlm.run_files_dir = (
        None  # a FAST model not loaded from a folder: nothing to copy its vocabulary from
    )
    with pytest.raises(ConfigError, match="fast_tokenizer.json, fast_tokenizer_settings.json"):
        export_hf_openvla(loaded.vlm, spec_of(loaded.vlm), tmp_path / "hf2", norm_stats=loaded.norm_stats)
