"""The prompt as a VLM reads it at inference: one right-aligned row per request, as training saw it.

    [pad ... pad] [BOS] [prefix: patches of every view, proprio] [text_2 ... text_L]   (mask 0 on the pads)

`layout` computes the host side (token ids, the gather index into `cat(text embeddings, prefix)`, the mask) and
`prompt_embeddings` the device side, with one gather. Both decoding paths use them: the dynamic cache
(`decoding.py`) and the CUDA-graph one (`static_decoding.py`, which rounds the lengths up so that shapes repeat).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from prismatic.models.vlms.prismatic import PrismaticVLM


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `value`."""
    return -(-value // multiple) * multiple


def layout(
    prompt_ids: Sequence[Sequence[int]], num_prefix: int, pad_id: int, bucket: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Host tensors of the layout: token ids `[B, T]` (right-padded with `pad_id`), the gather index `[B, S]` into
    `cat(text embeddings, prefix)` and the mask `[B, S]`; T and S are rounded up to a multiple of `bucket` (extra
    left padding).

    Row r of length l: `[pads] [BOS] [prefix 0 .. num_prefix - 1] [text 1 .. l - 1]`, pads pointing at position 0.
    """
    lengths = [len(ids) for ids in prompt_ids]
    text_len = round_up(max(lengths), bucket)
    seq_len = round_up(max(lengths) + num_prefix, bucket)
    ids = torch.full((len(prompt_ids), text_len), pad_id, dtype=torch.long)
    index = torch.zeros((len(prompt_ids), seq_len), dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), seq_len), dtype=torch.long)
    for row, row_ids in enumerate(prompt_ids):
        length = len(row_ids)
        ids[row, :length] = torch.as_tensor(row_ids, dtype=torch.long)
        start = seq_len - (num_prefix + length)
        index[row, start + 1 : start + 1 + num_prefix] = text_len + torch.arange(num_prefix)
        index[row, start + 1 + num_prefix :] = torch.arange(1, length)
        mask[row, start:] = 1
    return ids, index, mask


def prompt_embeddings(
    vlm: PrismaticVLM,
    ids: torch.Tensor,
    index: torch.Tensor,
    mask: torch.Tensor,
    pixel_values: Any,
    proprio: torch.Tensor | None,
) -> torch.Tensor:
    """Input embeddings `[B, S, D]` of `layout`'s rows (on the model's device): pads are zero vectors."""
    text = vlm.llm_backbone.embed_input_ids(ids)
    prefix = vlm.prefix_embeddings(pixel_values, proprio).to(text.dtype)
    source = torch.cat([text, prefix], dim=1)
    embeds = source.gather(1, index[..., None].expand(-1, -1, source.shape[-1]))
    return embeds.masked_fill(~mask.bool()[..., None], 0.0)
