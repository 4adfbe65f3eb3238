"""A Hugging Face `AutoModelForCausalLM` (Llama architecture and kin) as the VLM's language model.

Follows Prismatic's Llama-2 handling: the tokenizer gets a `<PAD>` token if it has none, the token embeddings are
resized to a multiple of 64 (faster matmuls; the extra rows are never produced by the tokenizer), and
`config.pad_token_id` is set. The KV cache is off: training never reuses it.

Every `Auto*` call passes `trust_remote_code=False`: a checkpoint folder or Hub repo that ships its own code (OpenVLA's
`auto_map`) is never executed, and transformers never stops to ask on the terminal whether to run it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from tokenizers import processors
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from prismatic.models.backbones.llm.base_llm import CAUSAL_SDPA, LLMBackbone
from prismatic.models.backbones.llm.prompting import PromptBuilder
from prismatic.models.backbones.llm.registry import LLMBackboneSpec
from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)

PAD_TOKEN = "<PAD>"
EMBEDDING_MULTIPLE = 64


def _unavailable(identifier: str, spec: LLMBackboneSpec, err: Exception) -> ConfigError:
    return ConfigError(
        f"LLM backbone '{identifier}' needs files from the Hugging Face Hub ('{spec.hf_hub_id}') that are "
        f"unavailable: they could not be fetched or found in the local cache (offline? gated repos such as "
        f"Llama-2 also need `hf_token`). Cause: {err}"
    )


def prepend_bos(tokenizer: PreTrainedTokenizerBase, bos_token: str) -> None:
    """Make a fast tokenizer prepend `bos_token` on encode (Phi-2 and Qwen2.5 tokenizers prepend nothing)."""
    bos_id = tokenizer.convert_tokens_to_ids(bos_token)
    if bos_id is None or bos_id == tokenizer.unk_token_id:
        raise ValueError(f"BOS token {bos_token!r} is not in the tokenizer's vocabulary.")
    tokenizer.bos_token = bos_token
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos_token} $A", pair=f"{bos_token} $A $B", special_tokens=[(bos_token, bos_id)]
    )


def load_tokenizer_dir(
    tokenizer_dir: Path, llm_config: PretrainedConfig | None = None
) -> PreTrainedTokenizerBase:
    """The tokenizer a checkpoint folder ships (HF OpenVLA layout; it already has its pad token), never running code.

    `tokenizer_config.json`'s `tokenizer_class` picks the class. AutoTokenizer would also read the folder's
    `config.json`, whose `auto_map` names OpenVLA's remote code (what makes transformers prompt): the LLM's own
    config is handed to it instead when known. Without a `tokenizer_class`, `tokenizer.json` is read directly.

    Raises:
        ConfigError: no readable tokenizer, or one that only remote code can load.
    """
    config_path = tokenizer_dir / "tokenizer_config.json"
    try:
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    except json.JSONDecodeError as err:
        raise ConfigError(f"'{config_path}' is not valid JSON: {err}") from err
    has_json = (tokenizer_dir / "tokenizer.json").is_file()
    try:
        if not config.get("tokenizer_class") and has_json:
            return PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir), padding_side="right")
        kwargs = {"config": llm_config} if llm_config is not None else {}
        return AutoTokenizer.from_pretrained(
            str(tokenizer_dir), padding_side="right", trust_remote_code=False, **kwargs
        )
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"The tokenizer in '{tokenizer_dir}' (tokenizer_class {config.get('tokenizer_class')!r}) cannot be "
            "loaded by transformers' own classes, and this tool never runs code shipped with a checkpoint. Name a "
            "transformers class in its tokenizer_config.json (LlamaTokenizerFast, PreTrainedTokenizerFast) and "
            f"keep tokenizer.json beside it. Cause: {err}"
        ) from err


def _load_tokenizer(
    identifier: str,
    spec: LLMBackboneSpec,
    hf_token: str | None,
    tokenizer_dir: Path | None,
    llm_config: PretrainedConfig | None,
) -> PreTrainedTokenizerBase:
    if tokenizer_dir is not None:
        tokenizer = load_tokenizer_dir(tokenizer_dir, llm_config)
    elif spec.tokenizer_source == "tiny":
        tokenizer = load_tiny_tokenizer()
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                spec.hf_hub_id, token=hf_token, padding_side="right", trust_remote_code=False
            )
        except OSError as err:
            raise _unavailable(identifier, spec, err) from err
    tokenizer.model_max_length = spec.max_length
    if spec.bos_token is not None and tokenizer_dir is None:
        prepend_bos(tokenizer, spec.bos_token)
    return tokenizer


def _load_llm(
    identifier: str,
    spec: LLMBackboneSpec,
    vocab_size: int,
    hf_token: str | None,
    pretrained: bool,
    config: PretrainedConfig | None,
) -> PreTrainedModel:
    kwargs = {
        "attn_implementation": spec.attn_implementation,
        "dtype": torch.float32,
        "trust_remote_code": False,
    }
    if config is not None:
        return AutoModelForCausalLM.from_config(config, **kwargs)
    if spec.hf_hub_id is None:
        config = AutoConfig.for_model(spec.model_type, vocab_size=vocab_size, **spec.config)
        return AutoModelForCausalLM.from_config(config, **kwargs)
    try:
        if pretrained:
            logger.info("Loading LLM '%s' weights from '%s'", identifier, spec.hf_hub_id)
            return AutoModelForCausalLM.from_pretrained(spec.hf_hub_id, token=hf_token, **kwargs)
        config = AutoConfig.from_pretrained(spec.hf_hub_id, token=hf_token, trust_remote_code=False)
    except OSError as err:
        raise _unavailable(identifier, spec, err) from err
    return AutoModelForCausalLM.from_config(config, **kwargs)


class HFCausalLLMBackbone(LLMBackbone):
    """`llm` is the `{Model}ForCausalLM` (state-dict keys `llm.*`, as in Prismatic); `tokenizer` has a pad token."""

    def __init__(
        self,
        identifier: str,
        spec: LLMBackboneSpec,
        *,
        hf_token: str | None = None,
        pretrained: bool,
        config: PretrainedConfig | None = None,
        tokenizer_dir: Path | None = None,
    ) -> None:
        """`config` / `tokenizer_dir` (from a checkpoint folder) replace the Hub config and tokenizer."""
        super().__init__(identifier)
        self.spec = spec
        self.llm_family = spec.llm_family
        self.tokenizer = _load_tokenizer(identifier, spec, hf_token, tokenizer_dir, config)
        # The VLM inserts patches right after BOS, so every tokenized prompt must start with it.
        probe = self.tokenizer("Testing 123").input_ids
        if not probe or probe[0] != self.tokenizer.bos_token_id:
            raise ValueError(
                f"Tokenizer of LLM backbone '{identifier}' does not prepend BOS; the VLM relies on it."
            )

        self.llm = _load_llm(identifier, spec, self.tokenizer.vocab_size, hf_token, pretrained, config)
        self.llm.config.use_cache = False
        if self.tokenizer.pad_token is None:
            self.tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
        self.llm.config.pad_token_id = self.tokenizer.pad_token_id
        # mean_resizing=False: new rows get the model's normal init, as in the transformers Prismatic used.
        self.llm.resize_token_embeddings(
            len(self.tokenizer), pad_to_multiple_of=EMBEDDING_MULTIPLE, mean_resizing=False
        )

    def last_hidden_state(self, inputs_embeds: torch.Tensor, attention_mask_4d: torch.Tensor) -> torch.Tensor:
        """transformers passes a 4D mask through as given, so its format must be the attention kernel's: boolean for
        SDPA, additive (0 / dtype min) for eager; other kernels (flash attention) take no custom mask."""
        kernel = self.llm.config._attn_implementation
        if kernel == "eager":
            blocked = torch.finfo(inputs_embeds.dtype).min
            attention_mask_4d = torch.zeros_like(attention_mask_4d, dtype=inputs_embeds.dtype).masked_fill(
                ~attention_mask_4d, blocked
            )
        elif kernel not in ("sdpa", CAUSAL_SDPA):  # the same SDPA (`LLMBackbone.causal_attention`)
            raise ConfigError(
                f"LLM backbone '{self.identifier}' uses attention kernel '{kernel}', which takes no custom attention "
                "mask; parallel decoding (--vla.action_head l1-chunk) needs 'sdpa' or 'eager'."
            )
        output = self.llm.get_decoder()(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask_4d, use_cache=False
        )
        return output.last_hidden_state

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.llm.get_input_embeddings()(input_ids)

    def get_layers(self) -> nn.ModuleList:
        return self.llm.get_decoder().layers

    def last_layer_finetune_modules(self) -> tuple[nn.Module, ...]:
        """OpenVLA's choice: `embed_tokens`, the last decoder layer and `lm_head`."""
        return (self.llm.get_input_embeddings(), self.get_layers()[-1], self.llm.get_output_embeddings())

    @property
    def prompt_builder_fn(self) -> type[PromptBuilder]:
        return self.spec.prompt_builder
