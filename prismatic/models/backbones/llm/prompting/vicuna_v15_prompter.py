"""Vicuna v1.5 chat prompt format (Prismatic's `VicunaV15ChatPromptBuilder`), used by the Vicuna-based base VLMs.

"{system prompt} USER: {human} ASSISTANT: {answer}</s>"; OpenVLA v0.1 (`siglip-224px+7b`) was trained with it.
"""

from __future__ import annotations

from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder

# Prismatic and OpenVLA use the same Vicuna / LLaVA system prompt.
DEFAULT_SYSTEM_PROMPT = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)


class VicunaV15ChatPromptBuilder(PromptBuilder):
    """Vicuna v1.5 chat: the system prompt opens the first human turn."""

    def __init__(self, model_family: str, system_prompt: str | None = None) -> None:
        super().__init__(model_family, system_prompt)
        self.system_prompt = (DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt).strip() + " "
        self.bos, self.eos = "<s>", "</s>"
        self.prompt, self.turn_count = "", 0

    @staticmethod
    def wrap_human(message: str) -> str:
        return f"USER: {message} ASSISTANT: "

    def wrap_gpt(self, message: str) -> str:
        return f"{message if message != '' else ' '}{self.eos}"

    def add_turn(self, role: str, message: str) -> str:
        expected = "human" if self.turn_count % 2 == 0 else "gpt"
        if role != expected:
            raise ValueError(f"Turn {self.turn_count} must come from '{expected}', got '{role}'.")
        message = message.replace("<image>", "").strip()
        if expected == "gpt":
            wrapped = self.wrap_gpt(message)
        elif self.turn_count == 0:
            wrapped = self.system_prompt + self.wrap_human(message)
        else:
            wrapped = self.wrap_human(message)
        self.prompt += wrapped
        self.turn_count += 1
        return wrapped

    def get_prompt(self) -> str:
        return self.prompt.removeprefix(self.bos).rstrip()

    def get_response_prefix(self) -> str:
        if self.turn_count % 2 != 1:
            raise ValueError("get_response_prefix() needs a human turn awaiting its answer.")
        return self.prompt.removeprefix(self.bos)
