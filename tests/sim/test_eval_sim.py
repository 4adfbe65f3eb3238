"""`prismatic/sim/evaluation.py` and `vla_scripts/eval_sim.py` without a simulator: the centre crop decided for every
kind of checkpoint (run folders trained with and without image augmentation, an HF export, the server's `/metadata`
with and without the record) down to the image the loaded policy is handed, and the bad input that must be refused
in one paragraph with exit code 2 before the first episode (a policy that does not fit the benchmark, a simulator
that is not installed). Flag-only mistakes are in tests/test_cli_errors.py's catalogue."""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
from scripts import import_script

from prismatic.sim import evaluation
from prismatic.sim.actions import PolicyFacts, ServerSource
from prismatic.sim.evaluation import EvalSimConfig, open_source, rollout_settings
from prismatic.sim.images import center_crop, resize_image
from prismatic.sim.libero.benchmark import BENCHMARK as LIBERO
from prismatic.sim.metaworld.benchmark import BENCHMARK as METAWORLD
from prismatic.sim.pool import EpisodeSpec, StepOutcome
from prismatic.sim.rollout import run_episodes

BASE_VLM = "tiny-vit+tiny-llama"
KEY = "libero_spatial"  # the run's only statistics: a LIBERO-shaped tokens policy (7-d actions, 1 view, no proprio)


def action_stats() -> dict:
    q01 = [-0.5 - 0.1 * d for d in range(7)]
    q99 = [0.25 + 0.2 * d for d in range(7)]
    action = {"mean": [0.0] * 7, "std": [1.0] * 7, "q01": q01, "q99": q99}
    action |= {"min": [v - 1 for v in q01], "max": [v + 1 for v in q99], "mask": [True] * 6 + [False]}
    return {"action": action, "num_transitions": 10, "num_trajectories": 2}


@pytest.fixture(scope="module", autouse=True)
def hub_offline() -> Iterator[None]:
    """Any Hub request fails at once instead of retrying without a network."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run folder in the training layout (random weights), its config.json without `image_aug`."""
    from prismatic.models import build_vlm

    run = tmp_path_factory.mktemp("eval_sim") / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.manual_seed(0)
    vlm = build_vlm(BASE_VLM)
    weights = {key: getattr(vlm, key).state_dict() for key in vlm.all_module_keys}
    torch.save({"model": weights}, run / "checkpoints" / "step-000002-epoch-00-loss=1.0000.pt")
    (run / "config.json").write_text(json.dumps({"vla": {"type": "tiny+mx-toy", "base_vlm": BASE_VLM}}))
    (run / "dataset_statistics.json").write_text(json.dumps({KEY: action_stats()}))
    return run


def with_image_aug(run: Path, image_aug: bool) -> Path:
    """`run`'s config.json as train.py writes it for `--image_aug <image_aug>` (the resolved top-level field)."""
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "image_aug": image_aug}))
    return run


@pytest.fixture(scope="module")
def hf_export(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny run exported by `vla_scripts/export_hf.py` (trained with augmentation: the export drops the record)."""
    script = import_script("export_hf")
    out = tmp_path_factory.mktemp("eval_sim_hf") / "hf"
    return script.export(
        script.ExportConfig(checkpoint=with_image_aug(tiny_run, True), out_dir=out, dtype="float32")
    )


def cfg_for(benchmark, **flags) -> EvalSimConfig:
    suite = "libero_spatial" if benchmark is LIBERO else "MT10"
    flags.setdefault("policy_url", "http://127.0.0.1:9")
    return EvalSimConfig(benchmark=benchmark.name, task_suite=suite, **flags)


def facts(image_aug: bool | None = None, **changes) -> PolicyFacts:
    values = dict(image_size=(24, 24), num_images=1, proprio_dim=0, chunk_size=1, unnorm_keys=(KEY,))
    values |= dict(trained_with_image_aug=image_aug, action_dims={KEY: 7})
    return PolicyFacts(**(values | changes))


# --- The centre crop --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image_aug", "flag", "crop"),
    [
        (True, None, True),  # trained with augmentation: crop (OpenVLA's get_vla_action, center_crop=True)
        (False, None, False),  # trained without: no crop
        (None, None, True),  # no record (HF export, Hub id): OpenVLA's default, center_crop=True
        (True, False, False),  # --center_crop overrides the record either way
        (False, True, True),
        (None, False, False),
    ],
)
@pytest.mark.parametrize("benchmark", [LIBERO, METAWORLD], ids=["libero", "metaworld"])
def test_rollout_settings_crop(benchmark, image_aug: bool | None, flag: bool | None, crop: bool) -> None:
    settings = rollout_settings(cfg_for(benchmark, center_crop=flag), benchmark, facts(image_aug))
    assert settings.center_crop is crop


@pytest.mark.parametrize("image_aug", [True, False])
def test_run_folder_record_gives_the_crop(tiny_run: Path, image_aug: bool) -> None:
    """A run folder, or a checkpoint file inside it, loaded as eval_sim.py loads it."""
    with_image_aug(tiny_run, image_aug)
    checkpoint = next((tiny_run / "checkpoints").glob("step-*.pt"))
    for path in (tiny_run, checkpoint):
        cfg = cfg_for(LIBERO, policy_url=None, checkpoint=str(path), device="cpu")
        source = open_source(cfg)
        assert source.facts.trained_with_image_aug is image_aug
        assert rollout_settings(cfg, LIBERO, source.facts).center_crop is image_aug


class OneStepPool:
    """One LIBERO episode of a fake simulator whose every frame is `frame` (the loop's pool interface)."""

    benchmark, num_envs = LIBERO, 1

    def __init__(self, frame: np.ndarray) -> None:
        from prismatic.sim.benchmark import SimObservation

        self.observation = SimObservation((frame, frame), np.zeros(8, np.float32), np.zeros(3))

    def reset(self, specs):
        return dict.fromkeys(specs, self.observation)

    def step(self, actions):
        return {slot: StepOutcome(self.observation, False) for slot in actions}

    def language(self, suite: str, task_id: int) -> str:
        return "pick up the black bowl"


def test_hf_export_has_no_record_and_the_policy_is_handed_the_centre_crop(
    hf_export: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An HF export says nothing of image augmentation: the rollout crops, as OpenVLA does by default, and the
    loaded policy itself receives the centre-cropped frame."""
    cfg = cfg_for(LIBERO, policy_url=None, checkpoint=str(hf_export), device="cpu", max_steps=1)
    source = open_source(cfg)
    assert source.policy.trained_with_image_aug is None and source.facts.trained_with_image_aug is None
    settings = rollout_settings(cfg, LIBERO, source.facts)
    assert settings.center_crop is True
    handed = []
    predict = source.policy.decode_batch

    def spy(images, instructions, unnorm_key, **kwargs):
        handed.extend(images)
        return predict(images, instructions, unnorm_key, **kwargs)

    monkeypatch.setattr(source.policy, "decode_batch", spy)
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:64, 0:64]
    frame = np.clip(np.stack([x * 4, y * 4, (x + y) * 2], -1) + rng.integers(0, 20, (64, 64, 3)), 0, 255)
    frame = frame.astype(np.uint8)
    (result,) = run_episodes(OneStepPool(frame), [EpisodeSpec("libero_spatial", 0, 0)], source, settings)
    assert result.steps == 11  # 10 no-ops, then the policy's one step
    size = tuple(source.policy.image_size)
    expected = center_crop(resize_image(frame, size))
    assert len(handed) == 1 and np.array_equal(np.asarray(handed[0]), expected)
    assert not np.array_equal(expected, resize_image(frame, size))


class MetadataServer:
    """Answers `GET /metadata` with `answer` (a stand-in for serve.py's; `/act` is not needed here)."""

    def __init__(self, answer: dict) -> None:
        body = json.dumps(answer).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(200 if self.path == "/metadata" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def served_metadata(tiny_run: Path) -> dict:
    """What serve.py's `/metadata` answers for the tiny run (`prismatic.inference.server.metadata`)."""
    from prismatic.inference import load_policy
    from prismatic.inference.server import metadata

    answer = metadata(load_policy(tiny_run, device="cpu"), max_batch_size=4, max_wait_ms=5.0)
    return json.loads(json.dumps(answer))  # as it travels


@pytest.mark.parametrize(
    ("record", "crop"),
    [("missing", True), (True, True), (False, False), (None, True)],
    ids=["missing", "true", "false", "null"],
)
def test_server_metadata_gives_the_crop(served_metadata: dict, record, crop: bool) -> None:
    """An older server leaves `trained_with_image_aug` out, a newer one says true / false / null (unknown)."""
    answer = {k: v for k, v in served_metadata.items() if k != "trained_with_image_aug"}
    if record != "missing":
        answer["trained_with_image_aug"] = record
    server = MetadataServer(answer)
    try:
        source = ServerSource(server.url, max_concurrent=1)
        try:
            assert source.facts.trained_with_image_aug is (None if record == "missing" else record)
            assert source.facts.action_dims == {KEY: 7} and source.facts.chunk_size == 1
            cfg = cfg_for(LIBERO, policy_url=server.url)
            assert rollout_settings(cfg, LIBERO, source.facts).center_crop is crop
        finally:
            source.close()
    finally:
        server.close()


# --- Bad input: refused in one paragraph, exit 2, before the first episode --------------------------------------


def refused(argv: list[str], capsys: pytest.CaptureFixture, script: str = "eval_sim") -> str:
    """Run the script's `main` in this process; it must exit 2 with one `error:` paragraph and no traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        import_script(script).main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


class NoEpisodes:
    """An `EnvPool` that fails the test if the evaluation gets as far as starting simulators."""

    def __init__(self, *args, **kwargs) -> None:
        pytest.fail("the evaluation started simulators: it should have refused before the first episode")


@pytest.fixture
def no_simulator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's rendering and simulator checks pass (the tests here are about what comes after them), and no
    simulator may start."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr("prismatic.sim.render.check_render_backend", lambda: "egl")
    monkeypatch.setattr(METAWORLD, "check_install", lambda: None)
    monkeypatch.setattr(LIBERO, "check_install", lambda: None)
    monkeypatch.setattr("prismatic.sim.pool.EnvPool", NoEpisodes)


class FactsSource:
    """An action source that is only its facts (the refusals come before any query)."""

    def __init__(self, policy: PolicyFacts) -> None:
        self.facts = policy

    def act(self, queries, unnorm_key):
        pytest.fail("the policy was asked: it should have been refused before the first episode")

    def close(self) -> None:
        pass


def test_a_libero_run_on_metaworld_is_refused_before_the_first_episode(
    tiny_run: Path, no_simulator: None, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """The real tiny LIBERO-shaped run (7-d actions) evaluated on Meta-World (4-d)."""
    out = tmp_path / "out"
    args = ["--benchmark", "metaworld", "--checkpoint", str(tiny_run), "--task_suite", "MT10", "--tasks", "0"]
    message = refused([*args, "--device", "cpu", "--out_dir", str(out)], capsys)
    assert "The policy emits 7 numbers per action (statistics 'libero_spatial')" in message
    assert "Meta-World's controller takes 4" in message
    assert not out.exists()


@pytest.mark.parametrize(
    ("benchmark", "changes", "key_words"),
    [
        ("metaworld", {"num_images": 2}, ("The policy reads 2 camera views; Meta-World renders 1",)),
        ("libero", {"num_images": 3}, ("The policy reads 3 camera views; LIBERO renders 2", "1 or 2")),
        ("metaworld", {"proprio_dim": 8}, ("The policy reads 8 proprio numbers; Meta-World's state has 4",)),
        ("libero", {"proprio_dim": 4}, ("The policy reads 4 proprio numbers; LIBERO's state has 8",)),
        (
            "libero",
            {"unnorm_keys": ("metaworld_mt10",), "action_dims": {"metaworld_mt10": 4}},
            ("no action statistics for LIBERO suite 'libero_spatial'", "metaworld_mt10", "--unnorm_key"),
        ),
        (
            "libero",
            {"unnorm_keys": (KEY,), "action_dims": {KEY: 4}},
            ("emits 4 numbers per action", "LIBERO's controller takes 7"),
        ),
    ],
    ids=["mw-views", "libero-views", "mw-proprio", "libero-proprio", "libero-stats", "libero-action-size"],
)
def test_a_policy_that_does_not_fit_is_refused_before_the_first_episode(
    benchmark: str,
    changes: dict,
    key_words: tuple[str, ...],
    no_simulator: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(evaluation, "open_source", lambda cfg: FactsSource(facts(**changes)))
    out = tmp_path / "out"
    message = refused(
        [
            "--benchmark",
            benchmark,
            "--policy_url",
            "http://127.0.0.1:9",
            "--tasks",
            "0",
            "--out_dir",
            str(out),
        ],
        capsys,
    )
    for word in key_words:
        assert word in message, message
    assert not out.exists()


def hide_modules(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """`importlib.util.find_spec` answers None for `names`, as when they are not installed."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        return None if name in names else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(
    ("benchmark", "missing", "key_words"),
    [
        ("metaworld", ("metaworld",), ("Meta-World cannot run: metaworld is not installed", "make install")),
        ("libero", ("libero",), ("LIBERO is not installed", "make install", "hf-libero")),
        ("metaworld", ("mujoco",), ("MuJoCo is not installed", "make install")),
    ],
    ids=["metaworld", "libero", "mujoco"],
)
def test_a_simulator_that_is_not_installed_names_the_install_command(
    benchmark: str,
    missing: tuple[str, ...],
    key_words: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # where prepare_libero would write its config
    if "mujoco" not in missing:  # the rendering probe opens an OpenGL context: not this test's business
        monkeypatch.setattr("prismatic.sim.render.check_render_backend", lambda: "egl")
    monkeypatch.setattr(evaluation, "open_source", lambda cfg: pytest.fail("the policy was loaded"))
    hide_modules(monkeypatch, *missing)
    message = refused(
        ["--benchmark", benchmark, "--policy_url", "http://127.0.0.1:9", "--tasks", "0"], capsys
    )
    for word in key_words:
        assert word in message, message


def test_eval_libero_trials_beyond_the_initial_states_refused_at_parse_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """51 episodes of a task LIBERO has 50 initial states for: refused before the simulator or the policy."""
    monkeypatch.setattr(evaluation, "evaluate", lambda cfg: pytest.fail("evaluate() ran"))
    for script, extra in (("eval_libero", []), ("eval_sim", ["--benchmark", "libero"])):
        message = refused(
            [*extra, "--policy_url", "http://127.0.0.1:9", "--num_trials_per_task", "51"], capsys, script
        )
        assert "--num_trials_per_task 51 is more than LIBERO has" in message and "at most 50" in message
