r"""The action heads side by side on Meta-World: the same demonstrations, steps, batch, seed and closed-loop episodes
for each preset, and one markdown table of success (k/n per task and overall, 95 % Wilson interval), training step
time and actions/s.

    OMP_NUM_THREADS=1 WANDB_MODE=offline .venv/bin/python benchmarks/bench_heads.py --work_dir /tmp/heads \
        --presets tiny+metaworld tiny-oft+metaworld tiny-flow+metaworld --tasks drawer-open-v3

Each phase is the project's own entry point in its own process: `collect_demos.py` once into `<work_dir>/data` (it
reuses a dataset collected with the same flags), then per preset `train.py` (one process, `--trackers jsonl`) into
`<work_dir>/runs/<preset>`, `eval_sim.py` into `<work_dir>/eval/<preset>`, and the trained policy's batched
`predict_action_batch` timed as `benchmarks/bench_predict.py` times it, on frames, instructions and states of the
demonstrations. A phase whose output is already there with the same settings is not run again (`<phase>.json`
beside it records them), so a benchmark cut short picks up where it stopped. Training step time is the median
`step_time_s` of the run's `metrics.jsonl` after the first `--skip_steps` steps (start-up, first-touch allocation);
actions/s counts every action of a chunk (a chunk head emits `chunk_size` actions per query, the tokens head one).
Presets run one after the other, never in parallel: on a shared CPU they would time each other.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "vla_scripts"
SUITE = "MT50"
VIEW = ["--resolution", "64", "--shadows", "false"]  # how the demonstrations are rendered, and evaluated


@dataclass
class HeadResult:
    """What one preset measured: its head, closed-loop successes per task, step time, actions/s, phase walls."""

    preset: str
    head: str
    successes: dict[str, tuple[int, int]]  # task name -> (successes, episodes)
    step_time_s: float
    actions_per_s: float
    chunk_size: int
    wall_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds, with process start-up


def wilson_percent(successes: int, episodes: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of `successes`/`episodes`, in percent."""
    from prismatic.sim.report import wilson_interval

    low, high = wilson_interval(successes, episodes)
    return 100 * low, 100 * high


def steady_step_time(records: Iterable[Mapping[str, Any]], skip_steps: int) -> float:
    """Median `step_time_s` of the training records after step `skip_steps` (validation records have none).

    Raises:
        ValueError: no training step after `skip_steps`.
    """
    times = [r["step_time_s"] for r in records if "step_time_s" in r and r.get("step", 0) > skip_steps]
    if not times:
        raise ValueError(f"no training step after step {skip_steps} in the metrics")
    return statistics.median(times)


def successes_by_task(results: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Task name -> (successes, episodes) from an `eval_sim.py` results.json (its rows name tasks by id)."""
    from prismatic.sim.metaworld.tasks import task_name

    return {
        task_name(row["suite"], row["task_id"]): (row["successes"], row["episodes"])
        for row in results["tasks"]
    }


def _cell(successes: int, episodes: int) -> str:
    low, high = wilson_percent(successes, episodes)
    return f"{successes}/{episodes} [{low:.1f}, {high:.1f}] %"


def markdown_table(results: Sequence[HeadResult], tasks: Sequence[str]) -> str:
    """One row per preset: head, preset, k/n with its 95 % Wilson interval per task and over all tasks, median
    training step time and actions/s of batched prediction."""
    header = ["head", "preset", *tasks, "all tasks", "training step (median)", "actions/s (batched predict)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        counts = [r.successes.get(task, (0, 0)) for task in tasks]
        overall = (sum(k for k, _ in counts), sum(n for _, n in counts))
        cells = [r.head, f"`{r.preset}`", *(_cell(*c) for c in counts), _cell(*overall)]
        cells += [f"{1e3 * r.step_time_s:.0f} ms", f"{r.actions_per_s:.0f} (chunk {r.chunk_size})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_id_of(preset: str) -> str:
    """A folder name for `preset` (`tiny-oft+metaworld` -> `tiny-oft_metaworld`)."""
    return re.sub(r"[^\w.-]", "_", preset)


def _run(cmd: list[str], log: Path) -> float:
    """Run `cmd` from the repository root with its output in `log`; its wall seconds. Exits on failure."""
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(
            f"failed (exit {done.returncode}) after {seconds:.0f} s, see {log}:\n{log.read_text()[-3000:]}"
        )
    print(f"  {seconds:.0f} s", flush=True)
    return seconds


def _phase(marker: Path, settings: dict[str, Any], cmd: list[str], log: Path) -> float:
    """Run a phase unless `marker` records it done with `settings`; its wall seconds (as recorded, if reused)."""
    if marker.exists():
        done = json.loads(marker.read_text())
        if done["settings"] == settings:
            print(f"reusing {marker.parent} ({done['wall_s']:.0f} s when it ran)", flush=True)
            return done["wall_s"]
    marker.unlink(missing_ok=True)
    seconds = _run(cmd, log)
    marker.write_text(json.dumps({"settings": settings, "wall_s": seconds}, indent=1))
    return seconds


def demo_requests(data: Path, batch_size: int, step: int = 30) -> tuple[list[Any], list[str], Any]:
    """Frames, instructions and states of `batch_size` demonstrations spread over the dataset in `data` (step
    `step` of each, mid-motion): the inputs a policy meets in closed loop. A head whose decoding length depends on
    what it predicts (fast) decodes random frames into other, often invalid, sequences, so random inputs would time
    another workload."""
    import numpy as np

    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    (version,) = (data / "metaworld_mt50").glob("*.*.*")
    dataset = tfds.builder_from_directory(str(version)).as_dataset(split="train", shuffle_files=False)
    picked = []
    for episode in tfds.as_numpy(dataset):
        steps = list(episode["steps"])
        picked.append(steps[min(step, len(steps) - 1)])
    rows = np.linspace(0, len(picked) - 1, batch_size).round().astype(int)
    images = [picked[i]["observation"]["image"] for i in rows]
    instructions = [picked[i]["language_instruction"].decode() for i in rows]
    states = np.stack([picked[i]["observation"]["state"] for i in rows]).astype(np.float32)
    return images, instructions, states


def measure_actions_per_s(run: Path, data: Path, batch_size: int, seconds: float) -> dict[str, Any]:
    """Actions/s of `predict_action_batch` on the trained run, on frames, instructions and states of the
    demonstrations, timed by bench_predict's `timed` (median seconds per batch after a warm-up call)."""
    import torch  # before TensorFlow (demo_requests)

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_predict import timed

    from prismatic.inference import load_policy

    torch.manual_seed(0)
    policy = load_policy(str(run), device="cpu")
    key = policy.resolve_unnorm_key(None)
    images, tasks, states = demo_requests(data, batch_size)
    proprio = states if policy.action_spec.proprio_dim else None
    per_batch = statistics.median(
        timed(lambda: policy.predict_action_batch(images, tasks, key, proprio=proprio), seconds)
    )
    chunk = policy.chunk_size
    return {
        "head": policy.action_spec.head,
        "actions_per_s": batch_size * chunk / per_batch,
        "chunk_size": chunk,
        "s_per_batch": per_batch,
    }


def bench_preset(preset: str, args: argparse.Namespace, data: Path, work: Path) -> HeadResult:
    """Train, evaluate and time one preset on the collected demonstrations."""
    py = sys.executable
    run_id = run_id_of(preset)
    runs, out = work / "runs", work / "eval" / run_id
    run, logs = runs / run_id, work / "logs"
    out.mkdir(parents=True, exist_ok=True)
    train_settings = {"preset": preset, "tasks": args.tasks, "demos": args.demos, "steps": args.steps}
    train_settings |= {"batch_size": args.batch_size, "seed": args.seed}
    train = [py, str(SCRIPTS / "train.py"), "--vla.type", preset, "--vla.expected_world_size", "1"]
    train += ["--vla.per_device_batch_size", str(args.batch_size), "--vla.max_steps", str(args.steps)]
    train += [
        "--plugins",
        str(data / "metaworld_mt50" / "metaworld_mt50_dataset.py"),
        "--data_root_dir",
        str(data),
    ]
    train += [
        "--run_root_dir",
        str(runs),
        "--run_id",
        run_id,
        "--trackers",
        "jsonl",
        "--seed",
        str(args.seed),
    ]
    marker = work / "logs" / f"{run_id}.train.json"
    if (
        not (marker.exists() and json.loads(marker.read_text())["settings"] == train_settings)
        and run.exists()
    ):
        import shutil

        shutil.rmtree(run)  # a run cut short, or one with other settings: train.py would resume it
    wall = {"train": _phase(marker, train_settings, train, logs / f"{run_id}.train.log")}

    evaluate = [py, str(SCRIPTS / "eval_sim.py"), "--benchmark", "metaworld", "--checkpoint", str(run)]
    evaluate += [
        "--task_suite",
        SUITE,
        "--tasks",
        ",".join(args.tasks),
        "--num_trials_per_task",
        str(args.episodes),
    ]
    evaluate += [
        "--num_envs",
        str(args.num_envs),
        "--max_steps",
        str(args.max_steps),
        *VIEW,
        "--out_dir",
        str(out),
    ]
    eval_settings = {**train_settings, "episodes": args.episodes, "max_steps": args.max_steps}
    wall["eval"] = _phase(logs / f"{run_id}.eval.json", eval_settings, evaluate, logs / f"{run_id}.eval.log")

    timing_file = logs / f"{run_id}.predict.result.json"
    predict = [
        py,
        str(Path(__file__).resolve()),
        "--actions_per_s_of",
        str(run),
        "--timing_out",
        str(timing_file),
    ]
    predict += ["--predict_batch", str(args.predict_batch), "--predict_seconds", str(args.predict_seconds)]
    predict += ["--data_dir", str(data)]
    predict_settings = {**train_settings, "batch": args.predict_batch, "seconds": args.predict_seconds}
    predict_settings["inputs"] = "demonstrations"
    wall["predict"] = _phase(
        logs / f"{run_id}.predict.json", predict_settings, predict, logs / f"{run_id}.predict.log"
    )
    timing = json.loads(timing_file.read_text())

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    results = json.loads((out / "results.json").read_text())
    return HeadResult(
        preset=preset,
        head=timing["head"],
        successes=successes_by_task(results),
        step_time_s=steady_step_time(records, args.skip_steps),
        actions_per_s=timing["actions_per_s"],
        chunk_size=timing["chunk_size"],
        wall_s=wall,
    )


def build_parser() -> argparse.ArgumentParser:
    """The flags (docs/heads.md's command is checked against them)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--work_dir", type=Path, default=Path("runs/bench_heads"), help="data, runs, evaluations"
    )
    parser.add_argument(
        "--presets",
        nargs="+",
        default=["tiny+metaworld", "tiny-oft+metaworld", "tiny-flow+metaworld"],
        help="--vla.type of each run, in the order they run",
    )
    parser.add_argument("--tasks", nargs="+", default=["drawer-open-v3"], help="Meta-World MT50 task names")
    parser.add_argument("--demos", type=int, default=24, help="scripted demonstrations per task")
    parser.add_argument("--steps", type=int, default=800, help="optimiser steps of every preset")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument(
        "--seed", type=int, default=7, help="training seed (the evaluation's episodes are fixed)"
    )
    parser.add_argument("--episodes", type=int, default=20, help="closed-loop episodes per task")
    parser.add_argument("--max_steps", type=int, default=150, help="policy steps per episode")
    parser.add_argument("--num_envs", type=int, default=2, help="simulators of the evaluation and collection")
    parser.add_argument("--skip_steps", type=int, default=50, help="first steps left out of the step time")
    parser.add_argument("--predict_batch", type=int, default=8, help="batch of the actions/s figure")
    parser.add_argument("--predict_seconds", type=float, default=5.0, help="minimum time measuring actions/s")
    parser.add_argument("--actions_per_s_of", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timing_out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data_dir", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Collect once, then train, evaluate and time each preset in turn; print and write the table."""
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.actions_per_s_of is not None:  # the predict phase, in its own process
        timing = measure_actions_per_s(
            args.actions_per_s_of, args.data_dir, args.predict_batch, args.predict_seconds
        )
        print(timing)
        if args.timing_out is not None:
            args.timing_out.write_text(json.dumps(timing))
        return 0

    from prismatic.sim.metaworld.tasks import check_task_names
    from prismatic.util.errors import ConfigError

    try:
        check_task_names(args.tasks)
    except ConfigError as error:
        parser.error(str(error))
    work, data = args.work_dir.resolve(), args.work_dir.resolve() / "data"
    (work / "logs").mkdir(parents=True, exist_ok=True)
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}", flush=True)
    collect = [sys.executable, str(SCRIPTS / "collect_demos.py"), "--data_root_dir", str(data)]
    collect += [
        "--task_suite",
        SUITE,
        "--tasks",
        ",".join(args.tasks),
        "--episodes_per_task",
        str(args.demos),
    ]
    collect += [*VIEW, "--num_workers", str(args.num_envs)]
    collect_settings = {"tasks": args.tasks, "demos": args.demos, "num_envs": args.num_envs}
    collect_s = _phase(
        work / "logs" / "collect.json", collect_settings, collect, work / "logs" / "collect.log"
    )

    results: list[HeadResult] = []
    for preset in args.presets:
        results.append(bench_preset(preset, args, data, work))
        (work / "results.json").write_text(json.dumps([r.__dict__ for r in results], indent=1))
        print(
            f"{preset}: phases {', '.join(f'{k} {v:.0f} s' for k, v in results[-1].wall_s.items())}",
            flush=True,
        )

    table = markdown_table(results, args.tasks)
    walls = [f"collection {collect_s:.0f} s"]
    walls += [f"{r.preset}: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.wall_s.items()) for r in results]
    text = f"{table}\n\nPhase wall times (with process start-up): " + "; ".join(walls) + ".\n"
    (work / "heads.md").write_text(text)
    print(text)
    print(f"written to {work / 'heads.md'} and {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
