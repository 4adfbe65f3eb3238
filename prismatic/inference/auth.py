"""The policy server's shared token: read from an environment variable or a file, never taken as a flag's value
(a command line shows in `ps`, shell histories and job logs), and compared in constant time.

    VLA_TOKEN=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
    python vla_scripts/serve.py --checkpoint runs/<run> --host 0.0.0.0 --auth_token_env VLA_TOKEN
    python vla_scripts/eval_libero.py --policy_url http://gpu-host:8000 --policy_auth_token_env VLA_TOKEN ...

Clients send it as `Authorization: Bearer <token>` (`bearer_header`). Standard library only: the flag checks that
read it run before torch loads.
"""

from __future__ import annotations

import hmac
import os
import re
from pathlib import Path

from prismatic.util.errors import ConfigError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# Visible ASCII: what an HTTP header carries unchanged (no spaces, no line breaks, nothing to encode).
_TOKEN = re.compile(r"[\x21-\x7e]+")


def read_token(env_name: str | None, file: str | Path | None, flag_prefix: str) -> str | None:
    """The token named by `<flag_prefix>_env` (an environment variable's name) or `<flag_prefix>_file` (a file
    holding it; surrounding whitespace is dropped); None when neither is given. Messages never show the token.

    Raises:
        ConfigError: both given, the variable unset or empty, the file missing, unreadable or empty, or a token
            with characters a header can't carry (spaces, non-ASCII).
    """
    if env_name is not None and file is not None:
        raise ConfigError(
            f"Give one of {flag_prefix}_env (an environment variable's name) and {flag_prefix}_file (a file holding "
            "the token), not both."
        )
    if env_name is not None:
        # A secret pasted in place of the name must not be printed back: only a plausible name is echoed.
        shown = f"'{env_name}'" if _ENV_NAME.fullmatch(env_name) else "the value given"
        token = os.environ.get(env_name, "") if env_name else ""
        if not token.strip():
            raise ConfigError(
                f"{flag_prefix}_env names the environment variable holding the token, but {shown} is not set (or "
                f'is empty) here: export it first (export NAME=<token>; python -c "import secrets; '
                f'print(secrets.token_urlsafe(32))" makes one), or use {flag_prefix}_file PATH.'
            )
        where = f"${env_name}" if shown != "the value given" else f"{flag_prefix}_env's variable"
    elif file is not None:
        path = Path(file).expanduser()
        try:
            token = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"{flag_prefix}_file '{file}' can't be read ({type(e).__name__}: {getattr(e, 'strerror', None) or e}): "
                "give a readable file holding the token on one line."
            ) from None
        if not token.strip():
            raise ConfigError(f"{flag_prefix}_file '{file}' is empty: write the token into it (one line).")
        where = f"{flag_prefix}_file '{file}'"
    else:
        return None
    token = token.strip()
    if not _TOKEN.fullmatch(token):
        raise ConfigError(
            f"The token in {where} holds spaces, line breaks or non-ASCII characters, which an HTTP header can't "
            "carry: use printable ASCII only (e.g. secrets.token_urlsafe(32))."
        )
    return token


def bearer_header(token: str) -> dict[str, str]:
    """The request header a client sends: `{"Authorization": "Bearer <token>"}`."""
    return {"Authorization": f"Bearer {token}"}


def token_matches(authorization: bytes | None, token: str) -> bool:
    """Whether an `Authorization` header value carries `token` as its Bearer credentials (scheme matched without
    regard to case, as RFC 9110 says); compared with `hmac.compare_digest`, so timing does not reveal the token."""
    if authorization is None:
        return False
    scheme, _, credentials = authorization.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(credentials.strip(), token.encode())
