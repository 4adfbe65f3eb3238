"""Validation of a flow run on the tiny VLM: the velocity MSE and the L1 error of sampled chunks, from noise seeded
per batch, equal to the same validation run again, and leaving torch's global generator as it was.

Expected values come from what the expert is at initialisation: its velocity is exactly zero (adaLN-Zero), so the
loss is the mean of (noise - target)^2 over the loss's noise, and Euler sampling returns its start noise, so the L1
is the mean of |start noise - target|. Both noises are drawn here again, in the head's order (the loss's noise, its
times, then the sampler's start), from the generator seeded by `batch_seed`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prismatic.conf.train import TrainConfig
from prismatic.util.cli import parse_config

BASE = "tiny-vit+tiny-llama"
K, D, P = 4, 7, 8  # chunk size, action width, proprio width
BATCH, NUM_BATCHES, NUM_FRAMES = 2, 2, 3  # 3 frames, 4 per pass: the second batch cycles back to frame 0
FLAGS = [
    *("--vla.type", "tiny-oft+mx-toy", "--vla.action_head", "flow", "--vla.chunk_size", str(K)),
    *("--vla.head.flow.width", "32", "--vla.head.flow.depth", "2", "--vla.head.flow.num_heads", "2"),
    *("--vla.head.flow.num_steps", "3"),
]


@pytest.fixture(scope="module")
def flow() -> dict:
    from prismatic.models import build_vlm
    from prismatic.models.action_heads import build_action_head
    from prismatic.training.model_setup import action_spec
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import PaddedCollatorForActionPrediction
    from prismatic.vla.prompt import action_prompt_ids

    cfg = parse_config(TrainConfig, FLAGS)
    spec = action_spec(cfg.vla, {"a": {"action": {"q01": [0.0] * D}, "proprio": {"q01": [0.0] * P}}})
    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    vlm.freeze_backbones("vla-full-train")
    vlm.attach_action_modules(spec)
    tokenizer = vlm.llm_backbone.tokenizer
    head = build_action_head(spec, ActionTokenizer(tokenizer), vlm.num_prefix_tokens)
    _, height, width = vlm.vision_backbone.default_image_resolution
    generator = torch.Generator().manual_seed(1)
    frames = []
    for text in ("pick up the red block", "push", "open the drawer")[:NUM_FRAMES]:
        actions = torch.rand((K, D), generator=generator).numpy() * 2 - 1
        ids = action_prompt_ids(tokenizer, vlm.llm_backbone.prompt_builder_fn, text)
        frames.append(
            {
                **head.layout(ids, actions, tokenizer.eos_token_id),
                "pixel_values": torch.randn((3, height, width), generator=generator),
                "proprio": torch.randn(P, generator=generator).numpy(),
                "actions": actions,
                "dataset_name": "a",
            }
        )
    collator = PaddedCollatorForActionPrediction(tokenizer.model_max_length, tokenizer.pad_token_id)
    return {"vlm": vlm.train(), "head": head, "frames": frames, "collator": collator}


def _validator(flow: dict, seed: int):
    from prismatic.training.validation import HeldOut, Validator

    return Validator(
        [HeldOut("a", flow["frames"])],
        flow["collator"],
        flow["head"],
        per_device_batch_size=BATCH,
        num_batches=NUM_BATCHES,
        seed=seed,
    )


def test_flow_validation_reports_the_seeded_loss_and_sampled_l1(flow: dict) -> None:
    from prismatic.training.validation import batch_seed

    seed = 7
    global_rng = torch.get_rng_state()
    got = _validator(flow, seed).run(flow["vlm"])
    assert torch.equal(torch.get_rng_state(), global_rng)  # validation drew nothing from the global generator
    assert flow["vlm"].training  # given back in the mode it came in

    order = [i % NUM_FRAMES for i in range(BATCH * NUM_BATCHES)]  # the pass cycles from its first frame
    sq, l1 = [], []
    for index in range(NUM_BATCHES):
        targets = torch.stack(
            [
                torch.as_tensor(flow["frames"][i]["actions"])
                for i in order[index * BATCH : (index + 1) * BATCH]
            ]
        ).double()
        generator = torch.Generator().manual_seed(batch_seed(seed, 0, 0, index))
        loss_noise = torch.randn((BATCH, K, D), generator=generator).double()
        torch.rand(BATCH, generator=generator)  # the loss's flow times
        start = torch.randn((BATCH, K, D), generator=generator).double()
        sq.append((loss_noise - targets).square())  # zero velocity: the error is the target velocity itself
        l1.append((start - targets).abs())  # zero velocity: the sampled chunk is its start noise
    expected_mse = torch.cat(sq).mean().item()
    expected_l1 = torch.cat(l1).mean().item()
    for prefix in ("val", "val/a"):
        assert got[f"{prefix}/loss"] == pytest.approx(expected_mse, rel=1e-6)
        assert got[f"{prefix}/flow_mse"] == got[f"{prefix}/loss"]
        assert got[f"{prefix}/l1_loss"] == pytest.approx(expected_l1, rel=1e-6)
        assert got[f"{prefix}/samples"] == BATCH * NUM_BATCHES


def test_flow_validation_repeats_exactly_and_depends_on_the_seed(flow: dict) -> None:
    import copy

    vlm = copy.deepcopy(flow["vlm"])
    # Move the expert off its zero-velocity start, so the sampler's steps count in the numbers compared.
    with torch.no_grad():
        for name, param in vlm.action_head.named_parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))))
    first = _validator(flow, 3).run(vlm)
    torch.manual_seed(123)  # the global generator's state does not matter either
    again = _validator(flow, 3).run(vlm)
    other = _validator(flow, 4).run(vlm)
    assert first == again
    assert first["val/l1_loss"] != other["val/l1_loss"] and first["val/loss"] != other["val/loss"]
    assert np.isfinite(list(first.values())).all()


def test_the_batch_seeds_differ_across_ranks_datasets_and_batches() -> None:
    from prismatic.training.validation import batch_seed

    places = [(rank, row, index) for rank in range(3) for row in range(3) for index in range(3)]
    seeds = {batch_seed(7, *place) for place in places}
    assert len(seeds) == len(places) and all(0 <= s < 2**63 for s in seeds)
    assert batch_seed(7, 0, 0, 0) != batch_seed(8, 0, 0, 0)
