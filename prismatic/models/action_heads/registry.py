"""The action-head registry and `ActionSpec`: the torch-free half of the heads, which the config reads.

`ACTION_HEADS` maps each `--vla.action_head` name to its class ("module:Class", imported on first use) and the one
fact the config checks without torch: `chunked` (actions come out as chunks `[chunk_size, action_dim]`, so
`--vla.chunk_size` may exceed 1). A new head is its class plus one `ACTION_HEADS.register(...)` line; a plugin
registers its own class the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from prismatic.util.errors import ConfigError
from prismatic.util.lazy import LazyRegistry

if TYPE_CHECKING:
    from prismatic.models.action_heads.base import ActionHead

ACTION_HEADS = LazyRegistry("action head")
ACTION_HEADS.register("tokens", "prismatic.models.action_heads.tokens:TokenActionHead", chunked=False)
ACTION_HEADS.register("l1-chunk", "prismatic.models.action_heads.l1_chunk:L1ChunkActionHead", chunked=True)


def is_chunked(head: str) -> bool:
    """Whether head `head` predicts chunks of actions (registered with `chunked=True`, the default)."""
    return bool(ACTION_HEADS.fact(head, "chunked", True))


@dataclass(frozen=True)
class ActionSpec:
    """What a VLA's action side looks like; recorded in a run's / export's config.json (`action_model`).

    `proprio_dim` 0 means no proprio input; `action_dim` is the width of one action (7 for OpenVLA's EEF delta +
    gripper); `num_images` camera views are featurised one after the other.
    """

    head: str = "tokens"
    chunk_size: int = 1
    action_dim: int = 7
    proprio_dim: int = 0
    num_images: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "config") -> ActionSpec:
        """Read back `to_dict()`; unknown keys or an unknown head are a ConfigError naming `where`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown action_model keys {unknown}; known: {sorted(known)}.")
        spec = cls(**dict(values))
        ACTION_HEADS.check(spec.head)
        return spec

    @property
    def is_default(self) -> bool:
        return self == ActionSpec(action_dim=self.action_dim)


def build_action_head(spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> ActionHead:
    """The head named by `spec.head` (a ConfigError listing the registered heads when unknown)."""
    return ACTION_HEADS.get_class(spec.head)(spec, action_tokenizer, num_prefix_tokens)


def get_action_head(name: str, action_tokenizer: Any = None, num_prefix_tokens: int = 0) -> ActionHead:
    """Shorthand for a head with a default spec (tests, tools)."""
    return build_action_head(ActionSpec(head=name), action_tokenizer, num_prefix_tokens)
