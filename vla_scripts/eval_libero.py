r"""Closed-loop evaluation in the LIBERO simulator: success rate per task with OpenVLA's protocol.

    python vla_scripts/eval_libero.py --checkpoint runs/<run_id> --task_suite libero_spatial
    python vla_scripts/eval_libero.py --checkpoint runs/<run_id> --task_suite libero_10 --num_envs 8 --tasks 0,3
    python vla_scripts/eval_libero.py --policy_url http://gpu-host:8000 --task_suite libero_goal --num_envs 16

Needs the simulator: `make install-sim` (LIBERO, robosuite, MuJoCo and LIBERO's assets; see docs/libero.md).

Each task of the suite runs `--num_trials_per_task` episodes (default 50, OpenVLA's), episode i from the task's
fixed initial state i, exactly as OpenVLA's `experiments/robot/libero/run_libero_eval.py` does (and OpenVLA-OFT's
for chunk heads): 10 settling steps, the suite's step limit (220 / 280 / 300 / 520 / 400), 256x256 renders
rotated 180 degrees and resized through JPEG and Lanczos as training saw them, the centre crop for runs trained
with image augmentation (`--center_crop` overrides), the suite's statistics (or its `_no_noops` variant), the
gripper mapped, binarised and inverted for LIBERO's controller; a chunk head's whole chunk runs open loop, with
proprio and the wrist image when the run reads them. docs/libero.md lists each step and its source.

`--num_envs N` runs N simulators in subprocesses and decodes their observations in one batch; every episode is
seeded on its own, so the table is the same for any N. `--policy_url` asks a running `vla_scripts/serve.py`
instead of loading the model here (a GPU server, CPU simulators). Prints the table with 95 % Wilson intervals and
writes `results.json`, `metrics.jsonl` (one record per episode; `--trackers jsonl wandb` as in training) and,
with `--save_videos`, one mp4 per episode into `--out_dir` (default `<run>/eval_libero/<suite>`).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.models.compile_scope import DEFAULT_COMPILE_SCOPE, check_compile_scope
from prismatic.run_layout import LIBERO_EVAL_DIR, LIBERO_RESULTS_FILE, LIBERO_VIDEOS_DIR
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError
from prismatic.util.files import looks_like_local_path, write_json_atomic
from prismatic.util.logging import setup_logging

logger = logging.getLogger("vla_scripts.eval_libero")


@dataclass
class EvalLiberoConfig:
    """Example: python vla_scripts/eval_libero.py --checkpoint runs/<run_id> --task_suite libero_spatial"""

    checkpoint: str | None = None  # a run folder, <run>/checkpoints/step-*, an HF OpenVLA folder, or a Hub id
    policy_url: str | None = None  # a running serve.py (http://host:port) instead of --checkpoint
    task_suite: str = "libero_spatial"  # libero_spatial, libero_object, libero_goal, libero_10 or libero_90
    tasks: str | None = None  # task ids to run, e.g. 0,3 (default: every task of the suite)
    num_trials_per_task: int = 50  # episodes per task (initial states 0..N-1; LIBERO has 50)
    seed: int = 7  # seeds Python, NumPy and torch (OpenVLA's set_seed_everywhere)
    num_envs: int = 1  # simulators stepping in parallel (subprocesses), batched into one policy call
    center_crop: bool | None = (
        None  # default: yes when the run trained with image_aug (unknown: yes, OpenVLA's)
    )
    unnorm_key: str | None = None  # default: the suite's statistics (<suite> or <suite>_no_noops)
    max_steps: int | None = None  # policy steps per episode; default: the suite's (OpenVLA's table)
    save_videos: bool = False  # write an mp4 of each episode's agent view
    out_dir: Path | None = (
        None  # default: <run>/eval_libero/<suite> (./eval_libero/<suite> for a Hub id / URL)
    )
    libero_assets_dir: Path | None = None  # a local copy of LIBERO's assets (default: the installed ones)
    trackers: list[str] = field(default_factory=lambda: ["jsonl"])  # jsonl and/or wandb
    wandb_project: str = "openvla"  # W&B project (with --trackers wandb)
    wandb_entity: str | None = None  # W&B entity (with --trackers wandb)
    device: str | None = None  # default: cuda if a GPU is available, else cpu
    dtype: str | None = None  # float32 / bfloat16 / float16; default bf16 on GPU, fp32 on CPU
    hf_token: str | None = None  # for gated Hub repos
    compile_decoding: bool = False  # torch.compile the static-cache decode steps (with --checkpoint)
    compile_scope: str = DEFAULT_COMPILE_SCOPE  # with --compile_decoding: "layers" (each block) or "whole"

    def __post_init__(self) -> None:
        if (self.checkpoint is None) == (self.policy_url is None):
            raise ConfigError(
                "Give exactly one of --checkpoint (load the policy here) and --policy_url (ask a running "
                f"serve.py); got checkpoint={self.checkpoint!r}, policy_url={self.policy_url!r}."
            )
        if self.checkpoint is not None:
            if looks_like_local_path(self.checkpoint) and not Path(self.checkpoint).expanduser().exists():
                raise ConfigError(f"--checkpoint '{self.checkpoint}' does not exist.")
        if self.policy_url is not None and not self.policy_url.startswith(("http://", "https://")):
            raise ConfigError(f"--policy_url must be an http(s):// URL, got '{self.policy_url}'.")
        if self.policy_url is not None and self.compile_decoding:
            raise ConfigError(
                "--compile_decoding applies to a policy loaded here (--checkpoint); with --policy_url the server "
                "decodes: start it with `vla_scripts/serve.py --compile_decoding true` instead."
            )
        check_compile_scope(self.compile_scope, self.compile_decoding)
        for name in ("num_trials_per_task", "num_envs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}.")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"--max_steps must be >= 1, got {self.max_steps}.")


def parse_task_ids(text: str | None, count: int) -> list[int]:
    """`--tasks 0,3` as ids (every task when None).

    Raises:
        ConfigError: a value that is no integer, or no task id of the suite.
    """
    if text is None:
        return list(range(count))
    ids = []
    for part in str(text).replace(" ", "").split(","):
        if not part.lstrip("-").isdigit() or not 0 <= int(part) < count:
            raise ConfigError(
                f"--tasks: '{part}' is not a task id of this suite; valid ids are 0..{count - 1} "
                "(comma-separated, e.g. --tasks 0,3)."
            )
        ids.append(int(part))
    return sorted(set(ids))


def default_out_dir(cfg: EvalLiberoConfig) -> Path:
    """`<run>/eval_libero/<suite>` for a local checkpoint, else `./eval_libero/<suite>`."""
    if cfg.checkpoint is not None and Path(cfg.checkpoint).expanduser().exists():
        from prismatic.models.checkpoint_format import run_folder_of  # lazy: torch

        return run_folder_of(Path(cfg.checkpoint).expanduser()) / LIBERO_EVAL_DIR / cfg.task_suite
    return Path(LIBERO_EVAL_DIR) / cfg.task_suite


def open_source(cfg: EvalLiberoConfig) -> Any:
    """The action source: the policy loaded here, or the server at `--policy_url`."""
    from prismatic.sim.libero.actions import InProcessSource, ServerSource  # lazy: numpy / torch

    if cfg.policy_url is not None:
        return ServerSource(cfg.policy_url, max_concurrent=cfg.num_envs)
    from prismatic.inference import load_policy

    policy = load_policy(cfg.checkpoint, device=cfg.device, dtype=cfg.dtype, hf_token=cfg.hf_token)
    policy.compile_decoding, policy.compile_scope = cfg.compile_decoding, cfg.compile_scope
    return InProcessSource(policy, policy.trained_with_image_aug)


def _settings(cfg: EvalLiberoConfig, facts: Any) -> Any:
    from prismatic.sim.libero.protocol import suite_unnorm_key
    from prismatic.sim.libero.rollout import RolloutSettings
    from prismatic.sim.libero.suites import LIBERO_SUITES

    if facts.num_images not in (1, 2):
        raise ConfigError(
            f"The policy reads {facts.num_images} camera views; LIBERO renders two (agent view, wrist): only "
            "policies trained with --vla.num_images 1 or 2 can be evaluated here."
        )
    if facts.proprio_dim not in (0, 8):
        raise ConfigError(
            f"The policy reads {facts.proprio_dim} proprio numbers; LIBERO's state (OpenVLA-OFT's) has 8: eef "
            "position, axis-angle, gripper qpos."
        )
    if cfg.unnorm_key is not None and cfg.unnorm_key not in facts.unnorm_keys:
        raise ConfigError(
            f"--unnorm_key '{cfg.unnorm_key}' is not in the checkpoint; its keys are: "
            f"{', '.join(facts.unnorm_keys) or 'none'}."
        )
    key = cfg.unnorm_key or suite_unnorm_key(cfg.task_suite, facts.unnorm_keys)
    crop = cfg.center_crop
    if crop is None:
        crop = facts.trained_with_image_aug is not False  # unknown: OpenVLA's default (center_crop=True)
        logger.info(
            "Centre crop %s (%s)",
            "on" if crop else "off",
            "the run trained with image augmentation"
            if facts.trained_with_image_aug
            else "the run trained without image augmentation"
            if facts.trained_with_image_aug is False
            else "the checkpoint does not say; OpenVLA's default",
        )
    return RolloutSettings(
        unnorm_key=key,
        image_size=tuple(facts.image_size),
        center_crop=crop,
        num_images=facts.num_images,
        use_proprio=facts.proprio_dim > 0,
        open_loop_steps=facts.chunk_size,
        max_steps=cfg.max_steps or LIBERO_SUITES[cfg.task_suite],
        keep_frames=cfg.save_videos,
    )


def evaluate_libero(cfg: EvalLiberoConfig) -> dict[str, Any]:
    """Run the evaluation `cfg` describes; returns the report written to `results.json`."""
    from prismatic.sim.libero import suites
    from prismatic.sim.libero.setup import check_render_backend, prepare_libero

    task_ids = parse_task_ids(cfg.tasks, suites.suite_task_count(cfg.task_suite))  # a typo fails in a second
    backend = check_render_backend()
    prepare_libero(cfg.libero_assets_dir)

    from prismatic.sim.libero.pool import EnvPool, EpisodeSpec
    from prismatic.sim.libero.report import format_table, protocol_record, summarize
    from prismatic.sim.libero.rollout import run_episodes
    from prismatic.training.trackers import TrackerRun, build_trackers
    from prismatic.training.train import seed_everything

    seed_everything(cfg.seed)
    source = open_source(cfg)
    out_dir = cfg.out_dir or default_out_dir(cfg)
    try:
        settings = _settings(cfg, source.facts)
        episodes = [
            EpisodeSpec(cfg.task_suite, task_id, episode, seed=0)
            for task_id in task_ids
            for episode in range(cfg.num_trials_per_task)
        ]
        out_dir.mkdir(parents=True, exist_ok=True)
        config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
        run = TrackerRun(
            out_dir, f"eval-libero-{cfg.task_suite}", config, None, cfg.wandb_project, cfg.wandb_entity
        )
        trackers = build_trackers(cfg.trackers, run)
        logger.info(
            "LIBERO %s: %d tasks x %d episodes on %d simulator(s), rendering with %s; unnorm key %s",
            cfg.task_suite,
            len(task_ids),
            cfg.num_trials_per_task,
            cfg.num_envs,
            backend,
            settings.unnorm_key,
        )
        progress = _Progress(len(episodes), cfg.task_suite, trackers, out_dir if cfg.save_videos else None)
        started = time.perf_counter()
        with EnvPool(cfg.num_envs) as pool:
            results = run_episodes(pool, episodes, source, settings, progress)
        seconds = time.perf_counter() - started
        summary = summarize(results)
        progress.close(summary["overall"]["success_rate"])
        report = {
            "task_suite": cfg.task_suite,
            "checkpoint": cfg.checkpoint,
            "policy_url": cfg.policy_url,
            "num_trials_per_task": cfg.num_trials_per_task,
            "num_envs": cfg.num_envs,
            "seed": cfg.seed,
            "protocol": protocol_record(settings),
            "seconds": round(seconds, 2),
            "episodes_per_minute": round(60 * len(results) / seconds, 2) if seconds > 0 else None,
            **summary,
        }
        write_json_atomic(out_dir / LIBERO_RESULTS_FILE, report, "LIBERO results")
        print(f"\nLIBERO {cfg.task_suite}: {cfg.checkpoint or cfg.policy_url}\n", flush=True)
        print(format_table(summary), flush=True)
        print(
            f"\n{len(results)} episodes in {seconds:.0f} s ({report['episodes_per_minute']} per minute); "
            f"wrote {out_dir / LIBERO_RESULTS_FILE}",
            flush=True,
        )
        return report
    finally:
        source.close()


class _Progress:
    """What happens as each episode ends: the progress bar with the running success rate, one tracker record
    (step = episodes done), the episode's video when asked for."""

    def __init__(self, total: int, suite: str, trackers: list[Any], videos_in: Path | None) -> None:
        import tqdm  # lazy: spared to --help

        self.bar = tqdm.tqdm(total=total, desc=f"LIBERO {suite}", unit="episode", dynamic_ncols=True)
        self.trackers, self.videos_in = trackers, videos_in
        self.done = self.successes = 0

    def __call__(self, result: Any) -> None:
        self.done += 1
        self.successes += int(result.success)
        rate = self.successes / self.done
        self.bar.update(1)
        self.bar.set_postfix(success=f"{100 * rate:.1f}%")
        record = {"task_id": result.spec.task_id, "episode": result.spec.episode_idx}
        record |= {"success": float(result.success), "steps": result.steps, "success_rate_so_far": rate}
        for tracker in self.trackers:
            tracker.log(self.done, record)
        if self.videos_in is not None:
            _write_video(self.videos_in / LIBERO_VIDEOS_DIR, result)

    def close(self, success_rate: float) -> None:
        """The overall rate as one last record (step = episodes + 1); trackers finish."""
        self.bar.close()
        for tracker in self.trackers:
            tracker.log(self.done + 1, {"success_rate": success_rate})
            tracker.finish()


def _write_video(videos: Path, result: Any) -> None:
    """The episode's agent-view frames as an H.264 mp4 at 30 fps, as OpenVLA's `save_rollout_video` writes them
    (through PyAV, a dependency already: imageio's legacy writer would need imageio-ffmpeg)."""
    import imageio.v3 as iio  # lazy: only with --save_videos

    videos.mkdir(parents=True, exist_ok=True)
    name = f"task{result.spec.task_id:02d}-episode{result.spec.episode_idx:02d}-success={result.success}.mp4"
    if result.frames:
        iio.imwrite(videos / name, np.stack(result.frames), plugin="pyav", codec="libx264", fps=30)
    result.frames.clear()


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them) and evaluate; a mistake exits 2 in one paragraph."""
    cfg = parse_config(EvalLiberoConfig, argv, doc=__doc__)
    setup_logging(0)
    evaluate_libero(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
