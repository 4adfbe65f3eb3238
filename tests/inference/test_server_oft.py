"""`serve.py` on an OpenVLA-OFT-shaped run (l1-chunk head, proprio, two cameras) behind a token.

    pytest tests/inference/test_server_oft.py

One real server (a subprocess, `--auth_token_env`, access log on) starts on the tiny `oft_run`: its warm-up is shaped
as the policy's requests, /metadata names the inputs, /act answers the chunk `load_policy(oft_run)` predicts for
the same views and proprio; requests without the token, with another one or another scheme get 401 and decode
nothing; the token appears nowhere in the server's output. The simulators' server client (`ServerSource`, what
`eval_libero.py --policy_url` drives) sends the views, proprio and token and gets the in-process actions.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import json_numpy
import numpy as np
import pytest
import requests
from conftest import OFT_SPEC
from served import served

from prismatic.inference import VLAPolicy, load_policy
from prismatic.util.errors import ConfigError

TOKEN_ENV = "PRISMATIC_TEST_SERVER_TOKEN"
INSTRUCTION = "put the bowl on the plate"


@pytest.fixture(scope="module")
def token() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def policy(oft_run: Path) -> VLAPolicy:
    return load_policy(oft_run)


@pytest.fixture(scope="module")
def server(
    oft_run: Path, token: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """(base URL, log file) of `serve.py` on `oft_run`, requiring `token` (read from $TOKEN_ENV), access log on."""
    log_path = tmp_path_factory.mktemp("server_oft") / "server.log"
    args = [
        "--checkpoint",
        str(oft_run),
        "--auth_token_env",
        TOKEN_ENV,
        "--access_log",
        "--max_batch_size",
        "4",
    ]
    with served(args, log_path, env={TOKEN_ENV: token}) as url:
        request.getfixturevalue("policy")  # the reference policy loads while the server is up
        yield url, log_path


def _views(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(2)]  # primary, wrist


def _proprio(seed: int) -> np.ndarray:
    return np.random.default_rng(100 + seed).uniform(-1.0, 1.5, 8).astype(np.float32)


def _act(url: str, payload: dict, headers: dict[str, str]) -> requests.Response:
    return requests.post(
        f"{url}/act",
        data=json_numpy.dumps(payload).encode(),
        headers={"Content-Type": "application/json", **headers},
        timeout=120,
    )


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_metadata_names_the_policys_inputs(server: tuple[str, Path], token: str) -> None:
    url, _ = server
    meta = requests.get(f"{url}/metadata", headers=_bearer(token), timeout=30).json()
    assert {k: meta[k] for k in ("action_head", "chunk_size", "num_images", "views", "proprio_dim")} == {
        "action_head": "l1-chunk",
        "chunk_size": OFT_SPEC.chunk_size,
        "num_images": 2,
        "views": ["primary", "wrist"],
        "proprio_dim": 8,
    }
    assert meta["unnorm_keys"] == ["only"] and meta["action_dim"] == {"only": 7}
    assert meta["image_size"] == [64, 64] and meta["max_batch_size"] == 4
    assert token not in str(meta)


def test_act_answers_the_in_process_chunk(server: tuple[str, Path], token: str, policy: VLAPolicy) -> None:
    url, _ = server
    views, proprio = _views(1), _proprio(1)
    response = _act(
        url, {"image": views, "instruction": INSTRUCTION, "proprio": proprio.tolist()}, _bearer(token)
    )
    assert response.status_code == 200, response.text
    chunk = json_numpy.loads(response.text)
    assert chunk.shape == (OFT_SPEC.chunk_size, 7) and chunk.dtype == np.float64
    expected = policy.predict_action(views, INSTRUCTION, "only", proprio=proprio)
    np.testing.assert_allclose(chunk, expected, rtol=1e-5, atol=1e-6)
    # The proprio is read: other numbers, another chunk.
    other = _act(
        url, {"image": views, "instruction": INSTRUCTION, "proprio": (-proprio).tolist()}, _bearer(token)
    )
    assert other.status_code == 200
    assert np.abs(json_numpy.loads(other.text) - chunk).max() > 1e-4, "proprio changed nothing"
    # One view, or no proprio, is refused with what to send.
    one_view = _act(
        url, {"image": views[0], "instruction": INSTRUCTION, "proprio": proprio.tolist()}, _bearer(token)
    )
    assert one_view.status_code == 422 and "2 camera views" in one_view.json()["error"]
    no_proprio = _act(url, {"image": views, "instruction": INSTRUCTION}, _bearer(token))
    assert no_proprio.status_code == 422 and "proprio" in no_proprio.json()["error"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-the-token"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": ""},
    ],
    ids=["none", "wrong-token", "other-scheme", "empty"],
)
def test_requests_without_the_token_get_401_and_decode_nothing(
    server: tuple[str, Path], token: str, headers: dict[str, str]
) -> None:
    url, _ = server
    served_before = requests.get(f"{url}/health", timeout=30).json()["requests_served"]
    payload = {"image": _views(2), "instruction": INSTRUCTION, "proprio": _proprio(2).tolist()}
    refused = [
        _act(url, payload, headers),
        requests.get(f"{url}/metadata", headers=headers, timeout=30),
        requests.get(f"{url}/openapi.json", headers=headers, timeout=30),
    ]
    for response in refused:
        assert response.status_code == 401, response.text
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert "Authorization: Bearer" in response.json()["error"]
    # /health stays open (a liveness probe) and shows that nothing was decoded.
    health = requests.get(f"{url}/health", timeout=30)
    assert health.status_code == 200 and health.json()["requests_served"] == served_before
    # The scheme is case-insensitive (RFC 9110); the token is not.
    assert requests.get(f"{url}/metadata", headers={"Authorization": f"bearer {token}"}, timeout=30).ok
    wrong_case = {"Authorization": f"Bearer {token.swapcase()}"}
    assert requests.get(f"{url}/metadata", headers=wrong_case, timeout=30).status_code == 401


def test_the_token_is_never_logged(server: tuple[str, Path], token: str) -> None:
    url, log_path = server
    assert _act(url, {"image": _views(3), "instruction": "x", "proprio": [0.0] * 8}, _bearer(token)).ok
    assert _act(url, {"image": _views(3), "instruction": "x"}, _bearer(token + "x")).status_code == 401
    log = log_path.read_text()
    # The access log is on and written (requests are logged: method, path, status), the token is not.
    assert '"POST /act HTTP/1.1" 200' in log and '"POST /act HTTP/1.1" 401' in log
    assert "Bearer token required" in log and "Refused POST /act (401)" in log
    assert token[:8] not in log  # not even in part


# --------------------------------------------------------------------------------------------------------------
# The simulators' server client: what `eval_sim.py` / `eval_libero.py --policy_url` ask the server with
# --------------------------------------------------------------------------------------------------------------


def test_sim_client_sends_views_proprio_and_token(
    server: tuple[str, Path], token: str, policy: VLAPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--policy_url` with `--policy_auth_token_env`: the client reads the policy's inputs from /metadata and
    sends both views, the proprio and the token; its chunks are the in-process ones."""
    from prismatic.sim.actions import InProcessSource, PolicyQuery
    from prismatic.sim.evaluation import EvalSimConfig, open_source
    from prismatic.util.cli import parse_config

    url, _ = server
    monkeypatch.setenv("PRISMATIC_TEST_CLIENT_TOKEN", token)
    flags = ["--benchmark", "libero", "--policy_url", url, "--num_envs", "3"]
    cfg = parse_config(EvalSimConfig, [*flags, "--policy_auth_token_env", "PRISMATIC_TEST_CLIENT_TOKEN"])
    assert token not in repr(cfg)  # the config (recorded by the trackers) holds the variable's name only
    queries = [PolicyQuery(tuple(_views(10 + i)), INSTRUCTION, _proprio(10 + i)) for i in range(3)]
    source = open_source(cfg)
    try:
        facts = source.facts
        assert (facts.num_images, facts.proprio_dim, facts.chunk_size) == (2, 8, OFT_SPEC.chunk_size)
        assert facts.image_size == (64, 64) and facts.unnorm_keys == ("only",)
        remote = source.act(queries, "only")  # three concurrent requests: the server may batch them
    finally:
        source.close()
    local = InProcessSource(policy, None).act(queries, "only")
    for got, expected in zip(remote, local, strict=True):
        assert got.shape == (OFT_SPEC.chunk_size, 7)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_token", [False, True], ids=["no-token", "wrong-token"])
def test_sim_client_without_the_token_is_one_paragraph(
    server: tuple[str, Path], with_token: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prismatic.sim.evaluation import EvalSimConfig, open_source
    from prismatic.util.cli import parse_config

    url, _ = server
    flags = ["--benchmark", "libero", "--policy_url", url]
    if with_token:
        monkeypatch.setenv("PRISMATIC_TEST_CLIENT_TOKEN", "not-the-token")
        flags += ["--policy_auth_token_env", "PRISMATIC_TEST_CLIENT_TOKEN"]
    with pytest.raises(ConfigError) as refused:
        open_source(parse_config(EvalSimConfig, flags))
    message = str(refused.value)
    assert "401" in message and "--policy_auth_token_env" in message and "not-the-token" not in message
