"""Batched greedy decoding of action tokens from a PrismaticVLM: left padding, attention mask, KV cache.

Every request of a batch has its own prompt length, so rows are laid out as training saw them, right-aligned:

    [pad ... pad] [BOS] [patch_1 ... patch_P] [text_2 ... text_L]   (attention mask 0 on the pads)

with position ids counted from each row's BOS, so a row decodes exactly as it would alone. The first forward
pass fills the KV cache; each further action token costs one forward of one position.
`DecodeOptions(use_cache=False)` re-runs the whole model (vision backbone included) on the grown sequence at
every step, as Hugging Face's `generate(use_cache=False)` does: the reference the benchmark compares against.

Decoding is greedy. Constrained decoding takes the argmax over the action-token ids only (a contiguous id
range), and its log-probabilities are those of the distribution over that range; unconstrained decoding is
OpenVLA's (argmax over every logit, the padded embedding rows included; log-probabilities over all of them), and
`openvla_action_ids` reads its action back as OpenVLA does when EOS comes early. The tokens head
(`prismatic/models/action_heads/tokens.py`) decodes with these; `PolicyInputError` is what a head or the policy
raises for a request it cannot answer.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from prismatic.models import static_decoding
from prismatic.models.compile_scope import DEFAULT_COMPILE_SCOPE
from prismatic.models.prompt_layout import layout, prompt_embeddings
from prismatic.util.errors import ConfigError

if TYPE_CHECKING:
    from prismatic.models.backbones.vision.base_vision import PixelValues
    from prismatic.models.vlms.prismatic import PrismaticVLM


class PolicyInputError(ConfigError):
    """A request the policy cannot answer (bad image, instruction or unnorm key); the message says what to fix."""


@dataclass(frozen=True)
class GreedyTokens:
    """Decoded tokens of a batch: `token_ids` int64 `[B, T]`, `logprobs` float32 `[B, T]` (of the chosen ids)."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor


@dataclass(frozen=True)
class DecodeOptions:
    """How `greedy_decode` runs (speed, not the algorithm): one object, so callers hand the mode on whole."""

    # Reuse keys and values across steps (False: re-run the full sequence every step).
    use_cache: bool = True
    # With `use_cache`, a static KV cache with each step replayed from a CUDA graph (same ids); None: on CUDA.
    static_cache: bool | None = None
    # On the static cache, `torch.compile` the prefill and the decode step before capturing them.
    compile_steps: bool = False
    # What `compile_steps` compiles: each ViT block and decoder layer ("layers"), or each function "whole".
    compile_scope: str = DEFAULT_COMPILE_SCOPE


def openvla_action_ids(
    prompt_ids: Sequence[int], generated_ids: Sequence[int], eos_id: int, action_dim: int
) -> tuple[list[int], list[bool]]:
    """The ids OpenVLA's `predict_action` reads as the action after unconstrained generation.

    Its `generate` stops at EOS, and it takes the last `action_dim` ids of prompt + output: when EOS comes early,
    EOS and trailing prompt ids become "actions". Returns those ids and, per id, whether it was generated.
    """
    generated = list(generated_ids)
    if eos_id in generated[:action_dim]:
        generated = generated[: generated.index(eos_id) + 1]
    sequence = [*prompt_ids, *generated][-action_dim:]
    from_output = [False] * (action_dim - min(action_dim, len(generated))) + [True] * min(
        action_dim, len(generated)
    )
    return sequence, from_output


def _keep_last_logits_kwarg(llm: torch.nn.Module) -> dict[str, int]:
    """Ask the LM head for the last position's logits only (all positions' would cost B x S x vocab floats)."""
    parameters = inspect.signature(llm.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):  # transformers >= 4.50 / 4.45-4.49
        if name in parameters:
            return {name: 1}
    return {}


def _left_padded_embeddings(
    vlm: PrismaticVLM,
    prompt_ids: Sequence[Sequence[int]],
    pixel_values: PixelValues,
    pad_id: int,
    proprio: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Input embeddings `[B, S, D]` (BOS, the VLM's prefix: patches of every view and proprio, rest of the prompt;
    right-aligned: `prompt_layout`) and their mask `[B, S]`."""
    device = vlm.llm_backbone.llm.get_input_embeddings().weight.device
    ids, index, mask = (t.to(device) for t in layout(prompt_ids, vlm.num_prefix_tokens, pad_id))
    return prompt_embeddings(vlm, ids, index, mask, pixel_values, proprio), mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids counted from each row's first attended token (pads get 0; they are masked anyway)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.inference_mode()
def greedy_decode(
    vlm: PrismaticVLM,
    prompt_ids: Sequence[Sequence[int]],
    pixel_values: PixelValues,
    num_tokens: int,
    *,
    pad_id: int,
    allowed_ids: range | None,
    proprio: torch.Tensor | None = None,
    options: DecodeOptions = DecodeOptions(),
) -> GreedyTokens:
    """Greedily decode `num_tokens` tokens for each of B prompts (each starting with BOS) and images.

    Args:
        vlm: the model, in eval mode, on the device and dtype of `pixel_values`.
        prompt_ids: B lists of token ids (any lengths).
        pixel_values: `[B, 3, H, W]` (or a dict of them for fused backbones).
        num_tokens: tokens to generate per row.
        pad_id: id used for padding (never attended).
        allowed_ids: the contiguous id range decoding may choose from (the action tokens), or None for every id.
        proprio: `[B, P]` normalised proprio, for a VLM with a proprio projector.
        options: the decoding mode (`DecodeOptions`):
            `use_cache`: reuse keys and values across steps (False: re-run the full sequence every step).
            `static_cache`: with `use_cache`, decode over a static KV cache with each step replayed from a
            CUDA graph (`prismatic.models.static_decoding`; same ids). None: on CUDA where the model supports
            it. On CPU it runs the same steps eagerly (tests).
            `compile_steps`: on the static cache, `torch.compile` the prefill and the decode step before
            capturing them: the same operations in fewer, fused kernels (ids pinned equal in FP32 on CPU;
            fused kernels may round differently in the last bits). Where compiling fails: one WARNING, and
            uncompiled decoding.
            `compile_scope`: what `compile_steps` compiles (`prismatic.models.compile_scope`): "layers", each ViT
            block and decoder layer (one graph per stack: minutes less at 7B), or "whole", each function.

    Returns:
        The chosen ids and their log-probabilities, `[B, num_tokens]` each.
    """
    llm = vlm.llm_backbone.llm
    keep_last = _keep_last_logits_kwarg(llm)
    cache_name = static_decoding.cache_kwarg(llm)  # the output's field has the input's name

    def prompt() -> tuple[torch.Tensor, torch.Tensor]:
        return _left_padded_embeddings(vlm, prompt_ids, pixel_values, pad_id, proprio)

    def choose(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits.float()
        offset = 0
        if allowed_ids is not None:
            logits, offset = logits[:, allowed_ids.start : allowed_ids.stop], allowed_ids.start
        logprobs = torch.log_softmax(logits, dim=-1)
        index = logits.argmax(dim=-1)
        return index + offset, logprobs.gather(-1, index[:, None])[:, 0]

    use_cache, static_cache, compile_steps = options.use_cache, options.static_cache, options.compile_steps
    device = llm.get_input_embeddings().weight.device
    if static_cache is None:
        static_cache = device.type == "cuda"
    if use_cache and static_cache and static_decoding.supported(llm):
        ids, logprobs = static_decoding.static_decode(
            vlm,
            prompt_ids,
            pixel_values,
            proprio,
            num_tokens,
            pad_id,
            static_decoding.StepOptions(
                choose,
                allowed_ids,
                keep_last,
                use_graph=device.type == "cuda",
                compile_steps=compile_steps,
                compile_scope=options.compile_scope,
            ),
        )
        return GreedyTokens(ids.cpu(), logprobs.cpu())
    embeds, mask = prompt()
    out = llm(
        inputs_embeds=embeds,
        attention_mask=mask,
        position_ids=_positions(mask),
        use_cache=use_cache,
        **keep_last,
    )
    chosen_ids, chosen_logprobs = [], []
    for index in range(num_tokens):
        token, logprob = choose(out.logits[:, -1])
        chosen_ids.append(token)
        chosen_logprobs.append(logprob)
        if index == num_tokens - 1:
            break
        token_embeds = vlm.llm_backbone.embed_input_ids(token[:, None])
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        if use_cache:
            out = llm(
                inputs_embeds=token_embeds,
                attention_mask=mask,
                position_ids=_positions(mask)[:, -1:],
                use_cache=True,
                **{cache_name: getattr(out, cache_name)},
                **keep_last,
            )
        else:
            embeds = torch.cat(
                [prompt()[0], *(vlm.llm_backbone.embed_input_ids(t[:, None]) for t in chosen_ids)], 1
            )
            out = llm(
                inputs_embeds=embeds,
                attention_mask=mask,
                position_ids=_positions(mask),
                use_cache=False,
                **keep_last,
            )
    return GreedyTokens(torch.stack(chosen_ids, dim=1).cpu(), torch.stack(chosen_logprobs, dim=1).cpu())
