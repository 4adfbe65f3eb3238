"""`vla_scripts/eval_libero.py` end to end on CPU: tiny LIBERO presets trained on the LIBERO-shaped toy data, then
evaluated in the simulator (1 task, 2 episodes, 12 policy steps): the same episodes for 1 and 2 simulators, the
same actions through `serve.py` as in process, OpenVLA-OFT's inputs for a chunk head, and bad input refused in
one paragraph with exit code 2."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch  # noqa: F401  (torch before TensorFlow in this process)
from scripts import import_script
from served import served
from train_runs import free_port, run_train

from prismatic.vla.datasets.rlds.toy import build_libero_toy_datasets

REPO = Path(__file__).resolve().parents[2]
SMOKE = ["--task_suite", "libero_spatial", "--tasks", "0", "--num_trials_per_task", "2", "--max_steps", "12"]


@pytest.fixture(scope="module")
def libero_runs(libero_config: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`tiny+libero_spatial` (tokens head) and `tiny-oft+libero_spatial` (8-action chunks, proprio, wrist image,
    image augmentation), 2 steps each on the LIBERO-shaped toy data."""
    root = tmp_path_factory.mktemp("libero_runs")
    build_libero_toy_datasets(root / "data", suites=("spatial",))
    runs = {}
    for name, preset in (("tokens", "tiny+libero_spatial"), ("oft", "tiny-oft+libero_spatial")):
        args = ["--vla.type", preset, "--vla.max_steps", "2", "--data_root_dir", str(root / "data")]
        args += ["--run_root_dir", str(root / "runs"), "--run_id", name, "--trackers", "jsonl"]
        proc = run_train(args, nproc=None)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[name] = root / "runs" / name
    return runs


def _script_main():
    return import_script("eval_libero").main


def evaluate(args: list[str], out_dir: Path) -> dict:
    """Run the script's `main` in this process (torch and TensorFlow already loaded) and read its report."""
    assert _script_main()([*args, "--out_dir", str(out_dir)]) == 0
    return json.loads((out_dir / "results.json").read_text())


def episode_table(report: dict) -> list[tuple]:
    """What the success table is made of, per episode."""
    return [(e["task_id"], e["episode"], e["success"], e["steps"]) for e in report["episodes"]]


def assert_same_episodes(got: dict, expected: dict, exact_actions: bool) -> None:
    """The same success table; the same trajectories: identical actions (token heads: discrete ids), or for
    continuous heads within float rounding of a different batch size (the end effector within 0.1 mm)."""
    assert episode_table(got) == episode_table(expected)
    if exact_actions:
        assert [e["actions_digest"] for e in got["episodes"]] == [
            e["actions_digest"] for e in expected["episodes"]
        ]
    for a, b in zip(got["episodes"], expected["episodes"], strict=True):
        assert np.allclose(a["final_eef_pos"], b["final_eef_pos"], rtol=0, atol=1e-4)


def test_chunk_head_rollout_is_the_same_for_1_and_2_simulators(
    libero_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B never needs a login in tests
    run = str(libero_runs["oft"])
    one = evaluate(
        ["--checkpoint", run, *SMOKE, "--num_envs", "1", "--trackers", "jsonl", "wandb"], tmp_path / "one"
    )
    two = evaluate(["--checkpoint", run, *SMOKE, "--num_envs", "2", "--save_videos"], tmp_path / "two")
    assert_same_episodes(two, one, exact_actions=False)
    assert [e["episode"] for e in one["episodes"]] == [0, 1]
    # 10 settling steps + 12 policy steps, unless the (untrained) policy succeeded first.
    assert all(e["steps"] == 22 or e["success"] for e in one["episodes"])
    # Two different initial states give two different episodes.
    assert one["episodes"][0]["actions_digest"] != one["episodes"][1]["actions_digest"]
    assert one["protocol"] == {
        "unnorm_key": "libero_spatial_no_noops",
        "center_crop": True,  # the preset trains with image augmentation
        "image_size": [64, 64],  # tiny-vit-64px
        "num_images": 2,  # agent view + wrist
        "proprio": True,
        "open_loop_steps": 8,  # the whole chunk, as OpenVLA-OFT
        "max_steps": 12,
        "num_steps_wait": 10,
    }
    assert one["overall"]["episodes"] == 2 and one["tasks"][0]["task_id"] == 0
    lines = (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2, 3]  # one per episode, then the total
    assert records[-1]["success_rate"] == one["overall"]["success_rate"]
    # W&B (offline in tests) wrote its run into the evaluation folder.
    (offline,) = (tmp_path / "one" / "wandb").glob("offline-run-*")
    assert sum(f.stat().st_size for f in offline.glob("run-*.wandb")) > 0
    # --save_videos: one mp4 per episode, named by task, episode and outcome.
    videos = sorted(p.name for p in (tmp_path / "two" / "videos").iterdir())
    assert videos == [f"task00-episode0{i}-success={e['success']}.mp4" for i, e in enumerate(two["episodes"])]
    assert all((tmp_path / "two" / "videos" / name).stat().st_size > 1000 for name in videos)


@pytest.fixture(scope="module")
def served_tokens_run(
    libero_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`serve.py` on the tokens run, in a subprocess on a free loopback port."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [
        sys.executable,
        "vla_scripts/serve.py",
        "--checkpoint",
        str(libero_runs["tokens"]),
        "--port",
        str(port),
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        import requests

        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"serve.py did not come up:\n{log_path.read_text()}")
            try:
                if requests.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_server_gives_the_in_process_actions(
    libero_runs: dict[str, Path], served_tokens_run: str, tmp_path: Path
) -> None:
    local = evaluate(
        ["--checkpoint", str(libero_runs["tokens"]), *SMOKE, "--num_envs", "1"], tmp_path / "local"
    )
    remote = evaluate(["--policy_url", served_tokens_run, *SMOKE, "--num_envs", "2"], tmp_path / "remote")
    assert_same_episodes(remote, local, exact_actions=True)
    # The server told the client what the run trained with: the same protocol either way.
    assert remote["protocol"] == local["protocol"]
    assert local["protocol"]["center_crop"] is True and local["protocol"]["open_loop_steps"] == 1


@pytest.fixture(scope="module")
def served_oft_run(
    libero_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """`serve.py` on the chunk-head run (wrist view, proprio) requiring a token: (URL, token)."""
    token = secrets.token_urlsafe(32)
    log_path = tmp_path_factory.mktemp("serve_oft") / "serve.log"
    args = ["--checkpoint", str(libero_runs["oft"]), "--auth_token_env", "LIBERO_TEST_SERVER_TOKEN"]
    with served(args, log_path, env={"LIBERO_TEST_SERVER_TOKEN": token}) as url:
        yield url, token


def test_server_drives_a_chunk_head_rollout_behind_a_token(
    served_oft_run: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OFT run through `--policy_url` with `--policy_auth_token_env`: the server answers no request without the
    token, the wrist view or the proprio, so an episode that runs at all was asked with them (that the answers are
    the in-process chunks is tests/inference/test_server_oft.py's)."""
    import requests

    url, token = served_oft_run
    monkeypatch.setenv("LIBERO_TEST_CLIENT_TOKEN", token)
    flags = [
        "--task_suite",
        "libero_spatial",
        "--tasks",
        "0",
        "--num_trials_per_task",
        "1",
        "--max_steps",
        "8",
    ]
    report = evaluate(
        ["--policy_url", url, "--policy_auth_token_env", "LIBERO_TEST_CLIENT_TOKEN", *flags], tmp_path
    )
    protocol = report["protocol"]
    assert (protocol["num_images"], protocol["proprio"], protocol["open_loop_steps"]) == (2, True, 8)
    (episode,) = report["episodes"]
    assert episode["steps"] == 18 or episode["success"]  # 10 settling steps, then the one chunk of 8
    # One policy query for the episode: its whole chunk ran open loop.
    assert requests.get(f"{url}/health", timeout=30).json()["requests_served"] == 1


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "vla_scripts/eval_libero.py", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, **env}
    )


def one_paragraph(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_bad_input_is_one_paragraph(
    libero_runs: dict[str, Path], libero_config: Path, tmp_path: Path
) -> None:
    """What needs a run or the machine to find out (flag mistakes are in tests/test_cli_errors.py's catalogue)."""
    run = str(libero_runs["tokens"])
    text = one_paragraph(run_script("--checkpoint", run, "--tasks", "0", MUJOCO_GL="glfw"))
    assert "MUJOCO_GL=glfw" in text and "egl, osmesa" in text
    text = one_paragraph(run_script("--checkpoint", run, "--task_suite", "libero_goal", "--tasks", "0"))
    assert "libero_goal" in text and "libero_spatial_no_noops" in text  # the keys it has
    port = free_port()  # nothing listens there
    text = one_paragraph(run_script("--policy_url", f"http://127.0.0.1:{port}", "--tasks", "0"))
    assert f"127.0.0.1:{port}" in text and "serve.py" in text
