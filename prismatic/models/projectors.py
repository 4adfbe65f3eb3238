"""Projectors: map vision patch features into the LLM's embedding space (Prismatic's exact designs).

Prismatic's `arch_specifier` may carry a training-procedure prefix ("no-align+gelu-mlp" = skip the align stage);
only the part after the last "+" picks the projector. Module layouts (`projector.0.weight`, ...) match Prismatic's
so its checkpoints load.
"""

from __future__ import annotations

import torch
from torch import nn

from prismatic.util.errors import ConfigError, did_you_mean


class LinearProjector(nn.Module):
    """`linear`: one Linear(vision_dim, llm_dim)."""

    def __init__(self, vision_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.projector = nn.Linear(vision_dim, llm_dim, bias=True)

    def forward(self, patch_features: torch.Tensor) -> torch.Tensor:
        return self.projector(patch_features)


class MLPProjector(nn.Module):
    """`gelu-mlp`: Linear(vision_dim, llm_dim) -> GELU -> Linear(llm_dim, llm_dim) (LLaVA v1.5's projector)."""

    def __init__(self, vision_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.projector = nn.Sequential(
            nn.Linear(vision_dim, llm_dim, bias=True),
            nn.GELU(),
            nn.Linear(llm_dim, llm_dim, bias=True),
        )

    def forward(self, patch_features: torch.Tensor) -> torch.Tensor:
        return self.projector(patch_features)


class FusedMLPProjector(nn.Module):
    """`fused-gelu-mlp`: Linear(d, 4d) -> GELU -> Linear(4d, llm) -> GELU -> Linear(llm, llm), for fused ViTs."""

    def __init__(self, vision_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.initial_projection_dim = 4 * vision_dim
        self.projector = nn.Sequential(
            nn.Linear(vision_dim, self.initial_projection_dim, bias=True),
            nn.GELU(),
            nn.Linear(self.initial_projection_dim, llm_dim, bias=True),
            nn.GELU(),
            nn.Linear(llm_dim, llm_dim, bias=True),
        )

    def forward(self, patch_features: torch.Tensor) -> torch.Tensor:
        return self.projector(patch_features)


PROJECTORS: dict[str, type[nn.Module]] = {
    "linear": LinearProjector,
    "gelu-mlp": MLPProjector,
    "fused-gelu-mlp": FusedMLPProjector,
}


def resolve_projector_arch(arch_specifier: str) -> str:
    """Projector name for a Prismatic `arch_specifier` ("no-align+fused-gelu-mlp" -> "fused-gelu-mlp").

    Raises:
        ConfigError: no projector of that name.
    """
    name = arch_specifier.rsplit("+", 1)[-1]
    if name not in PROJECTORS:
        raise ConfigError(
            f"Unknown projector architecture '{arch_specifier}'.{did_you_mean(name, PROJECTORS)} "
            f"Valid choices (optionally prefixed, e.g. 'no-align+gelu-mlp'): {', '.join(PROJECTORS)}."
        )
    return name


def build_projector(arch_specifier: str, vision_dim: int, llm_dim: int) -> nn.Module:
    """Instantiate the projector named by `arch_specifier` for the given widths."""
    return PROJECTORS[resolve_projector_arch(arch_specifier)](vision_dim, llm_dim)
