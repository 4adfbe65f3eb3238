"""The flow head's options, torch-free (the config reads them): the expert's size (`FlowExpertOptions`) and the
`--vla.head.flow.*` group (`FlowOptions`: the size and the sampler's Euler steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from prismatic.util.errors import ConfigError

DEFAULT_NUM_STEPS = 10  # openpi's Euler steps at inference (`matching.DEFAULT_NUM_STEPS` is this one)


@dataclass(frozen=True)
class FlowExpertOptions:
    """The expert's size. The defaults are π0's action expert (openpi's `gemma_300m`: width 1024, 18 layers, MLP
    4096, 8 heads), a few percent of a 7B VLM's parameters beside it; tests use tiny ones.

    Raises:
        ConfigError: a size is not a positive integer, `width` is odd or not a multiple of `num_heads`, or
            `mlp_ratio` is not positive.
    """

    width: int = 1024
    depth: int = 18
    num_heads: int = 8
    mlp_ratio: float = 4.0

    def __post_init__(self) -> None:
        for name in ("width", "depth", "num_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"The flow expert's {name} must be a positive integer; got {value!r}.")
        if self.width % self.num_heads or self.width % 2:
            raise ConfigError(
                f"The flow expert's width must be even and a multiple of its num_heads (each head gets width / "
                f"num_heads channels, and the time embedding pairs sines with cosines); got width {self.width} "
                f"with num_heads {self.num_heads}."
            )
        if (
            isinstance(self.mlp_ratio, bool)
            or not isinstance(self.mlp_ratio, int | float)
            or self.mlp_ratio <= 0
        ):
            raise ConfigError(
                f"The flow expert's mlp_ratio (MLP width / width) must be a positive number; got {self.mlp_ratio!r}."
            )

    @property
    def mlp_width(self) -> int:
        return max(1, round(self.width * self.mlp_ratio))


@dataclass
class FlowOptions:
    """The flow head (`--vla.head.flow.*`): its expert's size (π0's action expert by default) and the Euler steps
    its sampler takes at inference."""

    width: int = 1024  # the expert's hidden width (π0's action expert: 1024)
    depth: int = 18  # the expert's transformer blocks (π0: 18)
    num_heads: int = 8  # attention heads per block; width must be a multiple of it (π0: 8)
    mlp_ratio: float = 4.0  # MLP width / width (π0: 4096 / 1024)
    num_steps: int = DEFAULT_NUM_STEPS  # Euler steps from noise to actions at inference (π0: 10)

    def __post_init__(self) -> None:
        self.expert_options()  # refuses a bad size
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ConfigError(
                f"--vla.head.flow.num_steps={self.num_steps!r} is out of range: it must be an integer >= 1 (the "
                f"Euler steps from noise to actions at inference; π0's default: {DEFAULT_NUM_STEPS})."
            )

    def expert_options(self) -> FlowExpertOptions:
        return FlowExpertOptions(self.width, self.depth, self.num_heads, self.mlp_ratio)
