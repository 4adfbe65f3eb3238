"""Each head's own options (`--vla.head.<head>.*`), as plain data the config reads before torch loads.

A head with options registers its options dataclass with it (`ACTION_HEADS.register(..., options="module:Class")`,
a torch-free module); `HeadOptions` is the group `VLAConfig.head` holds, one sub-group per such head, named by the
head with `-` as `_` (`--vla.head.l1_chunk.mlp_blocks 3`). Only the chosen head's values reach its `ActionSpec`
(`head_options`), its module and the run's resume identity; the others are recorded in config.yaml, unused.

Why one sub-group per head rather than one group whose fields change with `--vla.action_head`: the flag set is
fixed before any value is read, so `--vla.action_head flow --vla.head.flow.num_steps 5` parses in any order, from a
flag or a config file, with the command line's ordinary rules; `--help` lists every head's options under its name.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prismatic.models.action_heads.registry import ACTION_HEADS, head_options_class
from prismatic.util.errors import ConfigError


def options_group_name(head: str) -> str:
    """The `--vla.head.<name>` sub-group of head `head` (`l1-chunk` -> `l1_chunk`)."""
    return head.replace("-", "_")


def positive_int(owner: str, name: str, value: Any) -> None:
    """A ConfigError unless `value` is an integer >= 1 (for options classes' `__post_init__`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"--vla.head.{owner}.{name}={value!r} is out of range: it must be an integer >= 1.")


@dataclass
class L1ChunkOptions:
    """OpenVLA-OFT's read-out MLP (`l1-chunk`)."""

    mlp_blocks: int = (
        2  # residual blocks of the read-out MLP after its input layer (OpenVLA-OFT's MLPResNet: 2)
    )

    def __post_init__(self) -> None:
        positive_int("l1_chunk", "mlp_blocks", self.mlp_blocks)


def _head_options_group() -> type:
    """The `HeadOptions` dataclass: one field per registered head with an options class, defaults as defined."""
    fields = []
    for head in ACTION_HEADS:
        cls = head_options_class(head)
        if cls is not None:
            fields.append((options_group_name(head), cls, dataclasses.field(default_factory=cls)))
    group = dataclasses.make_dataclass("HeadOptions", fields)
    group.__module__ = __name__
    group.__doc__ = "Each head's own options, one group per head: only the chosen head's are used."
    return group


# Built from the heads registered when the config layer loads (the built-in ones); a plugin head's options are its
# `ActionSpec.head_options`, given in code.
HeadOptions = _head_options_group()


def chosen_options(group: Any, head: str) -> dict[str, Any]:
    """The options of head `head` in the `HeadOptions` group `group`, as a dict ({} for a head without options)."""
    options = getattr(group, options_group_name(head), None)
    return dataclasses.asdict(options) if options is not None else {}


def preset_head_options(owner: str, defaults: Mapping[str, Mapping[str, Any]]) -> type:
    """`HeadOptions`, or for a preset that sets some heads' options (`register_vla(..., head={"l1_chunk":
    {"mlp_blocks": 3}})`) a subclass whose defaults are those values: a `--vla.head.*` flag then overrides one of
    them and keeps the others, and `--help` shows the preset's values. `owner`: the preset's id, for names.

    Raises:
        ValueError: a group or option that does not exist (a typo in a preset fails at import), or a bad value.
    """
    if not defaults:
        return HeadOptions
    suffix = "".join(c if c.isalnum() else "_" for c in owner)
    groups = {f.name: f.type for f in dataclasses.fields(HeadOptions)}
    fields = []
    for group, values in defaults.items():
        if group not in groups:
            raise ValueError(
                f"VLA preset '{owner}' sets options of head group '{group}'; the groups: {', '.join(groups)}."
            )
        base = groups[group]
        hints = typing.get_type_hints(base)
        unknown = sorted(set(values) - set(hints))
        if unknown:
            raise ValueError(
                f"VLA preset '{owner}' sets unknown {group} options {unknown}; known: {sorted(hints)}."
            )
        base(**values)  # refuses a bad value now
        sub = dataclasses.make_dataclass(
            f"{base.__name__}_{suffix}",
            [(name, hints[name], dataclasses.field(default=value)) for name, value in values.items()],
            bases=(base,),
        )
        sub.__module__, sub.__doc__ = __name__, base.__doc__
        fields.append((group, sub, dataclasses.field(default_factory=sub)))
    cls = dataclasses.make_dataclass(f"HeadOptions_{suffix}", fields, bases=(HeadOptions,))
    cls.__module__, cls.__doc__ = __name__, HeadOptions.__doc__
    return cls
