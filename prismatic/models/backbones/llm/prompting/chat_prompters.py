"""Chat prompt formats: Vicuna v1.5, Llama-2 chat, Mistral instruct, Phi-2 and Qwen2.5 (ChatML).

Each is Prismatic's (or, for Qwen2.5, MiniVLA's) format for that family, stated as the templates of the shared
turn-taking loop (`TemplatePromptBuilder`), so adding a chat format is a few class attributes.
"""

from __future__ import annotations

from prismatic.models.backbones.llm.prompting.base_prompter import TemplatePromptBuilder

# Prismatic and OpenVLA use the Vicuna / LLaVA system prompt for Vicuna.
VICUNA_SYSTEM_PROMPT = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)

# Prismatic's system prompt for chat-tuned LLMs (its `SYS_PROMPTS["prismatic"]`).
PRISMATIC_SYSTEM_PROMPT = (
    "You are a helpful language and vision assistant. You are able to understand the visual content that the "
    "user provides, and assist the user with a variety of tasks using natural language."
)


class VicunaV15ChatPromptBuilder(TemplatePromptBuilder):
    """Vicuna v1.5 chat: "{system} USER: {human} ASSISTANT: {answer}</s>" (OpenVLA v0.1 trained with it)."""

    human_template = "USER: {message} ASSISTANT: "
    gpt_template = "{message}</s>"
    system_prefix_template = "{system} "
    default_system_prompt = VICUNA_SYSTEM_PROMPT


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
    system_prefix_template = "<|im_start|>system\n{system}<|im_end|>\n"  # ChatML: a turn of its own
    default_system_prompt = None
