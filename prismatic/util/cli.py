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
  alone means v (`--resume` = `--resume latest`); a speed switch (`metadata={"switch": True}`: auto / on / off)
  also takes true / false and alone means on. A list field takes one or more values:
  `--trackers jsonl wandb`, `--trackers jsonl,wandb` or `--trackers [jsonl, wandb]` (never five characters).
- A choice-registry field (`--vla.type <preset>`) picks the preset whose values are the defaults of its fields;
  `--vla.*` flags alone override the default preset.
- `--config_path file.yaml` reads fields from a YAML file (e.g. a run's `config.yaml`); flags override it.
  `--plugins a.b` imports modules first (`prismatic.models.registry.import_plugins`).
- A config class's `MOVED_FLAGS` (old dotted name -> new) reads a file written before a field moved under its old
  name (a run folder's config.yaml from before `vla.speed`); typed as a flag, the old name is answered with the new.
- Help (`prismatic.util.cli_help`): a field's one-line description is its inline comment, or the docstring under
  it; a comment above a field that has one of those opens a group of flags titled by that comment (above a field
  without either, the comment is the field's description).

Mistakes (wrong type, unknown or missing field, malformed or missing config file, a list for a single value,
an unknown choice) raise `ConfigError` naming the field, the value, the expected type and where it came from;
`entry_point` (`prismatic.util.cli_report`) prints it as one paragraph (once per node), records it for
torchrun's failure summary and exits 2 without a traceback. Range checks live in the config dataclasses'
`__post_init__`, so they also fail here, before any heavy import.

What is draccus': decoding the checked values into the dataclasses (`draccus.decode`: nesting, choice
registries, `__post_init__`) and, from `draccus.utils`, which fields are choice registries, field defaults and
dotted names -> nested mapping. What stays ours, and why: draccus' argparse layer reads `--lr -1e-4` as two
flags, `--trackers jsonl` as five characters, `--run_id 007` as the number 7, needs `--vla.type` before any
`--vla.*` flag and answers mistakes with tracebacks; its decoders read `true` as the integer 1 or the text
"True", refuse `yes` for a bool and name neither source nor expected form, so values are checked here first; its
file loader is YAML's full loader with `!include`, not `safe_load`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, TypeVar

import draccus
import yaml
from draccus.utils import DraccusException, deflatten

from prismatic.models.registry import import_plugins
from prismatic.util.cli_help import (
    CHOICE_KEY,
    Flag,
    config_flags,
    describe_type,
    field_docs,
    format_help,
    sequence_item,
    show_value,
    unwrap_optional,
)
from prismatic.util.cli_report import entry_point, one_paragraph, record_error_for_torchrun, report_user_error
from prismatic.util.errors import ConfigError, did_you_mean

__all__ = [
    "Flag",
    "config_flags",
    "describe_type",
    "entry_point",
    "field_docs",
    "format_help",
    "one_paragraph",
    "parse_config",
    "record_error_for_torchrun",
    "report_user_error",
]

T = TypeVar("T")

CONFIG_PATH = "config_path"
HELP_FLAGS = ("-h", "--help")
COMMAND_LINE = "on the command line"
NULL_WORDS = ("null", "none", "~")  # what sets an optional field to None on the command line
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


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
    moved: Mapping[str, str] = getattr(config_class, "MOVED_FLAGS", {})  # old dotted name -> new name
    given: dict[str, _Given] = {}
    _flatten_file(file_data, flags, file_source, "", given, moved)
    for name, values in pairs:
        if name == CONFIG_PATH:
            continue
        if name in moved and name not in flags:
            raise ConfigError(
                f"--{name} is now --{moved[name]} ({COMMAND_LINE}): pass the same value as --{moved[name]}. Run "
                "with --help to list every flag."
            )
        if name not in flags:
            raise ConfigError(
                f"Unknown flag --{name} ({COMMAND_LINE}).{did_you_mean(f'--{name}', [f'--{n}' for n in flags])}"
                " Run with --help to list every flag."
            )
        given[name] = _Given(values, COMMAND_LINE, from_text=True)

    missing = [flag for name, flag in flags.items() if flag.required and name not in given]
    if missing:
        listed = "; ".join(f"--{f.name} ({f.help})" if f.help else f"--{f.name}" for f in missing)
        raise ConfigError(
            f"Missing required flag{'s' if len(missing) > 1 else ''}: {listed}. Run with --help for an example."
        )
    values = {name: _coerce(flags[name], item) for name, item in given.items()}
    for prefix, chosen in choices.items():  # `--vla.lr` alone overrides the default preset
        if any(name.startswith(f"{prefix}.") for name in values):
            values.setdefault(f"{prefix}.{CHOICE_KEY}", chosen)
    return _decode(config_class, deflatten(values))


def _split_args(args: list[str]) -> list[tuple[str, list[str]]]:
    """`--name v1 v2 --other=v` -> [("name", ["v1", "v2"]), ("other", ["v"])]: a flag's value is everything up to
    the next `--flag`, so `-1e-4` is a value, not a flag."""
    pairs: list[tuple[str, list[str]]] = []
    values: list[str] | None = None  # the values of the last `--name` while more may follow
    for token in args:
        if token in HELP_FLAGS:
            values = None
        elif token.startswith("--") and token != "--":
            name, eq, value = token[2:].partition("=")
            values = None if eq else []
            pairs.append((name, [value] if eq else values))
        elif values is None or token == "--":
            hint = (
                "flags start with two dashes (--name value)"
                if token.startswith("-") and token != "--"
                else "every value follows its flag, as in --name value"
            )
            raise ConfigError(f"Unexpected argument '{token}' ({COMMAND_LINE}): {hint}. Run with --help.")
        elif _looks_like_short_flag(token):
            raise ConfigError(
                f"Unexpected argument '{token}' after --{pairs[-1][0]} ({COMMAND_LINE}): flags start with two "
                "dashes (--name value). Run with --help."
            )
        else:
            values.append(token)
    return pairs


def _looks_like_short_flag(token: str) -> bool:
    """`-lr` is a mistyped flag; `-1e-4`, `-inf` and `-` are values."""
    with contextlib.suppress(ValueError):
        float(token)
        return False
    return token.startswith("-") and len(token) > 1 and token[1].isalpha()


def _read_config_file(pairs: list[tuple[str, list[str]]]) -> tuple[dict[str, Any], str]:
    """The `--config_path` file's mapping ({} without one) and its source text for messages."""
    paths = [values for name, values in pairs if name == CONFIG_PATH]
    if not paths:
        return {}, ""
    values = paths[-1]
    if len(values) != 1 or not values[0]:
        raise ConfigError(
            f"--config_path needs one file name ({COMMAND_LINE}), got {len(values)} values. Example: "
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
    for flag in config_flags(config_class):
        if not flag.choices:
            continue
        prefix = flag.name.removesuffix(f".{CHOICE_KEY}")
        name, source = flag.default, ""
        node: Any = file_data
        for part in prefix.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and CHOICE_KEY in node:
            name, source = node[CHOICE_KEY], file_source
        for key, values in pairs:
            if key == flag.name:
                if len(values) != 1:
                    raise ConfigError(
                        f"--{key} takes one preset id ({COMMAND_LINE}), got {len(values)}: "
                        f"{' '.join(values) or 'none'}."
                    )
                name, source = values[0], COMMAND_LINE
        known = ", ".join(flag.choices)
        if name is None or name is MISSING:
            raise ConfigError(f"--{flag.name} is required: one of {known}.")
        if not isinstance(name, str) or name not in flag.choices:
            raise ConfigError(
                f"Unknown --{flag.name} '{show_value(name)}'.{did_you_mean(str(name), flag.choices)} Valid "
                f"choices: {known} ({source})."
            )
        chosen[prefix] = name
    return chosen


def _flatten_file(
    data: Mapping[str, Any],
    flags: Mapping[str, Flag],
    source: str,
    prefix: str,
    out: dict[str, _Given],
    moved: Mapping[str, str],
) -> None:
    """Config-file mapping -> dotted leaves in `out`; unknown keys and non-mappings for groups are errors. A key
    under an older name (`moved`: old dotted name -> new, e.g. a run folder's config.yaml from before a field
    moved into a group) is read as its new name, unless the file also gives the new one."""
    groups = {name.rsplit(".", i)[0] for name in flags for i in range(1, name.count(".") + 1)}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if name in flags:
            out[name] = _Given(value, source, from_text=False)
        elif name in groups:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"'{name}' {source} is {show_value(value)}, but it must be a mapping of its fields (e.g. "
                    f"{name}: {{{CHOICE_KEY}: <preset>, ...}})."
                )
            _flatten_file(value, flags, source, f"{name}.", out, moved)
        elif moved.get(name) in flags:
            out.setdefault(moved[name], _Given(value, source, from_text=False))
        else:
            known = [n for n in flags if n.startswith(prefix)]
            raise ConfigError(
                f"Unknown field '{name}' {source}.{did_you_mean(name, known)} Run with --help to list every field."
            )


def _coerce(flag: Flag, given: _Given) -> Any:
    """The value of `given` checked against `flag.type`, in the form draccus decodes (YAML-native)."""
    inner, optional = unwrap_optional(flag.type)
    item = sequence_item(inner)
    label = f"--{flag.name}" if given.from_text else f"'{flag.name}'"
    expected = describe_type(flag.type)
    about = f" ({label}: {flag.help})" if flag.help else ""

    def bad(shown: Any, why: str = "") -> ConfigError:
        return ConfigError(
            f"{label} got {show_value(shown)!r} {given.source}, but it must be {expected}{why}.{about}"
        )

    value = given.value
    if flag.switch:  # true / false for on / off (and the flag alone: on); other text is the config's to check
        if given.from_text and not value:
            return "on"
        word = str(value[0] if given.from_text and len(value) == 1 else value).strip().lower()
        if word in TRUE_WORDS + FALSE_WORDS:
            return "on" if word in TRUE_WORDS else "off"
    if given.from_text:
        if flag.choices:
            return value[0]
        if not value:
            if inner is bool:
                return True  # a bare boolean flag
            if flag.bare is not None:
                return flag.bare
            raise ConfigError(f"{label} needs a value {given.source}: {expected}.{about}")
        if item is None and len(value) > 1:
            raise ConfigError(
                f"{label} takes one value but got {len(value)} {given.source} ({' '.join(value)}): it must be "
                f"{expected}.{about}"
            )
        text = value[0]
        if item is not None:
            if len(value) == 1:
                value = _yaml_or_text(text) if text.lstrip().startswith("[") else _split_list(text)
            return _coerce_sequence(item, value, bad)
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
    if item is not None:
        return _coerce_sequence(item, _split_list(value) if isinstance(value, str) else value, bad)
    return _coerce_scalar(inner, value, bad)


def _split_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _coerce_sequence(item: Any, value: Any, bad: Callable[..., ConfigError]) -> list[Any]:
    return [_coerce_scalar(item, v, bad) for v in (value if isinstance(value, list | tuple) else [value])]


def _coerce_scalar(annotation: Any, value: Any, bad: Callable[..., ConfigError]) -> Any:
    """`value` checked as a bool, int, float, text or path; other annotations (enums, literals, ...) are
    draccus' to check."""
    if isinstance(value, list | tuple | dict):
        raise bad(value, ", not a mapping" if isinstance(value, dict) else ", not a list")
    word = str(value).strip().lower()
    if annotation is bool and isinstance(value, str | int) and word in TRUE_WORDS + FALSE_WORDS:
        return word in TRUE_WORDS
    if annotation in (int, float) and not isinstance(value, bool):
        if isinstance(value, int) or (annotation is float and isinstance(value, float)):
            return annotation(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return annotation(value.strip())
    if annotation in (str, Path) and not isinstance(value, bool):
        return str(value)
    if annotation in (bool, int, float, str, Path):
        raise bad(value)
    return value


def _yaml_or_text(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _decode(config_class: type[T], raw: dict[str, Any]) -> T:
    """draccus' decoding, its errors (including a `ConfigError` from a `__post_init__`) as one `ConfigError`."""
    try:
        return draccus.decode(config_class, raw)
    except Exception as error:
        cause: BaseException | None = error
        for _ in range(16):  # draccus wraps a __post_init__'s error once per nesting level
            if cause is None or isinstance(cause, ConfigError):
                break
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, ConfigError):
            raise cause.with_traceback(None) from None
        if not isinstance(error, DraccusException):
            raise
        detail = f" ({error.__cause__})" if error.__cause__ is not None else ""
        raise ConfigError(
            f"{' '.join(str(error).split())}{detail}. Run with --help to list every flag."
        ) from None
