"""`load_policy` / `VLAPolicy`: actions as OpenVLA's HF `predict_action` makes them, batched, constrained or not.

Expected values are computed here independently of `prismatic/inference/`: bin centres and un-normalisation
from OpenVLA's formulas written out in NumPy, and greedy decoding by re-running the training forward
(`PrismaticVLM.forward` on the growing token sequence, no cache, no padding) one request at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from prismatic.inference import PolicyInputError, load_policy

INSTRUCTIONS = ["Pick up the red block", "push the can to the left, then lift the sponge", "go"]


@pytest.fixture(scope="module")
def policy(policy_run: Path):
    return load_policy(policy_run)


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size=(64 + 16 * i, 80 - 8 * i, 3), dtype=np.uint8) for i in range(3)]


def openvla_unnormalize(token_ids: np.ndarray, vocab_size: int, stats: dict) -> np.ndarray:
    """OpenVLA's HF `predict_action`, written out: ids -> bin centres -> q01/q99 with the mask."""
    bins = np.linspace(-1, 1, 256)
    centers = (bins[:-1] + bins[1:]) / 2.0
    discretized = np.clip(vocab_size - token_ids - 1, 0, 254)
    normalized = centers[discretized]
    high, low = np.array(stats["q99"]), np.array(stats["q01"])
    return np.where(np.array(stats["mask"]), 0.5 * (normalized + 1) * (high - low) + low, normalized)


def reference_greedy(policy, image: np.ndarray, instruction: str, num_tokens: int, constrained: bool):
    """Greedy decoding by re-running the training forward on the whole sequence: (prompt ids, ids, logprobs)."""
    vlm, tokenizer = policy.vlm, policy.tokenizer
    prompt = f"In: What action should the robot take to {instruction.lower()}?\nOut: "
    prompt_ids = tokenizer(prompt).input_ids
    pixel_values = vlm.vision_backbone.get_image_transform()(Image.fromarray(image).convert("RGB"))
    if isinstance(pixel_values, dict):  # fused backbones: one tensor per part
        pixel_values = {key: value[None] for key, value in pixel_values.items()}
    else:
        pixel_values = pixel_values[None]
    vocab = tokenizer.vocab_size
    ids, logprobs = [], []
    with torch.no_grad():
        for _ in range(num_tokens):
            logits = vlm(torch.tensor([prompt_ids + ids]), None, pixel_values).logits[0, -1].float()
            if constrained:
                logits = logits[vocab - 256 : vocab]
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token + (vocab - 256 if constrained else 0))
    return prompt_ids, ids, logprobs


def test_bin_centres_and_unnormalisation_equal_openvla(policy):
    vocab = policy.tokenizer.vocab_size
    stats = policy.norm_stats["ds_a"]["action"]
    # vocab-1 is digitize index 1 -> centre 0; indices 255 and 256 (vocab-255, vocab-256) both give centre 254.
    token_ids = np.array(
        [[vocab - 1, vocab - 2, vocab - 128, vocab - 129, vocab - 254, vocab - 255, vocab - 256]]
    )
    normalized, actions = policy.decode_ids(token_ids, ["ds_a"])
    step = 2 / 255
    expected_normalized = [
        -1 + step / 2,
        -1 + 1.5 * step,
        -1 + 127.5 * step,
        -1 + 128.5 * step,
        1 - 1.5 * step,
    ]
    np.testing.assert_allclose(normalized[0, :5], expected_normalized, rtol=0, atol=1e-12)
    assert normalized[0, 5] == normalized[0, 6] == pytest.approx(1 - step / 2, abs=1e-12)
    assert actions.dtype == np.float64
    assert (actions == openvla_unnormalize(token_ids, vocab, stats)).all()
    # Masked-off gripper dimension: the bin centre itself.
    assert actions[0, 6] == normalized[0, 6]
    q01, q99 = stats["q01"][0], stats["q99"][0]
    assert actions[0, 0] == pytest.approx(0.5 * (expected_normalized[0] + 1) * (q99 - q01) + q01, abs=1e-12)


def test_predict_action_equals_reference_greedy_decoding(policy, images):
    for image, instruction in zip(images, INSTRUCTIONS, strict=True):
        _, ids, _ = reference_greedy(policy, image, instruction, 7, constrained=True)
        action = policy.predict_action(image, instruction, unnorm_key="ds_b")
        expected = openvla_unnormalize(
            np.array([ids]), policy.tokenizer.vocab_size, policy.norm_stats["ds_b"]["action"]
        )
        assert action.shape == (7,) and action.dtype == np.float64
        assert (action == expected[0]).all()
        # A PIL image gives the same action as its array.
        assert (policy.predict_action(Image.fromarray(image), instruction, unnorm_key="ds_b") == action).all()


def test_batch_rows_equal_single_calls_with_their_own_keys(policy, images):
    keys = ["ds_a", "ds_b", "ds_a"]
    actions, logprobs = policy.predict_action_batch(
        images, INSTRUCTIONS, unnorm_key=keys, return_logprobs=True
    )
    assert actions.shape == (3, 7) and logprobs.shape == (3, 7) and logprobs.dtype == np.float32
    for row in range(3):
        assert (
            actions[row] == policy.predict_action(images[row], INSTRUCTIONS[row], unnorm_key=keys[row])
        ).all()
        _, ids, expected_logprobs = reference_greedy(
            policy, images[row], INSTRUCTIONS[row], 7, constrained=True
        )
        # Padded batch vs one unpadded sequence: FP32 rounding only (|logprob| ~ 5, ~5e-7 seen).
        np.testing.assert_allclose(logprobs[row], expected_logprobs, rtol=1e-6, atol=1e-6)
        assert (logprobs[row] < 0).all()


def test_kv_cache_gives_the_same_tokens_as_rerunning_the_sequence(policy, images):
    cached = policy.decode_batch(images, INSTRUCTIONS, "ds_a")
    rerun = policy.decode_batch(images, INSTRUCTIONS, "ds_a", use_cache=False)
    assert (cached.token_ids == rerun.token_ids).all()
    np.testing.assert_allclose(cached.logprobs, rerun.logprobs, rtol=1e-6, atol=1e-6)


def test_constrained_decoding_never_emits_a_non_action_id(policy, images):
    vocab = policy.tokenizer.vocab_size
    # The padded vocabulary: the model has more output rows than the tokenizer has ids.
    assert policy.vlm.llm_backbone.llm.get_output_embeddings().weight.shape[0] > vocab
    free = policy.decode_batch(images, INSTRUCTIONS, "ds_a", constrained=False)
    assert (free.token_ids < vocab - 256).any(), "precondition: the random model prefers other ids"
    constrained = policy.decode_batch(images, INSTRUCTIONS, "ds_a")
    assert ((constrained.token_ids >= vocab - 256) & (constrained.token_ids < vocab)).all()


def test_unconstrained_decoding_is_openvla_greedy(policy, images):
    eos = policy.tokenizer.eos_token_id
    decoded = policy.decode_batch(images, INSTRUCTIONS, "ds_a", constrained=False)
    for row, (image, instruction) in enumerate(zip(images, INSTRUCTIONS, strict=True)):
        prompt_ids, ids, logprobs = reference_greedy(policy, image, instruction, 7, constrained=False)
        if eos in ids:  # OpenVLA's generate stops there and reads the last 7 ids of prompt + output
            ids = [*prompt_ids, *ids[: ids.index(eos) + 1]][-7:]
        assert decoded.token_ids[row].tolist() == ids
        if eos not in ids:
            np.testing.assert_allclose(decoded.logprobs[row], logprobs, rtol=1e-6, atol=1e-6)


def test_early_eos_is_read_as_openvla_reads_it():
    from prismatic.models.decoding import openvla_action_ids

    assert openvla_action_ids([1, 10, 11, 12], [900, 2, 5, 6], eos_id=2, action_dim=4) == (
        [11, 12, 900, 2],
        [False, False, True, True],
    )
    assert openvla_action_ids([1, 10], [900, 901, 902], eos_id=2, action_dim=3) == (
        [900, 901, 902],
        [True] * 3,
    )


def test_prompt_is_the_training_prompt(policy):
    from prismatic.vla.datasets.batch_transform import RLDSBatchTransform

    transform = RLDSBatchTransform(
        policy.action_tokenizer, policy.tokenizer, policy.image_transform, policy.prompt_builder_fn
    )
    frame = {
        "task": {"language_instruction": b"Pick Up The Red Block"},
        "action": np.zeros(7, np.float32),
        "observation": {"image_primary": np.zeros((64, 64, 3), np.uint8)},
        "dataset_name": b"ds_a",
    }
    training_ids = transform(frame)["input_ids"][:-8].tolist()  # drop 7 action ids + EOS
    assert policy._prompt_ids("Pick Up The Red Block") == training_ids
    expected_text = "In: What action should the robot take to pick up the red block?\nOut: "
    assert training_ids == policy.tokenizer(expected_text).input_ids


def test_unnorm_key_and_input_errors_name_the_problem(policy, single_key_run, images):
    with pytest.raises(PolicyInputError, match="ds_a, ds_b"):
        policy.predict_action(images[0], "go")
    with pytest.raises(PolicyInputError, match="Unknown unnorm_key 'bridge'.*ds_a, ds_b"):
        policy.predict_action(images[0], "go", unnorm_key="bridge")
    with pytest.raises(PolicyInputError, match="dtype uint8"):
        policy.predict_action(images[0].astype(np.float32), "go", unnorm_key="ds_a")
    with pytest.raises(PolicyInputError, match=r"shape \(H, W, 3\)"):
        policy.predict_action(images[0][:, :, :2], "go", unnorm_key="ds_a")
    with pytest.raises(PolicyInputError, match="instruction must be a string"):
        policy.predict_action(images[0], 3, unnorm_key="ds_a")
    with pytest.raises(PolicyInputError, match="2 unnorm keys for a batch of 3"):
        policy.predict_action_batch(images, INSTRUCTIONS, unnorm_key=["ds_a", "ds_b"])
    # One dataset: no key needed.
    single = load_policy(single_key_run)
    assert single.unnorm_keys == ["only"] and single.action_dim() == 7
    assert single.predict_action(images[0], "go").shape == (7,)


def test_checkpoint_file_and_hf_export_give_the_same_actions(policy, policy_run, images, tmp_path):
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import spec_of

    checkpoint = next((policy_run / "checkpoints").glob("step-*.pt"))
    from_file = load_policy(checkpoint)
    out = export_hf_openvla(
        policy.vlm, spec_of(policy.vlm), tmp_path / "hf", norm_stats=policy.norm_stats, dtype="float32"
    )
    assert json.loads((out / "config.json").read_text())["norm_stats"] == policy.norm_stats
    exported = load_policy(out)
    assert exported.unnorm_keys == ["ds_a", "ds_b"]
    expected = policy.predict_action_batch(images, INSTRUCTIONS, unnorm_key="ds_b")
    assert (from_file.predict_action_batch(images, INSTRUCTIONS, unnorm_key="ds_b") == expected).all()
    assert (exported.predict_action_batch(images, INSTRUCTIONS, unnorm_key="ds_b") == expected).all()


def test_dtype_and_device_choices(policy_run, images):
    assert load_policy(policy_run).dtype == torch.float32  # CPU default
    bf16 = load_policy(policy_run, dtype="bfloat16")
    assert next(bf16.vlm.parameters()).dtype == torch.bfloat16
    action = bf16.predict_action(images[0], "go", unnorm_key="ds_a")
    assert action.shape == (7,) and np.isfinite(action).all()
    from prismatic.util.errors import ConfigError

    with pytest.raises(ConfigError, match="Unknown dtype 'fp8'"):
        load_policy(policy_run, dtype="fp8")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            load_policy(policy_run, device="cuda")


def test_fused_backbone_policy_from_the_package_root(fused_run, images):
    import prismatic

    policy = prismatic.load_policy(fused_run)
    batch = policy.predict_action_batch(images, INSTRUCTIONS)
    for row in range(len(images)):
        _, ids, _ = reference_greedy(policy, images[row], INSTRUCTIONS[row], 7, constrained=True)
        expected = openvla_unnormalize(
            np.array([ids]), policy.tokenizer.vocab_size, policy.norm_stats["only"]["action"]
        )
        assert (batch[row] == expected[0]).all()
