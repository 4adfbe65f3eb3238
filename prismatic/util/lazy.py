"""Lazy names, so `import prismatic.models`, the config layer and `--help` stay fast.

- `lazy_getattr`: a package re-exports names whose modules import heavy libraries (timm, transformers) only when
  a name is first used.
- `LazyRegistry`: classes by name whose names can be read without importing the classes. The config layer checks
  `--vla.action_head`, `--vla.train_strategy` and `--trackers` against the registered names while it parses,
  before torch loads; the classes behind those names import torch. So an entry is registered as a
  "package.module:Class" string (imported on first look-up) or, from a plugin, as the class itself, together with
  the few facts the torch-free config checks need (e.g. `chunked=False`):

      ACTION_HEADS = LazyRegistry("action head")
      ACTION_HEADS.register("tokens", "prismatic.models.action_heads.tokens:TokenActionHead", chunked=False)
      "tokens" in ACTION_HEADS            # True, imports nothing
      ACTION_HEADS.get_class("tokens")    # the class (a ConfigError with did-you-mean for an unknown name)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from prismatic.util.errors import lookup


def import_file(module_name: str, path: Path) -> ModuleType:
    """The Python file `path` imported as the module `module_name`, once per process: kept in `sys.modules` (where
    dataclasses and pickling look their module up) from before it runs, and removed again if it raises."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def lazy_getattr(package: str, lazy: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` that imports `lazy[name]` (a module path) on first access to `name`."""

    def __getattr__(name: str) -> Any:
        if name in lazy:
            return getattr(importlib.import_module(lazy[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


class LazyRegistry(Mapping[str, type]):
    """name -> class, in registration order. Iterating, `in` and `len` import nothing; `[name]` imports the class."""

    def __init__(self, what: str) -> None:
        self.what = what  # a noun phrase for error messages, e.g. "action head"
        self._targets: dict[str, str | type] = {}
        self._facts: dict[str, dict[str, Any]] = {}

    def register(self, name: str, target: str | type, **facts: Any) -> None:
        """Add `name` -> `target` ("package.module:Class" or the class) with its light `facts`, once.

        Raises:
            ValueError: `name` is already registered (a second class would silently replace the first).
        """
        if name in self._targets:
            raise ValueError(f"{self.what} '{name}' is registered twice.")
        self._targets[name] = target
        self._facts[name] = dict(facts)

    def fact(self, name: str, key: str, default: Any = None) -> Any:
        """A fact registered with `name` (no import), or `default` when it was not given."""
        return self._facts[name].get(key, default)

    def check(self, name: str) -> None:
        """A ConfigError listing the names (and the closest) when `name` is not registered; imports nothing."""
        lookup(self._targets, name, self.what)

    def get_class(self, name: str) -> type:
        """The class registered as `name` (imported now); a ConfigError as `check` says when unknown."""
        self.check(name)
        return self[name]

    def name_of(self, cls: type) -> str | None:
        """The name `cls` is registered under (None: it is not), importing nothing."""
        path = f"{cls.__module__}:{cls.__qualname__}"
        return next((name for name, target in self._targets.items() if target in (cls, path)), None)

    def __getitem__(self, name: str) -> type:
        target = self._targets[name]
        if isinstance(target, str):
            module, _, attribute = target.partition(":")
            target = getattr(importlib.import_module(module), attribute)
            self._targets[name] = target
        return target

    def __contains__(self, name: object) -> bool:
        return name in self._targets

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)
