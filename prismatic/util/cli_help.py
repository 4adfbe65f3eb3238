"""The flags of a config dataclass and its `--help` text: dotted names, types, defaults and one-line
descriptions from the fields' comments, grouped as those comments group them (grammar: `prismatic.util.cli`).

Comments are read with `ast` + `tokenize`, not with draccus' attribute-docstring reader: that one is
line-based, so it misses a field written over several lines (as `ruff format` wraps long ones) and takes that
field's comment for the group title of the next field, which would drop help texts and regroup flags.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import operator
import shutil
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from draccus.utils import default_value, is_choice_type

CHOICE_KEY = "type"  # draccus' key naming a choice-registry subclass


@dataclass(frozen=True)
class Flag:
    """One leaf field of a config: `--<name> value`."""

    name: str  # dotted path, e.g. "vla.learning_rate"
    type: Any  # the resolved annotation
    default: Any  # dataclasses.MISSING when the field is required
    help: str  # one line, from the field's comment or docstring
    group: str  # the group it is listed under in --help
    choices: tuple[str, ...] = ()  # for a choice-registry's `type` key
    bare: Any = None  # the value of the flag given alone (field metadata "bare"), e.g. `--resume` -> "latest"
    switch: bool = False  # an auto / on / off text field that also takes booleans (field metadata "switch")

    @property
    def required(self) -> bool:
        return self.default is MISSING


def config_flags(cls: type, choices: Mapping[str, str] | None = None) -> list[Flag]:
    """Every leaf field of `cls` as a `Flag`, nested dataclasses flattened to dotted names.

    Args:
        cls: the config dataclass.
        choices: choice-registry prefix -> chosen subclass name (e.g. {"vla": "tiny+mx-toy"}); a registry field
            not named here uses its default's subclass.
    """
    return _flags(cls, dict(choices or {}), "", "Options")


def _flags(cls: type, choices: dict[str, str], prefix: str, group: str) -> list[Flag]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    flags: list[Flag] = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        name, annotation = prefix + field.name, hints[field.name]
        help_text, heading = docs.get(field.name, ("", None))
        group = heading or group
        base, _ = unwrap_optional(annotation)
        if is_choice_type(base):
            default = default_value(field)
            chosen = choices.get(name) or (
                base.get_choice_name(type(default)) if default not in (MISSING, None) else MISSING
            )
            type_help = (
                f"{help_text.rstrip('.') or 'the preset'}; its values are the --{name}.* defaults below"
            )
            known = tuple(base.get_known_choices())
            flags.append(Flag(f"{name}.{CHOICE_KEY}", str, chosen, type_help, group, known))
            if chosen is not MISSING:
                flags += _flags(base.get_choice_class(chosen), choices, f"{name}.", group)
        elif dataclasses.is_dataclass(annotation):
            flags += _flags(annotation, choices, f"{name}.", group)
        else:
            bare, switch = field.metadata.get("bare"), bool(field.metadata.get("switch"))
            flags.append(
                Flag(name, annotation, default_value(field), help_text, group, bare=bare, switch=switch)
            )
    return flags


@functools.cache
def field_docs(cls: type) -> dict[str, tuple[str, str | None]]:
    """Field name -> (one-line help, title of the group it opens or None), read from the source of `cls` and of
    its bases (a class made by `dataclasses.make_dataclass`, e.g. a registered preset, has no source of its own).

    The help is the field's inline comment, else the docstring under it; a comment block directly above such a
    field is the title of a new group (above a field with neither, it is the field's help).
    """
    docs: dict[str, tuple[str, str | None]] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_source_docs(klass))
    return docs


def _source_docs(cls: type) -> dict[str, tuple[str, str | None]]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    inline: dict[int, str] = {}  # line -> a comment after code
    whole: dict[int, str] = {}  # line -> a comment alone on its line
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            alone = not token.line[: token.start[1]].strip()
            (whole if alone else inline)[token.start[0]] = token.string.lstrip("#").strip()
    body = ast.parse(source).body[0].body
    docs: dict[str, tuple[str, str | None]] = {}
    for node, below in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        help_text = " ".join(" ".join(inline.get(n, "") for n in lines).split())
        if not help_text and isinstance(below, ast.Expr) and isinstance(below.value, ast.Constant):
            help_text = " ".join(below.value.value.split()) if isinstance(below.value.value, str) else ""
        above, line = [], node.lineno - 1
        while line in whole:
            above.insert(0, whole[line])
            line -= 1
        title = " ".join(above)
        # with no help of its own, the comment above describes the field (draccus' reading)
        docs[node.target.id] = (help_text, title or None) if help_text else (title, None)
    return docs


def unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return functools.reduce(operator.or_, args), len(args) < len(typing.get_args(annotation))
    return annotation, False


def sequence_item(annotation: Any) -> Any:
    """The item type of a `tuple[X, ...]` / `list[X]` annotation, else None."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if (origin is list and len(args) == 1) or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return args[0]
    return None


_SCALAR_TEXT = {
    int: "an integer (a whole number such as 8)",
    float: "a number (such as 0.5 or 1e-4)",
    bool: "true or false",
    str: "a single text value",
    Path: "a single path",
}
_SCALAR_WORDS = {int: "integers", float: "numbers", bool: "booleans", str: "text values", Path: "paths"}
_METAVAR = {int: "INT", float: "FLOAT", bool: "[BOOL]", str: "TEXT", Path: "PATH"}


def describe_type(annotation: Any) -> str:
    """How a value of `annotation` is written, for help and error messages."""
    inner, optional = unwrap_optional(annotation)
    item = sequence_item(inner)
    if item is not None:
        text = f"a list of {_SCALAR_WORDS.get(item, 'values')} (e.g. a,b or [a, b])"
    else:
        text = _SCALAR_TEXT.get(inner, f"a {getattr(inner, '__name__', inner)}")
    return f"{text}, or null" if optional else text


def show_value(value: Any) -> str:
    """A value as the user wrote it (YAML-ish), for messages and defaults."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    return str(value)


def _metavar(flag: Flag) -> str:
    if flag.choices:
        return "ID"
    inner, _ = unwrap_optional(flag.type)
    item = sequence_item(inner)
    return f"{_METAVAR.get(item, 'VALUE')} [...]" if item is not None else _METAVAR.get(inner, "VALUE")


def format_help(config_class: type, doc: str | None, choices: Mapping[str, str] | None = None) -> str:
    """The `--help` text: `doc` (the script's docstring with its examples), then every flag with its one-line
    description and default, grouped as the config's comments group them."""
    width = max(60, min(shutil.get_terminal_size((110, 24)).columns, 120))
    flags = config_flags(config_class, choices)
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "script"
    out = [f"usage: {prog} [--help] [--config_path FILE] [--FLAG VALUE ...]", ""]
    if doc:
        out += [textwrap.dedent(doc).strip(), ""]
    out.append(
        textwrap.fill(
            "Values are read as YAML (1e-4, true, null, [a, b]); text and path flags keep the text as typed. A "
            "boolean flag alone means true; a list flag takes several values (a b, a,b or [a, b]). --config_path "
            "FILE reads fields from a YAML file (e.g. a run's config.yaml) and flags given here override it.",
            width,
        )
    )
    labels = {flag.name: f"  --{flag.name} {_metavar(flag)}" for flag in flags}
    column = min(max(map(len, labels.values())) + 2, 44) if labels else 0
    group = None
    for flag in flags:
        if flag.group != group:
            group = flag.group
            out += ["", textwrap.fill(group.rstrip(".:") + ":", width)]
        text = flag.help + (f". One of: {', '.join(flag.choices)}" if flag.choices else "")
        if flag.required:
            text += " (required)"
        elif not (
            flag.default is None and "default" in text.lower()
        ):  # the help already says what null means
            text += f" (default: {show_value(flag.default)})"
        lines = textwrap.wrap(text.strip(), width - column, break_on_hyphens=False, break_long_words=False)
        label, lines = labels[flag.name], lines or [""]
        if len(label) + 1 > column:
            out += [label, *(" " * column + line for line in lines)]
        else:
            out += [label.ljust(column) + lines[0], *(" " * column + line for line in lines[1:])]
    return "\n".join(out)
