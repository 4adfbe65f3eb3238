"""Decoding over the static KV cache reads the device only for its result (`tests/host_reads.py`).

On CUDA `predict_action` replays its prefill and decode steps from captured CUDA graphs
(`prismatic.models.static_decoding`); a host read inside them fails the capture and silently sends every request
down the eager path, several times slower. On CPU the same functions run without graphs, so their host reads are
recorded here: the only ones are the copies of the chosen ids and log-probabilities, after the decode's last op.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from host_reads import HostReads

from prismatic.inference.policy import load_policy
from prismatic.models.action_heads import tokens


@pytest.mark.parametrize("batch", [1, 3])
def test_static_cache_decoding_reads_the_device_only_for_its_result(
    policy_run: Path, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = load_policy(policy_run)
    policy.static_cache = True  # CUDA's default (None: on CUDA only)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(batch)]
    instructions = ["pick up the cup", "open the drawer", "stack the blocks"][:batch]
    expected = policy.predict_action_batch(images, instructions, "ds_a")  # first call of a shape: warm-up
    decode = tokens.greedy_decode
    recorders: list[HostReads] = []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        with HostReads() as rec:
            out = decode(*args, **kwargs)
        recorders.append(rec)
        return out

    monkeypatch.setattr(tokens, "greedy_decode", recorded)
    assert np.array_equal(policy.predict_action_batch(images, instructions, "ds_a"), expected)
    (rec,) = recorders
    assert rec.reads == [("cpu", "decoding.py:greedy_decode")] * 2
    assert len(rec.ops) > 100
    assert set(rec.ops[rec.read_at[0] :]) <= {"to", "_to_copy"}  # after the first copy: only the copies
