"""The VLA prompt, defined once for training (`RLDSBatchTransform`) and inference (`VLAPolicy`).

OpenVLA trains on "What action should the robot take to {instruction}?" with the instruction lower-cased, in the
LLM's prompt format, and its `predict_action` feeds the same text (its deploy script lower-cases the instruction;
`predict_action` appends Llama's "▁" after "Out:" so that the prompt ends exactly as at training time). Here the
prompt is tokenized *up to the answer* with the trailing whitespace kept, which yields those very ids for Llama
and the training-time ids for every other tokenizer, so training and inference can never drift apart.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder


def action_question(instruction: str) -> str:
    """The human turn OpenVLA trains on, for an instruction (lower-cased, as OpenVLA does)."""
    return f"What action should the robot take to {instruction.lower()}?"


def action_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, prompt_builder_fn: type[PromptBuilder], instruction: str
) -> list[int]:
    """Token ids (BOS first) of the prompt that precedes the action tokens, for one instruction."""
    prompt_builder = prompt_builder_fn("openvla")
    prompt_builder.add_turn("human", action_question(instruction))
    return tokenizer(prompt_builder.get_response_prefix(), add_special_tokens=True).input_ids
