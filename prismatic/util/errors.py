"""User-facing errors: one exception type for bad input, and registry look-ups that suggest the closest name.

Entry points catch `ConfigError`, print its one-paragraph message and exit non-zero; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """Bad user input (config value, path, id). The message names the bad value and the valid choices."""


class RankError(ConfigError):
    """A `ConfigError` a rank may meet alone (its GPU ran out of memory at the run's batch size): every rank that
    meets it reports it, where a plain `ConfigError` (the same on every rank) is printed once per node."""


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean 'x'?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def lookup(registry: Mapping[str, T], key: str, what: str) -> T:
    """Fetch `registry[key]`, raising a `ConfigError` that lists the valid keys when it is missing.

    Args:
        registry: the id -> entry mapping.
        key: the id the user gave.
        what: a noun phrase for the message, e.g. "dataset mixture".
    """
    if key in registry:
        return registry[key]
    choices = sorted(registry)
    raise ConfigError(
        f"Unknown {what} '{key}'.{did_you_mean(key, choices)} Valid choices: {', '.join(choices)}."
    )
