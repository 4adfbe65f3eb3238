"""Keeping secrets (the Hugging Face token) out of everything a run writes: config files, W&B, logs.

A secret reaches a run in three ways: the config object (`TrainConfig.hf_token`), the command line
(`--hf_token hf_...`, which W&B records as the run's arguments) and the environment (`HF_TOKEN`, which nothing
here writes). `redact_config` blanks the first, `redact_argv` the second. The token itself is only ever passed to
`huggingface_hub` / `transformers` calls.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# Config fields (at any nesting level) and flags (`--<name>`, `--<prefix>.<name>`) whose values are secrets.
SECRET_FIELDS = frozenset({"hf_token"})
REDACTED = "<redacted>"


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Copy of a (nested) config dict with every secret field set to None (so a saved config stays re-usable:
    the token then comes from the environment or HF's token store)."""
    return {
        key: None if key in SECRET_FIELDS else (redact_config(value) if isinstance(value, Mapping) else value)
        for key, value in config.items()
    }


def _is_secret_flag(arg: str) -> bool:
    return arg.startswith("--") and arg[2:].split("=", 1)[0].rsplit(".", 1)[-1] in SECRET_FIELDS


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with the value of every secret flag (`--hf_token X` or `--hf_token=X`) replaced by `<redacted>`."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        if redact_next:
            out.append(REDACTED)
            redact_next = False
        elif _is_secret_flag(arg) and "=" in arg:
            out.append(f"{arg.split('=', 1)[0]}={REDACTED}")
        else:
            out.append(arg)
            redact_next = _is_secret_flag(arg)
    return out


@contextlib.contextmanager
def argv_redacted() -> Iterator[None]:
    """Within the block, `sys.argv` has its secret values redacted (for libraries that record the command line,
    such as W&B's run metadata); restored afterwards."""
    original = sys.argv
    sys.argv = [original[0], *redact_argv(original[1:])] if original else original
    try:
        yield
    finally:
        sys.argv = original
