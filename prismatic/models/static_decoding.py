"""Greedy decoding over a static KV cache, each decode step replayed from a captured CUDA graph.

A 7B decode step on one token is ~1,000 kernel launches of a few microseconds each: eager, the GPU waits for
Python (measured: 152 ms for OpenVLA's 7 action tokens, where reading the weights 7 times takes ~20 ms). Here the
prompt is prefilled eagerly into a `StaticCache` (fixed-size keys / values), and one decode step (embed the last
token -> LLM forward over the cache -> greedy choice -> advance the mask and positions) is captured once as a CUDA
graph per (batch size, cache length, dtype, id range) and replayed for every later token and request: one launch
per token. Cache lengths are rounded up to `CACHE_BUCKET` so that prompts of nearby lengths share a graph.

The arithmetic is `greedy_decode`'s (same prompt layout, positions, masking of pads, choice and log-probabilities);
only the kernels' schedule differs, so ids match the dynamic-cache path (pinned on CPU in FP32, where the same
step runs eagerly, and on GPU in bf16 by tests/gpu). Where the installed transformers' `StaticCache` does not
keep its write position as a tensor (`cumulative_length`), `supported` says no and the dynamic path runs.
"""

from __future__ import annotations

import inspect
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

CACHE_BUCKET = 32  # cache lengths are multiples of this (nearby prompt lengths share one graph)
MAX_GRAPHS = 4  # per model: each holds a static KV cache (B x layers x 2 x heads x length x head_dim)


def _static_cache(llm: torch.nn.Module, max_len: int) -> Any:
    from transformers import StaticCache

    return StaticCache(config=llm.config, max_cache_len=max_len)


def cache_kwarg(llm: torch.nn.Module) -> str:
    """The name the model's forward takes its cache by (`cache` from transformers 5.2x, `past_key_values` before)."""
    return "cache" if "cache" in inspect.signature(llm.forward).parameters else "past_key_values"


def supported(llm: torch.nn.Module) -> bool:
    """Whether this model and transformers' `StaticCache` allow it: SDPA attention (which reads a boolean 4D mask
    as given) and a cache that can be reset and replayed (its write position is a tensor)."""
    if getattr(llm.config, "_attn_implementation", None) != "sdpa":
        return False
    try:
        cache = _static_cache(llm, CACHE_BUCKET)
    except (ImportError, TypeError, ValueError):
        return False
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(hasattr(layer, "cumulative_length") for layer in layers)


class StaticDecoder:
    """One (batch size, cache length) of static decoding: the cache, the step's static tensors and its graph."""

    def __init__(
        self,
        llm: torch.nn.Module,
        embed: Callable[[torch.Tensor], torch.Tensor],
        choose: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        batch_size: int,
        max_len: int,
        device: torch.device,
        use_graph: bool,
        keep_last: dict[str, int],
    ) -> None:
        self.llm, self.embed, self.choose, self.use_graph = llm, embed, choose, use_graph
        self.max_len = max_len
        self.cache = _static_cache(llm, max_len)
        self.model_kwargs = {cache_kwarg(llm): self.cache, "use_cache": True, **keep_last}
        self.token = torch.zeros(batch_size, dtype=torch.long, device=device)  # the last chosen ids
        self.logprob = torch.zeros(batch_size, dtype=torch.float32, device=device)
        self.valid = torch.zeros(
            (batch_size, 1, 1, max_len), dtype=torch.bool, device=device
        )  # keys to attend
        self.position = torch.zeros(
            (batch_size, 1), dtype=torch.long, device=device
        )  # the new token's position
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # its cache slot
        self.graph: torch.cuda.CUDAGraph | None = None

    def _reset(self) -> None:
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.zero_()

    def prefill(self, embeds: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> None:
        """Run the prompt `[B, S, D]` into the cache; choose the first token."""
        self._reset()
        seq_len = mask.shape[1]
        keys = torch.arange(self.max_len, device=mask.device)
        causal = keys[None, :] <= torch.arange(seq_len, device=mask.device)[:, None]  # [S, max_len]
        padded = torch.zeros((mask.shape[0], self.max_len), dtype=torch.bool, device=mask.device)
        padded[:, :seq_len] = mask.bool()
        # A pad (query) attends to itself alone: a row with no key at all would make NaNs in its keys and values.
        diagonal = keys[None, :] == torch.arange(seq_len, device=mask.device)[:, None]
        prompt_mask = (causal[None, None] & padded[:, None, None, :]) | diagonal[None, None]
        out = self.llm(
            inputs_embeds=embeds, attention_mask=prompt_mask, position_ids=positions, **self.model_kwargs
        )
        token, logprob = self.choose(out.logits[:, -1])
        self.token.copy_(token)
        self.logprob.copy_(logprob)
        self.valid.copy_(padded[:, None, None, :])
        self.position.copy_(positions[:, -1:] + 1)
        self.slot.fill_(seq_len)

    def _step(self) -> None:
        """Feed `token` at `position` (cache slot `slot`), choose the next one, advance: no host sync, so it can be
        captured."""
        self.valid.index_fill_(-1, self.slot, True)
        out = self.llm(
            inputs_embeds=self.embed(self.token[:, None]),
            attention_mask=self.valid,
            position_ids=self.position,
            **self.model_kwargs,
        )
        token, logprob = self.choose(out.logits[:, -1])
        self.token.copy_(token)
        self.logprob.copy_(logprob)
        self.position.add_(1)
        self.slot.add_(1)

    def step(self) -> None:
        """One decode step: eager the first time (it also warms up the kernels), then captured and replayed."""
        if not self.use_graph:
            self._step()
            return
        if self.graph is None:
            self._step()  # the real first step, eager (capturing below records without running)
            graph = torch.cuda.CUDAGraph()
            snapshot = self._state()
            with torch.cuda.graph(graph):
                self._step()
            self._restore(
                snapshot
            )  # capture runs nothing, but keep the state exactly as the eager step left it
            self.graph = graph
            return
        self.graph.replay()

    def _state(self) -> list[torch.Tensor]:
        return [t.clone() for t in (self.token, self.logprob, self.valid, self.position, self.slot)]

    def _restore(self, state: list[torch.Tensor]) -> None:
        for target, value in zip(
            (self.token, self.logprob, self.valid, self.position, self.slot), state, strict=True
        ):
            target.copy_(value)


def static_decoder(
    llm: torch.nn.Module,
    embed: Callable[[torch.Tensor], torch.Tensor],
    choose: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    key: tuple,
    batch_size: int,
    needed_len: int,
    device: torch.device,
    use_graph: bool,
    keep_last: dict[str, int],
) -> StaticDecoder:
    """The model's decoder for this shape, kept on the model (at most `MAX_GRAPHS`, least recently used dropped;
    they go with the model)."""
    max_len = -(-needed_len // CACHE_BUCKET) * CACHE_BUCKET
    per_model = llm.__dict__.setdefault("_static_decoders", OrderedDict())
    full_key = (*key, batch_size, max_len, use_graph)
    decoder = per_model.get(full_key)
    if decoder is None:
        decoder = StaticDecoder(llm, embed, choose, batch_size, max_len, device, use_graph, keep_last)
        per_model[full_key] = decoder
        while len(per_model) > MAX_GRAPHS:
            per_model.popitem(last=False)
    per_model.move_to_end(full_key)
    return decoder
