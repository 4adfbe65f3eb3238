"""FAST ids on the LLM's vocabulary and their autoregressive, constrained, greedy decoding.

Placement: OpenVLA puts its 256 bins on the last ids of the LLM's tokenizer vocabulary (bin i -> `vocab_size - i`);
FAST's `n` BPE ids go to the same end of it, id j -> `vocab_size - 1 - j` (π0-FAST's `_act_tokens_to_paligemma_tokens`
without its 128 skipped ids, which are PaliGemma's special tokens at the end of its vocabulary; Llama-2's last ids
are ordinary pieces, the ones OpenVLA's bins take). So the FAST ids are the contiguous range
`[vocab_size - n, vocab_size)`, and an LLM id maps back by the same formula.

Decoding is greedy and, constrained, picks only among the FAST ids and EOS (every other logit is masked); a row
stops at EOS or after `max_tokens` tokens. The step function is the caller's: validation runs the (possibly
FSDP- or DDP-wrapped) model's forward over the grown sequence, every rank as many steps (`all_ranks_done`), the
policy a KV-cached LLM (`cached_steps`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from prismatic.models import static_decoding
from prismatic.models.decoding import _keep_last_logits_kwarg, _left_padded_embeddings, _positions


def fast_id_range(llm_vocab_size: int, fast_vocab_size: int) -> range:
    """The LLM ids FAST's `fast_vocab_size` ids occupy: the last ones of the tokenizer's vocabulary."""
    return range(llm_vocab_size - fast_vocab_size, llm_vocab_size)


def to_llm_ids(fast_ids: Sequence[int], llm_vocab_size: int) -> list[int]:
    """FAST id j -> LLM id `llm_vocab_size - 1 - j`."""
    return [llm_vocab_size - 1 - int(j) for j in fast_ids]


def to_fast_ids(llm_ids: Sequence[int], llm_vocab_size: int) -> list[int]:
    """The inverse of `to_llm_ids` (an id outside the FAST range maps outside [0, n): invalid when decoded)."""
    return [llm_vocab_size - 1 - int(i) for i in llm_ids]


def choose(logits: torch.Tensor, allowed: range | None, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy ids `[B]` and their log-probabilities from next-token logits `[B, V']`: among `allowed` and EOS only
    (the rest masked to -inf) when `allowed` is given, else among every id."""
    logits = logits.float()
    if allowed is not None:
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        keep[allowed.start : allowed.stop] = True
        keep[eos_id] = True
        logits = logits.masked_fill(~keep, float("-inf"))
    logprobs = torch.log_softmax(logits, dim=-1)
    ids = logits.argmax(dim=-1)
    return ids, logprobs.gather(-1, ids[:, None])[:, 0]


# One decoding step: the ids chosen last `[B]` (None at the first step) -> the next-token logits `[B, V']`.
StepFn = Callable[[torch.Tensor | None], torch.Tensor]


def greedy_fast_decode(
    step: StepFn,
    batch_size: int,
    *,
    allowed: range | None,
    eos_id: int,
    max_tokens: int,
    agree: Callable[[bool], bool] | None = None,
) -> tuple[list[list[int]], list[bool]]:
    """Each row's generated LLM ids before its EOS, and whether it reached EOS within `max_tokens` tokens.

    `step(None)` returns the logits after the prompts, `step(ids)` those after appending `ids` (one per row;
    a finished row's appended ids are ignored). Decoding stops when every row has emitted EOS, or, with `agree`,
    when `agree(every row here has)` says so: a wrapped model's forward is a collective (FSDP gathers, DDP syncs
    buffers), so every rank must run as many steps (`all_ranks_done`).
    """
    rows: list[list[int]] = [[] for _ in range(batch_size)]
    done = [False] * batch_size
    ids = None
    for _ in range(max_tokens):
        ids, _ = choose(step(ids), allowed, eos_id)
        chosen = ids.tolist()
        for row, token in enumerate(chosen):
            if not done[row]:
                if token == eos_id:
                    done[row] = True
                else:
                    rows[row].append(token)
        finished = all(done)
        if agree(finished) if agree is not None else finished:
            break
    return rows, done


def all_ranks_done(device: torch.device) -> Callable[[bool], bool]:
    """`agree` for `greedy_fast_decode` under torch.distributed: True once every rank is done (one MAX all-reduce
    of a flag on `device` per step; without a process group of several ranks, this rank's answer)."""
    import torch.distributed as dist

    def agree(done: bool) -> bool:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return done
        pending = torch.tensor([0 if done else 1], device=device)
        dist.all_reduce(pending, op=dist.ReduceOp.MAX)
        return int(pending.item()) == 0

    return agree


def cached_steps(
    vlm: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    pixel_values: object,
    pad_id: int,
    proprio: torch.Tensor | None,
) -> StepFn:
    """A step function over the unwrapped VLM's LLM with a KV cache: the prompts left-padded as
    `prismatic.models.decoding` lays them out (each row decodes as it would alone), one position per step."""
    llm = vlm.llm_backbone.llm
    keep_last = _keep_last_logits_kwarg(llm)
    cache_name = static_decoding.cache_kwarg(llm)  # the output's field has the input's name
    state: dict[str, object] = {}

    def step(ids: torch.Tensor | None) -> torch.Tensor:
        if ids is None:
            embeds, mask = _left_padded_embeddings(vlm, prompt_ids, pixel_values, pad_id, proprio)
            out = llm(
                inputs_embeds=embeds,
                attention_mask=mask,
                position_ids=_positions(mask),
                use_cache=True,
                **keep_last,
            )
        else:
            mask = state["mask"]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            out = llm(
                inputs_embeds=vlm.llm_backbone.embed_input_ids(ids[:, None].to(mask.device)),
                attention_mask=mask,
                position_ids=_positions(mask)[:, -1:],
                **{cache_name: state["cache"]},
                use_cache=True,
                **keep_last,
            )
        state["mask"], state["cache"] = mask, getattr(out, cache_name)
        return out.logits[:, -1]

    return step


def forward_steps(
    model: torch.nn.Module,
    inputs: dict[str, object],
    prompt_lengths: Sequence[int],
    pad_id: int,
    num_prefix_tokens: int,
    max_tokens: int,
) -> StepFn:
    """A step function through `model`'s forward (what FSDP and DDP hook), without a cache: every step runs the
    right-padded text grown by one id per row, and asks for the logits at each row's last position only."""
    prompts = inputs["input_ids"]
    batch = prompts.shape[0]
    device = prompts.device
    lengths = torch.as_tensor(list(prompt_lengths), dtype=torch.long, device=device)
    width = int(lengths.max()) + max_tokens
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long, device=device)
    columns = torch.arange(width, device=device)
    for row, length in enumerate(prompt_lengths):
        input_ids[row, :length] = prompts[row, :length]
    rows = torch.arange(batch, device=device)

    def step(ids: torch.Tensor | None) -> torch.Tensor:
        nonlocal lengths
        if ids is not None:
            input_ids[rows, lengths] = ids.to(device)
            lengths = lengths + 1
        used = int(lengths.max())
        mask = columns[None, :used] < lengths[:, None]
        out = model(
            input_ids=input_ids[:, :used],
            attention_mask=mask,
            pixel_values=inputs["pixel_values"],
            **({"proprio": inputs["proprio"]} if inputs.get("proprio") is not None else {}),
            logits_positions=(lengths - 1 + num_prefix_tokens)[:, None],
        )
        return out.logits[:, 0]

    return step
