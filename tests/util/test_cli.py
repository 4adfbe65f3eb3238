"""The shared command-line layer (`prismatic/util/cli.py`): flag grammar, config files, help, and how a mistake
is reported (one paragraph, exit 2, recorded for torchrun). The catalogue of bad inputs across the scripts is
`tests/test_cli_errors.py`."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from scripts import import_script

from prismatic.conf.speed import SpeedConfig
from prismatic.conf.train import TrainConfig
from prismatic.conf.vla import VLAConfig, get_vla_config
from prismatic.training.run_folder import config_to_dict
from prismatic.util import cli_report
from prismatic.util.cli import config_flags, entry_point, field_docs, format_help, parse_config
from prismatic.util.errors import ConfigError, RankError


@dataclass
class Demo:
    """One field of each kind the scripts use."""

    path: Path  # a required path
    offset: float = 0.0  # may be negative
    count: int = 1  # how many
    names: tuple[str, ...] = ("a",)  # several names
    note: str | None = None  # free text

    # Switches
    flag: bool = False  # a switch
    level: int | None = None
    """An optional integer described by a docstring."""


def parse(*args: str) -> Demo:
    return parse_config(Demo, list(args), plugins=False)


def test_negative_numbers_are_values() -> None:
    cfg = parse("--path", "p", "--offset", "-1e-4", "--count=-3", "--level", "-2")
    assert (cfg.offset, cfg.count, cfg.level) == (-1e-4, -3, -2)
    assert parse("--path", "p", "--offset", "-inf").offset == float("-inf")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["x"], ("x",)),  # one value is one item, never its characters
        (["x,y"], ("x", "y")),
        (["x", "y"], ("x", "y")),
        (["[x, y]"], ("x", "y")),
        (["[]"], ()),
    ],
)
def test_list_flags(given: list[str], expected: tuple[str, ...]) -> None:
    assert parse("--path", "p", "--names", *given).names == expected


def test_text_stays_as_typed_and_null_unsets() -> None:
    assert parse("--path", "007", "--note", "1.10").note == "1.10"
    assert parse("--path", "007").path == Path("007")
    assert parse("--path", "p", "--note", "null").note is None
    assert parse("--path", "p", "--level", "null").level is None


def test_bare_boolean_flag_means_true() -> None:
    assert parse("--path", "p", "--flag").flag is True
    assert parse("--path", "p", "--flag", "--count", "2").flag is True
    assert parse("--path", "p", "--flag", "false").flag is False


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--count", "abc"], ["--count got 'abc' on the command line", "an integer", "(--count: how many)"]),
        (["--count", "2.5"], ["--count got '2.5'", "an integer"]),
        (["--offset", "[1, 2]"], ["--offset got '[1, 2]'", "a number", "not a list"]),
        (["--flag", "maybe"], ["--flag got 'maybe'", "true or false"]),
        (["--count", "null"], ["--count got 'null'", "null is not allowed"]),
        (["--count", "1", "2"], ["--count takes one value but got 2"]),
        (["--cuont", "1"], ["Unknown flag --cuont", "Did you mean '--count'?"]),
        (["--count"], ["--count needs a value"]),
        (["stray"], ["Unexpected argument 'stray'"]),
        (["--count", "-x"], ["Unexpected argument '-x' after --count", "two dashes"]),
    ],
)
def test_mistakes_name_field_value_type_and_source(args: list[str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse(*args, "--path", "p")
    for word in words:
        assert word in str(info.value)


def test_missing_required_field_is_named_with_its_help() -> None:
    with pytest.raises(ConfigError, match=r"Missing required flag: --path \(a required path\)"):
        parse("--count", "2")


def test_config_file_is_read_and_flags_override_it(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("path: data\ncount: 4\nnames: x\nnote: 007\n")
    cfg = parse("--config_path", str(path), "--count", "5")
    assert (cfg.path, cfg.count, cfg.names, cfg.note) == (Path("data"), 5, ("x",), "7")
    path.write_text("path: data\ncount: four\n")
    with pytest.raises(ConfigError, match=rf"'count' got 'four' in config file '{path}'"):
        parse("--config_path", str(path))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("count: [1\n", ["is not valid YAML at line 2"]),
        ("- 1\n- 2\n", ["holds a list", "mapping of field names"]),
        ("cuont: 1\n", ["Unknown field 'cuont' in config file", "Did you mean 'count'?"]),
    ],
)
def test_bad_config_files(tmp_path: Path, text: str, words: list[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        parse("--path", "p", "--config_path", str(path))
    for word in words:
        assert word in str(info.value)
    with pytest.raises(ConfigError, match="does not exist"):
        parse("--config_path", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        parse("--config_path", str(tmp_path))


def test_speed_switches_take_booleans_from_flags_and_old_config_files(tmp_path: Path) -> None:
    """`--vla.speed.compile` took true / false before it took auto / on / off: both spellings, the flag alone and a
    run's earlier config.yaml (`compile: false`, flat under `vla` as before the speed group) still parse, to on / off;
    other words are refused with the choices."""

    def speed(*args: str) -> SpeedConfig:
        return parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy", *args]).vla.speed

    assert speed().compile == "auto"
    for given, expected in [("true", "on"), ("false", "off"), ("yes", "on"), ("0", "off"), ("on", "on")]:
        assert speed("--vla.speed.compile", given).compile == expected
    assert speed("--vla.speed.compile").compile == "on"
    assert (
        speed("--vla.speed.compile", "auto", "--vla.speed.causal_mask_only", "no").causal_mask_only == "off"
    )
    path = tmp_path / "config.yaml"
    path.write_text("vla:\n  type: tiny+mx-toy\n  compile: false\n  logits_at_labels: true\n")
    cfg = parse_config(TrainConfig, ["--config_path", str(path)])
    switches = cfg.vla.speed
    assert (switches.compile, switches.logits_at_labels, switches.causal_mask_only) == ("off", "on", "auto")
    with pytest.raises(
        ConfigError, match=r"Unknown compile 'max' \(--vla.speed.compile\).*Valid choices: auto, on, off"
    ):
        speed("--vla.speed.compile", "max")


def test_vla_flags_without_type_override_the_default_preset() -> None:
    cfg = parse_config(TrainConfig, ["--vla.learning_rate", "1e-3", "--trackers", "jsonl"])
    assert cfg.vla.vla_id == TrainConfig().vla.vla_id and cfg.vla.learning_rate == 1e-3
    assert cfg.trackers == ("jsonl",)
    cfg = parse_config(TrainConfig, ["--vla.max_steps=5", "--vla.type", "tiny+mx-toy"])
    assert cfg.vla.vla_id == "tiny+mx-toy" and cfg.vla.max_steps == 5 and cfg.vla.data_mix == "toy"


def test_range_errors_from_post_init_are_config_errors() -> None:
    """draccus wraps a `__post_init__`'s error in its own; the user must see ours, with the valid range."""
    with pytest.raises(ConfigError, match=r"--vla.learning_rate=-0.0001 is out of range: it must be .*> 0"):
        parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy", "--vla.learning_rate", "-1e-4"])
    with pytest.raises(ConfigError, match=r"Unknown tracker 'jsnol'.*Did you mean 'jsonl'"):
        parse_config(TrainConfig, ["--trackers", "jsnol"])


def test_a_run_config_yaml_parses_back_to_the_same_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`<run_dir>/config.yaml` is documented as re-usable with `--config_path`."""
    cfg = parse_config(
        TrainConfig,
        ["--vla.type", "tiny-lora+mx-toy", "--vla.max_steps", "7", "--run_id", "007", "--trackers", "jsonl"],
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    again = parse_config(TrainConfig, ["--config_path", str(path)])
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg) and again.run_id == "007"


def test_every_field_of_every_script_has_help() -> None:
    configs = [
        TrainConfig,
        *(VLAConfig.get_choice_class(i) for i in ("tiny+mx-toy", "siglip-224px+mx-bridge")),
    ]
    for script, name in [
        ("export_hf", "ExportConfig"),
        ("merge_lora", "MergeConfig"),
        ("dataset_stats", "StatsConfig"),
        ("convert_to_rlds", "ConvertConfig"),
        ("build_toy_dataset", "ToyConfig"),
        ("evaluate", "EvaluateConfig"),
        ("serve", "ServeConfig"),
    ]:
        configs.append(getattr(import_script(script), name))
    for config in configs:
        for flag in config_flags(config):
            assert flag.help, f"{config.__name__}: --{flag.name} has no one-line description"


def test_train_help_groups_flags_and_shows_the_chosen_preset() -> None:
    text = format_help(TrainConfig, "Example: train.py --vla.type tiny+mx-toy", {"vla": "tiny+mx-toy"})
    for group in ("Model and freezing:", "Optimisation:", "Folders:", "Start from / resume:", "Tracking:"):
        assert f"\n{group}" in text
    flags = config_flags(TrainConfig, {"vla": "tiny+mx-toy"})
    for flag in flags:
        assert text.count(f"  --{flag.name} ") == 1
    assert "peak learning rate of AdamW (> 0) (default: 0.003)" in " ".join(text.split())
    assert "Example: train.py" in text


def test_presets_inherit_the_base_field_docs() -> None:
    preset = type(get_vla_config("tiny+mx-toy"))
    assert field_docs(preset)["learning_rate"] == field_docs(VLAConfig)["learning_rate"]
    assert field_docs(VLAConfig)["data_mix"][1] == "Data"


def _as_torchrun_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_rank: int
) -> tuple[Path, list[float]]:
    """Run as torchrun's local rank `local_rank` with its error file under `tmp_path`; the delays a non-zero rank
    would sleep are recorded, not slept. Returns (the error file, the delays)."""
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    slept: list[float] = []
    monkeypatch.setattr(cli_report.time, "sleep", slept.append)
    return error_file, slept


def test_entry_point_reports_one_paragraph_and_records_it_for_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    @entry_point
    def main() -> int:
        raise ConfigError("first line\n  and the second one")

    error_file, slept = _as_torchrun_rank(tmp_path, monkeypatch, 0)
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2 and slept == []
    assert capsys.readouterr().err == "error: first line and the second one\n"
    # torchrun's agent reads the file as it reads torch's own @record output, and its summary shows our message.
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(error_file))
    summary = ChildFailedError("train.py", {0: failure}).format_msg()
    assert "traceback : error: first line and the second one" in summary

    # other ranks of the node stay quiet, record, and give rank 0 time
    error_file, slept = _as_torchrun_rank(tmp_path, monkeypatch, 1)
    error_file.unlink()
    with pytest.raises(SystemExit):
        main()
    assert capsys.readouterr().err == "" and error_file.is_file()
    assert slept == [cli_report.NONZERO_RANK_EXIT_DELAY_S]


def test_a_rank_error_is_printed_by_the_rank_that_met_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `RankError` (one GPU out of memory) may happen on local rank 1 alone: it prints there, without waiting."""

    @entry_point
    def main() -> int:
        raise RankError("Rank 1 ran out of GPU memory\n with 2 steps done.")

    error_file, slept = _as_torchrun_rank(tmp_path, monkeypatch, 1)
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2 and slept == []
    assert capsys.readouterr().err == "error: Rank 1 ran out of GPU memory with 2 steps done.\n"
    recorded = json.loads(error_file.read_text())["message"]
    assert recorded["message"] == "RankError: Rank 1 ran out of GPU memory with 2 steps done."


def test_entry_point_keeps_a_bugs_traceback_and_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    @entry_point
    def main() -> int:
        raise KeyError("a bug")

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    with pytest.raises(KeyError):
        main()
    recorded = json.loads(error_file.read_text())["message"]
    assert recorded["message"] == "KeyError: 'a bug'" and "Traceback" in recorded["extraInfo"]["py_callstack"]


def test_entry_point_returns_the_exit_code() -> None:
    assert entry_point(lambda: None)() == 0
    assert entry_point(lambda: 3)() == 3
