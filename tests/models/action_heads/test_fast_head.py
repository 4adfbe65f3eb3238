"""The FAST head (`--vla.action_head fast`) on the tiny VLM: where a chunk's ids sit on the LLM's vocabulary, the
constrained greedy decoding, π0-FAST's invalid-sequence rule with its counts, and the refusals.

Expected values are computed here: LLM ids from the tokenizer's own FAST ids by OpenVLA's end-of-vocabulary rule
(`1024 - 1 - id` on the tiny LLM's 1024 ids), the decoding bound from the DCT's orthonormality, the held-out L1 of
zero chunks from the targets. Models whose logits favour chosen ids get a biased LM head.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from prismatic.util.constants import IGNORE_INDEX
from prismatic.util.errors import ConfigError

BASE = "tiny-vit+tiny-llama"
K, D = 4, 3  # chunk size, action width
LLM_VOCAB, EOS = 1024, 2  # the tiny tokenizer's vocab_size and EOS id
FAST_VOCAB = 300
OPTIONS = {"vocab_size": FAST_VOCAB, "scale": 10.0, "fit_chunks": 64, "max_decode_tokens": 12}


def smooth_chunks(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.cumsum(rng.normal(0.0, 0.15, (n, K, D)), axis=1), -1.0, 1.0)


@pytest.fixture(scope="module")
def fast_vlm():
    from prismatic.models import build_vlm
    from prismatic.models.action_heads import ActionSpec

    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    vlm.freeze_backbones("vla-full-train")
    vlm.attach_action_modules(ActionSpec(head="fast", chunk_size=K, action_dim=D, head_options=OPTIONS))
    return vlm.eval()


@pytest.fixture(scope="module")
def vocabulary():
    from prismatic.models.action_heads.fast import FastActionTokenizer

    return FastActionTokenizer.fit(smooth_chunks(0, 64), vocab_size=FAST_VOCAB, scale=10.0)


def make_head(vlm, vocabulary):
    from prismatic.models.action_heads import build_action_head
    from prismatic.vla.action_tokenizer import ActionTokenizer

    head = build_action_head(
        vlm.action_spec, ActionTokenizer(vlm.llm_backbone.tokenizer), vlm.num_prefix_tokens
    )
    head.use_vocabulary(vocabulary)
    return head


def biased(vlm, favoured: dict[int, float]):
    """A copy of `vlm` whose LM head adds `favoured[id]` to that id's logit at every position."""
    vlm = copy.deepcopy(vlm)
    llm = vlm.llm_backbone.llm
    old = llm.get_output_embeddings()
    new = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        new.weight.copy_(old.weight)
        new.bias.zero_()
        for token, value in favoured.items():
            new.bias[token] = value
    llm.lm_head = new
    return vlm


def prompts_and_pixels(vlm, texts):
    from prismatic.vla.prompt import action_prompt_ids

    tokenizer = vlm.llm_backbone.tokenizer
    prompts = [action_prompt_ids(tokenizer, vlm.llm_backbone.prompt_builder_fn, t) for t in texts]
    _, height, width = vlm.vision_backbone.default_image_resolution
    pixels = torch.randn((len(texts), 3, height, width), generator=torch.Generator().manual_seed(1))
    return prompts, pixels


def request(vlm, texts, constrained: bool = True):
    from prismatic.models.action_heads import DecodeRequest

    prompts, pixels = prompts_and_pixels(vlm, texts)
    tokenizer = vlm.llm_backbone.tokenizer
    return DecodeRequest(
        prompt_ids=prompts,
        pixel_values=pixels,
        proprio=None,
        action_dim=D,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        device=torch.device("cpu"),
        constrained=constrained,
    )


def training_batch(vlm, head, texts, chunks):
    from prismatic.vla.datasets import PaddedCollatorForActionPrediction

    tokenizer = vlm.llm_backbone.tokenizer
    prompts, pixels = prompts_and_pixels(vlm, texts)
    rows = [
        {
            **head.layout(ids, chunk, EOS),
            "pixel_values": pixels[i],
            "actions": chunk.astype(np.float32),
            "dataset_name": "a",
        }
        for i, (ids, chunk) in enumerate(zip(prompts, chunks, strict=True))
    ]
    return PaddedCollatorForActionPrediction(tokenizer.model_max_length, tokenizer.pad_token_id)(rows)


def test_a_chunk_s_ids_sit_on_the_last_ids_of_the_llm_vocabulary(fast_vlm, vocabulary) -> None:
    head = make_head(fast_vlm, vocabulary)
    assert fast_vlm.llm_backbone.tokenizer.vocab_size == LLM_VOCAB
    assert head.fast_ids == range(LLM_VOCAB - vocabulary.vocab_size, LLM_VOCAB)
    chunk = smooth_chunks(5, 1)[0]
    fast_ids = vocabulary.encode(chunk)
    expected = [LLM_VOCAB - 1 - j for j in fast_ids]  # FAST id 0 -> 1023, 1 -> 1022, ...
    prefix = [1, 17, 42, 99]
    row = head.layout(prefix, chunk, EOS)
    assert row["input_ids"].tolist() == [*prefix, *expected, EOS]
    assert row["labels"].tolist() == [IGNORE_INDEX] * len(prefix) + [*expected, EOS]
    with pytest.raises(ValueError, match=r"\(4, 3\)"):
        head.layout(prefix, np.zeros((K + 1, D)), EOS)


def test_the_training_loss_is_the_llm_s_cross_entropy_on_the_fast_ids_and_eos(fast_vlm, vocabulary) -> None:
    head = make_head(fast_vlm, vocabulary)
    chunks = smooth_chunks(6, 2)
    batch = training_batch(fast_vlm, head, ["pick up the red block", "push"], chunks)
    out = head(fast_vlm, batch)
    with torch.no_grad():
        logits = fast_vlm(**head.model_inputs(batch)).logits.float()
    # Text token j >= 1 is predicted at position num_prefix_tokens + j - 1; the loss is over labelled tokens.
    text = logits[:, head.num_prefix_tokens : -1]
    targets = batch["labels"][:, 1:]
    picked = torch.log_softmax(text, -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    labelled = targets != IGNORE_INDEX
    assert out.loss.item() == pytest.approx(
        -(picked * labelled).sum().item() / labelled.sum().item(), rel=1e-5
    )
    columns = dict(zip(head.columns, out.sums.T, strict=True))
    counts = [len(vocabulary.encode(c)) for c in chunks]
    assert columns["supervised"].tolist() == [n + 1 for n in counts]  # the FAST ids and EOS
    assert columns["action_tokens"].tolist() == counts


def test_constrained_decoding_emits_only_fast_ids_even_where_others_are_likelier(
    fast_vlm, vocabulary
) -> None:
    from prismatic.models.action_heads.fast.decoding import cached_steps, forward_steps, greedy_fast_decode

    # Id 300 (an ordinary text piece) wins every unconstrained step by far; EOS is the least likely of all.
    model = biased(fast_vlm, {300: 100.0, EOS: -100.0})
    head = make_head(model, vocabulary)
    req = request(model, ["pick up the red block", "push"])
    fast = range(LLM_VOCAB - vocabulary.vocab_size, LLM_VOCAB)

    def decode(constrained: bool, step):
        allowed = fast if constrained else None
        return greedy_fast_decode(
            step, 2, allowed=allowed, eos_id=EOS, max_tokens=OPTIONS["max_decode_tokens"]
        )

    def cached():
        return cached_steps(model, req.prompt_ids, req.pixel_values, req.pad_id, None)

    free, _ = decode(False, cached())
    assert free == [[300] * OPTIONS["max_decode_tokens"]] * 2
    rows, ended = decode(True, cached())
    assert ended == [False, False] and all(len(r) == OPTIONS["max_decode_tokens"] for r in rows)
    assert all(fast.start <= i < fast.stop for r in rows for i in r)
    # Validation's path (the model's forward over the right-padded grown text) chooses the same ids.
    batch = training_batch(model, head, ["pick up the red block", "push"], smooth_chunks(7, 2))
    lengths = [len(p) for p in req.prompt_ids]
    step = forward_steps(model, head.model_inputs(batch), lengths, req.pad_id, head.num_prefix_tokens, 12)
    assert decode(True, step)[0] == rows


def test_decoded_chunks_come_back_within_the_rounding_bound_and_invalid_ones_are_zeros(
    fast_vlm, vocabulary
) -> None:
    head = make_head(fast_vlm, vocabulary)
    chunk = smooth_chunks(8, 1)[0]
    ids = [LLM_VOCAB - 1 - j for j in vocabulary.encode(chunk)]
    rows = [ids, ids[:-1], [*ids[:-1], 5], []]  # whole; one token short; a non-FAST id; nothing before EOS
    chunks, valid = head.decode_rows(rows)
    assert valid.tolist() == [True, False, False, False]
    # Orthonormal DCT: the rounding error (at most 0.5 / scale per coefficient) keeps its L2 norm per dimension.
    assert (np.linalg.norm(chunks[0] - chunk, axis=0) <= np.sqrt(K) * 0.5 / 10.0 + 1e-6).all()
    assert (chunks[1:] == 0).all() and chunks.shape == (4, K, D)


def test_a_policy_whose_model_ends_at_once_predicts_zeros_and_counts_them(fast_vlm, vocabulary) -> None:
    model = biased(fast_vlm, {EOS: 100.0})  # EOS first: an empty sequence, invalid
    head = make_head(model, vocabulary)
    predicted = head.predict(model, request(model, ["pick", "push it", "open"]))
    assert predicted.normalized.shape == (3, K, D) and (predicted.normalized == 0).all()
    assert (head.invalid_count, head.predicted_count) == (3, 3)
    head.predict(model, request(model, ["pick"]))
    assert (head.invalid_count, head.predicted_count) == (4, 4)

    chunks = smooth_chunks(9, 2)
    batch = training_batch(model, head, ["pick up the red block", "push"], chunks)
    sums = head.evaluate(model, batch, generator=torch.Generator())
    columns = dict(zip(head.eval_columns, sums.T, strict=True))
    assert columns["invalid"].tolist() == [1.0, 1.0] and columns["chunks"].tolist() == [1.0, 1.0]
    np.testing.assert_allclose(
        columns["abs_sum"].numpy(), np.abs(chunks.astype(np.float32)).sum((1, 2)), rtol=1e-6
    )
    assert columns["values"].tolist() == [K * D] * 2
    assert head.eval_ratios["invalid_rate"] == ("invalid", "chunks")


def test_a_vocabulary_that_does_not_fit_is_refused(fast_vlm, vocabulary, tmp_path: Path) -> None:
    from prismatic.models.action_heads import ActionSpec, build_action_head
    from prismatic.models.action_heads.fast import FastActionTokenizer
    from prismatic.models.action_heads.fast.files import prepare_vocabulary
    from prismatic.models.action_heads.fast.options import FastOptions

    head = make_head(fast_vlm, vocabulary)
    with pytest.raises(ConfigError, match="fast_tokenizer.json is missing"):
        head.load_files(tmp_path)
    with pytest.raises(
        ConfigError, match=r"resumed .*\(fast_tokenizer.json, fast_tokenizer_settings.json\) is missing"
    ):
        prepare_vocabulary(
            tmp_path, None, None, FastOptions(**OPTIONS), resumed=True, timeout=timedelta(seconds=1)
        )
    other = FastActionTokenizer.fit(np.zeros((4, K + 1, D)) + smooth_chunks(1, 4)[:, :1], vocab_size=300)
    with pytest.raises(ConfigError, match=r"fitted on chunks \[5, 3\].*\[4, 3\]"):
        head.use_vocabulary(other)
    # An LLM of 300 ids: the FAST ids would cover its BOS / EOS / padding ids.
    small = SimpleNamespace(vocab_size=FAST_VOCAB, tokenizer=SimpleNamespace(all_special_ids=[0, 1, 2]))
    spec = ActionSpec(head="fast", chunk_size=K, action_dim=D, head_options=OPTIONS)
    with pytest.raises(ConfigError, match="vocab_size=300"):
        build_action_head(spec, small, 0).use_vocabulary(vocabulary)
    bare = build_action_head(spec, small, 0)
    with pytest.raises(ConfigError, match="no vocabulary"):
        bare.layout([1], np.zeros((K, D)), EOS)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--vla.head.fast.vocab_sise", "512", "Unknown flag --vla.head.fast.vocab_sise"),
        ("--vla.head.fast.vocab_size", "200", "vocab_size=200"),
        ("--vla.head.fast.scale", "0", "scale=0"),
        ("--vla.head.fast.max_decode_tokens", "0", "max_decode_tokens=0"),
    ],
)
def test_bad_fast_options_are_config_errors_naming_the_value(flag: str, value: str, message: str) -> None:
    from prismatic.conf.train import TrainConfig
    from prismatic.util.cli import parse_config

    with pytest.raises(ConfigError, match=message):
        parse_config(TrainConfig, ["--vla.type", "tiny-fast+mx-toy", flag, value])


def test_exports_copy_the_fast_files_and_refuse_a_folder_without_them(vocabulary, tmp_path: Path) -> None:
    from prismatic.models.action_heads.registry import copy_head_files, head_files

    assert head_files("fast") == ("fast_tokenizer.json", "fast_tokenizer_settings.json")
    assert head_files("tokens") == () and copy_head_files("tokens", None, tmp_path) == []
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir(), out.mkdir()
    vocabulary.save(run)
    assert copy_head_files("fast", run, out) == [out / name for name in head_files("fast")]
    for name in head_files("fast"):
        assert (out / name).read_bytes() == (run / name).read_bytes()
    (run / "fast_tokenizer_settings.json").unlink()
    with pytest.raises(ConfigError, match=r"lacks \['fast_tokenizer_settings.json'\]"):
        copy_head_files("fast", run, tmp_path)


def test_decoding_steps_until_every_rank_is_done_and_a_finished_row_stays_as_it_ended() -> None:
    from prismatic.models.action_heads.fast.decoding import all_ranks_done, greedy_fast_decode

    def ending(after: int):
        """Logits that favour FAST id 1023 for `after` steps, then EOS."""
        calls: list[object] = []

        def step(ids):
            calls.append(ids)
            logits = torch.zeros((1, LLM_VOCAB + 1))
            logits[0, EOS if len(calls) > after else LLM_VOCAB - 1] = 1.0
            return logits

        return step, calls

    step, calls = ending(1)
    assert greedy_fast_decode(step, 1, allowed=range(700, LLM_VOCAB), eos_id=EOS, max_tokens=9) == (
        [[1023]],
        [True],
    )
    assert len(calls) == 2
    # Another rank still decoding: this one keeps stepping (its forward is a collective), its row unchanged.
    answers = iter([False, False, False, True])
    step, calls = ending(1)
    rows = greedy_fast_decode(
        step, 1, allowed=range(700, LLM_VOCAB), eos_id=EOS, max_tokens=9, agree=lambda done: next(answers)
    )
    assert rows == ([[1023]], [True]) and len(calls) == 4
    assert all_ranks_done(torch.device("cpu"))(False) is False  # no process group: this rank's answer


def test_a_new_run_fits_its_vocabulary_unless_it_starts_from_a_fast_model(vocabulary, tmp_path: Path) -> None:
    from prismatic.models.action_heads.fast import FastActionTokenizer
    from prismatic.models.action_heads.fast.files import prepare_vocabulary
    from prismatic.models.action_heads.fast.options import FastOptions

    names = ("fast_tokenizer.json", "fast_tokenizer_settings.json")
    from prismatic.util.dist import DistInfo

    options, wait = FastOptions(**OPTIONS), timedelta(seconds=10)
    one = DistInfo(rank=0, local_rank=0, world_size=1, num_nodes=1, device=torch.device("cpu"))
    asked: list[int] = []

    def sample(n: int) -> np.ndarray:
        asked.append(n)
        return smooth_chunks(3, n)

    # From a model without a vocabulary (a base VLM, an OpenVLA export): fitted on the sample asked for.
    plain, fitted, expected = tmp_path / "plain", tmp_path / "fitted", tmp_path / "expected"
    plain.mkdir()
    prepare_vocabulary(fitted, sample, one, options, resumed=False, timeout=wait, base=plain)
    FastActionTokenizer.fit(smooth_chunks(3, 64), vocab_size=FAST_VOCAB, scale=10.0).save(expected)
    assert asked == [OPTIONS["fit_chunks"]]
    assert all((fitted / n).read_bytes() == (expected / n).read_bytes() for n in names)
    # From a FAST model's folder: its vocabulary, byte for byte, and no sample read.
    base, run = tmp_path / "base", tmp_path / "run"
    vocabulary.save(base)
    loaded = prepare_vocabulary(run, sample, one, options, resumed=False, timeout=wait, base=base)
    assert asked == [OPTIONS["fit_chunks"]] and loaded.vocab_size == vocabulary.vocab_size
    assert all((run / n).read_bytes() == (base / n).read_bytes() for n in names)
