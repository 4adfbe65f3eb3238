"""Lazy package attributes: a package re-exports names whose modules import heavy libraries (timm,
transformers) only when a name is first used, so `import prismatic.models` and `--help` stay fast."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, lazy: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` that imports `lazy[name]` (a module path) on first access to `name`."""

    def __getattr__(name: str) -> Any:
        if name in lazy:
            return getattr(importlib.import_module(lazy[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
