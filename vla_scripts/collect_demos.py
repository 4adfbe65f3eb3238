r"""Demonstrations from a simulator's scripted experts, written as an RLDS dataset to fine-tune on.

    python vla_scripts/collect_demos.py --benchmark metaworld --task_suite MT10 --episodes_per_task 50 \
        --data_root_dir data/rlds [--tasks reach-v3,push-v3] [--resolution 128] [--num_workers 2] [--seed 0] \
        [--action_noise 0.1] [--shadows false] [--val_fraction 0.1] [--name metaworld_mt10] [--overwrite]

Meta-World's experts (`metaworld.policies`) run in `--num_workers` spawned processes (MuJoCo's rendering must not
share a process with TensorFlow), one episode file each in the own-data format of `convert_to_rlds.py`; this
process then writes them through the converter's code path as `<data_root_dir>/<name>/<version>/`, with the plugin
file `<data_root_dir>/<name>/<name>_dataset.py` that registers the dataset (4-d actions: `eef_delta_xyz_gripper`).
Each step holds the upright corner2 view (`image`), the 4-d state (`state`: hand xyz, gripper opening), the
expert's 4-d action and the task's instruction (LeRobot's task description). An episode ends at the step the task
succeeds; failed episodes are left out (counted in the summary) and the next demonstrations are run in their place,
up to twice the number asked per task.

Seeds: demonstration j of a task is the simulator's episode 1_000_000 + j under `--seed` (evaluation episode i is
episode i), so no demonstration repeats an evaluated configuration. The same flags give the same episodes in any
number of workers. `--action_noise s` executes the expert's xyz action plus N(0, s) noise while recording the
clean action (recovery data). The val split holds the last `--val_fraction` of every task's demonstrations (at
least one each). The flags that decide the data are stored beside it (`collect_config.json`): running the same
collection again reuses the dataset; different ones are refused unless `--overwrite`. docs/metaworld.md.
"""

# No `from __future__ import annotations`: with it, @dataclass needs this module in sys.modules, which a test
# loading the file by path does not give; real annotations need nothing (Python >= 3.10).
import json
import logging
import multiprocessing
import os
import re
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from prismatic.sim.benchmark import get_benchmark, parse_tasks
from prismatic.sim.render import check_render_backend
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError, did_you_mean
from prismatic.util.files import write_text_atomic
from prismatic.util.lazy import import_file
from prismatic.util.logging import setup_logging

logger = logging.getLogger("vla_scripts.collect_demos")

COLLECTORS = ("metaworld",)  # benchmarks with scripted experts (LIBERO has none)
CONFIG_FILE = "collect_config.json"
MAX_ATTEMPTS_FACTOR = 2  # demonstrations tried per task, at most this many times --episodes_per_task
CHUNK_EPISODES = 10  # demonstrations per worker job (one simulator is built per job)


@dataclass
class CollectConfig:
    """Flags of this script (examples above)."""

    data_root_dir: Path  # where <name>/<version>/ and the plugin file <name>/<name>_dataset.py are written
    benchmark: str = "metaworld"  # simulator whose scripted experts are run: metaworld
    task_suite: str = "MT50"  # the benchmark's suite (MT50, MT10, easy, medium, hard, very_hard)
    tasks: str | None = (
        None  # task names or ids of the suite, e.g. reach-v3,push-v3 or 0,3 (default: every task)
    )
    episodes_per_task: int = 50  # successful demonstrations per task
    resolution: int = 128  # square render size, in pixels
    seed: int = 0  # seeds the positions and the action noise of every demonstration
    num_workers: int = 2  # simulator processes
    action_noise: float = (
        0.0  # std of Gaussian noise added to the executed xyz action (the clean one is recorded)
    )
    shadows: bool = True  # render shadows as the benchmark does; false renders faster (evaluate the same way)
    name: str | None = None  # dataset name (default: metaworld_<suite, lowercase>)
    version: str = "1.0.0"  # dataset version, major.minor.patch
    val_fraction: float = 0.1  # share of every task's demonstrations held out as the val split, in [0, 1)
    num_shards: int = 1  # tfrecord files per split (>= 1)
    overwrite: bool = False  # collect again and replace the dataset (else: reuse it when the flags match)

    def __post_init__(self) -> None:
        if self.benchmark not in COLLECTORS:
            raise ConfigError(
                f"--benchmark '{self.benchmark}' has no scripted experts to collect demonstrations with."
                f"{did_you_mean(self.benchmark, COLLECTORS)} Valid choices: {', '.join(COLLECTORS)}."
            )
        from prismatic.sim.metaworld.benchmark import default_dataset_name  # lazy: numpy only

        if self.name is None:
            self.name = default_dataset_name(self.task_suite)  # also refuses an unknown suite
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ConfigError(
                f"--name '{self.name}' is not a dataset name: use lowercase letters, digits and underscores, "
                "starting with a letter (e.g. metaworld_mt10)."
            )
        if not re.fullmatch(r"\d+\.\d+\.\d+", self.version):
            raise ConfigError(f"--version '{self.version}' is not major.minor.patch, e.g. 1.0.0.")
        for flag, value, low in (
            ("episodes_per_task", self.episodes_per_task, 1),
            ("resolution", self.resolution, 16),
            ("num_workers", self.num_workers, 1),
            ("num_shards", self.num_shards, 1),
        ):
            if value < low:
                raise ConfigError(f"--{flag} {value} must be at least {low}.")
        if not 0 <= self.action_noise <= 1:  # also refuses NaN
            raise ConfigError(
                f"--action_noise {self.action_noise} is outside [0, 1]: it is the std of the noise added to the "
                "executed xyz action, whose range is [-1, 1] (e.g. 0.1; 0 = none)."
            )
        if not 0 <= self.val_fraction < 1:
            raise ConfigError(
                f"--val_fraction {self.val_fraction} is outside [0, 1): it is the share of every task's "
                "demonstrations held out as the val split (e.g. 0.1; 0 = none)."
            )
        if self.val_fraction > 0 and self.episodes_per_task < 2:
            raise ConfigError(
                f"--episodes_per_task {self.episodes_per_task} leaves no training demonstration once the val split "
                "holds one of every task: ask for at least 2, or pass --val_fraction 0."
            )


def task_list(cfg: CollectConfig) -> list[str]:
    """The names of the tasks to collect, in the suite's order (`--tasks` as names or ids)."""
    benchmark = get_benchmark(cfg.benchmark)
    names = benchmark.task_names(cfg.task_suite)
    return [names[i] for i in parse_tasks(benchmark, cfg.task_suite, cfg.tasks)]


def collection_key(cfg: CollectConfig, tasks: list[str]) -> dict[str, Any]:
    """Everything that decides the collected data (not the worker count): the cache is reused when it is equal."""
    return {
        "benchmark": cfg.benchmark,
        "tasks": tasks,
        "episodes_per_task": cfg.episodes_per_task,
        "resolution": cfg.resolution,
        "seed": cfg.seed,
        "action_noise": cfg.action_noise,
        "shadows": cfg.shadows,
        "val_fraction": cfg.val_fraction,
        "num_shards": cfg.num_shards,
        "simulator": {package: metadata.version(package) for package in ("metaworld", "mujoco")},
    }


def cached(cfg: CollectConfig, key: dict[str, Any]) -> dict[str, Any] | None:
    """The stored record of an existing dataset collected with `key`, None when there is none.

    With `--overwrite` there is none: the collection runs again and replaces the dataset.

    Raises:
        ConfigError: a dataset is there, collected otherwise (or not by this script), and `--overwrite` is off.
    """
    target = Path(cfg.data_root_dir) / cfg.name / cfg.version
    if cfg.overwrite or not (target / "dataset_info.json").exists():
        return None
    record_path = target / CONFIG_FILE
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("key") == key:
        return record
    if record is None:
        why = f"it has no readable {CONFIG_FILE}, so it was not collected by this script"
    else:
        old = record.get("key", {})
        changed = sorted(k for k in set(key) | set(old) if key.get(k) != old.get(k))
        why = f"it was collected with other {', '.join(changed)}"
    raise ConfigError(
        f"'{target}' already holds an RLDS dataset, but {why}. Pass --overwrite to collect again and replace it "
        "(the old one is kept until the new one is complete), or choose another --name or --version."
    )


def plan_jobs(cfg: CollectConfig, missing: dict[str, list[int]], out_dir: Path) -> list[Any]:
    """Worker jobs for the demonstrations `missing` (task -> demonstration numbers), CHUNK_EPISODES per job."""
    from prismatic.sim.metaworld.demos import DemoRequest

    jobs = []
    for task, indices in missing.items():
        for start in range(0, len(indices), CHUNK_EPISODES):
            jobs.append(
                DemoRequest(
                    task=task,
                    demo_indices=tuple(indices[start : start + CHUNK_EPISODES]),
                    seed=cfg.seed,
                    resolution=cfg.resolution,
                    shadows=cfg.shadows,
                    action_noise=cfg.action_noise,
                    out_dir=str(out_dir),
                )
            )
    return jobs


def next_round(
    tasks: list[str], episodes_per_task: int, successes: dict[str, int], tried: dict[str, int]
) -> dict[str, list[int]]:
    """The demonstrations to run next: for each task still short of `episodes_per_task` successes, as many new
    demonstration numbers (after the `tried` ones) as it lacks, within MAX_ATTEMPTS_FACTOR times the number asked."""
    limit = MAX_ATTEMPTS_FACTOR * episodes_per_task
    missing = {}
    for task in tasks:
        count = min(episodes_per_task - successes.get(task, 0), limit - tried.get(task, 0))
        if count > 0:
            missing[task] = list(range(tried.get(task, 0), tried.get(task, 0) + count))
    return missing


def run_experts(cfg: CollectConfig, tasks: list[str], out_dir: Path) -> list[Any]:
    """Collect `episodes_per_task` successful demonstrations per task into `out_dir`, in worker processes.

    Demonstrations are tried in order 0, 1, ...; each round runs as many new ones as a task still lacks, so the
    result is each task's first successful demonstrations whatever the number of workers. Returns every result,
    failures included.
    """
    from prismatic.sim.metaworld.demos import collect

    results: list[Any] = []
    successes: dict[str, int] = defaultdict(int)
    tried: dict[str, int] = defaultdict(int)
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no TensorFlow, no inherited GL state
    with context.Pool(cfg.num_workers) as pool:
        while missing := next_round(tasks, cfg.episodes_per_task, successes, tried):
            for task, indices in missing.items():
                tried[task] += len(indices)
            for batch in pool.imap(collect, plan_jobs(cfg, missing, out_dir)):
                for result in batch:
                    results.append(result)
                    successes[result.task] += result.success
    return results


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them), collect, write the dataset and its plugin file; a mistake exits 2."""
    cfg = parse_config(CollectConfig, argv, doc=__doc__)
    setup_logging(0)
    tasks = task_list(cfg)
    get_benchmark(cfg.benchmark).check_install()  # before the versions of the simulator are read
    key = collection_key(cfg, tasks)
    record = cached(cfg, key)
    target = Path(cfg.data_root_dir) / cfg.name / cfg.version
    if record is not None:
        print(
            f"reusing {target}: collected with the same flags ({record['summary']}); --overwrite collects again"
        )
        return 0

    check_render_backend()  # chosen here, inherited by the workers
    staging = Path(cfg.data_root_dir) / cfg.name / f".episodes.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        start = time.perf_counter()
        results = run_experts(cfg, tasks, staging)
        seconds = time.perf_counter() - start
        kept = sorted((r for r in results if r.success), key=lambda r: (tasks.index(r.task), r.demo_index))
        failed = [r for r in results if not r.success]
        short = {
            task: n for task in tasks if (n := sum(r.task == task for r in kept)) < cfg.episodes_per_task
        }
        for task, count in short.items():
            logger.warning(
                "%s: only %d of %d demonstrations succeeded within %d tries; the dataset holds those.",
                task,
                count,
                cfg.episodes_per_task,
                MAX_ATTEMPTS_FACTOR * cfg.episodes_per_task,
            )
        if not kept:
            raise ConfigError(f"No demonstration succeeded for {', '.join(tasks)}: nothing to write.")
        frames = sum(r.num_steps for r in results)
        summary = (
            f"{len(kept)} demonstrations of {len(tasks)} task(s), {len(failed)} failed and left out; "
            f"{frames} frames in {seconds:.0f} s with {cfg.num_workers} worker(s)"
        )
        print(summary)

        convert = import_file(
            "convert_to_rlds_script", Path(__file__).resolve().parent / "convert_to_rlds.py"
        )
        converted = convert.write_episode_files(
            [Path(r.path) for r in kept],
            cfg.data_root_dir,
            cfg.name,
            groups=[r.task for r in kept],
            file_paths=[Path(r.path).name for r in kept],  # not the temporary folder: the same in every run
            description=f"Scripted {cfg.benchmark} demonstrations, by vla_scripts/collect_demos.py.",
            version=cfg.version,
            val_fraction=cfg.val_fraction,
            num_shards=cfg.num_shards,
            overwrite=True,  # `cached` refused an existing dataset unless --overwrite
        )
        episodes = {
            task: [r.demo_index for r in kept if r.task == task] for task in tasks
        }  # demonstration numbers kept, per task
        write_text_atomic(
            converted.target / CONFIG_FILE,
            json.dumps({"key": key, "summary": summary, "episodes": episodes}, indent=2) + "\n",
            "collection record",
        )
        convert.register_converted(
            converted,
            cfg.data_root_dir,
            cfg.name,
            action_space="eef_delta_xyz_gripper",
            origin=f"scripted {cfg.benchmark} demonstrations ({', '.join(tasks)})",
            mapping=[
                "image: the upright corner2 camera -> observation/image",
                "state [4]: hand xyz, gripper opening -> observation/state",
                "action [4]: the expert's xyz + gripper (clean, also under --action_noise) -> action",
                "task description -> language_instruction",
            ],
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
