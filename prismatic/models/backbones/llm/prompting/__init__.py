"""Prompt builders: how each LLM family formats a (human, model) conversation."""

from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder, PurePromptBuilder
from prismatic.models.backbones.llm.prompting.chat_prompters import (
    Llama2ChatPromptBuilder,
    MistralInstructPromptBuilder,
    PhiPromptBuilder,
    Qwen25ChatPromptBuilder,
    TemplatePromptBuilder,
)
from prismatic.models.backbones.llm.prompting.vicuna_v15_prompter import VicunaV15ChatPromptBuilder

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
