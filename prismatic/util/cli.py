"""Command-line entry points: flags -> a config dataclass, `--help` from the fields' comments, and every user
mistake answered in one paragraph with exit code 2, also under torchrun.

Every script in `vla_scripts/` is written as

    @entry_point
    def main(argv: list[str] | None = None) -> int:
        cfg = parse_config(MyConfig, argv, doc=__doc__)
        ...
        return 0

and so gets the same flag grammar, help and error handling:

- `--name value` or `--name=value`; nested fields as `--vla.learning_rate 1e-4`. Everything up to the next
  `--flag` is the value, so negative numbers are values (`--vla.learning_rate -1e-4`).
- Values are read as YAML (`1e-4`, `true`, `null`, `[a, b]`), except that text and path fields keep the text
  as typed (`--run_id 007` stays "007"). A boolean flag alone means true; a field with `metadata={"bare": v}`
  alone means v (`--resume` = `--resume latest`). A list field takes one or more values:
  `--trackers jsonl wandb`, `--trackers jsonl,wandb` or `--trackers [jsonl, wandb]` (never five characters).
- A choice-registry field (`--vla.type <preset>`) picks the preset whose values are the defaults of its fields;
  `--vla.*` flags alone override the default preset.
- `--config_path file.yaml` reads fields from a YAML file (e.g. a run's `config.yaml`); flags override it.
  `--plugins a.b` imports modules first (`prismatic.models.registry.import_plugins`).
- Help: a field's one-line description is its inline comment, or the docstring under it; a comment above a
  field that has one of those opens a group of flags titled by that comment (above a field without either, the
  comment is the field's description).

Mistakes (wrong type, unknown or missing field, malformed or missing config file, a list for a single value,
an unknown choice) raise `ConfigError` naming the field, the value, the expected type and where it came from;
`entry_point` prints it as one paragraph (once per node), records it for torchrun's failure summary
(`TORCHELASTIC_ERROR_FILE`, the file torch's `@record` writes) and exits 2 without a traceback. Range checks live
in the config dataclasses' `__post_init__`, so they also fail here, before any heavy import.

Why not draccus' own argparse layer: it reads `--lr -1e-4` as two flags, `--trackers jsonl` as five characters,
`--run_id 007` as the number 7, needs `--vla.type` before any `--vla.*` flag, and answers mistakes with tracebacks.
Decoding into the dataclasses (types, choice registries, `__post_init__`) is still draccus'.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import json
import operator
import os
import shutil
import sys
import textwrap
import time
import tokenize
import traceback
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from prismatic.util.errors import ConfigError, did_you_mean

T = TypeVar("T")
P = ParamSpec("P")

USAGE_ERROR = 2  # exit code of a user mistake (argparse's convention)
CONFIG_PATH = "config_path"
CHOICE_KEY = "type"  # draccus' key naming a choice-registry subclass
HELP_FLAGS = ("-h", "--help")
NULL_WORDS = ("null", "none", "~")  # what sets an optional field to None on the command line
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


# ======================================================================================================
# Fields of a config class, as the command line names them
# ======================================================================================================


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

    @property
    def required(self) -> bool:
        return self.default is MISSING


@dataclass(frozen=True)
class _ChoiceField:
    """A choice-registry field (`vla: VLAConfig`): its `--<prefix>.type` picks the subclass."""

    prefix: str  # dotted path of the field, e.g. "vla"
    base: Any  # the registry class
    default: str | None  # the default subclass's name


def _choice_base(annotation: Any) -> Any:
    """The registry class when `annotation` is a draccus choice registry, else None."""
    from draccus.choice_types import ChoiceRegistryBase

    inner, _ = _unwrap_optional(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, ChoiceRegistryBase) else None


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return MISSING


def _choice_fields(cls: type, prefix: str = "") -> list[_ChoiceField]:
    """The choice-registry fields of `cls` and its nested plain dataclasses."""
    hints = typing.get_type_hints(cls)
    found = []
    for field in dataclasses.fields(cls):
        annotation = hints[field.name]
        base = _choice_base(annotation)
        if base is not None:
            default = _default_of(field)
            name = base.get_choice_name(type(default)) if default not in (MISSING, None) else None
            found.append(_ChoiceField(prefix + field.name, base, name))
        elif dataclasses.is_dataclass(annotation):
            found += _choice_fields(annotation, f"{prefix}{field.name}.")
    return found


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
        name = prefix + field.name
        annotation = hints[field.name]
        help_text, heading = docs.get(field.name, ("", None))
        group = heading or group
        base = _choice_base(annotation)
        if base is not None:
            known = list(base.get_known_choices())
            default = _default_of(field)
            chosen = choices.get(name) or (
                base.get_choice_name(type(default)) if default not in (MISSING, None) else MISSING
            )
            type_help = (
                f"{help_text.rstrip('.') or 'the preset'}; its values are the --{name}.* defaults below"
            )
            flags.append(Flag(f"{name}.{CHOICE_KEY}", str, chosen, type_help, group, tuple(known)))
            if chosen is not MISSING:
                flags += _flags(base.get_choice_class(chosen), choices, f"{name}.", group)
        elif dataclasses.is_dataclass(annotation):
            flags += _flags(annotation, choices, f"{name}.", group)
        else:
            flags.append(
                Flag(name, annotation, _default_of(field), help_text, group, bare=field.metadata.get("bare"))
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
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    body = next((node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)), None)
    if body is None:
        return {}

    def whole_line_comment(line: int) -> bool:
        return line in comments and lines[line - 1].lstrip().startswith("#")

    docs: dict[str, tuple[str, str | None]] = {}
    for i, node in enumerate(body.body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        inline = [
            comments[n] for n in range(node.lineno, end + 1) if n in comments and not whole_line_comment(n)
        ]
        below = body.body[i + 1] if i + 1 < len(body.body) else None
        docstring = (
            below.value.value
            if isinstance(below, ast.Expr)
            and isinstance(below.value, ast.Constant)
            and isinstance(below.value.value, str)
            else ""
        )
        above: list[str] = []
        line = node.lineno - 1
        while whole_line_comment(line):
            above.insert(0, comments[line])
            line -= 1
        help_text = " ".join(" ".join(inline).split()) or " ".join(inspect.cleandoc(docstring).split())
        if help_text:
            docs[node.target.id] = (help_text, " ".join(above) or None)
        else:  # no help of its own: the comment above describes the field (draccus' reading)
            docs[node.target.id] = (" ".join(above), None)
    return docs


# ======================================================================================================
# Types: what a value must look like
# ======================================================================================================


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        return functools.reduce(operator.or_, args), optional
    return annotation, False


def _sequence_item(annotation: Any) -> Any:
    """The item type of a `tuple[X, ...]` / `list[X]` annotation, else None."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and len(args) == 1:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def describe_type(annotation: Any) -> str:
    """How a value of `annotation` is written, for help and error messages."""
    inner, optional = _unwrap_optional(annotation)
    item = _sequence_item(inner)
    if item is not None:
        text = f"a list of {_SCALAR_WORDS.get(item, 'values')} (e.g. a,b or [a, b])"
    else:
        text = _SCALAR_TEXT.get(inner, f"a {getattr(inner, '__name__', inner)}")
    return f"{text}, or null" if optional else text


_SCALAR_TEXT = {
    int: "an integer (a whole number such as 8)",
    float: "a number (such as 0.5 or 1e-4)",
    bool: "true or false",
    str: "a single text value",
    Path: "a single path",
}
_SCALAR_WORDS = {int: "integers", float: "numbers", bool: "booleans", str: "text values", Path: "paths"}
_METAVAR = {int: "INT", float: "FLOAT", bool: "[BOOL]", str: "TEXT", Path: "PATH"}


def _metavar(flag: Flag) -> str:
    if flag.choices:
        return "ID"
    inner, _ = _unwrap_optional(flag.type)
    item = _sequence_item(inner)
    if item is not None:
        return f"{_METAVAR.get(item, 'VALUE')} [...]"
    return _METAVAR.get(inner, "VALUE")


def _show(value: Any) -> str:
    """A value as the user wrote it (YAML-ish), for messages and defaults."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


# ======================================================================================================
# Parsing
# ======================================================================================================


@dataclass(frozen=True)
class _Given:
    """One value for a flag and where it came from."""

    value: Any  # the text(s) from the command line, or the YAML value from the config file
    source: str  # "on the command line" / "in config file 'x.yaml'"
    from_text: bool  # command-line text, not yet read as YAML


def parse_config(
    config_class: type[T], argv: Sequence[str] | None = None, *, doc: str | None = None, plugins: bool = True
) -> T:
    """Parse `argv` (default `sys.argv[1:]`) into `config_class` with this module's flag grammar.

    `-h` / `--help` prints `doc` (the script's docstring, with its examples) and every flag, then exits 0.

    Args:
        config_class: the config dataclass (may nest dataclasses and choice registries).
        argv: the arguments, without the program name.
        doc: the text printed above the flags by `--help`.
        plugins: import `--plugins` / `$PRISMATIC_PLUGINS` modules first (they may register presets).

    Raises:
        ConfigError: any mistake, in one paragraph naming field, value, expected type and source.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if plugins:
        from prismatic.models.registry import import_plugins

        args = import_plugins(args)
    if any(token in HELP_FLAGS for token in args):
        try:  # `--vla.type X --help` shows X's values as the defaults
            help_choices = _resolve_choices(config_class, _split_args(args), {}, "")
        except ConfigError:
            help_choices = None
        print(format_help(config_class, doc, help_choices))
        raise SystemExit(0)
    pairs = _split_args(args)
    file_data, file_source = _read_config_file(pairs)
    choices = _resolve_choices(config_class, pairs, file_data, file_source)

    flags = {flag.name: flag for flag in config_flags(config_class, choices)}
    given: dict[str, _Given] = {}
    if file_data:
        _flatten_file(file_data, flags, file_source, "", given)
    for name, values in pairs:
        if name == CONFIG_PATH:
            continue
        if name not in flags:
            raise ConfigError(
                f"Unknown flag --{name} (on the command line).{did_you_mean(f'--{name}', [f'--{n}' for n in flags])}"
                " Run with --help to list every flag."
            )
        given[name] = _Given(values, "on the command line", from_text=True)

    missing = [flag for name, flag in flags.items() if flag.required and name not in given]
    if missing:
        listed = "; ".join(f"--{f.name} ({f.help})" if f.help else f"--{f.name}" for f in missing)
        raise ConfigError(
            f"Missing required flag{'s' if len(missing) > 1 else ''}: {listed}. Run with --help for an example."
        )

    raw: dict[str, Any] = {}
    for name, item in given.items():
        value = _coerce(flags[name], item)
        node = raw
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    for choice in _choice_fields(config_class):
        node = raw
        for part in choice.prefix.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and CHOICE_KEY not in node:
            node[CHOICE_KEY] = choices[choice.prefix]  # `--vla.lr` alone overrides the default preset
    return _decode(config_class, raw)


def _split_args(args: list[str]) -> list[tuple[str, list[str]]]:
    """`--name v1 v2 --other=v` -> [("name", ["v1", "v2"]), ("other", ["v"])]: a flag's value is everything up to
    the next `--flag`, so `-1e-4` is a value, not a flag."""
    pairs: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token in HELP_FLAGS:
            continue
        if not token.startswith("--") or token == "--":
            hint = (
                "flags start with two dashes (--name value)"
                if token.startswith("-") and token != "--"
                else "every value follows its flag, as in --name value"
            )
            raise ConfigError(
                f"Unexpected argument '{token}' (on the command line): {hint}. Run with --help."
            )
        name, eq, value = token[2:].partition("=")
        if eq:
            pairs.append((name, [value]))
            continue
        values = []
        while i < len(args) and not args[i].startswith("--") and args[i] not in HELP_FLAGS:
            if _looks_like_short_flag(args[i]):
                raise ConfigError(
                    f"Unexpected argument '{args[i]}' after --{name} (on the command line): flags start with two "
                    "dashes (--name value). Run with --help."
                )
            values.append(args[i])
            i += 1
        pairs.append((name, values))
    return pairs


def _looks_like_short_flag(token: str) -> bool:
    """`-lr` is a mistyped flag; `-1e-4`, `-inf` and `-` are values."""
    if not token.startswith("-") or len(token) < 2:
        return False
    try:
        float(token)
    except ValueError:
        return token[1].isalpha()
    return False


def _read_config_file(pairs: list[tuple[str, list[str]]]) -> tuple[dict[str, Any], str]:
    """The `--config_path` file's mapping ({} without one) and its source text for messages."""
    paths = [values for name, values in pairs if name == CONFIG_PATH]
    if not paths:
        return {}, ""
    values = paths[-1]
    if len(values) != 1 or not values[0]:
        raise ConfigError(
            f"--config_path needs one file name (on the command line), got {len(values)} values. Example: "
            "--config_path configs/tiny-toy.yaml."
        )
    path = Path(values[0]).expanduser()
    source = f"in config file '{path}'"
    if not path.exists():
        raise ConfigError(
            f"--config_path '{path}' does not exist. Pass the path of a YAML file of field values."
        )
    if not path.is_file():
        raise ConfigError(f"--config_path '{path}' is a folder, not a file. Pass the path of a YAML file.")
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark, context = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        if context is not None and getattr(e, "context", None):  # e.g. where an unclosed [ was opened
            problem += f" ({e.context} started at line {context.line + 1})"
        raise ConfigError(
            f"--config_path '{path}' is not valid YAML{where}: {problem}. Fix the file (a mapping of field names "
            "to values, as in configs/tiny-toy.yaml)."
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config_path '{path}' cannot be read: {e}.") from None
    if data is None:
        return {}, source
    if not isinstance(data, dict):
        raise ConfigError(
            f"--config_path '{path}' holds a {type(data).__name__}, but it must hold a mapping of field names to "
            "values (e.g. `seed: 7`, as in configs/tiny-toy.yaml)."
        )
    return data, source


def _resolve_choices(
    config_class: type, pairs: list[tuple[str, list[str]]], file_data: dict[str, Any], file_source: str
) -> dict[str, str]:
    """Prefix -> chosen subclass name for every choice-registry field: command line, else file, else default."""
    chosen: dict[str, str] = {}
    for choice in _choice_fields(config_class):
        key = f"{choice.prefix}.{CHOICE_KEY}"
        name, source = choice.default, ""
        node: Any = file_data
        for part in choice.prefix.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and CHOICE_KEY in node:
            name, source = node[CHOICE_KEY], file_source
        for flag, values in pairs:
            if flag == key:
                if len(values) != 1:
                    raise ConfigError(
                        f"--{key} takes one preset id (on the command line), got {len(values)}: "
                        f"{' '.join(values) or 'none'}."
                    )
                name, source = values[0], "on the command line"
        known = list(choice.base.get_known_choices())
        if name is None:
            raise ConfigError(f"--{key} is required: one of {', '.join(known)}.")
        if not isinstance(name, str) or name not in known:
            raise ConfigError(
                f"Unknown --{key} '{_show(name)}'.{did_you_mean(str(name), known)} Valid choices: "
                f"{', '.join(known)} ({source})."
            )
        chosen[choice.prefix] = name
    return chosen


def _flatten_file(
    data: Mapping[str, Any], flags: Mapping[str, Flag], source: str, prefix: str, out: dict[str, _Given]
) -> None:
    """Config-file mapping -> dotted leaves in `out`; unknown keys and non-mappings for groups are errors."""
    groups = {name.rsplit(".", 1)[0] for name in flags if "." in name}
    groups |= {g.rsplit(".", i)[0] for g in list(groups) for i in range(g.count(".") + 1)}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if name in flags:
            out[name] = _Given(value, source, from_text=False)
        elif name in groups:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"'{name}' {source} is {_show(value)}, but it must be a mapping of its fields (e.g. "
                    f"{name}: {{{CHOICE_KEY}: <preset>, ...}})."
                )
            _flatten_file(value, flags, source, f"{name}.", out)
        else:
            known = [n for n in flags if n.startswith(prefix)]
            raise ConfigError(
                f"Unknown field '{name}' {source}.{did_you_mean(name, known)} Run with --help to list every field."
            )


def _coerce(flag: Flag, given: _Given) -> Any:
    """The value of `given` checked against `flag.type`, in the form draccus decodes (YAML-native)."""
    inner, optional = _unwrap_optional(flag.type)
    value = given.value
    label = f"--{flag.name}" if given.from_text else f"'{flag.name}'"
    expected = describe_type(flag.type)
    about = f" ({label}: {flag.help})" if flag.help else ""

    def bad(shown: Any, why: str = "") -> ConfigError:
        return ConfigError(
            f"{label} got {_show(shown)!r} {given.source}, but it must be {expected}{why}.{about}"
        )

    if given.from_text:
        if flag.choices:
            return value[0]
        if not value:
            if inner is bool:
                return True  # a bare boolean flag
            if flag.bare is not None:
                return flag.bare
            raise ConfigError(f"{label} needs a value {given.source}: {expected}.{about}")
        item = _sequence_item(inner)
        if item is None and len(value) > 1:
            raise ConfigError(
                f"{label} takes one value but got {len(value)} {given.source} ({' '.join(value)}): it must be "
                f"{expected}.{about}"
            )
        if item is not None:
            if len(value) == 1 and not value[0].lstrip().startswith("["):
                value = [v.strip() for v in value[0].split(",") if v.strip()]
            elif len(value) == 1:
                value = _yaml_or_text(value[0])
            return _coerce_sequence(item, value, bad)
        text = value[0]
        if text.strip().lower() in NULL_WORDS and (optional or inner not in (str, Path)):
            value = None
        elif inner in (str, Path) and not text.lstrip().startswith(("[", "{")):
            return text  # as typed: "007" stays text, "1.10" is not the number 1.1
        else:
            value = _yaml_or_text(text)

    if value is None:
        if optional:
            return None
        raise bad(None, " (null is not allowed here)")
    item = _sequence_item(inner)
    if item is not None:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        return _coerce_sequence(item, value, bad)
    return _coerce_scalar(inner, value, bad)


def _coerce_sequence(item: Any, value: Any, bad: Callable[..., ConfigError]) -> list[Any]:
    if not isinstance(value, list | tuple):
        value = [value]
    return [_coerce_scalar(item, v, bad) for v in value]


def _coerce_scalar(annotation: Any, value: Any, bad: Callable[..., ConfigError]) -> Any:
    if isinstance(value, list | tuple | dict):
        kind = "a list" if isinstance(value, list | tuple) else "a mapping"
        raise bad(value, f", not {kind}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str | int) and str(value).strip().lower() in TRUE_WORDS + FALSE_WORDS:
            return str(value).strip().lower() in TRUE_WORDS
        raise bad(value)
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise bad(value)
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise bad(value)
    if annotation in (str, Path):
        if isinstance(value, bool):
            raise bad(value)
        return str(value)
    return value  # other annotations (enums, literals, ...) are draccus' to check


def _yaml_or_text(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _decode(config_class: type[T], raw: dict[str, Any]) -> T:
    """draccus' decoding, its errors (including a `ConfigError` from a `__post_init__`) as one `ConfigError`."""
    import draccus

    try:
        return draccus.decode(config_class, raw)
    except Exception as error:
        cause: BaseException | None = error
        for _ in range(16):  # draccus wraps a __post_init__'s error once per nesting level
            if cause is None:
                break
            if isinstance(cause, ConfigError):
                raise cause.with_traceback(None) from None
            cause = cause.__cause__ or cause.__context__
        from draccus.utils import DraccusException

        if not isinstance(error, DraccusException):
            raise
        detail = f" ({error.__cause__})" if error.__cause__ is not None else ""
        raise ConfigError(
            f"{' '.join(str(error).split())}{detail}. Run with --help to list every flag."
        ) from None


# ======================================================================================================
# --help
# ======================================================================================================


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
    column = min(max(len(label) for label in labels.values()) + 2, 44) if labels else 0
    group = None
    for flag in flags:
        if flag.group != group:
            group = flag.group
            out += ["", textwrap.fill(group.rstrip(".:") + ":", width)]
        text = flag.help or ""
        if flag.choices:
            text += f". One of: {', '.join(flag.choices)}"
        if flag.required:
            text += " (required)"
        elif not (
            flag.default is None and "default" in text.lower()
        ):  # the help already says what null means
            text += f" (default: {_show(flag.default)})"
        label = labels[flag.name]
        lines = textwrap.wrap(text.strip(), width - column, break_on_hyphens=False, break_long_words=False)
        lines = lines or [""]
        if len(label) + 1 > column:
            out.append(label)
            out += [" " * column + line for line in lines]
        else:
            out.append(label.ljust(column) + lines[0])
            out += [" " * column + line for line in lines[1:]]
    return "\n".join(out)


# ======================================================================================================
# Entry points: one paragraph, exit 2, recorded for torchrun
# ======================================================================================================


NONZERO_RANK_EXIT_DELAY_S = 10.0  # how long a non-zero local rank lingers after a user error (see below)


def one_paragraph(message: str) -> str:
    """`message` with every run of whitespace (newlines included) as one space."""
    return " ".join(message.split())


def record_error_for_torchrun(message: str, details: str) -> None:
    """Write the error file torchrun's agent reads for its failure summary (`TORCHELASTIC_ERROR_FILE`, set only
    under torchrun), in the format of torch's `ErrorHandler.record_exception`; `details` is what the summary
    shows as the rank's "traceback". Written without importing torch, so a fast failure stays fast."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": details, "timestamp": str(int(time.time()))},
        }
    }
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the summary then says less; the message itself was already printed


def report_user_error(error: ConfigError) -> None:
    """Print `error` as `error: <one paragraph>` on stderr, once per node (local rank 0; every rank of a torchrun
    job meets the same config error), and record it on every rank for torchrun's failure summary."""
    message = one_paragraph(str(error))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    record_error_for_torchrun(f"ConfigError: {message}", f"error: {message}")
    if local_rank != 0:
        # torchrun stops every rank as soon as one exits: a rank that met the mistake first (a loaded machine)
        # would otherwise end the job before local rank 0 has printed it. Rank 0's exit ends this wait.
        time.sleep(NONZERO_RANK_EXIT_DELAY_S)


def entry_point(main: Callable[P, int | None]) -> Callable[P, int]:
    """Decorate a script's `main`: a `ConfigError` becomes one paragraph on stderr and `SystemExit(2)` without a
    traceback; any other exception (a bug) is recorded for torchrun, like torch's `@record`, and keeps its
    traceback. Returns `main`'s exit code (0 for None)."""

    @functools.wraps(main)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            code = main(*args, **kwargs)
        except ConfigError as error:
            report_user_error(error)
            raise SystemExit(USAGE_ERROR) from None
        except Exception as error:
            record_error_for_torchrun(f"{type(error).__name__}: {error}", traceback.format_exc())
            raise
        return 0 if code is None else code

    return wrapper
