"""Chat prompt formats beyond Vicuna: Llama-2 chat, Mistral instruct, Phi-2 and Qwen2.5 (ChatML).

Each is Prismatic's (or, for Qwen2.5, MiniVLA's) format for that family. They share one turn-taking loop
(`TemplatePromptBuilder`); a family only states how a human turn, a model turn and the system prompt are wrapped,
so adding a chat format is a few class attributes. BOS is never part of the text: the tokenizer adds it (the VLM
inserts image patches right after it).
"""

from __future__ import annotations

from typing import ClassVar

from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder

# Prismatic's system prompt for chat-tuned LLMs (its `SYS_PROMPTS["prismatic"]`).
PRISMATIC_SYSTEM_PROMPT = (
    "You are a helpful language and vision assistant. You are able to understand the visual content that the "
    "user provides, and assist the user with a variety of tasks using natural language."
)


class TemplatePromptBuilder(PromptBuilder):
    """Alternating human / model turns wrapped by format strings; the system prompt opens the first human turn.

    Subclasses set:
        human_template: wraps a human message, e.g. "[INST] {message} [/INST] ".
        gpt_template: wraps a model answer, e.g. "{message}</s>".
        system_template: wraps the system prompt placed before the first human message ("" = none).
        default_system_prompt: used when none is passed.
    """

    human_template: ClassVar[str]
    gpt_template: ClassVar[str]
    system_template: ClassVar[str] = ""
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
            if self.turn_count == 0 and self.system_template and self.system_prompt:
                message = self.system_template.format(system=self.system_prompt.strip()) + message
            wrapped = self.human_template.format(message=message)
        self.prompt += wrapped
        self.turn_count += 1
        return wrapped

    def get_prompt(self) -> str:
        return self.prompt.rstrip()

    def get_response_prefix(self) -> str:
        if self.turn_count % 2 != 1:
            raise ValueError("get_response_prefix() needs a human turn awaiting its answer.")
        return self.prompt


class Llama2ChatPromptBuilder(TemplatePromptBuilder):
    """Llama-2 chat: "[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n{human} [/INST] {answer}</s>"."""

    human_template = "[INST] {message} [/INST] "
    gpt_template = "{message}</s>"
    system_template = "<<SYS>>\n{system}\n<</SYS>>\n\n"
    default_system_prompt = PRISMATIC_SYSTEM_PROMPT


class MistralInstructPromptBuilder(TemplatePromptBuilder):
    """Mistral v0.1 instruct: "[INST] {human} [/INST] {answer}</s>" (no system prompt)."""

    human_template = "[INST] {message} [/INST] "
    gpt_template = "{message}</s>"


class PhiPromptBuilder(TemplatePromptBuilder):
    """Phi-2 (a base model): "Input: {human}\\nOutput: {answer}\\n<|endoftext|>"."""

    human_template = "Input: {message}\nOutput: "
    gpt_template = "{message}\n<|endoftext|>"


class Qwen25ChatPromptBuilder(TemplatePromptBuilder):
    """Qwen2.5 instruct (ChatML): "<|im_start|>user\\n{human}<|im_end|>\\n<|im_start|>assistant\\n{answer}..."."""

    human_template = "<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
    gpt_template = "{message}<|im_end|>\n"
    default_system_prompt = None

    def add_turn(self, role: str, message: str) -> str:
        # ChatML's system prompt is a turn of its own, before the first user turn.
        prefix = ""
        if role == "human" and self.turn_count == 0 and self.system_prompt:
            prefix = f"<|im_start|>system\n{self.system_prompt.strip()}<|im_end|>\n"
            self.prompt += prefix
        return prefix + super().add_turn(role, message)
