"""Action heads: how actions are represented, learned and read out. The training loop, the strategies, validation
and the policy call a head and never know the representation, so a new one is one class and one registry entry.

A head owns, for its representation:
    - the model side: `ActionSpec` says which modules the VLM gets (`PrismaticVLM.attach_action_modules`);
    - the text layout of a training frame (`layout`): which ids follow the prompt and which carry labels;
    - the loss and the metric sums of a batch (`__call__`), and which ratios of those sums are reported;
    - its chunk length: the pipeline's future-action window is `chunk_size - 1`.

Heads:
    tokens    OpenVLA: each action dimension is one of 256 bins on the LLM's last token ids; the loss is the LLM's
              next-token cross-entropy on the action tokens (and EOS); decoded one token per forward.
    l1-chunk  OpenVLA-OFT (Kim, Finn, Liang 2025): `chunk_size * action_dim` empty action positions follow the prompt
              (their embeddings are zero), attend to each other and to the prompt (which does not see them), and an
              MLP on their last hidden states predicts the whole chunk of normalised actions in one forward; L1 loss.

A head is called with the (possibly FSDP- or DDP-wrapped) model and a batch already on the device: it must call the
model through its `forward` (wrappers hook it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from prismatic.util.constants import IGNORE_INDEX
from prismatic.util.errors import ConfigError, lookup


@dataclass(frozen=True)
class ActionSpec:
    """What a VLA's action side looks like; recorded in a run's / export's config.json (`action_model`).

    `proprio_dim` 0 means no proprio input; `action_dim` is the width of one action (7 for OpenVLA's EEF delta +
    gripper); `num_images` camera views are featurised one after the other.
    """

    head: str = "tokens"
    chunk_size: int = 1
    action_dim: int = 7
    proprio_dim: int = 0
    num_images: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "config") -> ActionSpec:
        """Read back `to_dict()`; unknown keys or an unknown head are a ConfigError naming `where`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown action_model keys {unknown}; known: {sorted(known)}.")
        spec = cls(**dict(values))
        lookup(ACTION_HEADS, spec.head, "action head")
        return spec

    @property
    def is_default(self) -> bool:
        return self == ActionSpec(action_dim=self.action_dim)


@dataclass
class HeadOutput:
    loss: torch.Tensor  # scalar, the mean loss of this micro-batch (what backward sees)
    sums: torch.Tensor  # float64 [B, len(head.columns)], detached: the per-sample metric sums


class ActionHead(ABC):
    """One action representation (see the module docstring). Subclasses set `name`, `columns` and `ratios`."""

    name: ClassVar[str]
    uses_lm_head: ClassVar[bool]  # False: the LM head gets no gradient and is frozen
    columns: tuple[str, ...]  # per-sample sums returned by `__call__`
    ratios: dict[str, tuple[str, str]]  # reported metric -> (numerator column, denominator column)

    def __init__(self, spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> None:
        self.spec, self.action_tokenizer, self.num_prefix_tokens = spec, action_tokenizer, num_prefix_tokens

    @property
    def future_action_window_size(self) -> int:
        """Future actions the pipeline attaches to each frame (its `future_action_window_size`)."""
        return self.spec.chunk_size - 1

    @abstractmethod
    def layout(self, prefix_ids: list[int], actions: np.ndarray, eos_id: int) -> dict[str, torch.Tensor]:
        """A frame's text after its prompt: {"input_ids", "labels"} (and head-specific masks), int64 / bool [L]."""

    @abstractmethod
    def __call__(self, model: nn.Module, batch: dict[str, Any], *, with_loss: bool = True) -> HeadOutput:
        """Forward `batch` through `model`; the loss (0 when `with_loss` is False) and the metric sums."""

    @staticmethod
    def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch entries every head passes to the VLM's forward."""
        inputs = {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "pixel_values": batch["pixel_values"],
        }
        if batch.get("proprio") is not None:
            inputs["proprio"] = batch["proprio"]
        return inputs


class TokenActionHead(ActionHead):
    """OpenVLA's: actions are 256 bins on the LLM's last token ids; the loss is the LLM's next-token cross-entropy
    over the label tokens (prompt and padding masked with IGNORE_INDEX)."""

    name = "tokens"
    uses_lm_head = True
    columns = ("ce_sum", "supervised", "correct", "action_tokens", "l1_sum")
    ratios = {
        "loss": ("ce_sum", "supervised"),
        "action_accuracy": ("correct", "action_tokens"),
        "l1_loss": ("l1_sum", "action_tokens"),
    }

    def __init__(self, spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> None:
        super().__init__(spec, action_tokenizer, num_prefix_tokens)
        self._bin_centers: dict[torch.device, torch.Tensor] = {}

    def layout(self, prefix_ids: list[int], actions: np.ndarray, eos_id: int) -> dict[str, torch.Tensor]:
        """prompt + one token per action dimension + EOS; labels on the action tokens and EOS."""
        action_ids = self.action_tokenizer.encode_to_ids(np.asarray(actions, np.float32).reshape(-1)).tolist()
        input_ids = torch.tensor([*prefix_ids, *action_ids, eos_id], dtype=torch.long)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[len(prefix_ids) :] = input_ids[len(prefix_ids) :]
        return {"input_ids": input_ids, "labels": labels}

    def _decode(self, ids: torch.Tensor) -> torch.Tensor:
        """`ActionTokenizer.decode_ids` on the device: `vocab_size - id` is the 1-based bin, shifted and clipped."""
        centers = self._bin_centers.get(ids.device)
        if centers is None:
            centers = torch.as_tensor(
                self.action_tokenizer.bin_centers, dtype=torch.float64, device=ids.device
            )
            self._bin_centers[ids.device] = centers
        index = (self.action_tokenizer.vocab_size - ids - 1).clamp(0, centers.numel() - 1)
        return centers[index]

    def __call__(self, model: nn.Module, batch: dict[str, Any], *, with_loss: bool = True) -> HeadOutput:
        labels = batch["labels"]
        output = model(**self.model_inputs(batch), labels=labels if with_loss else None)
        return HeadOutput(
            loss=output.loss if with_loss else output.logits.new_zeros(()),
            sums=self.sums(output.logits, labels),
        )

    @torch.no_grad()
    def sums(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """float64 [B, 5]: CE summed over supervised tokens, their count, correct / all action tokens, L1 sum.

        Logit at position t predicts token t+1; the prefix (patches, proprio) sits after BOS, so text token j >= 1 is
        predicted at position num_prefix_tokens + j - 1. No host synchronisation: masks multiply.
        """
        text_logits = logits[:, self.num_prefix_tokens : -1]
        targets = labels[:, 1:].to(text_logits.device)
        ce = F.cross_entropy(
            text_logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
        ).view_as(targets)  # 0 where ignored
        supervised = targets != IGNORE_INDEX
        preds = text_logits.argmax(dim=-1)
        action = targets > self.action_tokenizer.action_token_begin_idx
        correct = (preds == targets) & action
        l1 = (self._decode(preds) - self._decode(targets)).abs() * action
        return torch.stack(
            [
                ce.double().sum(1),
                supervised.sum(1).double(),
                correct.sum(1).double(),
                action.sum(1).double(),
                l1.sum(1),
            ],
            dim=1,
        )


class L1ChunkActionHead(ActionHead):
    """OpenVLA-OFT's parallel decoding with a continuous head (module docstring). Targets are the pipeline's
    normalised actions `[K, action_dim]` (the current one and K - 1 future ones)."""

    name = "l1-chunk"
    uses_lm_head = False

    def __init__(self, spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> None:
        super().__init__(spec, action_tokenizer, num_prefix_tokens)
        dims = [f"abs_dim{d}" for d in range(spec.action_dim)]
        self.columns = ("abs_sum", "values", "steps", *dims)
        self.ratios = {
            "loss": ("abs_sum", "values"),
            "l1_loss": ("abs_sum", "values"),
            **{f"l1_dim{d}": (f"abs_dim{d}", "steps") for d in range(spec.action_dim)},
        }

    @property
    def num_slots(self) -> int:
        return self.spec.chunk_size * self.spec.action_dim

    def layout(self, prefix_ids: list[int], actions: np.ndarray, eos_id: int) -> dict[str, torch.Tensor]:
        """prompt + `chunk_size * action_dim` action positions (their ids never reach the LLM: the VLM zeroes their
        embeddings), no labels; `action_mask` marks them; `actions` must be `[chunk_size, action_dim]`."""
        shape = np.shape(actions)
        expected = (self.spec.chunk_size, self.spec.action_dim)
        if tuple(shape) != expected:
            raise ValueError(
                f"The l1-chunk head needs actions of shape {expected} (chunk_size, action_dim) per frame, got "
                f"{tuple(shape)}: build the pipeline with future_action_window_size = chunk_size - 1."
            )
        n = len(prefix_ids)
        input_ids = torch.tensor([*prefix_ids, *([eos_id] * self.num_slots)], dtype=torch.long)
        action_mask = torch.zeros(len(input_ids), dtype=torch.bool)
        action_mask[n:] = True
        return {
            "input_ids": input_ids,
            "labels": torch.full_like(input_ids, IGNORE_INDEX),
            "action_mask": action_mask,
        }

    def __call__(self, model: nn.Module, batch: dict[str, Any], *, with_loss: bool = True) -> HeadOutput:
        output = model(**self.model_inputs(batch), action_mask=batch["action_mask"])
        predicted = output.actions  # [B, K, D], normalised units
        target = batch["actions"].to(device=predicted.device, dtype=torch.float32)
        error = (predicted.float() - target).abs()
        loss = error.mean() if with_loss else error.new_zeros(())
        with torch.no_grad():
            e = error.detach().double()
            batch_size, chunk, dim = e.shape
            sums = torch.cat(
                [
                    e.sum((1, 2))[:, None],
                    e.new_full((batch_size, 1), float(chunk * dim)),
                    e.new_full((batch_size, 1), float(chunk)),
                    e.sum(1),
                ],
                dim=1,
            )
        return HeadOutput(loss=loss, sums=sums)


class ResidualMLPBlock(nn.Module):
    """LayerNorm -> Linear -> ReLU, added to its input (OpenVLA-OFT's MLPResNet block)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.linear(self.norm(x)))


class L1ChunkMLP(nn.Module):
    """Hidden states of one chunk step's `action_dim` positions, concatenated -> that step's action.

    `[B, K, action_dim * llm_dim]` -> LayerNorm -> Linear(-> llm_dim) -> ReLU -> 2 residual blocks -> LayerNorm ->
    Linear(-> action_dim): `[B, K, action_dim]` (OpenVLA-OFT's L1 regression head, MLPResNet with 2 blocks).
    """

    def __init__(self, llm_dim: int, action_dim: int, num_blocks: int = 2) -> None:
        super().__init__()
        self.input_norm = nn.LayerNorm(action_dim * llm_dim)
        self.input = nn.Linear(action_dim * llm_dim, llm_dim)
        self.blocks = nn.ModuleList(ResidualMLPBlock(llm_dim) for _ in range(num_blocks))
        self.output_norm = nn.LayerNorm(llm_dim)
        self.output = nn.Linear(llm_dim, action_dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.input(self.input_norm(hidden)))
        for block in self.blocks:
            x = block(x)
        return self.output(self.output_norm(x))


class ProprioProjector(nn.Module):
    """Normalised proprio `[B, P]` -> one LLM token `[B, 1, llm_dim]`: Linear -> GELU -> Linear (OpenVLA-OFT's)."""

    def __init__(self, proprio_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(proprio)))[:, None, :]


# name -> head class; and name -> builder of the VLM module the head reads out with (absent: none)
ACTION_HEADS: dict[str, type[ActionHead]] = {
    "tokens": TokenActionHead,
    "l1-chunk": L1ChunkActionHead,
}
HEAD_MODULES: dict[str, Any] = {
    "l1-chunk": lambda spec, llm_dim: L1ChunkMLP(llm_dim, spec.action_dim),
}


def build_action_head(spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> ActionHead:
    """The head named by `spec.head` (a ConfigError listing the registered heads when unknown)."""
    return lookup(ACTION_HEADS, spec.head, "action head")(spec, action_tokenizer, num_prefix_tokens)


def get_action_head(name: str, action_tokenizer: Any = None, num_prefix_tokens: int = 0) -> ActionHead:
    """Shorthand for a head with a default spec (tests, tools)."""
    return build_action_head(ActionSpec(head=name), action_tokenizer, num_prefix_tokens)
