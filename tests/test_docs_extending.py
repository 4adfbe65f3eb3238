"""The three "one class plus one registry entry" examples of docs/architecture.md, run as written.

Each `# docs-example:` block is executed as a plugin module would be, in a fresh interpreter (registering a head,
a strategy and a tracker is global and must not leak into other tests); the new names must then be valid flags
and the registered classes must work: the head's loss and sums against values computed here, the strategy
wrapping the tiny model in a static-graph DDP (a group of one on gloo), the tracker logging every 10th step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, logging, re, sys, types
from pathlib import Path

import torch

text = Path("docs/architecture.md").read_text()
blocks = dict(re.findall(r"```python\n# docs-example: (\w+)\n(.*?)```", text, re.S))
modules = {}
for name, code in blocks.items():
    module = types.ModuleType(f"docs_example_{name}")
    sys.modules[module.__name__] = module
    exec(compile(code, f"docs/architecture.md[{name}]", "exec"), module.__dict__)
    modules[name] = module

from types import SimpleNamespace

from prismatic.conf.train import TrainConfig
from prismatic.models.action_heads import ACTION_HEADS, ActionSpec, build_action_head
from prismatic.training.strategies import TRAIN_STRATEGIES, TrainingStrategy, get_train_strategy
from prismatic.training.trackers import TrackerRun, build_trackers
from prismatic.util.cli import parse_config

out = {"blocks": sorted(blocks)}
cfg = parse_config(TrainConfig, [
    "--vla.type", "tiny+mx-toy", "--vla.action_head", "l2-chunk", "--vla.chunk_size", "2",
    "--vla.train_strategy", "ddp-static", "--trackers", "jsonl", "log",
])
out["flags"] = [cfg.vla.action_head, cfg.vla.chunk_size, cfg.vla.train_strategy, list(cfg.trackers)]

# The head: squared error of a fake model's zero chunk against targets 1 and 2.
head = build_action_head(ActionSpec(head="l2-chunk", chunk_size=2, action_dim=3), None, 0)
out["head_class"] = type(head) is modules["head"].L2ChunkHead is ACTION_HEADS.get_class("l2-chunk")
batch = {
    "input_ids": torch.zeros(2, 4, dtype=torch.long), "attention_mask": torch.ones(2, 4, dtype=torch.bool),
    "pixel_values": torch.zeros(2, 3, 8, 8), "action_mask": torch.zeros(2, 4, dtype=torch.bool),
    "actions": torch.stack([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)]),
}
result = head(lambda **inputs: SimpleNamespace(actions=torch.zeros(2, 2, 3)), batch)
out["loss"], out["sums"], out["columns"] = result.loss.item(), result.sums.tolist(), list(head.columns)

# The strategy: the tiny model in one process (a gloo group of one), wrapped as DDP with a static graph.
from prismatic.models import build_vlm
from prismatic.util.dist import init_distributed

info = init_distributed()
vlm = build_vlm("tiny-vit+tiny-llama")
vlm.attach_action_modules(ActionSpec())
strategy = get_train_strategy(vlm, cfg.vla, info)
strategy.setup(2)
out["strategy"] = [
    type(strategy).__name__, isinstance(strategy, TrainingStrategy), type(strategy.model).__name__,
    bool(strategy.model.static_graph), TRAIN_STRATEGIES.get_class("ddp-static") is type(strategy),
]

# The tracker: built from the registry, logs steps 10 and 20 of 1..20.
records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logging.getLogger(modules["tracker"].__name__).addHandler(handler)
logging.getLogger(modules["tracker"].__name__).setLevel(logging.INFO)
(tracker,) = build_trackers(["log"], TrackerRun(Path("."), "run-7", {}, None))
for step in range(1, 21):
    tracker.log(step, {"loss": step / 8})
tracker.finish()
out["tracker"] = [type(tracker).__name__, records]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def result() -> dict:
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_the_examples_register_valid_flags(result: dict) -> None:
    assert result["blocks"] == ["head", "strategy", "tracker"]
    assert result["flags"] == ["l2-chunk", 2, "ddp-static", ["jsonl", "log"]]


def test_the_example_head_scores_a_chunk(result: dict) -> None:
    # Targets 1 (sample 0) and 2 (sample 1) against a zero prediction of 2 x 3 values each: squared errors 1 and 4.
    assert result["head_class"] is True
    assert result["columns"] == ["sq_sum", "values"]
    assert result["sums"] == [[6.0, 6.0], [24.0, 6.0]]
    assert result["loss"] == (6 * 1 + 6 * 4) / 12


def test_the_example_strategy_wraps_the_model(result: dict) -> None:
    assert result["strategy"] == ["StaticGraphDDPStrategy", True, "DistributedDataParallel", True, True]


def test_the_example_tracker_logs_every_tenth_step(result: dict) -> None:
    name, records = result["tracker"]
    assert name == "LogTracker"
    assert records == ["run-7 step 10: {'loss': 1.25}", "run-7 step 20: {'loss': 2.5}", "run-7: done"]
