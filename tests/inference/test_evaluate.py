"""Offline evaluation: metric sums against numbers worked out by hand, the raw actions the pipeline keeps for it,
`vla_scripts/evaluate.py` as one process and under torchrun (the same numbers), and bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scripts import import_script

from prismatic.inference.evaluation import EvalMetrics
from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.stream_spec import StreamSpec

REPO = Path(__file__).resolve().parents[2]
EVALUATE = str(REPO / "vla_scripts" / "evaluate.py")


def test_metrics_match_hand_computed_values() -> None:
    metrics = EvalMetrics(["a", "b", "c"], action_dim=3)  # last dim = gripper; "c" gets no frames
    # Frames 0 and 2 are from "a", frame 1 from "b"; two updates, as from two batches.
    metrics.update(
        ["a", "b"],
        pred_token_ids=[[10, 11, 12], [20, 21, 22]],
        true_token_ids=[[10, 0, 12], [0, 0, 22]],
        pred_actions=[[0.1, -0.2, 0.9], [0.0, 0.5, 0.2]],
        true_actions=[[0.0, 0.0, 1.0], [0.5, 0.5, 1.0]],
    )
    metrics.update(
        ["a"],
        pred_token_ids=[[30, 31, 32]],
        true_token_ids=[[30, 31, 32]],
        pred_actions=[[0.3, 0.3, 0.4]],
        true_actions=[[0.1, 0.6, 0.0]],
    )
    # Errors (pred - true): frame 0 [0.1, -0.2, -0.1], frame 1 [-0.5, 0, -0.8], frame 2 [0.2, -0.3, 0.4].
    # Gripper open = value > 0.5: frame 0 open/open (right), 1 closed/open (wrong), 2 closed/closed (right).
    expected = {
        "a": {
            "num_frames": 2,
            "action_token_accuracy": 5 / 6,
            "gripper_accuracy": 1.0,
            "l1_per_dim": [0.15, 0.25, 0.25],
            "mse_per_dim": [0.025, 0.065, 0.085],
            "l1_mean": 0.65 / 3,
            "mse_mean": 0.175 / 3,
        },
        "b": {
            "num_frames": 1,
            "action_token_accuracy": 1 / 3,
            "gripper_accuracy": 0.0,
            "l1_per_dim": [0.5, 0.0, 0.8],
            "mse_per_dim": [0.25, 0.0, 0.64],
            "l1_mean": 1.3 / 3,
            "mse_mean": 0.89 / 3,
        },
        "overall": {
            "num_frames": 3,
            "action_token_accuracy": 6 / 9,
            "gripper_accuracy": 2 / 3,
            "l1_per_dim": [0.8 / 3, 0.5 / 3, 1.3 / 3],
            "mse_per_dim": [0.3 / 3, 0.13 / 3, 0.81 / 3],
            "l1_mean": 2.6 / 9,
            "mse_mean": 1.24 / 9,
        },
    }
    summary = metrics.summary()
    got = {**summary["datasets"], "overall": summary["overall"]}
    for group, values in expected.items():
        assert got[group]["num_frames"] == values["num_frames"], group
        for key, value in values.items():
            assert np.allclose(got[group][key], value, rtol=0, atol=1e-12), (group, key, got[group][key])
    assert (
        got["c"]["num_frames"] == 0 and got["c"]["l1_mean"] is None and got["c"]["gripper_accuracy"] is None
    )

    with pytest.raises(ValueError, match="not among"):
        metrics.update(["zzz"], [[0, 0, 0]], [[0, 0, 0]], [[0.0] * 3], [[0.0] * 3])
    with pytest.raises(ValueError, match="shape"):
        metrics.update(["a"], [[0, 0]], [[0, 0]], [[0.0] * 2], [[0.0] * 2])


def test_pipeline_keeps_raw_actions_only_when_asked(toy_data_root: Path) -> None:
    from prismatic.vla.datasets.rlds import make_interleaved_dataset, normalize_np
    from prismatic.vla.datasets.rlds.configs import get_dataset_config
    from prismatic.vla.datasets.rlds.toy import NUM_EPISODES, generate_toy_episode

    kwargs = {"resize_resolution": (16, 16), "shuffle_buffer_size": 1, "train": False}
    plain = next(
        make_interleaved_dataset(StreamSpec(toy_data_root, "toy", **kwargs)).dataset.as_numpy_iterator()
    )
    assert "raw_action" not in plain
    pipeline = make_interleaved_dataset(StreamSpec(toy_data_root, "toy", keep_raw_action=True, **kwargs))
    frames = [f for f in pipeline.dataset.as_numpy_iterator() if f["dataset_name"] == b"toy_pick_place"]
    # toy_pick_place stores its actions already standardised: the raw actions are exactly what the builder wrote.
    written = {
        np.asarray(step["action"], np.float32).tobytes()
        for index in range(NUM_EPISODES["val"])
        for step in generate_toy_episode("toy_pick_place", "val", index)["steps"]
    }
    assert {f["raw_action"].tobytes() for f in frames} == written
    config = get_dataset_config("toy_pick_place")
    stats = pipeline.dataset_statistics["toy_pick_place"]["action"]
    for frame in frames[:10]:
        renormalised = normalize_np(
            frame["raw_action"], stats, config.action_normalization_type, config.action_normalization_mask
        )
        np.testing.assert_allclose(renormalised, frame["action"], atol=1e-6)


# === The entry point ===


def run_evaluate(
    args: list[str], nproc: int | None = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    """evaluate.py as a plain process (nproc None) or under torchrun; W&B and the Hub off."""
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)  # a plain process then joins a group of one on a free port of its own
    if nproc is None:
        cmd = [sys.executable, EVALUATE, *args]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
        cmd = [*launcher, "--nproc-per-node", str(nproc), EVALUATE, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def toy_run(policy_run: Path, toy_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`policy_run`'s tiny random-weight model in a run folder holding the toy mixture's statistics, saved the
    way training saves them, and `vla.data_mix` in config.json as training writes it."""
    from prismatic.vla.datasets import save_dataset_statistics
    from prismatic.vla.datasets.rlds import mixture_statistics

    run = tmp_path_factory.mktemp("eval") / "run"
    shutil.copytree(policy_run, run)
    stats = mixture_statistics(toy_data_root, "toy")
    assert all("mask" in s["action"] for s in stats.values())
    save_dataset_statistics(stats, run)
    config = json.loads((run / "config.json").read_text())
    config["vla"]["data_mix"] = "toy"  # evaluate.py's default mixture
    (run / "config.json").write_text(json.dumps(config))
    return run


@pytest.fixture(scope="module")
def one_process_report(toy_run: Path, toy_data_root: Path) -> tuple[dict, str]:
    """evaluate.py as a plain process, with the run's own mixture and the default report path: (report, stdout)."""
    checkpoint = next((toy_run / "checkpoints").glob("step-*.pt"))
    proc = run_evaluate(["--checkpoint", str(checkpoint), "--data_root_dir", str(toy_data_root)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report_file = checkpoint.with_name(f"{checkpoint.stem}.eval-val.json")
    return json.loads(report_file.read_text()), proc.stdout


def test_evaluate_one_process_reports_every_val_frame(one_process_report: tuple[dict, str]) -> None:
    from prismatic.vla.datasets.rlds.toy import NUM_EPISODES, TOY_SPECS

    report, stdout = one_process_report
    expected_frames = {name: NUM_EPISODES["val"] * spec.num_steps for name, spec in TOY_SPECS.items()}
    assert expected_frames == {"toy_pick_place": 80, "toy_push": 64}
    assert report["data_mix"] == "toy" and report["split"] == "val" and report["world_size"] == 1
    assert {name: m["num_frames"] for name, m in report["datasets"].items()} == expected_frames
    assert report["overall"]["num_frames"] == sum(expected_frames.values())
    for group in [*report["datasets"].values(), report["overall"]]:
        assert 0.0 <= group["action_token_accuracy"] <= 1.0 and 0.0 <= group["gripper_accuracy"] <= 1.0
        assert len(group["l1_per_dim"]) == len(group["mse_per_dim"]) == 7
        assert group["l1_mean"] > 0 and group["mse_mean"] > 0
    for header in ("dataset", "frames", "token_acc", "gripper_acc", "L1", "MSE"):
        assert header in stdout
    assert any(line.split()[:2] == ["overall", "144"] for line in stdout.splitlines())


def test_evaluate_under_torchrun_gives_the_same_numbers(
    one_process_report: tuple[dict, str], toy_run: Path, toy_data_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    args = ["--checkpoint", str(toy_run), "--data_root_dir", str(toy_data_root), "--data_mix", "toy"]
    proc = run_evaluate([*args, "--batch_size", "8", "--out", str(out)], nproc=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.stdout.count("token_acc") == 1  # rank 0 alone prints
    distributed, single = json.loads(out.read_text()), one_process_report[0]
    assert distributed["world_size"] == 2
    for name in ("overall", "toy_pick_place", "toy_push"):
        a = distributed["overall"] if name == "overall" else distributed["datasets"][name]
        b = single["overall"] if name == "overall" else single["datasets"][name]
        assert a["num_frames"] == b["num_frames"]
        for key in (
            "action_token_accuracy",
            "gripper_accuracy",
            "l1_mean",
            "mse_mean",
            "l1_per_dim",
            "mse_per_dim",
        ):
            # float64 sums added in another order (per rank, then all_reduce): equal to a few ulps.
            np.testing.assert_allclose(a[key], b[key], rtol=1e-12, atol=0, err_msg=f"{name} {key}")


# === Bad input ===


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--checkpoint", "missing/run/checkpoints/step-1.pt"], "does not exist"),
        (["--data_mix", "tyo"], "Unknown dataset mixture 'tyo'"),
        (["--split", "test"], "Unknown --split 'test'"),
        (["--split", "train"], "--max_frames"),
    ],
)
def test_bad_input_exits_2_with_one_message(
    toy_run: Path, toy_data_root: Path, extra: list[str], message: str
) -> None:
    args = ["--checkpoint", str(toy_run), "--data_root_dir", str(toy_data_root), *extra]
    proc = run_evaluate(args)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_dataset_without_statistics_is_named(policy_run: Path, toy_data_root: Path) -> None:
    """A policy trained on other datasets: the error names the dataset and the way out (--unnorm_key)."""
    from prismatic.inference import PolicyInputError, load_policy
    from prismatic.inference.evaluation import check_unnorm_keys
    from prismatic.vla.datasets.rlds import mixture_statistics

    policy = load_policy(policy_run)  # statistics for "ds_a" and "ds_b"
    stats = mixture_statistics(toy_data_root, "toy")
    with pytest.raises(ConfigError, match=r"'toy_pick_place', 'toy_push'.*--unnorm_key"):
        check_unnorm_keys(policy, stats, None, data_mix="toy")
    assert check_unnorm_keys(policy, stats, "ds_b", data_mix="toy") == 7
    with pytest.raises(PolicyInputError, match="nope"):
        check_unnorm_keys(policy, stats, "nope", data_mix="toy")


def test_evaluation_uses_the_runs_data_options_with_given_flags_on_top(tmp_path: Path) -> None:
    from prismatic.conf.data import DataOptions

    script = import_script("evaluate")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"data": {"statistics_split": "train", "load_proprio": True}})
    )
    argv = ["--checkpoint", str(run), "--data_root_dir", str(tmp_path), "--data.skip_unlabeled", "false"]
    cfg = script.parse_config(script.EvaluateConfig, argv)
    options = script.resolve_data_options(cfg, script.given_data_flags(argv))
    # The run's two choices are kept, the one flag given is laid over them, the rest are the defaults.
    assert options == DataOptions(statistics_split="train", load_proprio=True, skip_unlabeled=False)
    assert script.resolve_data_options(cfg, frozenset()) == DataOptions(
        statistics_split="train", load_proprio=True
    )
