"""The flow head (`--vla.action_head flow`) on the tiny VLM: its flags, its loss, training steps and seeded sampling.

Expected values come from what the expert is at initialisation: its velocity is exactly zero (adaLN-Zero), so the
first loss is the mean of (noise - actions)^2 over the noise torch's generator draws, and sampling returns the
seeded noise itself; both are drawn again here from the same seeds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from prismatic.conf.train import TrainConfig
from prismatic.util.cli import parse_config

BASE = "tiny-vit+tiny-llama"
K, D, P = 4, 7, 8  # chunk size, action width, proprio width
TINY_EXPERT = {"width": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0, "num_steps": 3}
FLAGS = [
    "--vla.type",
    "tiny-oft+mx-toy",
    "--vla.action_head",
    "flow",
    "--vla.chunk_size",
    str(K),
    *[part for name, value in TINY_EXPERT.items() for part in (f"--vla.head.flow.{name}", str(value))],
]


@pytest.fixture(scope="module")
def flow_vlm():
    from prismatic.models import build_vlm
    from prismatic.training.model_setup import action_spec

    cfg = parse_config(TrainConfig, FLAGS)
    spec = action_spec(cfg.vla, {"a": {"action": {"q01": [0.0] * D}, "proprio": {"q01": [0.0] * P}}})
    assert spec.head == "flow" and dict(spec.head_options) == TINY_EXPERT and spec.proprio_dim == P
    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    vlm.freeze_backbones("vla-full-train")
    vlm.attach_action_modules(spec)
    return vlm.eval()


def _head_and_batch(vlm, instructions):
    from prismatic.models.action_heads import build_action_head
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import PaddedCollatorForActionPrediction
    from prismatic.vla.prompt import action_prompt_ids

    tokenizer = vlm.llm_backbone.tokenizer
    head = build_action_head(vlm.action_spec, ActionTokenizer(tokenizer), vlm.num_prefix_tokens)
    generator = torch.Generator().manual_seed(1)
    _, height, width = vlm.vision_backbone.default_image_resolution
    instances = []
    for instruction in instructions:
        actions = torch.rand((K, D), generator=generator).numpy() * 2 - 1
        ids = action_prompt_ids(tokenizer, vlm.llm_backbone.prompt_builder_fn, instruction)
        instances.append(
            {
                **head.layout(ids, actions, tokenizer.eos_token_id),
                "pixel_values": torch.randn((3, height, width), generator=generator),
                "proprio": torch.randn(P, generator=generator).numpy(),
                "actions": actions,
                "dataset_name": "a",
            }
        )
    collator = PaddedCollatorForActionPrediction(tokenizer.model_max_length, tokenizer.pad_token_id)
    return head, collator(instances)


def test_the_layout_is_the_prompt_alone(flow_vlm) -> None:
    head, batch = _head_and_batch(flow_vlm, ["pick up the red block", "push"])
    assert batch["action_mask"].sum().item() == 0 and (batch["labels"] == -100).all()
    with pytest.raises(ValueError, match=r"\(4, 7\)"):
        head.layout([1, 2], np.zeros((K + 1, D)), 2)


def test_the_first_loss_is_the_noise_s_distance_to_the_actions(flow_vlm) -> None:
    head, batch = _head_and_batch(flow_vlm, ["pick up the red block", "push"])
    torch.manual_seed(5)
    out = head(flow_vlm, batch)
    torch.manual_seed(5)
    noise = torch.randn((2, K, D))  # the head draws the noise first, from torch's generator
    expected = (noise.double() - batch["actions"].double()) ** 2
    assert out.loss.item() == pytest.approx(expected.mean().item(), rel=1e-6)
    columns = dict(zip(head.columns, out.sums.T, strict=True))
    np.testing.assert_allclose(columns["sq_sum"].numpy(), expected.sum((1, 2)).numpy(), rtol=1e-6)
    assert columns["values"].tolist() == [K * D] * 2
    assert set(head.ratios) == {"loss", "flow_mse"}


def test_a_few_training_steps_train_the_expert_and_the_vlm_not_the_lm_head(flow_vlm) -> None:
    import copy

    vlm = copy.deepcopy(flow_vlm)
    head, batch = _head_and_batch(vlm, ["pick up the red block", "push"])
    optimizer = torch.optim.AdamW([p for p in vlm.parameters() if p.requires_grad], lr=1e-3)
    before = {name: p.detach().clone() for name, p in vlm.named_parameters()}
    losses = []
    torch.manual_seed(0)
    for _ in range(3):
        optimizer.zero_grad()
        loss = head(vlm, batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses))
    changed = {name for name, p in vlm.named_parameters() if not torch.equal(p, before[name])}
    assert any(name.startswith("action_head.expert.blocks.") for name in changed)
    assert any(name.startswith("projector.") for name in changed)
    assert any(name.startswith("proprio_projector.") for name in changed)
    lm_head = [
        n for n, p in vlm.named_parameters() if p is vlm.llm_backbone.llm.get_output_embeddings().weight
    ]
    assert lm_head and lm_head[0] not in changed


def test_sampling_is_seeded_and_starts_from_the_seed_s_noise(flow_vlm) -> None:
    from prismatic.models.action_heads import DecodeRequest, build_action_head
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.prompt import action_prompt_ids

    tokenizer = flow_vlm.llm_backbone.tokenizer
    head = build_action_head(flow_vlm.action_spec, ActionTokenizer(tokenizer), flow_vlm.num_prefix_tokens)
    prompts = [
        action_prompt_ids(tokenizer, flow_vlm.llm_backbone.prompt_builder_fn, text)
        for text in ("pick", "push it")
    ]
    _, height, width = flow_vlm.vision_backbone.default_image_resolution

    def request(seed: int) -> DecodeRequest:
        return DecodeRequest(
            prompt_ids=prompts,
            pixel_values=torch.zeros((2, 3, height, width)),
            proprio=torch.zeros((2, P)),
            action_dim=D,
            pad_id=tokenizer.pad_token_id,
            eos_id=tokenizer.eos_token_id,
            device=torch.device("cpu"),
            seed=seed,
        )

    first, again, other = (head.predict(flow_vlm, request(seed)) for seed in (3, 3, 4))
    assert first.normalized.shape == (2, K, D) and first.token_ids.shape == (2, 0)
    assert np.array_equal(first.normalized, again.normalized)
    assert not np.array_equal(first.normalized, other.normalized)
    # Zero velocity at initialisation: num_steps Euler steps leave the seeded noise as it was.
    noise = torch.randn((2, K, D), generator=torch.Generator().manual_seed(3))
    np.testing.assert_array_equal(first.normalized, noise.double().numpy())


def test_a_flow_run_folder_loads_as_a_seeded_policy(flow_vlm, tmp_path: Path) -> None:
    import prismatic

    stats = {
        "only": {
            "action": {"q01": [-1.0] * D, "q99": [1.0] * D},
            "proprio": {"q01": [-1.0] * P, "q99": [1.0] * P, "min": [-2.0] * P, "max": [2.0] * P},
        }
    }
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"vla": {"type": "tiny-oft+mx-toy", "base_vlm": BASE}}))
    (folder / "action_model.json").write_text(json.dumps(flow_vlm.action_spec.to_dict()))
    (folder / "dataset_statistics.json").write_text(json.dumps(stats))
    weights = {key: getattr(flow_vlm, key).state_dict() for key in flow_vlm.all_module_keys}
    torch.save({"model": weights}, folder / "checkpoints" / "step-000010-epoch-00-loss=1.0000.pt")
    assert json.loads((folder / "action_model.json").read_text())["head_options"] == TINY_EXPERT

    policy = prismatic.load_policy(folder)
    assert policy.action_spec == flow_vlm.action_spec
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    proprio = np.linspace(-0.5, 0.5, P)
    chunk = policy.predict_action(image, "pick up the block", proprio=proprio)
    assert chunk.shape == (K, D) and np.isfinite(chunk).all()
    assert np.array_equal(policy.predict_action(image, "pick up the block", proprio=proprio), chunk)


def test_under_lora_the_expert_trains_whole_and_the_vlm_through_its_adapters() -> None:
    """π0's split, through the same set-up a LoRA run does (`build_vlm`: stage, then adapters; the action side after):
    every expert and proprio-projector weight trains, the VLM only through its LoRA adapters; a few steps move the
    expert and the adapters and leave every other VLM weight as it was."""
    from prismatic.models import build_vlm
    from prismatic.models.lora import LoraSettings, apply_lora
    from prismatic.training.model_setup import action_spec

    cfg = parse_config(TrainConfig, FLAGS)
    spec = action_spec(cfg.vla, {"a": {"action": {"q01": [0.0] * D}, "proprio": {"q01": [0.0] * P}}})
    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    vlm.freeze_backbones("vla-full-train")
    apply_lora(vlm, LoraSettings(rank=4, alpha=8.0))
    vlm.attach_action_modules(spec)
    trainable = {name for name, p in vlm.named_parameters() if p.requires_grad}
    side = {
        name for name, _ in vlm.named_parameters() if name.startswith(("action_head.", "proprio_projector."))
    }
    assert side and side <= trainable  # the whole expert and the proprio projector
    vlm_trainable = trainable - side
    assert vlm_trainable and all(".lora_" in name for name in vlm_trainable)

    head, batch = _head_and_batch(vlm, ["pick up the red block", "push"])
    optimizer = torch.optim.AdamW([p for p in vlm.parameters() if p.requires_grad], lr=1e-3)
    before = {name: p.detach().clone() for name, p in vlm.named_parameters()}
    torch.manual_seed(0)
    for _ in range(3):
        optimizer.zero_grad()
        loss = head(vlm, batch).loss
        assert torch.isfinite(loss)
        loss.backward()
        optimizer.step()
    changed = {name for name, p in vlm.named_parameters() if not torch.equal(p, before[name])}
    assert any(name.startswith("action_head.expert.blocks.") for name in changed)
    assert any(".lora_B." in name for name in changed)  # B starts at zero: moved means the VLM trained
    assert changed <= trainable  # no frozen base weight moved
