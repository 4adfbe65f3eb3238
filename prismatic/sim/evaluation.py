"""One closed-loop evaluation of a trained policy in a simulator benchmark, whatever the benchmark: its flags
(`EvalSimConfig`), the checks that refuse a policy that does not fit the benchmark before the first episode, the
episodes on the subprocess pool, and the report (`results.json`, trackers, videos).

`vla_scripts/eval_sim.py` is its entry point (`--benchmark libero|metaworld`); `vla_scripts/eval_libero.py` runs
the same evaluation for LIBERO under the flags it always had.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.models.compile_scope import DEFAULT_COMPILE_SCOPE, check_compile_scope
from prismatic.run_layout import SIM_RESULTS_FILE, SIM_VIDEOS_DIR, sim_eval_dir
from prismatic.util.errors import ConfigError
from prismatic.util.files import looks_like_local_path, write_json_atomic

logger = logging.getLogger(__name__)


@dataclass
class EvalSimConfig:
    """Example: python vla_scripts/eval_sim.py --benchmark metaworld --checkpoint runs/<run_id> --task_suite MT10"""

    benchmark: str = "libero"  # libero or metaworld (prismatic/sim/benchmark.py's registry)
    checkpoint: str | None = None  # a run folder, <run>/checkpoints/step-*, an HF OpenVLA folder, or a Hub id
    policy_url: str | None = None  # a running serve.py (http://host:port) instead of --checkpoint
    policy_auth_token_env: str | None = None  # the token --policy_url requires: held by this env variable
    policy_auth_token_file: Path | None = None  # or this file does (never the token on the command line)
    task_suite: str | None = None  # the benchmark's suite; default: its first (libero_spatial, MT50)
    tasks: str | None = None  # task ids or names to run, e.g. 0,3 or reach-v3,push-v3 (default: every task)
    num_trials_per_task: int = 50  # episodes per task (LIBERO: initial states 0..N-1, it has 50)
    seed: int = 7  # seeds Python, NumPy and torch (OpenVLA's set_seed_everywhere)
    num_envs: int = 1  # simulators stepping in parallel (subprocesses), batched into one policy call
    center_crop: bool | None = (
        None  # default: yes when the run trained with image_aug (unknown: yes, OpenVLA's)
    )
    unnorm_key: str | None = None  # default: the benchmark's rule for the suite
    max_steps: int | None = None  # policy steps per episode; default: the benchmark's for the suite
    resolution: int | None = None  # square render size; default: the benchmark's (LIBERO 256, Meta-World 480)
    shadows: bool = (
        True  # Meta-World: false skips MuJoCo's shadow pass (as `collect_demos.py --shadows false`)
    )
    save_videos: bool = False  # write an mp4 of each episode's primary camera
    out_dir: Path | None = (
        None  # default: <run>/eval_<benchmark>/<suite> (./eval_<benchmark>/<suite> for a URL)
    )
    libero_assets_dir: Path | None = None  # LIBERO: a local copy of its assets (default: the installed ones)
    trackers: list[str] = field(default_factory=lambda: ["jsonl"])  # jsonl and/or wandb
    wandb_project: str = "openvla"  # W&B project (with --trackers wandb)
    wandb_entity: str | None = None  # W&B entity (with --trackers wandb)
    device: str | None = None  # default: cuda if a GPU is available, else cpu
    dtype: str | None = None  # float32 / bfloat16 / float16; default bf16 on GPU, fp32 on CPU
    hf_token: str | None = None  # for gated Hub repos
    compile_decoding: bool = False  # torch.compile the static-cache decode steps (with --checkpoint)
    compile_scope: str = DEFAULT_COMPILE_SCOPE  # with --compile_decoding: "layers" (each block) or "whole"

    def __post_init__(self) -> None:
        from prismatic.sim.benchmark import get_benchmark  # lazy: numpy only, still before torch

        benchmark = get_benchmark(self.benchmark)
        if self.task_suite is None:
            self.task_suite = benchmark.suites[0]
        if self.task_suite not in benchmark.suites:
            benchmark.task_names(self.task_suite)  # raises the benchmark's own message, with did-you-mean
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
        token_flags = (self.policy_auth_token_env, self.policy_auth_token_file)
        if self.policy_url is None and token_flags != (None, None):
            raise ConfigError(
                "--policy_auth_token_env / --policy_auth_token_file are the token of a server (--policy_url); "
                "a policy loaded here (--checkpoint) needs none."
            )
        self.policy_auth_token()  # an unset variable or a missing file fails now, before any simulator starts
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
        if not self.shadows and self.benchmark == "libero":
            from prismatic.sim.libero.benchmark import SHADOWS_REFUSED

            raise ConfigError(SHADOWS_REFUSED)
        if self.resolution is not None and self.resolution < 8:
            raise ConfigError(f"--resolution must be >= 8 pixels, got {self.resolution}.")
        limit = benchmark.max_episodes_per_task(self.task_suite)
        if limit is not None and self.num_trials_per_task > limit:
            raise ConfigError(
                f"--num_trials_per_task {self.num_trials_per_task} is more than {benchmark.title} has: each task of "
                f"'{self.task_suite}' has {limit} distinct episodes (fixed initial states 0-{limit - 1}); ask for "
                f"at most {limit}."
            )

    def policy_auth_token(self) -> str | None:
        """The token sent to `--policy_url` (None: none), read now; never a field, so no record of the config
        (trackers, results.json) holds it."""
        from prismatic.inference.auth import read_token  # standard library only

        return read_token(self.policy_auth_token_env, self.policy_auth_token_file, "--policy_auth_token")


def default_out_dir(cfg: EvalSimConfig) -> Path:
    """`<run>/eval_<benchmark>/<suite>` for a local checkpoint, else `./eval_<benchmark>/<suite>`."""
    if cfg.checkpoint is not None and Path(cfg.checkpoint).expanduser().exists():
        from prismatic.models.checkpoint_format import run_folder_of  # lazy: torch

        return run_folder_of(Path(cfg.checkpoint).expanduser()) / sim_eval_dir(cfg.benchmark) / cfg.task_suite
    return Path(sim_eval_dir(cfg.benchmark)) / cfg.task_suite


def open_source(cfg: EvalSimConfig) -> Any:
    """The action source: the policy loaded here, or the server at `--policy_url`."""
    from prismatic.sim.actions import InProcessSource, ServerSource  # lazy: numpy / torch

    if cfg.policy_url is not None:
        return ServerSource(cfg.policy_url, max_concurrent=cfg.num_envs, auth_token=cfg.policy_auth_token())
    from prismatic.inference import load_policy

    policy = load_policy(cfg.checkpoint, device=cfg.device, dtype=cfg.dtype, hf_token=cfg.hf_token)
    policy.compile_decoding, policy.compile_scope = cfg.compile_decoding, cfg.compile_scope
    return InProcessSource(policy, policy.trained_with_image_aug)


def rollout_settings(cfg: EvalSimConfig, benchmark: Any, facts: Any) -> Any:
    """How observations become queries and chunks become steps, from the benchmark, the policy and the flags.

    Raises:
        ConfigError: the policy's views, proprio or action size do not fit the benchmark, or an unknown
            `--unnorm_key`.
    """
    from prismatic.sim.rollout import RolloutSettings

    if not 1 <= facts.num_images <= benchmark.num_views:
        raise ConfigError(
            f"The policy reads {facts.num_images} camera views; {benchmark.title} renders {benchmark.num_views}: "
            f"only policies trained with --vla.num_images 1{' or 2' if benchmark.num_views == 2 else ''} can be "
            "evaluated here."
        )
    if facts.proprio_dim not in (0, benchmark.proprio_dim):
        raise ConfigError(
            f"The policy reads {facts.proprio_dim} proprio numbers; {benchmark.title}'s state has "
            f"{benchmark.proprio_dim}. Evaluate it on the benchmark whose data it was trained on."
        )
    if cfg.unnorm_key is not None and cfg.unnorm_key not in facts.unnorm_keys:
        raise ConfigError(
            f"--unnorm_key '{cfg.unnorm_key}' is not in the checkpoint; its keys are: "
            f"{', '.join(facts.unnorm_keys) or 'none'}."
        )
    key = cfg.unnorm_key or benchmark.unnorm_key(cfg.task_suite, facts.unnorm_keys)
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
        max_steps=cfg.max_steps or benchmark.max_steps(cfg.task_suite),
        num_steps_wait=benchmark.num_steps_wait,
        keep_frames=cfg.save_videos,
    )


def check_action_dim(benchmark: Any, source: Any, unnorm_key: str) -> None:
    """A policy whose actions have another size than the benchmark's controller takes is refused before the first
    episode (the statistics of `unnorm_key` say how many numbers it emits)."""
    action_dim = source.facts.action_dims.get(unnorm_key)
    if action_dim is not None and action_dim != benchmark.action_dim:
        raise ConfigError(
            f"The policy emits {action_dim} numbers per action (statistics '{unnorm_key}'); {benchmark.title}'s "
            f"controller takes {benchmark.action_dim}. Evaluate it on the benchmark whose data it was trained on."
        )


def evaluate(cfg: EvalSimConfig) -> dict[str, Any]:
    """Run the evaluation `cfg` describes; returns the report written to `results.json`."""
    from prismatic.sim.benchmark import get_benchmark, parse_tasks
    from prismatic.sim.render import check_render_backend

    benchmark = get_benchmark(cfg.benchmark)
    if cfg.benchmark == "libero":
        benchmark.assets_dir = cfg.libero_assets_dir
    task_ids = parse_tasks(benchmark, cfg.task_suite, cfg.tasks)  # a typo fails in a second
    backend = check_render_backend()
    benchmark.check_install()

    from prismatic.sim.pool import EnvPool, EpisodeSpec
    from prismatic.sim.report import format_table, protocol_record, summarize
    from prismatic.sim.rollout import run_episodes
    from prismatic.training.trackers import TrackerRun, build_trackers
    from prismatic.training.train import seed_everything

    seed_everything(cfg.seed)
    source = open_source(cfg)
    out_dir = cfg.out_dir or default_out_dir(cfg)
    try:
        settings = rollout_settings(cfg, benchmark, source.facts)
        check_action_dim(benchmark, source, settings.unnorm_key)
        episodes = [
            EpisodeSpec(cfg.task_suite, task_id, episode, seed=0)
            for task_id in task_ids
            for episode in range(cfg.num_trials_per_task)
        ]
        out_dir.mkdir(parents=True, exist_ok=True)
        config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
        run = TrackerRun(
            out_dir,
            f"eval-{cfg.benchmark}-{cfg.task_suite}",
            config,
            None,
            cfg.wandb_project,
            cfg.wandb_entity,
        )
        trackers = build_trackers(cfg.trackers, run)
        logger.info(
            "%s %s: %d tasks x %d episodes on %d simulator(s), rendering with %s; unnorm key %s",
            benchmark.title,
            cfg.task_suite,
            len(task_ids),
            cfg.num_trials_per_task,
            cfg.num_envs,
            backend,
            settings.unnorm_key,
        )
        label = f"{benchmark.title} {cfg.task_suite}"
        progress = _Progress(len(episodes), label, trackers, out_dir if cfg.save_videos else None)
        started = time.perf_counter()
        resolution = cfg.resolution or benchmark.default_resolution
        with EnvPool(benchmark, cfg.num_envs, resolution, cfg.shadows) as pool:
            results = run_episodes(pool, episodes, source, settings, progress)
        seconds = time.perf_counter() - started
        summary = summarize(results)
        progress.close(summary["overall"]["success_rate"])
        # LIBERO's report keeps exactly the keys it always had; other benchmarks say which one and its render size.
        extra = {} if cfg.benchmark == "libero" else {"benchmark": cfg.benchmark, "resolution": resolution}
        extra |= {} if cfg.shadows else {"shadows": False}
        report = {
            **extra,
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
        write_json_atomic(out_dir / SIM_RESULTS_FILE, report, f"{label} results")
        print(f"\n{label}: {cfg.checkpoint or cfg.policy_url}\n", flush=True)
        print(format_table(summary), flush=True)
        print(
            f"\n{len(results)} episodes in {seconds:.0f} s ({report['episodes_per_minute']} per minute); "
            f"wrote {out_dir / SIM_RESULTS_FILE}",
            flush=True,
        )
        return report
    finally:
        source.close()


class _Progress:
    """What happens as each episode ends: the progress bar with the running success rate, one tracker record
    (step = episodes done), the episode's video when asked for."""

    def __init__(self, total: int, label: str, trackers: list[Any], videos_in: Path | None) -> None:
        import tqdm  # lazy: spared to --help

        self.bar = tqdm.tqdm(total=total, desc=label, unit="episode", dynamic_ncols=True)
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
        if result.invalid_chunks is not None:  # a head whose chunks may not decode (fast)
            record["invalid_chunks"] = result.invalid_chunks
        for tracker in self.trackers:
            tracker.log(self.done, record)
        if self.videos_in is not None:
            _write_video(self.videos_in / SIM_VIDEOS_DIR, result)

    def close(self, success_rate: float) -> None:
        """The overall rate as one last record (step = episodes + 1); trackers finish."""
        self.bar.close()
        for tracker in self.trackers:
            tracker.log(self.done + 1, {"success_rate": success_rate})
            tracker.finish()


def _write_video(videos: Path, result: Any) -> None:
    """The episode's primary-camera frames as an H.264 mp4 at 30 fps, as OpenVLA's `save_rollout_video` writes
    them (through PyAV, a dependency already: imageio's legacy writer would need imageio-ffmpeg)."""
    import imageio.v3 as iio  # lazy: only with --save_videos

    videos.mkdir(parents=True, exist_ok=True)
    name = f"task{result.spec.task_id:02d}-episode{result.spec.episode_idx:02d}-success={result.success}.mp4"
    if result.frames:
        iio.imwrite(videos / name, np.stack(result.frames), plugin="pyav", codec="libx264", fps=30)
    result.frames.clear()


def run_from_flags(config_class: type[EvalSimConfig], argv: list[str] | None, doc: str | None) -> int:
    """What `eval_sim.py` and `eval_libero.py` do: parse the flags (`--help` lists them), refuse W&B without a login
    before the simulator and the policy load, evaluate; returns the exit code (a mistake exits 2 through the
    scripts' `entry_point`)."""
    from prismatic.training.trackers import check_trackers  # lazy: the config layer stays free of training
    from prismatic.util.cli import parse_config
    from prismatic.util.logging import setup_logging

    cfg = parse_config(config_class, argv, doc=doc)
    check_trackers(cfg.trackers)
    setup_logging(0)
    evaluate(cfg)
    return 0
