"""Action heads (prismatic/models/action_heads/): OpenVLA-OFT's parallel decoding with an L1 chunk head.

Pinned here, with expectations computed in the test: the attention mask of parallel decoding (action positions see
each other and the prompt; the prompt does not see them), the head's output shape, loss and metric sums, that its
targets are the pipeline's future-action window, the proprio / camera-view prefix, and that a chunk-head model
round-trips through its run folder, the policy and the HF export with identical outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from prismatic.util.errors import ConfigError

BASE = "tiny-vit+tiny-llama"
K, D, P = 4, 7, 8  # chunk size, action width, proprio width


def _spec(**overrides):
    from prismatic.models.action_heads import ActionSpec

    return ActionSpec(**{"head": "l1-chunk", "chunk_size": K, "action_dim": D, "proprio_dim": P, **overrides})


@pytest.fixture(scope="module")
def chunk_vlm():
    from prismatic.models import build_vlm

    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    vlm.attach_action_modules(_spec())
    vlm.freeze_backbones("vla-full-train")
    return vlm.eval()


def _batch(vlm, instructions, seed=0, num_images=1):
    """Frames laid out by the head and padded by the training collator; random images, proprio and targets."""
    from prismatic.models.action_heads import build_action_head
    from prismatic.vla.action_tokenizer import ActionTokenizer
    from prismatic.vla.datasets import PaddedCollatorForActionPrediction
    from prismatic.vla.prompt import action_prompt_ids

    tokenizer = vlm.llm_backbone.tokenizer
    head = build_action_head(vlm.action_spec, ActionTokenizer(tokenizer), vlm.num_prefix_tokens)
    generator = torch.Generator().manual_seed(seed)
    _, height, width = vlm.vision_backbone.default_image_resolution
    instances = []
    for instruction in instructions:
        actions = torch.rand((K, D), generator=generator).numpy() * 2 - 1
        ids = action_prompt_ids(tokenizer, vlm.llm_backbone.prompt_builder_fn, instruction)
        instances.append(
            {
                **head.layout(ids, actions, tokenizer.eos_token_id),
                "pixel_values": torch.randn((3 * num_images, height, width), generator=generator),
                "proprio": torch.randn(P, generator=generator).numpy(),
                "actions": actions,
                "dataset_name": "a",
            }
        )
    collator = PaddedCollatorForActionPrediction(tokenizer.model_max_length, tokenizer.pad_token_id)
    return head, collator(instances)


def test_parallel_decoding_mask_by_hand() -> None:
    from prismatic.models.vlms.prismatic import parallel_decoding_mask

    # 6 positions: BOS, 2 prompt tokens, 2 action positions, 1 pad.
    attention = torch.tensor([[1, 1, 1, 1, 1, 0]])
    actions = torch.tensor([[0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],  # BOS sees itself
            [1, 1, 0, 0, 0, 0],  # prompt: causal, never an action position
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1, 0],  # first action position also sees the later one
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 0],  # the pad query sees what is before it; no one sees the pad
        ],
        dtype=torch.bool,
    )
    assert torch.equal(parallel_decoding_mask(attention, actions), expected[None, None])


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_llm_honours_the_mask(chunk_vlm, kernel: str) -> None:
    """Through the real decoder: changing the last action position changes the first one (bidirectional) but no
    prompt position; the prompt's states equal a plain causal run over the prompt alone."""
    from prismatic.models.vlms.prismatic import parallel_decoding_mask

    llm_backbone = chunk_vlm.llm_backbone
    llm_backbone.llm.config._attn_implementation = kernel
    try:
        generator = torch.Generator().manual_seed(1)
        embeds = torch.randn((1, 9, llm_backbone.embed_dim), generator=generator)
        actions = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1, 1]], dtype=torch.bool)
        mask = parallel_decoding_mask(torch.ones((1, 9), dtype=torch.long), actions)
        with torch.no_grad():
            base = llm_backbone.last_hidden_state(embeds, mask)
            changed = embeds.clone()
            changed[0, 8] += 1.0
            other = llm_backbone.last_hidden_state(changed, mask)
            prompt_only = llm_backbone.llm.get_decoder()(inputs_embeds=embeds[:, :6], use_cache=False)
        assert torch.equal(base[0, :6], other[0, :6])
        assert not torch.allclose(base[0, 6], other[0, 6], atol=1e-4)
        torch.testing.assert_close(base[0, :6], prompt_only.last_hidden_state[0], rtol=1e-6, atol=1e-6)
    finally:
        llm_backbone.llm.config._attn_implementation = "sdpa"


def test_flash_attention_is_refused(chunk_vlm) -> None:
    llm_backbone = chunk_vlm.llm_backbone
    llm_backbone.llm.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ConfigError, match="sdpa.*eager"):
            llm_backbone.last_hidden_state(
                torch.zeros((1, 2, llm_backbone.embed_dim)), torch.ones((1, 1, 2, 2)).bool()
            )
    finally:
        llm_backbone.llm.config._attn_implementation = "sdpa"


def test_l1_head_shape_loss_and_sums(chunk_vlm) -> None:
    head, batch = _batch(chunk_vlm, ["pick up the red block", "push"])
    assert batch["action_mask"].sum(1).tolist() == [K * D, K * D]
    assert (
        batch["attention_mask"].sum(1).tolist()[0] > batch["attention_mask"].sum(1).tolist()[1]
    )  # padded row
    out = head(chunk_vlm, batch)
    with torch.no_grad():
        predicted = chunk_vlm(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=batch["pixel_values"],
            proprio=batch["proprio"],
            action_mask=batch["action_mask"],
        ).actions
    assert predicted.shape == (2, K, D)
    error = (predicted.double() - batch["actions"].double()).abs().numpy()
    assert out.loss.item() == pytest.approx(error.mean(), rel=1e-6)
    columns = dict(zip(head.columns, out.sums.T, strict=True))
    np.testing.assert_allclose(columns["abs_sum"].numpy(), error.sum((1, 2)), rtol=1e-6)
    assert columns["values"].tolist() == [K * D] * 2 and columns["steps"].tolist() == [K] * 2
    np.testing.assert_allclose(columns["abs_dim6"].numpy(), error[:, :, 6].sum(1), rtol=1e-6)
    assert "action_accuracy" not in head.ratios  # no tokens, no token accuracy


def test_a_padded_row_predicts_as_it_would_alone(chunk_vlm) -> None:
    head, both = _batch(chunk_vlm, ["pick up the red block", "push"])
    _, alone = _batch(chunk_vlm, ["push"], seed=0)
    alone["pixel_values"], alone["proprio"] = both["pixel_values"][1:], both["proprio"][1:]
    with torch.no_grad():
        rows = chunk_vlm(**head.model_inputs(both), action_mask=both["action_mask"]).actions
        single = chunk_vlm(**head.model_inputs(alone), action_mask=alone["action_mask"]).actions
    torch.testing.assert_close(rows[1:], single, rtol=1e-6, atol=3e-6)  # FP32 rounding (~6e-7 seen)


def test_only_action_modules_and_backbones_train_not_the_lm_head(chunk_vlm) -> None:
    head, batch = _batch(chunk_vlm, ["pick"])
    chunk_vlm.zero_grad()
    chunk_vlm.train()
    head(chunk_vlm, batch).loss.backward()
    chunk_vlm.eval()
    lm_head = chunk_vlm.llm_backbone.llm.get_output_embeddings().weight
    assert not lm_head.requires_grad and lm_head.grad is None
    for module in (chunk_vlm.action_head, chunk_vlm.proprio_projector, chunk_vlm.projector):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_prefix_holds_every_view_then_proprio() -> None:
    """Two camera views: each view's patches (as the backbone featurises it alone), then the proprio token."""
    from prismatic.models import build_vlm

    torch.manual_seed(0)
    vlm = build_vlm(BASE).eval()
    vlm.attach_action_modules(_spec(num_images=2))
    _, height, width = vlm.vision_backbone.default_image_resolution
    pixels = torch.randn((2, 6, height, width))
    proprio = torch.randn((2, P))
    with torch.no_grad():
        prefix = vlm.prefix_embeddings(pixels, proprio)
        first = vlm.projector(vlm.vision_backbone(pixels[:, :3]))
        second = vlm.projector(vlm.vision_backbone(pixels[:, 3:]))
        token = vlm.proprio_projector.fc2(torch.nn.functional.gelu(vlm.proprio_projector.fc1(proprio)))
    n = vlm.num_patches
    assert vlm.num_prefix_tokens == 2 * n + 1 and prefix.shape[1] == 2 * n + 1
    # The same modules on the same inputs: the same numbers exactly.
    assert torch.equal(prefix[:, :n], first)
    assert torch.equal(prefix[:, n : 2 * n], second)
    assert torch.equal(prefix[:, -1], token)


def test_another_spec_on_a_trained_model_is_refused(chunk_vlm) -> None:
    with pytest.raises(ConfigError, match="trained with action spec"):
        chunk_vlm.attach_action_modules(_spec(chunk_size=8))


def test_config_refuses_chunks_for_the_tokens_head() -> None:
    from prismatic.conf.vla import get_vla_config

    config = get_vla_config("tiny+mx-toy")
    config.chunk_size = 8
    with pytest.raises(ConfigError, match="l1-chunk"):
        config.check_values()
    config.chunk_size, config.action_head = 1, "l2-chunk"
    with pytest.raises(ConfigError, match="tokens, l1-chunk"):
        config.check_values()


def _write_chunk_run(folder: Path, vlm, norm_stats: dict) -> Path:
    weights = {key: getattr(vlm, key).state_dict() for key in vlm.all_module_keys}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"vla": {"type": "tiny-oft+mx-toy", "base_vlm": BASE}}))
    (folder / "action_model.json").write_text(json.dumps(vlm.action_spec.to_dict()))
    (folder / "dataset_statistics.json").write_text(json.dumps(norm_stats))
    (folder / "checkpoints").mkdir()
    torch.save({"model": weights}, folder / "checkpoints" / "step-000010-epoch-00-loss=1.0000.pt")
    return folder


def test_policy_returns_unnormalised_chunks_and_hf_export_round_trips(chunk_vlm, tmp_path: Path) -> None:
    import prismatic
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import spec_of

    q01, q99 = np.linspace(-1, 0, D), np.linspace(0.5, 2, D)
    mask = [True] * (D - 1) + [False]
    p01, p99 = np.linspace(-2, 0, P), np.linspace(1, 3, P)
    stats = {
        "only": {
            "action": {"q01": q01.tolist(), "q99": q99.tolist(), "mask": mask},
            "proprio": {
                "q01": p01.tolist(),
                "q99": p99.tolist(),
                "min": (p01 - 1).tolist(),
                "max": (p99 + 1).tolist(),
            },
        }
    }
    run = _write_chunk_run(tmp_path / "run", chunk_vlm, stats)
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    proprio = np.linspace(-1, 2, P)
    policy = prismatic.load_policy(run)
    chunk = policy.predict_action(image, "pick up the block", proprio=proprio)
    assert chunk.shape == (K, D) and chunk.dtype == np.float64

    # The same numbers by hand: the head's normalised chunk, un-normalised with q01 / q99 where masked.
    batch = policy.pixel_values([image])
    normalized_proprio = np.clip(2 * (proprio - p01) / (p99 - p01 + 1e-8) - 1, -1, 1)
    ids = policy._prompt_ids("pick up the block")
    layout = policy.head.layout(ids, np.zeros((K, D)), policy.tokenizer.eos_token_id)
    with torch.no_grad():
        raw = (
            chunk_vlm(
                input_ids=layout["input_ids"][None],
                attention_mask=torch.ones((1, len(layout["input_ids"])), dtype=torch.bool),
                pixel_values=batch,
                proprio=torch.tensor(normalized_proprio, dtype=torch.float32)[None],
                action_mask=layout["action_mask"][None],
            )
            .actions[0]
            .double()
            .numpy()
        )
    expected = np.where(mask, 0.5 * (raw + 1) * (q99 - q01) + q01, raw)
    np.testing.assert_allclose(chunk, expected, rtol=1e-6, atol=1e-6)

    with pytest.raises(ConfigError, match="proprio"):
        policy.predict_action(image, "pick up the block")
    batch_out = policy.predict_action_batch(
        [image, image], ["pick up the block", "push"], proprio=[proprio] * 2
    )
    assert batch_out.shape == (2, K, D)

    exported = export_hf_openvla(
        chunk_vlm, spec_of(chunk_vlm), tmp_path / "hf", norm_stats=stats, dtype="float32"
    )
    assert (
        json.loads((exported / "config.json").read_text())["action_model"] == chunk_vlm.action_spec.to_dict()
    )
    again = prismatic.load_policy(exported)
    assert again.action_spec == chunk_vlm.action_spec
    assert np.array_equal(again.predict_action(image, "pick up the block", proprio=proprio), chunk)


def test_step_metrics_report_the_heads_ratios() -> None:
    """Two datasets, hand-made sums: L1 is abs_sum / values over the whole step, per dimension over steps."""
    from prismatic.models.action_heads import ActionSpec, build_action_head
    from prismatic.training.metrics import StepMetrics

    head = build_action_head(ActionSpec(head="l1-chunk", chunk_size=2, action_dim=2), None, 0)
    assert head.columns == ("abs_sum", "values", "steps", "abs_dim0", "abs_dim1")
    metrics = StepMetrics(["a", "b"], head, torch.device("cpu"))
    # sample 1 (a): errors [[1, 2], [3, 4]]; sample 2 (b): [[0, 0], [0, 4]]; sample 3 (a): all 1.
    sums = torch.tensor([[10.0, 4, 2, 4, 6], [4.0, 4, 2, 0, 4], [4.0, 4, 2, 2, 2]], dtype=torch.float64)
    metrics.update(torch.tensor(0.5), sums[:2], ["a", "b"])
    metrics.update(torch.tensor(1.5), sums[2:], ["a"])
    out = metrics.reduce()
    assert out["loss"] == 1.0  # the mean of the micro-batches' losses
    assert out["l1_loss"] == 18 / 12
    assert out["l1_dim0"] == 6 / 6 and out["l1_dim1"] == 12 / 6
    assert out["a/l1_loss"] == 14 / 8 and out["b/l1_loss"] == 4 / 4 and out["a/samples"] == 2
    assert "action_accuracy" not in out
