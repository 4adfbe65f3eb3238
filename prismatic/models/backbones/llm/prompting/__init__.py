"""Prompt builders: how each LLM family formats a (human, model) conversation."""

from prismatic.models.backbones.llm.prompting.base_prompter import (
    PromptBuilder,
    PurePromptBuilder,
    TemplatePromptBuilder,
)
from prismatic.models.backbones.llm.prompting.chat_prompters import (
    Llama2ChatPromptBuilder,
    MistralInstructPromptBuilder,
    PhiPromptBuilder,
    Qwen25ChatPromptBuilder,
    VicunaV15ChatPromptBuilder,
)

__all__ = [
    "Llama2ChatPromptBuilder",
    "MistralInstructPromptBuilder",
    "PhiPromptBuilder",
    "PromptBuilder",
    "PurePromptBuilder",
    "Qwen25ChatPromptBuilder",
    "TemplatePromptBuilder",
    "VicunaV15ChatPromptBuilder",
]
