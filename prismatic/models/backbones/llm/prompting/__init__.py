"""Prompt builders: how each LLM family formats a (human, model) conversation."""

from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder, PurePromptBuilder

__all__ = ["PromptBuilder", "PurePromptBuilder"]
