"""The speed group (`prismatic/conf/speed.py`): the speed and memory means live under `--vla.speed.*`, apart from the
experiment's identity; OpenVLA's own fields stay where OpenVLA has them; presets set switches through the group; and
a run folder written before the group (its switches flat under `vla`) still resumes and loads.

The old run folders are written here by hand, as the code before the group wrote them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from prismatic.conf import vla as vla_module
from prismatic.conf.speed import SpeedConfig
from prismatic.conf.train import TrainConfig
from prismatic.conf.vla import VLAConfig, get_vla_config, register_vla
from prismatic.training.run_folder import RunFolder, config_to_dict
from prismatic.util.cli import format_help, parse_config
from prismatic.util.errors import ConfigError

# The switches that moved, by their names before and after the move (the group keeps the field names).
SWITCHES = (
    "optimizer_impl",
    "logits_at_labels",
    "causal_mask_only",
    "prefetch_batches",
    "compile",
    "compile_mode",
    "overlap_steps",
    "batched_grad_copy",
    "pad_to_multiple",
    "checkpointing_policy",
    "cpu_offload",
)
# OpenVLA's `VLAConfig` has these memory, precision and strategy fields: users compare config files with OpenVLA's.
OPENVLA_FIELDS = (
    "train_strategy",
    "enable_gradient_checkpointing",
    "enable_mixed_precision_training",
    "reduce_in_full_precision",
)
# Not the defaults, so that reading them back proves they were read.
OLD_SWITCHES = {
    "optimizer_impl": "foreach",
    "logits_at_labels": "off",
    "causal_mask_only": "on",
    "prefetch_batches": 2,
    "compile": False,  # a run's config.yaml from before `compile` took auto / on / off
    "compile_mode": "default",
    "overlap_steps": "off",
    "batched_grad_copy": "off",
    "pad_to_multiple": 4,
    "checkpointing_policy": "every-2",
    "cpu_offload": False,
}
# What the group holds once they are read (`compile: false` is `off`).
READ_BACK = {**OLD_SWITCHES, "compile": "off"}
IDENTITY_OF_TINY = {  # what train_state.json records for the tiny preset with seed 7 (run_folder.IDENTITY)
    "vla_id": "tiny+mx-toy",
    "seed": 7,
    "data_mix": "toy",
    "base_vlm": "tiny-vit+tiny-llama",
    "action_head": "tokens",
    "chunk_size": 1,
    "use_proprio": False,
    "num_images": 1,
}


def test_the_group_holds_the_speed_switches_and_openvla_fields_stay_top_level() -> None:
    top = {f.name for f in dataclasses.fields(VLAConfig)}
    assert {f.name for f in dataclasses.fields(SpeedConfig)} == set(SWITCHES)
    assert not top & set(SWITCHES) and set(OPENVLA_FIELDS) <= top
    cfg = parse_config(
        TrainConfig,
        [
            "--vla.type",
            "tiny+mx-toy",
            "--vla.speed.compile",
            "on",
            "--vla.speed.compile_mode",
            "reduce-overhead",
        ],
    )
    assert (cfg.vla.speed.compile, cfg.vla.speed.compile_mode, cfg.vla.speed.optimizer_impl) == (
        "on",
        "reduce-overhead",
        "auto",
    )
    saved = config_to_dict(cfg)["vla"]  # what config.yaml / config.json record
    assert saved["speed"]["compile_mode"] == "reduce-overhead" and "compile_mode" not in saved
    assert (
        saved["enable_gradient_checkpointing"] is True
        and "enable_gradient_checkpointing" not in saved["speed"]
    )


def test_a_switch_typed_under_its_old_name_is_answered_with_the_new_one() -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy", "--vla.compile_mode", "default"])
    assert str(error.value) == (
        "--vla.compile_mode is now --vla.speed.compile_mode (on the command line): pass the same value as "
        "--vla.speed.compile_mode. Run with --help to list every flag."
    )


def test_the_group_refuses_bad_values_naming_the_new_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--vla.speed.prefetch_batches=-1 is out of range"):
        parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy", "--vla.speed.prefetch_batches", "-1"])
    vla = get_vla_config("tiny+mx-toy")
    vla.train_strategy, vla.speed.cpu_offload = "ddp", True
    with pytest.raises(ConfigError, match=r"^--vla.speed.cpu_offload true needs an FSDP strategy"):
        vla.check_values()  # a rule across the group and the experiment: VLAConfig's


def _old_config(cfg: TrainConfig, switches: dict) -> dict:
    """`cfg` as config.yaml / config.json recorded it before the speed group: every switch flat under `vla`."""
    saved = config_to_dict(cfg)
    vla = {k: v for k, v in saved["vla"].items() if k != "speed"}
    saved["vla"] = {**vla, **saved["vla"]["speed"], **switches}
    return saved


def _old_run_folder(root: Path) -> Path:
    """A run folder as the code before the group left it: old-style config.yaml / config.json and one checkpoint
    (its train state; the weights are not read before the resume is decided)."""
    run_dir = root / "old"
    cfg = TrainConfig(vla=get_vla_config("tiny+mx-toy"), run_root_dir=root, run_id="old", trackers=("jsonl",))
    old = _old_config(cfg, OLD_SWITCHES)
    assert "speed" not in old["vla"] and old["vla"]["compile"] is False
    checkpoint = run_dir / "checkpoints" / "step-000004-epoch-00"
    checkpoint.mkdir(parents=True)
    (checkpoint / ".metadata").write_bytes(b"")
    state = {"step": 4, "epoch": 0, "frames": 64, "world_size": 1, **IDENTITY_OF_TINY}
    (checkpoint / "train_state.json").write_text(json.dumps(state))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    (run_dir / "config.json").write_text(json.dumps(old, indent=2))
    return run_dir


@pytest.mark.parametrize("name", ["config.yaml", "config.json"])
def test_an_old_run_folder_s_config_resumes_with_its_switches_in_the_group(tmp_path: Path, name: str) -> None:
    run_dir = _old_run_folder(tmp_path)
    cfg = parse_config(TrainConfig, ["--config_path", str(run_dir / name), "--resume"])
    assert dataclasses.asdict(cfg.vla.speed) == READ_BACK
    point = RunFolder.of(cfg, 1).check(cfg)
    assert point is not None and (point.step, point.epoch) == (4, 0)
    # Re-written, the config says the same in the new layout (a resume's own config.resume-*.yaml).
    assert config_to_dict(cfg)["vla"]["speed"] == READ_BACK


def test_the_new_name_wins_over_the_old_one_in_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    for text in (
        "vla:\n  type: tiny+mx-toy\n  compile: off\n  speed:\n    compile: on\n",
        "vla:\n  type: tiny+mx-toy\n  speed:\n    compile: on\n  compile: off\n",
    ):
        path.write_text(text)
        assert parse_config(TrainConfig, ["--config_path", str(path)]).vla.speed.compile == "on"


def test_a_resume_that_changes_speed_switches_continues_and_one_that_changes_the_seed_is_refused(
    tmp_path: Path,
) -> None:
    """Today's rule, kept: the switches change how the run goes, not what it trains, so they are not part of the
    identity a resume checks (`run_folder.IDENTITY`); the seed is."""
    run_dir = _old_run_folder(tmp_path)
    config = ["--config_path", str(run_dir / "config.yaml"), "--resume"]
    faster = [
        "--vla.speed.compile",
        "on",
        "--vla.speed.checkpointing_policy",
        "full",
        "--vla.speed.overlap_steps",
    ]
    cfg = parse_config(TrainConfig, [*config, *faster])
    assert (cfg.vla.speed.compile, cfg.vla.speed.checkpointing_policy, cfg.vla.speed.overlap_steps) == (
        "on",
        "full",
        "on",
    )
    assert RunFolder.of(cfg, 1).check(cfg).step == 4
    cfg = parse_config(TrainConfig, [*config, "--seed", "8"])
    with pytest.raises(
        ConfigError, match=r"^Refusing to resume from .* with --seed 8 \(the checkpoint's run used 7\)"
    ):
        RunFolder.of(cfg, 1).check(cfg)


def test_the_loaders_read_an_old_run_folder_s_config(tmp_path: Path) -> None:
    """What loading, the policy and the LoRA export read of a run's config.json (the base model, LoRA and image
    augmentation) is outside the group, so an old file reads as before."""
    from prismatic.inference.policy import trained_with_image_aug
    from prismatic.models.architecture import run_architecture

    run_dir = _old_run_folder(tmp_path)
    old = json.loads((run_dir / "config.json").read_text())
    old["image_aug"] = True
    (run_dir / "config.json").write_text(json.dumps(old))
    assert run_architecture(run_dir).spec == run_architecture(_fresh_run_folder(tmp_path)).spec
    assert trained_with_image_aug(run_dir / "checkpoints" / "step-000004-epoch-00") is True


def _fresh_run_folder(root: Path) -> Path:
    cfg = TrainConfig(vla=get_vla_config("tiny+mx-toy"), run_root_dir=root, run_id="new", trackers=("jsonl",))
    RunFolder(root / "new").write_config(cfg, None)
    return root / "new"


@pytest.fixture
def presets() -> Iterator[None]:
    """Restores the preset registries afterwards: other tests enumerate them."""
    registries = (vla_module._PRESETS, VLAConfig._choice_registry)
    saved = [dict(registry) for registry in registries]
    try:
        yield
    finally:
        for registry, before in zip(registries, saved, strict=True):
            registry.clear()
            registry.update(before)


def test_a_preset_sets_switches_through_the_group_and_a_flag_overrides_one(presets: None) -> None:
    register_vla("tiny-compiled+mx-toy", "tiny+mx-toy", speed={"compile": "on", "prefetch_batches": 2})
    register_vla(
        "tiny-compiled-lora+mx-toy", "tiny-compiled+mx-toy", use_lora=True, speed={"compile_mode": "default"}
    )
    child = get_vla_config("tiny-compiled-lora+mx-toy")
    assert (child.speed.compile, child.speed.prefetch_batches, child.speed.compile_mode) == (
        "on",
        2,
        "default",
    )
    assert get_vla_config("tiny+mx-toy").speed == SpeedConfig()  # the parent of both is as it was
    cfg = parse_config(
        TrainConfig, ["--vla.type", "tiny-compiled+mx-toy", "--vla.speed.prefetch_batches", "0"]
    )
    assert (cfg.vla.speed.compile, cfg.vla.speed.prefetch_batches) == (
        "on",
        0,
    )  # the preset's other switch kept
    listed = format_help(TrainConfig, None, {"vla": "tiny-compiled+mx-toy"})
    # Each flag's entry, its wrapped lines joined (the width follows the terminal).
    entries = " ".join(listed.split()).split(" --")
    (compile_entry,) = [entry for entry in entries if entry.startswith("vla.speed.compile ")]
    assert compile_entry.endswith("(default: on)")  # the preset's value


def test_a_preset_with_a_bad_switch_fails_at_registration(presets: None) -> None:
    with pytest.raises(ValueError, match=r"sets unknown speed fields \['compiled'\]"):
        register_vla("tiny-typo+mx-toy", "tiny+mx-toy", speed={"compiled": "on"})
    with pytest.raises(ConfigError, match=r"Unknown compile_mode 'fast' \(--vla.speed.compile_mode\)"):
        register_vla("tiny-bad+mx-toy", "tiny+mx-toy", speed={"compile_mode": "fast"})
    with pytest.raises(ValueError, match=r"pass the switches it changes as a mapping"):
        register_vla("tiny-obj+mx-toy", "tiny+mx-toy", speed=SpeedConfig(compile="on"))
    assert not {"tiny-typo+mx-toy", "tiny-bad+mx-toy", "tiny-obj+mx-toy"} & set(vla_module._PRESETS)


def test_no_doc_or_source_names_a_switch_by_its_old_flag() -> None:
    """The flag reference, the README, the docs and every message and docstring name the group's flags as
    `--vla.speed.<name>` (a line saying what an old name is now excepted); dated reports stay as written."""
    repo = Path(__file__).resolve().parents[2]
    old = re.compile(rf"--vla\.({'|'.join(SWITCHES)})\b")
    files = [repo / "README.md", repo / "Makefile", *(repo / "docs").glob("*.md")]
    for folder in ("prismatic", "vla_scripts", "benchmarks", "configs"):
        files += [p for p in (repo / folder).rglob("*") if p.suffix in (".py", ".yaml", ".sh")]
    found = [
        f"{path.relative_to(repo)}: {line.strip()}"
        for path in files
        if path.is_file() and "results" not in path.parts
        for line in path.read_text().splitlines()
        if old.search(line) and "is now --vla.speed." not in line
    ]
    assert found == []
