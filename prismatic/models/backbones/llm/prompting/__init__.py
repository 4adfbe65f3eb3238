"""Prompt builders: how each LLM family formats a (human, model) conversation."""

from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder, PurePromptBuilder
from prismatic.models.backbones.llm.prompting.vicuna_v15_prompter import VicunaV15ChatPromptBuilder

__all__ = ["PromptBuilder", "PurePromptBuilder", "VicunaV15ChatPromptBuilder"]
