"""The FAST head (`--vla.action_head fast`, π0-FAST's recipe): a chunk of actions as a few BPE ids on the LLM's
vocabulary, learnt with the LLM's next-token cross-entropy and decoded autoregressively.

Training: the text after the prompt is the chunk's FAST ids (`FastActionTokenizer.encode` of the normalised
`[chunk_size, action_dim]` chunk), placed on the LLM's last ids as OpenVLA places its bins (`decoding.py`), then
EOS; labels on those and EOS, the loss the LLM's own (as the tokens head's). The vocabulary is the run's, fitted
at its first start on its training chunks and kept in its run folder (`files.py`).
Inference: greedy decoding constrained to the FAST ids and EOS, until EOS or `--vla.head.fast.max_decode_tokens`;
the ids are read back into a chunk, and a sequence that does not decode to exactly `chunk_size x action_dim`
coefficients gives zeros, as π0-FAST's `extract_actions` does. Such chunks are counted: each prediction marks them
(`HeadPrediction.valid`, which the offline and closed-loop evaluations count), the policy's head keeps
`invalid_count` / `predicted_count` (and warns), validation reports `invalid_rate` beside the held-out L1 of the
decoded chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from prismatic.models.action_heads.base import ActionHead, DecodeRequest, HeadOutput, HeadPrediction
from prismatic.models.action_heads.fast.decoding import (
    all_ranks_done,
    cached_steps,
    fast_id_range,
    forward_steps,
    greedy_fast_decode,
    to_fast_ids,
    to_llm_ids,
)
from prismatic.models.action_heads.fast.options import FastOptions
from prismatic.models.action_heads.fast.tokenizer import FastActionTokenizer
from prismatic.models.action_heads.registry import ActionSpec
from prismatic.models.decoding import PolicyInputError
from prismatic.util.constants import IGNORE_INDEX
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)


class FastActionHead(ActionHead):
    """π0-FAST's action tokens (module docstring). Give it its vocabulary (`use_vocabulary`, `load_files`, or
    `prepare_files` in training) before it lays out or decodes anything."""

    uses_lm_head = True
    columns = ("ce_sum", "supervised", "correct", "action_tokens")
    ratios = {"loss": ("ce_sum", "supervised"), "action_accuracy": ("correct", "action_tokens")}
    # Validation also decodes (`evaluate`): the L1 error of the decoded chunks per value, in normalised units, and
    # the share of chunks whose ids did not decode (zeros, each counted in `invalid`).
    eval_columns = (*columns, "abs_sum", "values", "invalid", "chunks")
    eval_ratios = {**ratios, "l1_loss": ("abs_sum", "values"), "invalid_rate": ("invalid", "chunks")}

    def __init__(self, spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> None:
        super().__init__(spec, action_tokenizer, num_prefix_tokens)
        self.options = FastOptions(**spec.head_options)
        self.fast: FastActionTokenizer | None = None
        self.invalid_count = (
            0  # predicted chunks that did not decode (zeros), over this head's `predict` calls
        )
        self.predicted_count = 0

    # ----- the vocabulary -----

    @property
    def llm_vocab_size(self) -> int:
        """The LLM tokenizer's vocabulary size (OpenVLA's `vocab_size`: the FAST ids end there)."""
        return int(self.action_tokenizer.vocab_size)

    @property
    def fast_ids(self) -> range:
        """The LLM ids the run's FAST vocabulary occupies."""
        return fast_id_range(self.llm_vocab_size, self.vocabulary.vocab_size)

    @property
    def vocabulary(self) -> FastActionTokenizer:
        if self.fast is None:
            raise ConfigError(
                "This FAST head has no vocabulary: a FAST policy reads fast_tokenizer.json and "
                "fast_tokenizer_settings.json from its run (or export) folder, beside dataset_statistics.json; "
                "load it with prismatic.load_policy(<run folder>)."
            )
        return self.fast

    def use_vocabulary(self, fast: FastActionTokenizer) -> None:
        """Take `fast` as this head's vocabulary, once it fits the spec and the LLM's vocabulary.

        Raises:
            ConfigError: it was fitted on chunks of another shape or scale, or its ids would cover one of the
                tokenizer's special ids (BOS, EOS, padding).
        """
        spec = self.spec
        if (fast.horizon, fast.action_dim) != (spec.chunk_size, spec.action_dim):
            raise ConfigError(
                f"The FAST vocabulary was fitted on chunks [{fast.horizon}, {fast.action_dim}], but this model "
                f"predicts [{spec.chunk_size}, {spec.action_dim}] ([chunk_size, action_dim]): use the run folder "
                f"the model was trained in."
            )
        if fast.scale != float(self.options.scale):
            raise ConfigError(
                f"The FAST vocabulary was fitted with scale {fast.scale}, but --vla.head.fast.scale is "
                f"{self.options.scale}: use the run folder the model was trained in."
            )
        taken = fast_id_range(self.llm_vocab_size, fast.vocab_size)
        special = sorted(i for i in self.action_tokenizer.tokenizer.all_special_ids if i in taken)
        if special:
            raise ConfigError(
                f"--vla.head.fast.vocab_size={self.options.vocab_size}: the fitted {fast.vocab_size} FAST ids "
                f"would take the LLM's ids {taken.start}..{taken.stop - 1}, which hold its special token(s) "
                f"{special}; choose a vocab_size below {self.llm_vocab_size - max(special) - 1}."
            )
        self.fast = fast

    def load_files(self, folder: Path | None) -> None:
        """Read the vocabulary the run saved in `folder` (None: leave the head without one).

        Raises:
            ConfigError: the folder has no (readable) vocabulary, or one that does not fit (`use_vocabulary`).
        """
        if folder is not None:
            self.use_vocabulary(FastActionTokenizer.load(folder))

    def prepare_files(
        self,
        folder: Path,
        sample_chunks: Callable[[int], np.ndarray],
        dist_info: Any,
        *,
        resumed: bool,
        timeout: timedelta,
        base: Path | None = None,
    ) -> None:
        """Training: fit the vocabulary on a new run (rank 0; a FAST `base` model's own, copied), or read a resumed
        run's, then take it. Collective."""
        from prismatic.models.action_heads.fast.files import prepare_vocabulary

        fast = prepare_vocabulary(
            folder, sample_chunks, dist_info, self.options, resumed=resumed, timeout=timeout, base=base
        )
        self.use_vocabulary(fast)

    # ----- training -----

    def layout(self, prefix_ids: list[int], actions: np.ndarray, eos_id: int) -> dict[str, torch.Tensor]:
        """prompt + the chunk's FAST ids (on the LLM's vocabulary) + EOS; labels on the FAST ids and EOS."""
        expected = (self.spec.chunk_size, self.spec.action_dim)
        chunk = np.asarray(actions, np.float64)
        if chunk.shape != expected:
            raise ValueError(
                f"The FAST head needs actions of shape {expected} (chunk_size, action_dim) per frame, got "
                f"{chunk.shape}: build the pipeline with future_action_window_size = chunk_size - 1."
            )
        action_ids = to_llm_ids(self.vocabulary.encode(chunk), self.llm_vocab_size)
        input_ids = torch.tensor([*prefix_ids, *action_ids, eos_id], dtype=torch.long)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[len(prefix_ids) :] = input_ids[len(prefix_ids) :]
        return {"input_ids": input_ids, "labels": labels}

    def __call__(self, model: nn.Module, batch: dict[str, Any], *, with_loss: bool = True) -> HeadOutput:
        labels = batch["labels"]
        output = model(**self.model_inputs(batch), labels=labels if with_loss else None)
        return HeadOutput(
            loss=output.loss if with_loss else output.logits.new_zeros(()),
            sums=self.sums(output.logits, labels),
        )

    @torch.no_grad()
    def sums(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """float64 [B, 4]: cross-entropy summed over the labelled tokens, their count, and the teacher-forced
        argmax hits among the FAST tokens, their count (text token j >= 1 is predicted at position
        num_prefix_tokens + j - 1, as for the tokens head)."""
        logits = logits[:, self.num_prefix_tokens : -1].float()
        targets = labels[:, 1:].to(logits.device)
        ce = F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
        ).view_as(targets)
        supervised = targets != IGNORE_INDEX
        ids = self.fast_ids
        action = (targets >= ids.start) & (targets < ids.stop)
        correct = (logits.argmax(dim=-1) == targets) & action
        return torch.stack(
            [ce.double().sum(1), supervised.sum(1).double(), correct.sum(1).double(), action.sum(1).double()],
            dim=1,
        )

    def evaluate(
        self, model: nn.Module, batch: dict[str, Any], *, generator: torch.Generator
    ) -> torch.Tensor:
        """Held-out sums: the training ones, then those of chunks decoded greedily (constrained) from each row's
        prompt through `model`'s forward: |decoded - target| summed, the values compared, invalid chunks, chunks.
        No randomness (`generator` unused). One forward of the grown sequence per decoded token, as many on every
        rank (until every rank's rows have ended: the forwards of a wrapped model are collectives). Collective."""
        teacher = self(model, batch, with_loss=False).sums
        # A row's prompt ends at its first label; a row truncated before its actions has none: all of it.
        labelled = (batch["labels"] != IGNORE_INDEX).cpu()
        first_label = labelled.to(torch.uint8).argmax(dim=1)
        lengths = batch["attention_mask"].cpu().sum(dim=1)
        prompt_lengths = torch.where(labelled.any(dim=1), first_label, lengths).tolist()
        inputs = self.model_inputs(batch)
        eos_id = int(self.action_tokenizer.tokenizer.eos_token_id)
        step = forward_steps(
            model,
            inputs,
            prompt_lengths,
            self.action_tokenizer.tokenizer.pad_token_id,
            self.num_prefix_tokens,
            self.options.max_decode_tokens,
        )
        rows, _ = greedy_fast_decode(
            step,
            len(prompt_lengths),
            allowed=self.fast_ids,
            eos_id=eos_id,
            max_tokens=self.options.max_decode_tokens,
            agree=all_ranks_done(batch["input_ids"].device),
        )
        chunks, valid = self.decode_rows(rows)
        targets = batch["actions"].detach().to("cpu", torch.float64)
        abs_sum = (torch.from_numpy(chunks) - targets).abs().sum((1, 2))
        values = torch.full_like(abs_sum, float(self.spec.chunk_size * self.spec.action_dim))
        invalid = torch.from_numpy((~valid).astype(np.float64))
        decoded = torch.stack([abs_sum, values, invalid, torch.ones_like(invalid)], dim=1)
        return torch.cat([teacher.cpu(), decoded], dim=1).to(teacher.device)

    # ----- inference -----

    def decode_rows(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """`[B, chunk_size, action_dim]` float64 chunks from each row's generated LLM ids (EOS excluded), and
        whether each decoded; one that did not is zeros (π0-FAST's rule, `FastActionTokenizer.decode`)."""
        chunks, valid = [], []
        for ids in rows:
            chunk, ok = self.vocabulary.decode(
                to_fast_ids(ids, self.llm_vocab_size), self.spec.chunk_size, self.spec.action_dim
            )
            chunks.append(chunk)
            valid.append(ok)
        return np.stack(chunks).astype(np.float64), np.asarray(valid, dtype=bool)

    @torch.inference_mode()
    def predict(self, vlm: nn.Module, request: DecodeRequest) -> HeadPrediction:
        """Greedy decoding with a KV cache, constrained to the FAST ids and EOS (`request.constrained`; else over
        every id, where a non-FAST id makes the chunk invalid), then the chunk read back (zeros when invalid)."""
        if request.action_dim != self.spec.action_dim:
            raise PolicyInputError(
                f"This policy predicts {self.spec.action_dim}-dim actions; the unnorm key asks for "
                f"{request.action_dim}."
            )
        batch = len(request.prompt_ids)
        step = cached_steps(vlm, request.prompt_ids, request.pixel_values, request.pad_id, request.proprio)
        rows, _ = greedy_fast_decode(
            step,
            batch,
            allowed=self.fast_ids if request.constrained else None,
            eos_id=request.eos_id,
            max_tokens=self.options.max_decode_tokens,
        )
        chunks, valid = self.decode_rows(rows)
        invalid = int((~valid).sum())
        self.invalid_count += invalid
        self.predicted_count += batch
        if invalid:
            logger.warning(
                "%d of %d FAST chunks did not decode and are zeros (π0-FAST's rule); %d of %d so far",
                invalid,
                batch,
                self.invalid_count,
                self.predicted_count,
            )
        shape = (batch, self.spec.chunk_size, self.spec.action_dim)
        return HeadPrediction(
            np.zeros((batch, 0), np.int64), chunks, np.full(shape, np.nan, np.float32), valid=valid
        )
