"""Greedy decoding over a static KV cache, the prefill and each decode step replayed from captured CUDA graphs.

A 7B decode step on one token is ~1,000 kernel launches of a few microseconds each: eager, the GPU waits for
Python, far longer than reading the weights takes. Here everything after the host's preprocessing runs as two
CUDA graphs, captured once per shape and replayed for every later request:
- the prefill: token embeddings, the vision backbone and projector, the prompt laid out right-aligned (one gather
  from text and patches), the LLM over it into a `StaticCache` (fixed-size keys / values), the first greedy choice;
- one decode step: embed the last token, the LLM over the cache, the next greedy choice, advance mask and position.
Prompt and cache lengths are rounded up (`TEXT_BUCKET`, `CACHE_BUCKET`) so that prompts of nearby lengths share
graphs; the extra room is left padding, masked as padding is.

The arithmetic is `greedy_decode`'s (same layout, positions, masking of pads, choice and log-probabilities); only
the kernels' schedule differs, so ids match the dynamic-cache path (pinned on CPU in FP32, where the same functions
run eagerly, and on GPU in bf16 by tests/gpu). Where the installed transformers' `StaticCache` does not keep its
write position as a tensor (`cumulative_length`), or where the model has sliding-window layers (Mistral),
`supported` says no and the dynamic path runs; a shape whose capture fails (an operation that waits for the
host) runs the same functions eagerly.

Replayed, a 7B step still runs ~1,000 small unfused kernels (RMSNorm, RoPE, SiLU, residual adds, cache writes:
a large share of an action's time on a GPU; benchmarks/results/ has the profile). With `compile_steps` they are
compiled by `torch.compile` (inductor) after the first, eager call of each shape, run once (compiling them, never
inside a capture), then captured, so the graphs replay inductor's fused kernels. What compiles (`compile_scope`):
- "layers" (the default): each ViT block and LLM decoder layer, torchtitan's way, the glue between them eager. The
  blocks of a stack share their code and so their graphs (the cache is stacked so that a layer's index is a
  symbol, `_stackable_cache_class`): a handful of graphs of one block each, whatever the depth.
- "whole": the two functions, each one graph of the whole model (minutes of compiling at 7B), which fuses across
  block boundaries and the glue too.
Either way batch size and prompt and cache lengths are symbols in the graphs, so they compile once for one request
and once for larger batches, and a later shape only captures its graphs (when each shape compiled its own, a
server paid the compile for every new batch size and prompt length). Where compiling fails, the model keeps the
uncompiled functions (one WARNING); on CPU the compiled code runs without graphs (tests).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from prismatic.models.compile_scope import COMPILE_SCOPES, DEFAULT_COMPILE_SCOPE
from prismatic.models.prompt_layout import layout, prompt_embeddings, round_up

if TYPE_CHECKING:
    from prismatic.models.vlms.prismatic import PrismaticVLM

logger = logging.getLogger(__name__)

TEXT_BUCKET = 16  # prompt token lengths are multiples of this
CACHE_BUCKET = 32  # cache lengths are multiples of this
MAX_GRAPHS = 4  # per model: each holds a static KV cache (B x layers x 2 x heads x length x head_dim)

Choose = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
COMPILED = ("prefill", "step")  # what `compile_steps` compiles (CPU tests: the step only, faster to compile)
# Layers: an int on a module that changes between calls (a decoder layer's `layer_idx`) becomes a symbol, so that
# one graph serves every layer; room for the graphs of one request and of larger batches, prefill and step, per
# block type, and whatever else in the process shares the blocks' code (training's compiled blocks).
_LAYER_CONFIG = {"allow_unspec_int_on_nn_module": True, "recompile_limit": 64}
COMPILE_FAILED = "_static_compile_failed"  # set on a model (its `__dict__`) whose functions failed to compile
_COMPILE_ISOLATES = "isolate_recompiles" in inspect.signature(torch.compile).parameters  # torch >= 2.14


@dataclass(frozen=True)
class StepOptions:
    """How `greedy_decode`'s prefill and steps run here: `choose` picks the next ids from the last logits
    (`choose_key` names its behaviour, its id range, which graphs and compiled code bake in); `keep_last` asks the
    LM head for the last position only; `use_graph` captures CUDA graphs; `compile_steps` compiles first, each
    block (`compile_scope="layers"`) or each function whole (`"whole"`)."""

    choose: Choose
    choose_key: Any
    keep_last: dict[str, int]
    use_graph: bool
    compile_steps: bool = False
    compile_scope: str = DEFAULT_COMPILE_SCOPE

    def __post_init__(self) -> None:
        if self.compile_scope not in COMPILE_SCOPES:
            raise ValueError(
                f"compile_scope {self.compile_scope!r} is not one of {', '.join(COMPILE_SCOPES)}: 'layers' compiles "
                "each ViT block and decoder layer, 'whole' the prefill and the decode step each as one graph."
            )


def _static_cache(llm: torch.nn.Module, max_len: int, stackable: bool = False) -> Any:
    from transformers import StaticCache

    cache_class = _stackable_cache_class() if stackable else StaticCache
    return cache_class(config=llm.config, max_cache_len=max_len)


@functools.cache
def _stackable_cache_class() -> type:
    """transformers' `StaticCache` with every layer's keys, values and write position in one tensor each
    (`[layers x batch x heads, length, head_dim]`, and `[layers]`), each layer holding views of its part.

    A decoder layer's attention updates its cache as `cache.update(keys, values, self.layer_idx)`; `StaticCache`
    then picks the layer from a list, which a compiled layer can only do with `layer_idx` fixed: a graph per layer,
    32 at 7B, past dynamo's limit of 8 per function. Stacked, the layer's rows are arithmetic on `layer_idx`, a
    symbol of one graph for every layer. The writes are `StaticLayer.update`'s: the new keys and values at the
    layer's write position on, which then advances by their length.
    """
    from transformers import StaticCache

    class StackableStaticCache(StaticCache):
        # Keys, values, write positions: allocated by the first write (the decoder's first, eager call).
        stacked: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

        def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            """The stacked tensors, shaped after the first write's; each layer initialised by transformers (its
            attributes) and then pointed at its rows, one at a time (its own tensors freed at once)."""
            batch, heads = key_states.shape[:2]
            rows, length = batch * heads, self.layers[0].max_cache_len
            keys = key_states.new_zeros((len(self.layers) * rows, length, key_states.shape[-1]))
            values = value_states.new_zeros((len(self.layers) * rows, length, value_states.shape[-1]))
            positions = torch.zeros(len(self.layers), dtype=torch.long, device=key_states.device)
            for index, layer in enumerate(self.layers):
                if not layer.is_initialized:
                    layer.lazy_initialization(key_states, value_states)
                part = slice(index * rows, (index + 1) * rows)
                layer.keys = keys[part].view(batch, heads, length, -1)
                layer.values = values[part].view(batch, heads, length, -1)
                layer.cumulative_length = positions[index]
            # Rows (layers x batch x heads) and cache length: symbols when compiled, as the layers' inputs' sizes.
            for tensor, dim in itertools.product((keys, values), (0, 1)):
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
            self.stacked = (keys, values, positions)

        def update(
            self,
            key_states: torch.Tensor,
            value_states: torch.Tensor,
            layer_idx: int,
            *args: Any,
            **kwargs: Any,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if self.stacked is None:
                self._allocate(key_states, value_states)
            keys, values, positions = self.stacked
            batch, heads, new, _ = key_states.shape
            first = layer_idx * batch * heads
            rows = (first + torch.arange(batch * heads, device=keys.device))[:, None]
            slots = (positions[layer_idx] + torch.arange(new, device=keys.device))[None, :]
            keys.index_put_((rows, slots), key_states.reshape(batch * heads, new, -1))
            values.index_put_((rows, slots), value_states.reshape(batch * heads, new, -1))
            positions[layer_idx].add_(new)
            length = keys.shape[1]
            return (
                keys[first : first + batch * heads].view(batch, heads, length, -1),
                values[first : first + batch * heads].view(batch, heads, length, -1),
            )

    return StackableStaticCache


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
    # Plain full-attention layers only: a sliding-window layer (Mistral) writes and masks its window otherwise.
    return bool(layers) and all(
        type(layer).__name__ == "StaticLayer" and hasattr(layer, "cumulative_length") for layer in layers
    )


def _like(value: Any) -> Any:
    """A zero buffer (or dict of them) shaped like `value`: where each request's inputs are copied for replay."""
    if isinstance(value, dict):
        return {key: torch.zeros_like(item) for key, item in value.items()}
    return None if value is None else torch.zeros_like(value)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, dict):
        return list(value.values())
    return [] if value is None else [value]


def compiled_function(
    vlm: PrismaticVLM, function: Callable[[StaticDecoder], None]
) -> Callable[[StaticDecoder], None]:
    """`function` (a `StaticDecoder` method, unbound) compiled for `vlm`, made once and kept with the model: every
    shape's decoder calls the same one, whose graphs take batch size and lengths as symbols (`_mark_dynamic`)."""
    kept = vlm.__dict__.setdefault("_static_compiled", {})
    if function.__name__ not in kept:
        # Recompiles counted per model where torch can (2.14; dynamo's limits are per code object otherwise).
        isolate = {"isolate_recompiles": True} if _COMPILE_ISOLATES else {}
        kept[function.__name__] = torch.compile(function, fullgraph=True, **isolate)
    return kept[function.__name__]


def compiled_blocks(vlm: PrismaticVLM) -> list[tuple[torch.nn.Module, Callable[..., Any]]]:
    """Every block that runs (`running_blocks`) with its `forward` compiled, made once and kept with the model.
    The blocks of a stack share their code, so they share its graphs too: one per block type and shape kind."""
    from prismatic.models.parallelize import running_blocks

    kept = vlm.__dict__.get("_static_compiled_blocks")
    if kept is None:
        kept = [
            (block, _sizes_symbolic(torch.compile(block.forward, fullgraph=True)))
            for block in running_blocks(vlm)
        ]
        vlm.__dict__["_static_compiled_blocks"] = kept
    return kept


def _sizes_symbolic(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """`compiled`, called with every size of its tensor arguments marked symbolic (batch, lengths; a size a weight
    fixes, or a size of 1, is specialised by the compiler all the same): one graph for all shapes of a kind, as
    `_mark_dynamic` gives the whole functions. Not `dynamic=True`: that would make every int on a module a symbol
    (head sizes, epsilons), where only `layer_idx` needs to be one."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        pending = [*args, *kwargs.values()]
        while pending:
            value = pending.pop()
            if isinstance(value, (tuple, list)):
                pending.extend(value)
            elif isinstance(value, torch.Tensor):
                for dim in range(value.dim()):
                    torch._dynamo.maybe_mark_dynamic(value, dim)
        return compiled(*args, **kwargs)

    return forward


@contextmanager
def _blocks_compiled(blocks: list[tuple[torch.nn.Module, Callable[..., Any]]]) -> Iterator[None]:
    """The blocks run their compiled `forward` inside (and only inside: the model stays as it was for any other
    caller, training or the dynamic cache), with the dynamo settings that let one graph serve a whole stack."""
    kept = [(block, block.__dict__.get("forward")) for block, _ in blocks]
    for block, compiled in blocks:
        block.forward = compiled
    try:
        with torch._dynamo.config.patch(**_LAYER_CONFIG):
            yield
    finally:
        for block, forward in kept:
            if forward is None:
                del block.forward
            else:
                block.forward = forward


def _copy_into(target: Any, value: Any) -> None:
    if isinstance(target, dict):
        for key, item in target.items():
            item.copy_(value[key])
    elif target is not None:
        target.copy_(value)


class StaticDecoder:
    """One shape of static decoding (batch size, prompt and cache lengths): the cache, the static inputs and
    outputs, and the two functions as they run (compiled or not) and their graphs."""

    def __init__(self, vlm: PrismaticVLM, shape: tuple[int, int, int, int], options: StepOptions) -> None:
        self.vlm, self.llm, self.options, self.choose = vlm, vlm.llm_backbone.llm, options, options.choose
        batch_size, text_len, seq_len, max_len = shape
        self.layerwise = options.compile_steps and options.compile_scope == "layers"
        self.cache = _static_cache(self.llm, max_len, stackable=self.layerwise)
        self.model_kwargs = {cache_kwarg(self.llm): self.cache, "use_cache": True, **options.keep_last}
        device = self.llm.get_input_embeddings().weight.device
        # Inputs of the prefill, refilled from each request (`load`).
        self.ids = torch.zeros((batch_size, text_len), dtype=torch.long, device=device)
        self.index = torch.zeros((batch_size, seq_len), dtype=torch.long, device=device)
        self.mask = torch.zeros((batch_size, seq_len), dtype=torch.long, device=device)
        self.pixels: Any = None
        self.proprio: torch.Tensor | None = None
        keys = torch.arange(max_len, device=device)
        queries = torch.arange(seq_len, device=device)[:, None]
        self.causal = keys[None, :] <= queries  # [S, max_len]
        # A pad (query) attends to itself alone: a row with no key at all would make NaNs in its keys and values.
        self.diagonal = keys[None, :] == queries
        # State carried from step to step.
        self.token = torch.zeros(batch_size, dtype=torch.long, device=device)  # the last chosen ids
        self.logprob = torch.zeros(batch_size, dtype=torch.float32, device=device)
        self.valid = torch.zeros(
            (batch_size, 1, 1, max_len), dtype=torch.bool, device=device
        )  # keys to attend
        self.position = torch.zeros(
            (batch_size, 1), dtype=torch.long, device=device
        )  # the new token's position
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # its cache slot
        self.runs: dict[str, Callable[[], None]] = {}  # per function, once warmed up: compiled or not
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}  # per function, where captured

    @property
    def max_len(self) -> int:
        """The cache length (the functions read every length off their tensors' shapes)."""
        return self.valid.shape[-1]

    def load(
        self,
        ids: torch.Tensor,
        index: torch.Tensor,
        mask: torch.Tensor,
        pixels: Any,
        proprio: torch.Tensor | None,
    ) -> None:
        """Copy one request batch into the static inputs (host tensors are copied without a sync)."""
        if self.pixels is None:
            self.pixels, self.proprio = _like(pixels), _like(proprio)
        for target, value in ((self.ids, ids), (self.index, index), (self.mask, mask)):
            target.copy_(value, non_blocking=True)
        _copy_into(self.pixels, pixels)
        _copy_into(self.proprio, proprio)

    def _prefill(self) -> None:
        """Prompt embeddings (text and prefix, laid out by `index`), the LLM into the reset cache, the first choice."""
        # Lengths come from the tensors' shapes, not from ints: symbolic when compiled (one graph for all shapes).
        batch_size, seq_len = self.mask.shape
        embeds = prompt_embeddings(self.vlm, self.ids, self.index, self.mask, self.pixels, self.proprio)
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        padded = torch.zeros((batch_size, self.valid.shape[-1]), dtype=torch.bool, device=self.mask.device)
        padded[:, :seq_len] = self.mask.bool()
        prompt_mask = (self.causal[None, None] & padded[:, None, None, :]) | self.diagonal[None, None]
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.zero_()
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
        """Feed `token` at `position` (cache slot `slot`), choose the next one, advance."""
        self.valid.index_fill_(-1, self.slot, True)
        out = self.llm(
            inputs_embeds=self.vlm.llm_backbone.embed_input_ids(self.token[:, None]),
            attention_mask=self.valid,
            position_ids=self.position,
            **self.model_kwargs,
        )
        token, logprob = self.choose(out.logits[:, -1])
        self.token.copy_(token)
        self.logprob.copy_(logprob)
        self.position.add_(1)
        self.slot.add_(1)

    def _run(self, name: str, fn: Callable[[], None]) -> None:
        """Replay `name`'s graph; the first time, run `fn` eagerly (warming its kernels up and allocating the
        cache), compile it (`compile_steps`), then capture it (on CUDA)."""
        graph = self.graphs.get(name)
        if graph is not None:
            graph.replay()
            return
        run = self.runs.get(name)
        if run is not None:  # no graph: CPU, or a failed capture
            run()
            return
        fn()  # the real call, eager: what follows runs on the state it leaves and restores it
        run = self._compile(name, fn) if self.options.compile_steps and name in COMPILED else fn
        if self.options.use_graph:
            graph = torch.cuda.CUDAGraph()
            try:
                with self._state_kept(), torch.cuda.graph(graph):
                    run()  # records without running
                self.graphs[name] = graph
            except RuntimeError as err:  # something in it waits for the host: keep this shape eager
                logger.warning("CUDA graph capture of the %s failed (%s); it runs eagerly.", name, err)
        self.runs[name] = run

    @contextmanager
    def _state_kept(self) -> Iterator[None]:
        """Runs inside leave the decoding state (and the cache's write positions) as they found it: a warm-up or
        a capture computes what the next real call computes again."""
        state = (self.token, self.logprob, self.valid, self.position, self.slot)
        saved = [t.clone() for t in state]
        lengths = [layer.cumulative_length.clone() for layer in self.cache.layers]
        try:
            yield
        finally:
            for target, value in zip(state, saved, strict=True):
                target.copy_(value)
            for layer, length in zip(self.cache.layers, lengths, strict=True):
                layer.cumulative_length.copy_(length)

    def _compile(self, name: str, fn: Callable[[], None]) -> Callable[[], None]:
        """The model's compiled `fn` (`compiled_function`) bound to this shape and run once (compiling it where no
        earlier shape's graphs fit; never inside a capture), or `fn` where that fails: the model then keeps the
        uncompiled functions, with one WARNING."""
        if COMPILE_FAILED in self.vlm.__dict__:
            return fn
        if self.layerwise:
            blocks = compiled_blocks(self.vlm)

            def run() -> None:
                with _blocks_compiled(blocks):
                    fn()

        else:
            self._mark_dynamic()
            compiled = compiled_function(self.vlm, fn.__func__)

            def run() -> None:
                compiled(self)

        try:
            with self._state_kept():
                run()
        except torch.OutOfMemoryError:
            raise
        except (
            RuntimeError,
            torch._dynamo.exc.FailOnRecompileLimitHit,
        ) as err:  # dynamo's, inductor's errors
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            logger.warning("torch.compile of the %s failed (%s); decoding runs uncompiled.", name, reason)
            self.vlm.__dict__[COMPILE_FAILED] = reason
            return fn
        return run

    def _mark_dynamic(self) -> None:
        """Mark the batch and length dimensions of this shape's tensors as symbolic (`maybe_mark_dynamic`: a size
        of 1 is still specialised, hence one graph for a single request and one for larger batches)."""
        dims = [
            (self.ids, (0, 1)),
            (self.index, (0, 1)),
            (self.mask, (0, 1)),
            (self.causal, (0, 1)),
            (self.diagonal, (0, 1)),
            (self.token, (0,)),
            (self.logprob, (0,)),
            (self.valid, (0, 3)),
            (self.position, (0,)),
        ]
        dims += [(tensor, (0,)) for tensor in _tensors(self.pixels) + _tensors(self.proprio)]
        for layer in self.cache.layers:  # keys / values [B, heads, max_len, head_dim], made by the eager call
            dims += [(tensor, (0, 2)) for tensor in (layer.keys, layer.values)]
        for tensor, indices in dims:
            for index in indices:
                torch._dynamo.maybe_mark_dynamic(tensor, index)

    def decode(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill, then `num_tokens - 1` steps: ids and log-probabilities `[B, num_tokens]` (on the device)."""
        self._run("prefill", self._prefill)
        chosen = [(self.token.clone(), self.logprob.clone())]
        for _ in range(num_tokens - 1):
            self._run("step", self._step)
            chosen.append((self.token.clone(), self.logprob.clone()))
        ids, logprobs = zip(*chosen, strict=True)
        return torch.stack(ids, dim=1), torch.stack(logprobs, dim=1)


def static_decode(
    vlm: PrismaticVLM,
    prompt_ids: Sequence[Sequence[int]],
    pixel_values: Any,
    proprio: torch.Tensor | None,
    num_tokens: int,
    pad_id: int,
    options: StepOptions,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`greedy_decode` over a static cache: ids and log-probabilities `[B, num_tokens]` on the device.

    The model keeps one `StaticDecoder` per shape and options (at most `MAX_GRAPHS`, least recently used dropped;
    they go with the model, and their graphs and compiled code with them).
    """
    ids, index, mask = layout(prompt_ids, vlm.num_prefix_tokens, pad_id, bucket=TEXT_BUCKET)
    seq_len = mask.shape[1]
    shape = (len(prompt_ids), ids.shape[1], seq_len, round_up(seq_len + num_tokens, CACHE_BUCKET))
    dtype = vlm.llm_backbone.llm.get_input_embeddings().weight.dtype
    compiled = options.compile_scope if options.compile_steps else None
    key = (shape, dtype, options.choose_key, options.use_graph, compiled, proprio is not None)
    kept = vlm.__dict__.setdefault("_static_decoders", OrderedDict())
    decoder = kept.get(key)
    if decoder is None:
        decoder = StaticDecoder(vlm, shape, options)
        kept[key] = decoder
        while len(kept) > MAX_GRAPHS:
            kept.popitem(last=False)
    kept.move_to_end(key)
    decoder.load(ids, index, mask, pixel_values, proprio)
    return decoder.decode(num_tokens)
