"""What compiled static decoding compiles (`VLAPolicy.compile_scope`, the scripts' `--compile_scope`).

Torch-free, so that `serve.py` and `eval_libero.py` refuse a bad value before torch and the model load.
"""

from __future__ import annotations

from prismatic.util.errors import ConfigError, did_you_mean

# Each ViT block and LLM decoder layer (one graph per stack, whatever its depth), or each function whole;
# `static_decoding` reads them.
COMPILE_SCOPES = ("layers", "whole")
DEFAULT_COMPILE_SCOPE = COMPILE_SCOPES[0]


def check_compile_scope(compile_scope: str, compile_decoding: bool) -> None:
    """Refuse a scope that is not one of `COMPILE_SCOPES`, and a non-default one without `--compile_decoding`
    (it would compile nothing, and the user asked for a compiled policy).

    Raises:
        ConfigError: naming the value and the choices.
    """
    if compile_scope not in COMPILE_SCOPES:
        raise ConfigError(
            f"--compile_scope '{compile_scope}' is not a scope.{did_you_mean(compile_scope, COMPILE_SCOPES)} "
            "Valid choices: 'layers' (the default: each ViT block and LLM decoder layer compiled on its own) or "
            "'whole' (the prefill and the decode step each compiled as one graph: minutes longer to compile at "
            "7B, and fused across the blocks)."
        )
    if compile_scope != DEFAULT_COMPILE_SCOPE and not compile_decoding:
        raise ConfigError(
            f"--compile_scope {compile_scope} says what --compile_decoding compiles, but --compile_decoding is "
            "off, so nothing would compile. Add --compile_decoding true (or drop --compile_scope)."
        )
