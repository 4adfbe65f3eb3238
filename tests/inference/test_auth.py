"""The server's token rules (`prismatic/inference/auth.py`, `serve.py`'s flags), in process: where the token is read
from, what is refused and how, that no message shows it, how the header is matched, and which hosts are loopback.

    pytest tests/inference/test_auth.py

The server answering 401 / 200 by it is tested on a real server in test_server_oft.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scripts import import_script

from prismatic.inference.auth import bearer_header, read_token, token_matches
from prismatic.util.errors import ConfigError

TOKEN = "k3Y-s3cr3t_T0ken.value~0123456789"


def test_read_from_the_environment_or_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLA_TEST_TOKEN", TOKEN)
    assert read_token("VLA_TEST_TOKEN", None, "--auth_token") == TOKEN
    file = tmp_path / "token.txt"
    file.write_text(f"  {TOKEN}\n")  # as `echo` writes it: surrounding whitespace is not the token's
    assert read_token(None, file, "--auth_token") == TOKEN
    assert read_token(None, None, "--auth_token") is None


@pytest.mark.parametrize(
    ("env_name", "file_text", "env_value", "words"),
    [
        ("VLA_UNSET_TOKEN", None, None, ["'VLA_UNSET_TOKEN' is not set", "--auth_token_file"]),
        ("VLA_TEST_TOKEN", None, "   ", ["'VLA_TEST_TOKEN' is not set (or is empty)"]),
        (None, "\n", None, ["is empty"]),
        ("VLA_TEST_TOKEN", "x", TOKEN, ["not both"]),
        ("VLA_TEST_TOKEN", None, "two words", ["$VLA_TEST_TOKEN", "spaces"]),
        (None, "caf\u00e9-token", None, ["non-ASCII"]),
    ],
    ids=["unset", "blank", "empty-file", "both", "space", "non-ascii"],
)
def test_refusals_name_the_flag_and_what_to_fix(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env_name: str | None,
    file_text: str | None,
    env_value: str | None,
    words: list[str],
) -> None:
    if env_value is not None:
        monkeypatch.setenv("VLA_TEST_TOKEN", env_value)
    monkeypatch.delenv("VLA_UNSET_TOKEN", raising=False)
    file = None
    if file_text is not None:
        file = tmp_path / "token.txt"
        file.write_text(file_text)
    with pytest.raises(ConfigError) as refused:
        read_token(env_name, file, "--auth_token")
    for word in words:
        assert word in str(refused.value), str(refused.value)


def test_a_missing_file_and_a_pasted_secret_are_refused_without_showing_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="can't be read"):
        read_token(None, tmp_path / "absent.txt", "--auth_token")
    # The token itself given where the variable's name goes: the message must not print it back.
    with pytest.raises(ConfigError) as refused:
        read_token(TOKEN, None, "--auth_token")
    assert TOKEN not in str(refused.value) and "the value given is not set" in str(refused.value)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"Bearer {TOKEN}".encode(), True),
        (f"bearer {TOKEN}".encode(), True),  # the scheme's case does not matter (RFC 9110)
        (f"Bearer  {TOKEN} ".encode(), True),
        (f"Bearer {TOKEN}x".encode(), False),
        (f"Bearer {TOKEN[:-1]}".encode(), False),
        (f"Bearer {TOKEN.upper()}".encode(), False),
        (TOKEN.encode(), False),  # no scheme
        (f"Basic {TOKEN}".encode(), False),
        (b"Bearer", False),
        (b"", False),
        (None, False),
    ],
)
def test_header_matching(header: bytes | None, expected: bool) -> None:
    assert token_matches(header, TOKEN) is expected


def test_bearer_header() -> None:
    assert bearer_header(TOKEN) == {"Authorization": f"Bearer {TOKEN}"}


def test_serve_flags_read_the_token_at_parse_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--auth_token_env` of an unset variable exits 2 in one paragraph before anything loads; a set one parses,
    and the config holds the variable's name only."""
    from prismatic.util.cli import parse_config

    serve = import_script("serve")
    monkeypatch.delenv("VLA_UNSET_TOKEN", raising=False)
    monkeypatch.setattr(
        sys, "argv", ["serve.py", "--checkpoint", str(tmp_path), "--auth_token_env", "VLA_UNSET_TOKEN"]
    )
    with pytest.raises(SystemExit) as exit_info:
        serve.main()
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("error:") and "VLA_UNSET_TOKEN" in message and "\n\n" not in message

    monkeypatch.setenv("VLA_TEST_TOKEN", TOKEN)
    cfg = parse_config(
        serve.ServeConfig, ["--checkpoint", str(tmp_path), "--auth_token_env", "VLA_TEST_TOKEN"]
    )
    assert cfg.auth_token() == TOKEN and TOKEN not in repr(cfg)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
    ],
)
def test_which_hosts_are_loopback(host: str, loopback: bool) -> None:
    """`serve.py` warns loudly when it serves a non-loopback host without a token."""
    assert import_script("serve").is_loopback(host) is loopback


def test_eval_flags_read_the_token_at_parse_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`eval_sim.py` / `eval_libero.py`: the token of a `--policy_url` is read when the flags are (an unset variable
    fails before any simulator starts), never kept in the config, and refused beside `--checkpoint`."""
    from prismatic.sim.evaluation import EvalSimConfig
    from prismatic.util.cli import parse_config

    url = ["--policy_url", "http://127.0.0.1:1"]
    monkeypatch.delenv("VLA_UNSET_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="'VLA_UNSET_TOKEN' is not set.*--policy_auth_token_file"):
        parse_config(EvalSimConfig, [*url, "--policy_auth_token_env", "VLA_UNSET_TOKEN"])
    file = tmp_path / "token"
    file.write_text(TOKEN + "\n")
    cfg = parse_config(EvalSimConfig, [*url, "--policy_auth_token_file", str(file)])
    assert cfg.policy_auth_token() == TOKEN and TOKEN not in repr(cfg)
    with pytest.raises(ConfigError, match="--checkpoint"):
        parse_config(EvalSimConfig, ["--checkpoint", str(tmp_path), "--policy_auth_token_file", str(file)])
