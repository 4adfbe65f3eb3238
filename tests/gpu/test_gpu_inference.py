"""The policy and the server on the GPU in bf16: `predict_action` with and without the KV cache, and
`prismatic/inference/server.py` (what `vla_scripts/serve.py` runs) answering OpenVLA's client payload; frames
normalised on the device as on the host; compiled static decoding (`--compile_decoding`) choosing the uncompiled
graphs' ids.

The server runs in process (FastAPI's TestClient drives the app and its batcher's lifespan); the request body is
what OpenVLA's client sends (`json_numpy.patch()` + `requests.post(url, json=payload)`: the payload encoded by
`json_numpy.dumps`), and its answer must equal `predict_action` on the same inputs exactly.
"""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import pytest
import torch
from gpu_setup import ACTION_DIM, action_statistics

from prismatic.inference import VLAPolicy
from prismatic.models import load

pytestmark = pytest.mark.gpu

BASE = "tiny-vit+tiny-llama"
INSTRUCTIONS = (
    "pick up the red block",
    "open the drawer",
    "push the can to the left",
    "put the sponge in the sink",
)


def _images(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(count)]


@pytest.fixture(scope="module")
def policy(device: torch.device) -> VLAPolicy:
    """The tiny VLM (random weights, seed 0) as a bf16 policy on the device, with one dataset's statistics."""
    torch.manual_seed(0)
    return VLAPolicy(load(BASE), {"ds": action_statistics()}, BASE, device, torch.bfloat16)


def test_predict_action_bf16_same_ids_with_and_without_kv_cache(
    policy: VLAPolicy, device: torch.device
) -> None:
    assert next(policy.vlm.parameters()).device == device and policy.dtype == torch.bfloat16
    images = _images(len(INSTRUCTIONS))
    cached = policy.decode_batch(images, INSTRUCTIONS, "ds", use_cache=True)
    rerun = policy.decode_batch(images, INSTRUCTIONS, "ds", use_cache=False)
    assert cached.token_ids.shape == (len(INSTRUCTIONS), ACTION_DIM)
    np.testing.assert_array_equal(cached.token_ids, rerun.token_ids)
    for image, instruction in zip(images, INSTRUCTIONS, strict=True):
        alone = policy.decode_batch([image], [instruction], "ds", use_cache=False)
        action = policy.predict_action(image, instruction, unnorm_key="ds")  # KV-cached, one request
        assert action.shape == (ACTION_DIM,) and action.dtype == np.float64
        np.testing.assert_array_equal(action, alone.actions[0])


def test_server_answers_openvla_client_payload(policy: VLAPolicy, device: torch.device) -> None:
    missing = [name for name in ("fastapi", "json_numpy", "httpx") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the server test needs {', '.join(missing)} (pip install fastapi json_numpy httpx)")
    import json_numpy
    from fastapi.testclient import TestClient

    from prismatic.inference.server import create_app

    image = _images(1, seed=1)[0]
    payload = {"image": image, "instruction": "do something", "unnorm_key": "ds"}
    with TestClient(create_app(policy, max_batch_size=4, max_wait_ms=5.0)) as client:
        meta = client.get("/metadata").json()
        assert (meta["device"], meta["dtype"], meta["unnorm_keys"]) == (str(device), "bfloat16", ["ds"])
        response = client.post(
            "/act", content=json_numpy.dumps(payload), headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 200, response.text
        action = json_numpy.loads(response.text)
        health = client.get("/health").json()
    assert isinstance(action, np.ndarray) and action.shape == (ACTION_DIM,) and action.dtype == np.float64
    np.testing.assert_array_equal(action, policy.predict_action(image, "do something", unnorm_key="ds"))
    assert health["status"] == "ok" and health["requests_served"] == 1


def test_frames_are_normalised_on_the_gpu_as_on_the_host(policy: VLAPolicy, device: torch.device) -> None:
    """On CUDA the policy sends uint8 frames at the backbone's size to the device and normalises them there (by
    default): bf16 pixel values equal to the host path's, hence the same actions."""
    size = policy._fast_transform.size_hw
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(len(INSTRUCTIONS))]
    assert policy.pixels_on_device is None
    on_device = policy.pixel_values(images)
    actions = policy.predict_action_batch(images, INSTRUCTIONS, "ds")
    assert (policy._device_pixels is not None) == (device.type == "cuda")
    policy.pixels_on_device = False
    try:
        host = policy.pixel_values(images)
        host_actions = policy.predict_action_batch(images, INSTRUCTIONS, "ds")
    finally:
        policy.pixels_on_device = None
    assert on_device.device == host.device and on_device.dtype == host.dtype == torch.bfloat16
    assert torch.equal(on_device, host)
    np.testing.assert_array_equal(actions, host_actions)


@pytest.mark.parametrize("scope", ["layers", "whole"])
def test_compiled_decoding_gives_the_uncompiled_ids(
    device: torch.device, caplog: pytest.LogCaptureFixture, scope: str
) -> None:
    """`VLAPolicy.compile_decoding`: the prefill and the decode step compiled by inductor (each block, or each
    function whole: `compile_scope`), then captured as CUDA graphs. In FP32 the ids equal the uncompiled graphs'
    (first call and replay; a batch, a single request, and another batch size whose graphs take the batch's
    compiled code with other sizes), and nothing fell back."""
    torch.manual_seed(0)
    policy = VLAPolicy(load(BASE), {"ds": action_statistics()}, BASE, device, torch.float32)
    policy.static_cache = (
        True  # the GPU's default; on CPU (PRISMATIC_GPU_TESTS_ON_CPU=1) the same, without graphs
    )
    images = _images(len(INSTRUCTIONS), seed=2)
    plain = policy.decode_batch(images, INSTRUCTIONS, "ds")
    plain_alone = policy.decode_batch(images[:1], INSTRUCTIONS[:1], "ds")
    plain_three = policy.decode_batch(images[1:], INSTRUCTIONS[1:], "ds")
    policy.compile_decoding, policy.compile_scope = True, scope
    with caplog.at_level(logging.WARNING):
        compiled = policy.decode_batch(images, INSTRUCTIONS, "ds")
        replayed = policy.decode_batch(images, INSTRUCTIONS, "ds")
        alone = policy.decode_batch(images[:1], INSTRUCTIONS[:1], "ds")  # one request: compiled again
        three = policy.decode_batch(images[1:], INSTRUCTIONS[1:], "ds")  # the batch's code, other sizes
    np.testing.assert_array_equal(compiled.token_ids, plain.token_ids)
    np.testing.assert_array_equal(replayed.token_ids, plain.token_ids)
    np.testing.assert_array_equal(alone.token_ids, plain_alone.token_ids)
    np.testing.assert_array_equal(three.token_ids, plain_three.token_ids)
    fallbacks = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("prismatic")
    ]
    assert not fallbacks, fallbacks
