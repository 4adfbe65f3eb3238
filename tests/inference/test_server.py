"""Tests of the policy server (`vla_scripts/serve.py`, `prismatic/inference/server.py`).

    pytest tests/inference/test_server.py

One real server (a subprocess on a loopback port the OS picked, serving the tiny `policy_run`) answers OpenVLA's client
snippet, the double-encoded form, /metadata, malformed requests and concurrent requests; its answers must equal
`load_policy(policy_run).predict_action` on the same inputs exactly. The batcher, the per-dimension grouping of a
batch and the 500 / 413 paths are tested in process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import json_numpy
import numpy as np
import pytest
import requests
from hand_stats import hand_stats

# Imported before any test patches `json`: numpy.testing's import calls json.loads in a way json_numpy breaks.
from numpy.testing import assert_array_equal
from scripts import import_script
from served import SERVE, served

from prismatic.inference import VLAPolicy, load_policy
from prismatic.inference.server import ActRequest, DynamicBatcher, create_app, predict_batch

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _image(seed: int, height: int = 256, width: int = 256) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _body(obj: Any) -> bytes:
    """A request body encoded as a json_numpy-patched client would (without patching `json` here)."""
    return json_numpy.dumps(obj).encode()


def _post(url: str, body: bytes) -> requests.Response:
    return requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=60)


@pytest.fixture(scope="module")
def policy(policy_run: Path) -> VLAPolicy:
    return load_policy(policy_run)


@pytest.fixture(scope="module")
def server(
    policy_run: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Base URL of a `serve.py` subprocess on `policy_run` (a port the OS picked); killed at teardown."""
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    with served(["--checkpoint", str(policy_run)], log_path) as url:
        request.getfixturevalue("policy")
        yield url


@pytest.fixture
def json_numpy_patched() -> Iterator[None]:
    """`json_numpy.patch()` as OpenVLA's client calls it, undone afterwards (it rebinds the `json` module's
    functions for the whole process)."""
    saved = (json.dumps, json.loads, json.dump, json.load)
    json_numpy.patch()
    try:
        yield
    finally:
        json.dumps, json.loads, json.dump, json.load = saved


GOOD = {"image": _image(0), "instruction": "Pick up the red block", "unnorm_key": "ds_b"}


@pytest.fixture(scope="module")
def good_action(policy: VLAPolicy) -> np.ndarray:
    return policy.predict_action(GOOD["image"], GOOD["instruction"], GOOD["unnorm_key"])


def test_openvla_client_snippet(server: str, policy: VLAPolicy, json_numpy_patched: None) -> None:
    image = _image(1)
    # OpenVLA's documented client, unchanged but for the URL, the unnorm key and a timeout.
    action = requests.post(
        f"{server}/act",
        json={"image": image, "instruction": "do something", "unnorm_key": "ds_a"},
        timeout=60,
    ).json()
    assert isinstance(action, np.ndarray) and action.shape == (7,) and action.dtype == np.float64
    assert_array_equal(action, policy.predict_action(image, "do something", unnorm_key="ds_a"))


def test_double_encoded(server: str, good_action: np.ndarray) -> None:
    response = requests.post(f"{server}/act", json={"encoded": json_numpy.dumps(GOOD)}, timeout=60)
    assert response.status_code == 200
    assert_array_equal(json_numpy.loads(response.json()), good_action)


def test_metadata_and_health(server: str, policy_run: Path) -> None:
    meta = requests.get(f"{server}/metadata", timeout=10).json()
    assert meta == {
        "model_id": "tiny-vit+tiny-llama",
        "source": str(policy_run),
        "device": "cpu",
        "dtype": "float32",
        "unnorm_keys": ["ds_a", "ds_b"],
        "action_dim": {"ds_a": 7, "ds_b": 7},
        "normalized_action_dim": None,
        "action_head": "tokens",
        "chunk_size": 1,
        "num_images": 1,
        "views": ["primary"],
        "proprio_dim": 0,
        "image_size": [64, 64],  # tiny-vit-64px
        "trained_with_image_aug": None,  # the fixture's config.json does not say
        "max_batch_size": 16,
        "max_wait_ms": 5.0,
    }
    health = requests.get(f"{server}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"


BAD_REQUESTS = {
    "not-json": (b"image=1&instruction=x", 400, ["JSON"]),
    "empty-body": (b"", 400, ["JSON"]),
    "json-list": (_body([GOOD["image"], "do it"]), 400, ["object", "list"]),
    "json-string": (_body("do it"), 400, ["object", "str"]),
    "missing-image": (_body({"instruction": "x", "unnorm_key": "ds_a"}), 422, ["image"]),
    "missing-instruction": (_body({"image": GOOD["image"], "unnorm_key": "ds_a"}), 422, ["instruction"]),
    "instruction-too-long": (_body({**GOOD, "instruction": "go " * 2000}), 422, ["instruction", "6000"]),
    "instruction-int": (_body({**GOOD, "instruction": 5}), 422, ["instruction", "string", "int"]),
    "image-float": (_body({**GOOD, "image": GOOD["image"].astype(np.float32)}), 422, ["uint8", "float32"]),
    "image-2d": (_body({**GOOD, "image": GOOD["image"][..., 0]}), 422, ["shape", "(256, 256)"]),
    "image-rgba": (_body({**GOOD, "image": np.zeros((8, 8, 4), np.uint8)}), 422, ["shape", "(8, 8, 4)"]),
    "image-empty": (_body({**GOOD, "image": np.zeros((0, 8, 3), np.uint8)}), 422, ["shape"]),
    "image-list": (_body({**GOOD, "image": GOOD["image"].tolist()}), 422, ["image", "json_numpy", "list"]),
    "image-scalar": (_body({**GOOD, "image": np.uint8(3)}), 422, ["image", "array"]),
    "image-corrupt": (
        b'{"image": {"__numpy__": "%%%", "dtype": "|u1", "shape": [4]}, "instruction": "x"}',
        400,
        ["json-numpy"],
    ),
    "unknown-unnorm-key": (_body({**GOOD, "unnorm_key": "ds_c"}), 422, ["ds_c", "ds_a", "ds_b"]),
    "no-unnorm-key": (
        _body({k: v for k, v in GOOD.items() if k != "unnorm_key"}),
        422,
        ["unnorm_key", "ds_a, ds_b"],
    ),
    "unnorm-key-int": (_body({**GOOD, "unnorm_key": 1}), 422, ["unnorm_key", "string"]),
    "encoded-not-string": (_body({"encoded": {"image": 1}}), 400, ["encoded", "string"]),
    "encoded-extra-field": (
        _body({"encoded": json_numpy.dumps(GOOD), "instruction": "x"}),
        400,
        ["encoded", "only"],
    ),
    "encoded-bad-json": (_body({"encoded": "{not json"}), 400, ["encoded", "JSON"]),
    "encoded-missing-image": (_body({"encoded": json_numpy.dumps({"instruction": "x"})}), 422, ["image"]),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request_is_answered_and_server_goes_on(server: str, good_action: np.ndarray, name: str) -> None:
    body, status, words = BAD_REQUESTS[name]
    response = _post(f"{server}/act", body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    for word in words:
        assert word in error, f"{word!r} not in {error!r}"
    good = _post(f"{server}/act", _body(GOOD))
    assert good.status_code == 200
    assert_array_equal(json_numpy.loads(good.text), good_action)


def test_concurrent_requests_equal_single_calls(server: str, policy: VLAPolicy) -> None:
    instructions = [
        "pick up the can",
        "open the top drawer and put the bowl inside",
        "push",
        "wipe the table",
    ]
    payloads = [
        {
            "image": _image(10 + i, 200 + 8 * i, 256),
            "instruction": instructions[i % 4],
            "unnorm_key": f"ds_{'ab'[i % 2]}",
        }
        for i in range(16)
    ]
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda p: _post(f"{server}/act", _body(p)), payloads))
    for payload, response in zip(payloads, responses, strict=True):
        assert response.status_code == 200, response.text
        expected = policy.predict_action(payload["image"], payload["instruction"], payload["unnorm_key"])
        assert_array_equal(json_numpy.loads(response.text), expected)


def _serve_error(*args: str) -> str:
    """stderr of a `serve.py` run that must fail at start-up with exit code 2."""
    result = subprocess.run(
        [sys.executable, str(SERVE), *args], capture_output=True, text=True, env=ENV, cwd=REPO, timeout=120
    )
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip()
    assert message.startswith("error:") and "Traceback" not in message and "\n\n" not in message, message
    return message


def test_serve_nonexistent_checkpoint_is_one_paragraph() -> None:
    assert "'/nonexistent/run' does not exist" in _serve_error("--checkpoint", "/nonexistent/run")


def test_serve_port_in_use_is_one_paragraph(policy_run: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        message = _serve_error("--checkpoint", str(policy_run), "--port", str(port))
    assert f"127.0.0.1:{port}" in message and "--port" in message


def test_serve_unloadable_checkpoint_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An existing path `load_policy` refuses: its ConfigError is the one-paragraph message (in process, as
    a subprocess would spend seconds importing torch again)."""
    serve_script = import_script("serve")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a checkpoint")
    monkeypatch.setattr(sys, "argv", ["serve.py", "--checkpoint", str(notes), "--port", "0"])
    with pytest.raises(SystemExit) as exit_info:
        serve_script.main()
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("error:") and str(notes) in message and "\n\n" not in message


# --------------------------------------------------------------------------------------------------------------
# In process: the batcher, grouping by action dimension, failures inside a batch, oversized bodies
# --------------------------------------------------------------------------------------------------------------


def test_batcher_takes_what_queued_while_busy_and_waits_for_more() -> None:
    started, release = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def run_batch(items: list[int]) -> list[int]:
        batches.append(items)
        started.set()
        release.wait(10)
        return [2 * item for item in items]

    batcher = DynamicBatcher(run_batch, max_batch_size=4, max_wait_ms=0)
    batcher.start()
    try:
        first = batcher.submit(0)
        assert started.wait(10)
        rest = [batcher.submit(i) for i in range(1, 6)]  # queued while batch [0] runs
        release.set()
        assert [f.result(10) for f in [first, *rest]] == [0, 2, 4, 6, 8, 10]
        assert batches == [[0], [1, 2, 3, 4], [5]]
        assert (batcher.batches_run, batcher.requests_served) == (3, 6)
    finally:
        batcher.stop()

    # With a wait, the second item joins the first one's batch, which closes as soon as it is full: the wait is
    # far longer than any stall between the two submits, and the test never sits through it.
    batches.clear()
    batcher = DynamicBatcher(run_batch, max_batch_size=2, max_wait_ms=600_000)
    batcher.start()
    try:
        futures = [batcher.submit(i) for i in (7, 8)]
        assert [f.result(10) for f in futures] == [14, 16]
        assert batches == [[7, 8]]
    finally:
        batcher.stop()
    assert not batcher.running


def test_batcher_survives_a_failing_batch() -> None:
    calls = []

    def run_batch(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return items

    batcher = DynamicBatcher(run_batch, max_batch_size=8, max_wait_ms=0)
    batcher.start()
    try:
        with pytest.raises(RuntimeError, match="boom"):
            batcher.submit(1).result(10)
        assert batcher.submit(2).result(10) == 2
    finally:
        batcher.stop()


def test_batcher_retries_a_failing_batch_row_by_row() -> None:
    """An item that breaks its batch fails alone; the others of that batch are answered."""
    started, release = threading.Event(), threading.Event()

    def run_batch(items: list[str]) -> list[str]:
        started.set()
        release.wait(10)
        if "bad" in items:
            raise ValueError("bad item")
        return [item.upper() for item in items]

    batcher = DynamicBatcher(run_batch, max_batch_size=8, max_wait_ms=0)
    batcher.start()
    try:
        first = batcher.submit("first")
        assert started.wait(10)
        futures = [batcher.submit(item) for item in ("a", "bad", "b")]  # one batch, queued while busy
        release.set()
        assert first.result(10) == "FIRST"
        assert futures[0].result(10) == "A" and futures[2].result(10) == "B"
        with pytest.raises(ValueError, match="bad item"):
            futures[1].result(10)
        assert batcher.requests_served == 3
    finally:
        batcher.stop()


def test_predict_batch_groups_rows_by_action_dim(policy: VLAPolicy) -> None:
    """A 6-dim and a 7-dim dataset in one batch: `predict_action_batch` decodes one length per call."""
    mixed = VLAPolicy(
        policy.vlm,
        {"ds_a": hand_stats(), "six": hand_stats(action_dim=6)},
        "mixed",
        policy.device,
        policy.dtype,
    )
    requests_ = [
        ActRequest(_image(20), "pick up the can", "ds_a"),
        ActRequest(_image(21), "push the button", "six"),
        ActRequest(_image(22), "open the drawer", "ds_a"),
    ]
    actions = predict_batch(mixed, requests_)
    assert [a.shape for a in actions] == [(7,), (6,), (7,)]
    for request_, action in zip(requests_, actions, strict=True):
        expected = mixed.predict_action(request_.image, request_.instruction, request_.unnorm_key)
        assert_array_equal(action, expected)


def test_failing_batch_answers_500_and_oversized_body_413(
    policy: VLAPolicy, good_action: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    original = policy.predict_action_batch
    calls = []

    def fail_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated device failure")
        return original(*args, **kwargs)

    monkeypatch.setattr(policy, "predict_action_batch", fail_once)
    with TestClient(create_app(policy, max_request_bytes=1_000_000)) as client:
        failed = client.post("/act", content=_body(GOOD))
        assert failed.status_code == 500 and "simulated device failure" in failed.json()["error"]
        ok = client.post("/act", content=_body(GOOD))
        assert ok.status_code == 200
        assert_array_equal(json_numpy.loads(ok.text), good_action)
        big = client.post("/act", content=_body({**GOOD, "image": np.zeros((600, 600, 3), np.uint8)}))
        assert big.status_code == 413 and "exceeds" in big.json()["error"]
        assert client.get("/health").json()["status"] == "ok"


def test_an_empty_token_is_refused(policy: VLAPolicy) -> None:
    """An empty token would let `Authorization: Bearer ` through: `create_app` refuses it (serve.py never reads one)."""
    from prismatic.util.errors import ConfigError

    with pytest.raises(ConfigError, match="auth_token is empty"):
        create_app(policy, auth_token=" ")
