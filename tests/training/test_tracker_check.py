"""`check_trackers`: `--trackers wandb` without a W&B login is refused in one paragraph, and every way wandb finds
a key or runs without one lets it through. Each case hands the check its own environment (HOME, WANDB_DIR and
WANDB_CONFIG_DIR in a temp folder), so nothing of the machine's own W&B set-up leaks in. The outcomes are those of
wandb's own look-up (`wandb.sdk.lib.wbauth`, checked by hand for wandb 0.31); that the scripts call it before
torch loads is tested in tests/test_cli_errors.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from prismatic.training.trackers import check_trackers
from prismatic.util.errors import ConfigError

KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 characters, as W&B keys are


def netrc_entry(machine: str) -> str:
    """What `wandb login` appends to ~/.netrc."""
    return f"machine {machine}\n  login user\n  password {KEY}\n"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A user with no W&B set-up at all: an empty home, no WANDB_* variables."""
    for name in ("home", "work"):
        (tmp_path / name).mkdir()
    return {"HOME": str(tmp_path / "home"), "WANDB_DIR": str(tmp_path / "work")}


def refused(trackers: list[str], env: dict[str, str]) -> str | None:
    """The check's message, or None when it lets `trackers` through."""
    try:
        check_trackers(trackers, env)
    except ConfigError as e:
        return str(e)
    return None


def test_no_login_is_one_paragraph_naming_the_three_ways_out(env: dict[str, str]) -> None:
    message = refused(["jsonl", "wandb"], env)
    assert message is not None
    assert "\n" not in message
    for way_out in ("`wandb login`", "WANDB_MODE=offline", "--trackers jsonl"):
        assert way_out in message, message
    assert f"{env['HOME']}/.netrc" in message  # where wandb looked for the key
    assert "api.wandb.ai" in message


def test_trackers_without_wandb_need_no_login(env: dict[str, str]) -> None:
    assert refused(["jsonl"], env) is None
    assert refused([], env) is None


@pytest.mark.parametrize("mode", ["offline", "dryrun", "disabled"])
def test_local_modes_need_no_login(env: dict[str, str], mode: str) -> None:
    assert refused(["wandb"], {**env, "WANDB_MODE": mode}) is None


def test_online_modes_need_one(env: dict[str, str]) -> None:
    for mode in ("online", "shared"):
        assert refused(["wandb"], {**env, "WANDB_MODE": mode}) is not None, mode
    # wandb >= 0.2x ignores WANDB_DISABLED (HF Trainer's old switch): wandb.init still needs a key.
    assert refused(["wandb"], {**env, "WANDB_DISABLED": "true"}) is not None


def test_a_key_in_the_environment_is_a_login(env: dict[str, str]) -> None:
    assert refused(["wandb"], {**env, "WANDB_API_KEY": KEY}) is None
    assert refused(["wandb"], {**env, "WANDB_API_KEY": ""}) is not None  # set but empty: wandb skips it
    token = Path(env["HOME"]) / "token"
    assert refused(["wandb"], {**env, "WANDB_IDENTITY_TOKEN_FILE": str(token)}) is None


@pytest.mark.parametrize(
    ("machine", "base_url", "found"),
    [
        ("api.wandb.ai", None, True),  # `wandb login` against W&B's cloud
        ("api.forge.coreweave.com", None, True),  # newer wandb's default host
        ("example.com", None, False),  # another service's entry
        ("wandb.mylab.org", "https://wandb.mylab.org", True),  # a self-hosted server
        ("api.wandb.ai", "https://wandb.mylab.org", False),  # a cloud key does not log in elsewhere
    ],
)
def test_netrc_entry_for_the_host(
    env: dict[str, str], machine: str, base_url: str | None, found: bool
) -> None:
    (Path(env["HOME"]) / ".netrc").write_text(netrc_entry(machine))
    if base_url is not None:
        env = {**env, "WANDB_BASE_URL": base_url}
    assert (refused(["wandb"], env) is None) is found


def test_netrc_named_by_NETRC(env: dict[str, str], tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.netrc"
    other.write_text(netrc_entry("api.wandb.ai"))
    assert refused(["wandb"], {**env, "NETRC": str(other)}) is None
    assert refused(["wandb"], env) is not None  # ~/.netrc itself holds nothing


def test_an_entry_without_a_key_or_a_broken_file_is_no_login(env: dict[str, str]) -> None:
    netrc = Path(env["HOME"]) / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n")
    assert refused(["wandb"], env) is not None
    netrc.write_text(f"machin api.wandb.ai login user password {KEY}\n")  # a bad token: NetrcParseError
    assert refused(["wandb"], env) is not None  # refused in one paragraph, not a parse traceback


def test_settings_files_as_wandb_offline_and_wandb_login_write_them(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`wandb offline` writes `mode = offline` to ./wandb/settings (the workspace under WANDB_DIR); the global
    file (~/.config/wandb, or WANDB_CONFIG_DIR) may hold mode, base_url or api_key; WANDB_MODE wins over both."""
    workspace = Path(env["WANDB_DIR"]) / "wandb"
    workspace.mkdir()
    (workspace / "settings").write_text("[default]\nmode = offline\n")
    assert refused(["wandb"], env) is None
    assert refused(["wandb"], {**env, "WANDB_MODE": "online"}) is not None
    (workspace / "settings").unlink()

    global_dir = Path(env["HOME"]) / ".config" / "wandb"
    global_dir.mkdir(parents=True)
    (global_dir / "settings").write_text("[default]\nmode = disabled\n")
    assert refused(["wandb"], env) is None
    (global_dir / "settings").write_text(f"[default]\napi_key = {KEY}\n")
    assert refused(["wandb"], env) is None

    config_dir = tmp_path / "wandb_config"
    config_dir.mkdir()
    (config_dir / "settings").write_text("[default]\nbase_url = https://wandb.mylab.org\n")
    moved = {**env, "WANDB_CONFIG_DIR": str(config_dir)}  # the file under ~/.config is no longer read
    assert refused(["wandb"], moved) is not None
    (Path(env["HOME"]) / ".netrc").write_text(netrc_entry("wandb.mylab.org"))
    assert refused(["wandb"], moved) is None
