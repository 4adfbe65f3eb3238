"""A small, deterministic, real `PreTrainedTokenizerFast` for the tiny CPU presets and the tests.

Byte-level BPE (so any text encodes) trained on a fixed built-in corpus, with Llama's special-token layout
(`<unk>`=0, `<s>`=1, `</s>`=2) and (at least) 256 reserved tokens at the *end* of the base vocabulary, which no text ever
produces: the action tokenizer maps its 256 bins onto exactly those ids (`vocab_size - 1 ... vocab_size - 256`),
as OpenVLA does on Llama's last 256 tokens. `<PAD>` is added after the base vocabulary, as Prismatic adds it to
Llama. The tokenizer is shipped as JSON beside this file; `build_tiny_tokenizer_json()` re-creates it.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

TINY_TOKENIZER_PATH = Path(__file__).with_name("tiny_tokenizer.json")
VOCAB_SIZE = 1024  # base vocabulary (HF `vocab_size`), `<PAD>` excluded
MAX_TEXT_TOKENS = 768  # the rest, at least 256, is reserved for action tokens
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def _corpus() -> list[str]:
    """Fixed training text: robot instructions and the prompt template, deterministic by construction."""
    verbs = ["pick up", "put", "move", "push", "open", "close", "place", "stack", "wipe", "turn on", "lift"]
    objects = [
        "the red block",
        "the blue cup",
        "the green bowl",
        "the drawer",
        "the sponge",
        "the can",
        "a towel",
    ]
    places = ["on the plate", "in the sink", "to the left", "to the right", "into the box", "on the table"]
    lines = [
        f"In: What action should the robot take to {v} {o} {p}?\nOut: "
        for v, o, p in itertools.product(verbs, objects, places)
    ]
    lines += ["The quick brown fox jumps over the lazy dog. 0123456789 ,.;:!?'\"()[]{}<>-_/\\"] * 4
    return lines


def build_tiny_tokenizer_json() -> str:
    """Train the byte-level BPE and return its `tokenizer.json` text (same text on every run)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_TEXT_TOKENS,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    # Reserved ids fill the end of the base vocabulary: in the BPE vocab but reachable by no merge.
    for i, token_id in enumerate(range(len(vocab), VOCAB_SIZE)):
        vocab[f"<reserved_{i}>"] = token_id
    spec["model"]["vocab"] = vocab
    # BOS is prepended on encode, like Llama's tokenizer.
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    return json.dumps(spec, ensure_ascii=False, sort_keys=True, indent=1) + "\n"


def load_tiny_tokenizer(path: Path = TINY_TOKENIZER_PATH) -> PreTrainedTokenizerFast:
    """Load the tiny tokenizer with Llama's special tokens and an added `<PAD>` token."""
    if not path.exists():
        raise FileNotFoundError(
            f"Tiny tokenizer file {path} is missing; re-create it with build_tiny_tokenizer_json()."
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(path), bos_token="<s>", eos_token="</s>", unk_token="<unk>", padding_side="right"
    )
    tokenizer.add_special_tokens({"pad_token": "<PAD>"})
    return tokenizer
