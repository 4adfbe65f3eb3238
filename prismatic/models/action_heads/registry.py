"""The action-head registry and `ActionSpec`: the torch-free half of the heads, which the config reads.

`ACTION_HEADS` maps each `--vla.action_head` name to its class ("module:Class", imported on first use) and the
facts the config reads without torch: `chunked` (actions come out as chunks `[chunk_size, action_dim]`, so
`--vla.chunk_size` may exceed 1), `options` (its options dataclass, "module:Class" in a torch-free module: the
`--vla.head.<head>.*` flags, `options.py`) and `files` (what it keeps beside the statistics, which exports copy).
A new head is its folder plus one `ACTION_HEADS.register(...)` line; a plugin registers its own class the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prismatic.run_layout import FAST_SETTINGS_FILE, FAST_TOKENIZER_FILE
from prismatic.util.errors import ConfigError
from prismatic.util.lazy import LazyRegistry

if TYPE_CHECKING:
    from prismatic.models.action_heads.base import ActionHead

ACTION_HEADS = LazyRegistry("action head")
ACTION_HEADS.register("tokens", "prismatic.models.action_heads.tokens:TokenActionHead", chunked=False)
ACTION_HEADS.register(
    "l1-chunk",
    "prismatic.models.action_heads.l1_chunk:L1ChunkActionHead",
    chunked=True,
    options="prismatic.models.action_heads.options:L1ChunkOptions",
)
ACTION_HEADS.register(
    "flow",
    "prismatic.models.action_heads.flow.head:FlowActionHead",
    chunked=True,
    options="prismatic.models.action_heads.flow.options:FlowOptions",
)
ACTION_HEADS.register(
    "fast",
    "prismatic.models.action_heads.fast.head:FastActionHead",
    chunked=True,
    options="prismatic.models.action_heads.fast.options:FastOptions",
    files=(FAST_TOKENIZER_FILE, FAST_SETTINGS_FILE),
)


def is_chunked(head: str) -> bool:
    """Whether head `head` predicts chunks of actions (registered with `chunked=True`, the default)."""
    return bool(ACTION_HEADS.fact(head, "chunked", True))


def head_files(head: str) -> tuple[str, ...]:
    """The files head `head` keeps beside the statistics (registered `files`: FAST's vocabulary), which a model's
    folder needs beside its weights: exports and LoRA adapters copy them, `ActionHead.load_files` reads them."""
    return tuple(ACTION_HEADS.fact(head, "files", ()))


def copy_head_files(head: str, source: Path | None, out_dir: Path) -> list[Path]:
    """Copy head `head`'s files (`head_files`) from `source`, the folder its model was loaded from, into `out_dir`.

    Returns:
        The files written ([] for a head without files).

    Raises:
        ConfigError: a file is missing from `source` (or the model was not loaded from a folder).
    """
    names = head_files(head)
    missing = [n for n in names if source is None or not (Path(source) / n).is_file()]
    if missing:
        raise ConfigError(
            f"The '{head}' head's model needs {', '.join(names)} beside its weights, but "
            f"{'it was not loaded from a folder' if source is None else f'{source} lacks {missing}'}: export from "
            f"the run folder the model was trained in (it writes them beside dataset_statistics.json)."
        )
    written = []
    for name in names:
        (Path(out_dir) / name).write_bytes((Path(source) / name).read_bytes())
        written.append(Path(out_dir) / name)
    return written


def head_options_class(head: str) -> type | None:
    """The options dataclass registered with head `head` (imported now; a torch-free module), or None."""
    target = ACTION_HEADS.fact(head, "options")
    if isinstance(target, str):
        module, _, name = target.partition(":")
        target = getattr(importlib.import_module(module), name)
    return target


def read_head_options(head: str, given: Mapping[str, Any], where: str = "action spec") -> dict[str, Any]:
    """`given` completed with head `head`'s defaults and checked by its options class; {} for a head without.

    Raises:
        ConfigError: an option the head does not have, or a value its options class refuses.
    """
    cls = head_options_class(head)
    if cls is None:
        if given:
            raise ConfigError(f"{where}: the '{head}' head has no options, but {dict(given)} were given.")
        return {}
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(
            f"{where}: the '{head}' head has no option(s) {unknown}; its options: {', '.join(known)}."
        )
    return asdict(cls(**dict(given)))


@dataclass(frozen=True)
class ActionSpec:
    """What a VLA's action side looks like; recorded in a run's / export's config.json (`action_model`).

    `proprio_dim` 0 means no proprio input; `action_dim` is the width of one action (7 for OpenVLA's EEF delta +
    gripper); `num_images` camera views are featurised one after the other. `head_options` are the head's own
    options (`--vla.head.<head>.*`), completed with its defaults on construction, so a spec read from a file
    written before a head had options equals one built today; `to_dict` leaves them out while they are the
    defaults.
    """

    head: str = "tokens"
    chunk_size: int = 1
    action_dim: int = 7
    proprio_dim: int = 0
    num_images: int = 1
    head_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head in ACTION_HEADS:  # an unknown head is `from_dict`'s (or the builder's) to refuse
            object.__setattr__(
                self, "head_options", read_head_options(self.head, self.head_options, f"head '{self.head}'")
            )

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if self.head not in ACTION_HEADS or self.head_options == read_head_options(self.head, {}):
            del values["head_options"]
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "config") -> ActionSpec:
        """Read back `to_dict()`; unknown keys or an unknown head are a ConfigError naming `where`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown action_model keys {unknown}; known: {sorted(known)}.")
        head = values.get("head", cls.head)
        ACTION_HEADS.check(head)
        options = read_head_options(head, values.get("head_options") or {}, f"{where}: head_options")
        return cls(**{**values, "head_options": options})

    @property
    def is_default(self) -> bool:
        return self == ActionSpec(action_dim=self.action_dim)


def build_action_head(spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> ActionHead:
    """The head named by `spec.head` (a ConfigError listing the registered heads when unknown)."""
    return ACTION_HEADS.get_class(spec.head)(spec, action_tokenizer, num_prefix_tokens)


def get_action_head(name: str, action_tokenizer: Any = None, num_prefix_tokens: int = 0) -> ActionHead:
    """Shorthand for a head with a default spec (tests, tools)."""
    return build_action_head(ActionSpec(head=name), action_tokenizer, num_prefix_tokens)
