"""Action heads: how actions are represented, learned and read out. The training loop, the strategies, validation,
the batch transform and the policy call a head and never know the representation, so a new one is one class and
one registry entry (`registry.py`: `ACTION_HEADS.register(name, "module:Class")`).

A head owns, for its representation:
    - its module: `build_module` gives the VLM its `action_head` (`PrismaticVLM.attach_action_modules`), whose
      `forward(HeadInputs)` gets the LLM's last hidden states, their masks and the head's own inputs (targets,
      proprio, a generator) and returns a `HeadModuleOutput`;
    - the text layout of a training frame (`layout`): which ids follow the prompt and which carry labels;
    - the loss and the metric sums of a batch (`__call__`), and which ratios of those sums are reported;
    - its decoding at inference (`predict`): a batch of requests -> normalised actions (and token ids);
    - its chunk length: the pipeline's future-action window is `chunk_size - 1` (`future_action_window_size`).

Heads:
    tokens    OpenVLA: each action dimension is one of 256 bins on the LLM's last token ids; the loss is the LLM's
              next-token cross-entropy on the action tokens (and EOS); decoded one token per forward (`tokens.py`).
    l1-chunk  OpenVLA-OFT: a chunk of `chunk_size` continuous actions predicted in one forward by an MLP on the
              LLM's last hidden states; L1 loss (`l1_chunk.py`).
    flow      π0: a chunk sampled by a flow-matching transformer expert that attends to the LLM's last hidden
              states; velocity MSE in training, Euler steps from seeded noise at inference (`flow/`).
    fast      π0-FAST: a chunk as a few BPE ids over its DCT coefficients, on the LLM's last token ids; the LLM's
              next-token cross-entropy; greedy decoding constrained to those ids, invalid sequences as zeros;
              the vocabulary fitted once per run and kept in its folder (`fast/`).

Importing this package loads no torch: the registry and `ActionSpec` are plain data (the config reads them); the
head classes load with the first name used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prismatic.models.action_heads.registry import (
    ACTION_HEADS,
    ActionSpec,
    build_action_head,
    get_action_head,
    is_chunked,
)
from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.models.action_heads.base import (
        ActionHead,
        DecodeRequest,
        HeadInputs,
        HeadModule,
        HeadModuleOutput,
        HeadOutput,
        HeadPrediction,
        ProprioProjector,
    )
    from prismatic.models.action_heads.l1_chunk import L1ChunkActionHead, L1ChunkMLP
    from prismatic.models.action_heads.tokens import TokenActionHead, token_layout

_BASE = "prismatic.models.action_heads.base"
_LAZY = {
    **dict.fromkeys(
        (
            "ActionHead",
            "DecodeRequest",
            "HeadInputs",
            "HeadModule",
            "HeadModuleOutput",
            "HeadOutput",
            "HeadPrediction",
            "ProprioProjector",
        ),
        _BASE,
    ),
    **dict.fromkeys(("L1ChunkActionHead", "L1ChunkMLP"), "prismatic.models.action_heads.l1_chunk"),
    **dict.fromkeys(("TokenActionHead", "token_layout"), "prismatic.models.action_heads.tokens"),
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "ACTION_HEADS",
    "ActionHead",
    "ActionSpec",
    "DecodeRequest",
    "HeadInputs",
    "HeadModule",
    "HeadModuleOutput",
    "HeadOutput",
    "HeadPrediction",
    "L1ChunkActionHead",
    "L1ChunkMLP",
    "ProprioProjector",
    "TokenActionHead",
    "build_action_head",
    "get_action_head",
    "is_chunked",
    "token_layout",
]
