"""`Validator`: held-out metrics equal a computation written out here, are deterministic, cycle short shards, and
do not hang under FSDP2 when the ranks' shards differ in size (2 processes, gloo on CPU).

Expected values come from running the plain model over the same held-out frames (read from `RLDSDataset` directly)
and computing cross-entropy, accuracy and L1 in NumPy below, never from `prismatic/training/validation.py`.
Run as a script under torchrun, this file is the FSDP worker of `test_fsdp_ranks_with_different_shards_agree`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
IGNORE = -100  # labels of prompt / padding positions
TINY_VOCAB = 1024  # the tiny tokenizer's vocab_size (tests/conftest.py); action ids are its last NUM_BINS
NUM_BINS = 256  # ActionTokenizer's default
BOOSTED_TOKEN = TINY_VOCAB - NUM_BINS  # the top bin: what the toy gripper's "open" (1.0) becomes


# --- the tiny model and the data path (as vla_scripts/train.py builds them) ------------------------------------
def build_parts(seed: int = 0) -> dict[str, Any]:
    from prismatic.models import build_vlm
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import PaddedCollatorForActionPrediction, RLDSBatchTransform

    torch.manual_seed(seed)
    vlm = build_vlm("tiny-vit+tiny-llama")
    tokenizer = vlm.llm_backbone.tokenizer
    assert tokenizer.vocab_size == TINY_VOCAB
    action_tokenizer = ActionTokenizer(tokenizer)
    max_length = min(
        tokenizer.model_max_length, vlm.llm_backbone.llm.config.max_position_embeddings - vlm.num_patches
    )
    return {
        "vlm": vlm,
        "action_tokenizer": action_tokenizer,
        "batch_transform": RLDSBatchTransform(
            action_tokenizer,
            tokenizer,
            vlm.vision_backbone.get_image_transform(),
            vlm.llm_backbone.prompt_builder_fn,
        ),
        "collator": PaddedCollatorForActionPrediction(max_length, tokenizer.pad_token_id),
        "resize_resolution": tuple(vlm.vision_backbone.default_image_resolution[1:]),
    }


def boost(vlm: torch.nn.Module) -> Any:
    """Make the untrained model predict the top action bin (+10 on its logit), so accuracy is not trivially 0;
    returns the hook's handle. The model evaluated is then this one, in the validator and in the expectation."""
    lm_head = vlm.llm_backbone.llm.get_output_embeddings()
    bonus = torch.zeros(lm_head.out_features)
    bonus[BOOSTED_TOKEN] = 10.0
    return lm_head.register_forward_hook(lambda module, inputs, logits: logits + bonus)


def make_validator(
    parts: dict[str, Any],
    data_root: Path,
    data_mix: str,
    *,
    per_device_batch_size: int,
    num_batches: int,
    device: str = "cpu",
    **spec_fields: Any,
):
    from prismatic.models.action_heads import get_action_head
    from prismatic.training.validation import Validator
    from prismatic.vla.datasets import StreamSpec

    return Validator.from_spec(
        StreamSpec(data_root, data_mix, parts["resize_resolution"], **spec_fields),
        parts["batch_transform"],
        parts["collator"],
        head=get_action_head("tokens", parts["action_tokenizer"], parts["vlm"].num_prefix_tokens),
        per_device_batch_size=per_device_batch_size,
        num_batches=num_batches,
        device=device,
    )


# --- the independent computation ------------------------------------------------------------------------------
def held_out_pass(
    parts: dict[str, Any], data_root: Path, name: str, rank: int = 0, world_size: int = 1
) -> list:
    """One pass over the rank's held-out frames of dataset `name`, read from the pipeline directly."""
    from prismatic.vla.datasets import RLDSDataset, StreamSpec

    dataset = RLDSDataset(
        StreamSpec(
            data_root, name, parts["resize_resolution"], 0, train=False, rank=rank, world_size=world_size
        ),
        parts["batch_transform"],
    )
    return list(dataset)


def take_cycled(frames: list, num: int) -> list:
    """The first `num` frames of the pass repeated from its start (what a fixed number of batches sees)."""
    return list(itertools.islice(itertools.cycle(frames), num))


def bin_centre(token_id: int) -> float:
    """OpenVLA's decoding, written out: id -> 0-based bin (clipped) -> centre of that bin of linspace(-1, 1)."""
    edges = np.linspace(-1.0, 1.0, NUM_BINS)
    index = min(max(TINY_VOCAB - token_id - 1, 0), NUM_BINS - 2)
    return float((edges[index] + edges[index + 1]) / 2)


def sums_over(vlm: torch.nn.Module, collator, frames: list, batch_size: int) -> np.ndarray:
    """[CE sum, supervised tokens, correct action tokens, action tokens, L1 sum, samples], per token in float64."""
    num_patches = vlm.num_patches
    out = np.zeros(6)
    for start in range(0, len(frames), batch_size):
        batch = collator(frames[start : start + batch_size])
        with torch.no_grad():
            logits = vlm(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                pixel_values=batch["pixel_values"],
            ).logits
        logits = logits.double().numpy()
        labels = batch["labels"].numpy()
        for i in range(labels.shape[0]):
            out[5] += 1
            for j in range(1, labels.shape[1]):
                target = int(labels[i, j])
                if target == IGNORE:
                    continue
                row = logits[i, num_patches + j - 1]  # predicts text token j
                log_z = row.max() + np.log(np.exp(row - row.max()).sum())
                out[0] += log_z - row[target]
                out[1] += 1
                if target > TINY_VOCAB - (NUM_BINS + 1):
                    prediction = int(row.argmax())
                    out[2] += prediction == target
                    out[3] += 1
                    out[4] += abs(bin_centre(prediction) - bin_centre(target))
    return out


def as_metrics(prefix: str, sums: np.ndarray) -> dict[str, float]:
    return {
        f"{prefix}/loss": sums[0] / sums[1],
        f"{prefix}/action_accuracy": sums[2] / sums[3],
        f"{prefix}/l1_loss": sums[4] / sums[3],
        f"{prefix}/samples": sums[5],
    }


def assert_metrics_equal(got: dict[str, float], expected: dict[str, float]) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        if key.endswith(("samples", "action_accuracy")):
            assert got[key] == value, key  # ratios of the same integer counts
        elif key.endswith("l1_loss"):
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key  # sums of the same bin centres
        else:
            assert got[key] == pytest.approx(value, rel=1e-6), key  # float32 vs float64 log-softmax


# --- fixtures ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def parts() -> dict[str, Any]:
    return build_parts()


@pytest.fixture
def boosted(parts: dict[str, Any]):
    """The tiny model (`boost`ed), in train mode as the trainer hands it over."""
    vlm = parts["vlm"]
    handle = boost(vlm)
    vlm.train()
    try:
        yield vlm
    finally:
        handle.remove()


# --- tests ------------------------------------------------------------------------------------------------------
def test_metrics_equal_an_independent_computation_and_repeat(parts, boosted, toy_data_root: Path):
    batch_size, num_batches = 4, 3
    validator = make_validator(
        parts, toy_data_root, "toy", per_device_batch_size=batch_size, num_batches=num_batches
    )
    modes: list[bool] = []
    hook = boosted.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    try:
        first = validator.run(boosted)
        second = validator.run(boosted)
    finally:
        hook.remove()
    assert modes == [False] * (2 * 2 * num_batches)  # eval mode in every forward: 2 runs x 2 datasets
    assert boosted.training  # given back in train mode

    expected, total = {}, np.zeros(6)
    for name in ("toy_pick_place", "toy_push"):
        frames = take_cycled(held_out_pass(parts, toy_data_root, name), batch_size * num_batches)
        sums = sums_over(boosted, parts["collator"], frames, batch_size)
        expected.update(as_metrics(f"val/{name}", sums))
        total += sums
    expected.update(as_metrics("val", total))
    assert_metrics_equal(first, expected)
    assert 0 < first["val/action_accuracy"] < 1
    assert second == first  # the same frames every time: curves comparable across steps


def test_a_shard_shorter_than_num_batches_is_cycled(parts, boosted, toy_data_root: Path):
    """Rank 1 of 2 holds 2 of toy_push's 4 held-out episodes (32 frames); 5 batches of 8 need 40."""
    batch_size, num_batches = 8, 5
    validator = make_validator(
        parts,
        toy_data_root,
        "toy_push",
        per_device_batch_size=batch_size,
        num_batches=num_batches,
        rank=1,
        world_size=2,  # no process group: this rank's sums are returned unreduced
    )
    got = validator.run(boosted)
    shard = held_out_pass(parts, toy_data_root, "toy_push", rank=1, world_size=2)
    assert len(shard) == 32 < batch_size * num_batches
    sums = sums_over(boosted, parts["collator"], take_cycled(shard, batch_size * num_batches), batch_size)
    assert_metrics_equal(got, as_metrics("val", sums) | as_metrics("val/toy_push", sums))
    assert got["val/samples"] == batch_size * num_batches


def test_a_split_with_fewer_trajectories_than_ranks_counts_once(parts, boosted, toy_data_root: Path):
    """toy_push has 4 held-out episodes: with 5 ranks each reads all of them and only rank 0's frames count."""
    kwargs = {"per_device_batch_size": 2, "num_batches": 1, "world_size": 5}
    on_rank_0 = make_validator(parts, toy_data_root, "toy_push", rank=0, **kwargs).run(boosted)
    on_rank_3 = make_validator(parts, toy_data_root, "toy_push", rank=3, **kwargs).run(boosted)
    sums = sums_over(boosted, parts["collator"], held_out_pass(parts, toy_data_root, "toy_push")[:2], 2)
    assert_metrics_equal(on_rank_0, as_metrics("val", sums) | as_metrics("val/toy_push", sums))
    assert on_rank_3["val/samples"] == 0 and on_rank_3["val/toy_push/samples"] == 0


def test_bad_sizes_are_refused(parts, toy_data_root: Path):
    with pytest.raises(ValueError, match="num_batches"):
        make_validator(parts, toy_data_root, "toy", per_device_batch_size=2, num_batches=0)
    with pytest.raises(ValueError, match="per_device_batch_size"):
        make_validator(parts, toy_data_root, "toy", per_device_batch_size=0, num_batches=1)


# --- 2 processes, FSDP2 -----------------------------------------------------------------------------------------
FSDP_BATCH, FSDP_NUM_BATCHES = 4, 3  # 12 frames per rank: more than either rank's shard (10 and 5 frames)
FSDP_EPISODE_STEPS = 5


@pytest.fixture(scope="module")
def uneven_data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`toy_pick_place` with 3 held-out episodes cut to 5 steps: of 2 ranks, one gets 2 episodes, the other 1."""
    from prismatic.vla.datasets.rlds import mixture_statistics, write_rlds_dataset
    from prismatic.vla.datasets.rlds.toy import _features, generate_toy_episode

    root = tmp_path_factory.mktemp("uneven")
    name = "toy_pick_place"

    def episodes(split: str, count: int):
        def make():
            for index in range(count):
                episode = generate_toy_episode(name, split, index)
                yield {**episode, "steps": episode["steps"][:FSDP_EPISODE_STEPS]}

        return make

    write_rlds_dataset(
        root,
        name,
        lambda tfds: _features(tfds, name),
        {"train": episodes("train", 4), "val": episodes("val", 3)},
    )
    mixture_statistics(root, name)  # cached beside the data, so the two ranks only read it
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


FSDP_TEST = "test_fsdp_ranks_with_different_shards_agree"


@pytest.fixture(scope="module", autouse=True)
def fsdp_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The 2-process FSDP run of `FSDP_TEST`, started as the module starts when that test is selected: its two
    processes' start-up (torch, model, TensorFlow: most of their time) then overlaps the single-process tests."""
    if not any(item.name == FSDP_TEST for item in request.session.items):
        yield None
        return
    data_root = request.getfixturevalue("uneven_data_root")
    out = tmp_path_factory.mktemp("fsdp_run")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        __file__,
        "--data-root",
        str(data_root),
        "--out",
        str(out),
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(out / "log.txt", "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        yield proc, out
    finally:
        if proc.poll() is None:  # the test did not wait for it (it failed or was interrupted)
            proc.kill()
            proc.wait()


def test_fsdp_ranks_with_different_shards_agree(parts, boosted, uneven_data_root: Path, fsdp_run):
    proc, out = fsdp_run
    returncode = proc.wait(timeout=300)
    assert returncode == 0, (out / "log.txt").read_text()[-8000:]
    results = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert results[0]["metrics"] == results[1]["metrics"]  # reduced: identical on both ranks
    assert results[0]["again"] == results[0]["metrics"]
    assert all(result["resharded"] for result in results)

    # The worker built the same weights (seed 0), boosted and sharded them: compare with the plain model here.
    shards = [held_out_pass(parts, uneven_data_root, "toy_pick_place", rank, 2) for rank in (0, 1)]
    assert sorted(len(shard) for shard in shards) == [5, 10]  # the ranks' shards differ in size
    total = np.zeros(6)
    for shard in shards:
        frames = take_cycled(shard, FSDP_BATCH * FSDP_NUM_BATCHES)
        total += sums_over(boosted, parts["collator"], frames, FSDP_BATCH)
    assert_metrics_equal(
        results[0]["metrics"], as_metrics("val", total) | as_metrics("val/toy_pick_place", total)
    )
    assert results[0]["metrics"]["val/samples"] == 2 * FSDP_BATCH * FSDP_NUM_BATCHES


def _fsdp_worker(data_root: Path, out: Path) -> None:
    """One rank: FSDP2 over a CPU gloo mesh, two validation runs, the metrics written to `out/rank<r>.json`."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from prismatic.models.parallelize import apply_fsdp, mixed_precision_policy
    from prismatic.util.dist import destroy_distributed, init_distributed

    info = init_distributed()
    parts = build_parts(seed=0)
    boost(parts["vlm"])
    mesh = init_device_mesh("cpu", (info.world_size,))
    # ZeRO-2 (no reshard after forward): without a backward only the validator frees the gathered parameters.
    model = apply_fsdp(parts["vlm"], mesh, mixed_precision_policy(False, True), reshard_after_forward=False)
    validator = make_validator(
        parts,
        data_root,
        "toy_pick_place",
        per_device_batch_size=FSDP_BATCH,
        num_batches=FSDP_NUM_BATCHES,
        rank=info.rank,
        world_size=info.world_size,
        device=info.device,
    )
    metrics = validator.run(model)
    again = validator.run(model)
    resharded = all(isinstance(p, DTensor) for p in parts["vlm"].llm_backbone.parameters())
    result = {"metrics": metrics, "again": again, "resharded": resharded}
    (out / f"rank{info.rank}.json").write_text(json.dumps(result))
    dist.barrier()
    destroy_distributed()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    _fsdp_worker(args.data_root, args.out)
