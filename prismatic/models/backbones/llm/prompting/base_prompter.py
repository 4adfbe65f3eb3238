"""Prompt builder interface, the shared turn-taking loop (`TemplatePromptBuilder`), and the "pure" (base,
non-chat) LLM format that OpenVLA trains with.

The VLA batch transform needs the text that comes *before* the model's answer, so that it can tokenize it and
append the action token ids directly: `get_response_prefix()` returns exactly that text (BOS excluded, since
the tokenizer adds it; trailing whitespace kept, because e.g. Llama's SentencePiece turns "Out: " into
"Out", ":", "▁", which is what OpenVLA's checkpoints were trained on).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar


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


class TemplatePromptBuilder(PromptBuilder):
    """Alternating human / model turns wrapped by format strings; a family states only its templates.

    Subclasses set:
        human_template: wraps a human message, e.g. "[INST] {message} [/INST] ".
        gpt_template: wraps a model answer, e.g. "{message}</s>".
        system_template: wraps the system prompt *inside* the first human turn, before its message
            (Llama-2 chat's "<<SYS>>...").
        system_prefix_template: wraps the system prompt *before* the first human turn (Vicuna's "{system} ",
            ChatML's system turn).
        default_system_prompt: used when none is passed.
    BOS is never part of the text: the tokenizer adds it (the VLM inserts image patches right after it).
    """

    human_template: ClassVar[str]
    gpt_template: ClassVar[str]
    system_template: ClassVar[str] = ""
    system_prefix_template: ClassVar[str] = ""
    default_system_prompt: ClassVar[str | None] = None

    def __init__(self, model_family: str, system_prompt: str | None = None) -> None:
        super().__init__(
            model_family, system_prompt if system_prompt is not None else self.default_system_prompt
        )
        self.prompt, self.turn_count = "", 0

    def add_turn(self, role: str, message: str) -> str:
        expected = "human" if self.turn_count % 2 == 0 else "gpt"
        if role != expected:
            raise ValueError(f"Turn {self.turn_count} must come from '{expected}', got '{role}'.")
        message = message.replace("<image>", "").strip()
        if expected == "gpt":
            wrapped = self.gpt_template.format(message=message if message != "" else " ")
        else:
            prefix = ""
            if self.turn_count == 0 and self.system_prompt:
                system = self.system_prompt.strip()
                if self.system_template:
                    message = self.system_template.format(system=system) + message
                if self.system_prefix_template:
                    prefix = self.system_prefix_template.format(system=system)
            wrapped = prefix + self.human_template.format(message=message)
        self.prompt += wrapped
        self.turn_count += 1
        return wrapped

    def get_prompt(self) -> str:
        return self.prompt.rstrip()

    def get_response_prefix(self) -> str:
        if self.turn_count % 2 != 1:
            raise ValueError("get_response_prefix() needs a human turn awaiting its answer.")
        return self.prompt


class PurePromptBuilder(TemplatePromptBuilder):
    """Base-LLM format: "In: {human}\\nOut: {answer}</s>" (Prismatic's `PurePromptBuilder`)."""

    human_template = "In: {message}\nOut: "
    gpt_template = "{message}</s>"
