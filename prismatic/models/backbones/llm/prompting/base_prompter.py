"""Prompt builder interface and the "pure" (base, non-chat) LLM format that OpenVLA trains with.

The VLA batch transform needs the text that comes *before* the model's answer, so that it can tokenize it and
append the action token ids directly: `get_response_prefix()` returns exactly that text (BOS excluded, since
the tokenizer adds it; trailing whitespace kept, because e.g. Llama's SentencePiece turns "Out: " into
"Out", ":", "▁", which is what OpenVLA's checkpoints were trained on).
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class PromptBuilder(ABC):
    """Accumulates alternating human / model turns into one prompt string."""

    def __init__(self, model_family: str, system_prompt: str | None = None) -> None:
        self.model_family = model_family
        self.system_prompt = system_prompt

    @abstractmethod
    def add_turn(self, role: str, message: str) -> str:
        """Append one turn (role alternates human, gpt, ...); return the wrapped text that was appended."""

    @abstractmethod
    def get_prompt(self) -> str:
        """The whole conversation so far, BOS excluded."""

    @abstractmethod
    def get_response_prefix(self) -> str:
        """The text the model sees before its (next) answer, BOS excluded, trailing whitespace kept."""


class PurePromptBuilder(PromptBuilder):
    """Base-LLM format: "In: {human}\\nOut: {answer}</s>" (Prismatic's `PurePromptBuilder`)."""

    def __init__(self, model_family: str, system_prompt: str | None = None) -> None:
        super().__init__(model_family, system_prompt)
        self.bos, self.eos = "<s>", "</s>"
        self.prompt, self.turn_count = "", 0

    @staticmethod
    def wrap_human(message: str) -> str:
        return f"In: {message}\nOut: "

    def wrap_gpt(self, message: str) -> str:
        return f"{message if message != '' else ' '}{self.eos}"

    def add_turn(self, role: str, message: str) -> str:
        expected = "human" if self.turn_count % 2 == 0 else "gpt"
        if role != expected:
            raise ValueError(f"Turn {self.turn_count} must come from '{expected}', got '{role}'.")
        message = message.replace("<image>", "").strip()
        wrapped = self.wrap_human(message) if expected == "human" else self.wrap_gpt(message)
        self.prompt += wrapped
        self.turn_count += 1
        return wrapped

    def get_prompt(self) -> str:
        return self.prompt.removeprefix(self.bos).rstrip()

    def get_response_prefix(self) -> str:
        if self.turn_count % 2 != 1:
            raise ValueError("get_response_prefix() needs a human turn awaiting its answer.")
        return self.prompt.removeprefix(self.bos)
