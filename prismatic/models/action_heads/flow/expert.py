"""The flow-matching action expert: a small transformer that maps the VLM's hidden states, a noisy action chunk, the
flow time and proprio to a velocity (what `matching.sample` integrates).

Design. The VLM hands the expert one layer's hidden states, not every layer's keys and values as π0 and SmolVLA
share them, so each block, as GR00T's DiT cross-attends to one feature map, projects the prefix (normalised and
narrowed once) into its own keys and values; the suffix tokens (a proprio token, then the H action tokens) attend
jointly to those and to each other, π0's attention pattern, with padded prefix positions masked out. Those prefix
keys and values depend on neither x_t nor t, so `encode_prefix` computes them once per observation and each of the
sampler's N `forward` calls runs only the H + 1 suffix tokens. Time conditions every block through adaptive
LayerNorm with zero-initialised gates (DiT's adaLN-Zero; GR00T's AdaLayerNorm and π0.5's adaRMS likewise), fed by
π0's sine-cosine embedding of t.

Shapes: B samples, L prefix positions of width `llm_dim`, H chunk steps of `action_dim`, P proprio values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from prismatic.models.action_heads.flow.options import FlowExpertOptions

# π0's time embedding periods (openpi `posemb_sincos(timestep, width, min_period=4e-3, max_period=4.0)`): the
# shortest wave resolves time steps of a few thousandths, the longest spans the unit interval.
TIME_MIN_PERIOD = 4e-3
TIME_MAX_PERIOD = 4.0


def time_embedding(
    time_B: torch.Tensor,
    dim: int,
    min_period: float = TIME_MIN_PERIOD,
    max_period: float = TIME_MAX_PERIOD,
) -> torch.Tensor:
    """π0's sine-cosine embedding of scalar times (openpi's `posemb_sincos`): `[B, dim]` float32.

    With `dim // 2` periods spaced geometrically from `min_period` to `max_period`, period_i = min_period *
    (max_period / min_period) ** (i / (dim // 2 - 1)), the embedding is [sin(2π t / period_i)..., cos(...)...].
    Computed in float64 and rounded once: the shortest period puts t = 1 near 1571 radians, where float32 arithmetic
    would lose about 1e-4.
    """
    if dim % 2:
        raise ValueError(f"the time embedding's width must be even (sines and cosines pair up); got {dim}")
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=time_B.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = time_B.to(torch.float64)[:, None] * (2 * math.pi / period)[None, :]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1).float()


def _modulate(x_BSW: torch.Tensor, shift_BW: torch.Tensor, scale_BW: torch.Tensor) -> torch.Tensor:
    return x_BSW * (1 + scale_BW[:, None]) + shift_BW[:, None]


@dataclass(frozen=True)
class PrefixCache:
    """What `encode_prefix` computes once per observation: the prefix mask `[B, L]` (True at real positions), the
    prefix narrowed to the expert's width `[B, L, width]` and, unless it was asked not to project it, each block's
    prefix keys and values `[B, heads, L, head_dim]` (without them each block projects the narrowed prefix inside
    its `forward`). Read, never written, by `forward`."""

    mask_BL: torch.Tensor
    narrowed_BLW: torch.Tensor
    keys: tuple[torch.Tensor, ...] | None = None
    values: tuple[torch.Tensor, ...] | None = None


class FlowExpertBlock(nn.Module):
    """One pre-norm transformer block over the suffix tokens: joint attention to the prefix's keys and values and to
    the suffix itself, then an MLP, each scaled and shifted by the time (adaLN) and gated (zero at init, so a new
    block is the identity). Its own prefix key/value projection runs once per observation: on its own
    (`project_prefix`) when the velocity is wanted several times (the sampler's steps), inside `forward` when it is
    wanted once (a training step)."""

    def __init__(self, options: FlowExpertOptions) -> None:
        super().__init__()
        width = options.width
        self.num_heads = options.num_heads
        self.attention_norm = nn.LayerNorm(width, elementwise_affine=False)
        self.qkv = nn.Linear(width, 3 * width)
        self.prefix_kv = nn.Linear(width, 2 * width)
        self.attention_out = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width, elementwise_affine=False)
        self.mlp_in = nn.Linear(width, options.mlp_width)
        self.mlp_out = nn.Linear(options.mlp_width, width)
        # time -> shift, scale, gate for the attention and for the MLP; zero so that each block starts as the identity.
        self.modulation = nn.Linear(width, 6 * width)
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)

    def _heads(self, x_BSW: torch.Tensor) -> torch.Tensor:
        batch, length, width = x_BSW.shape
        return x_BSW.view(batch, length, self.num_heads, width // self.num_heads).transpose(1, 2)

    def project_prefix(self, prefix_BLW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This block's keys and values of the (narrowed) prefix, `[B, heads, L, head_dim]` each, contiguous (they
        are read N times; and FSDP2 warns about views returned from a sharded module's method).

        Not `forward`, so FSDP2 gathers the block's parameters for it only as a registered forward method (the
        head module names it in `block_methods`; the FSDP strategies register it).
        """
        return self._project(prefix_BLW)

    def _project(self, prefix_BLW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.prefix_kv(prefix_BLW).chunk(2, dim=-1)
        return self._heads(keys).contiguous(), self._heads(values).contiguous()

    def forward(
        self,
        x_BSW: torch.Tensor,
        time_cond_BW: torch.Tensor,
        prefix: tuple[torch.Tensor, torch.Tensor] | torch.Tensor,
        key_mask_B11K: torch.Tensor,
    ) -> torch.Tensor:
        """The suffix tokens after this block. `prefix`: this block's prefix keys and values as `project_prefix`
        made them, or the narrowed prefix `[B, L, width]`, projected here: one call per observation (a training
        step) then gathers the block's weights under FSDP2 once, not once for the projection and again for this."""
        prefix_keys, prefix_values = self._project(prefix) if isinstance(prefix, torch.Tensor) else prefix
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.modulation(time_cond_BW).chunk(6, dim=-1)
        h = _modulate(self.attention_norm(x_BSW), shift_a, scale_a)
        query, key, value = (self._heads(part) for part in self.qkv(h).chunk(3, dim=-1))
        key = torch.cat([prefix_keys.to(key.dtype), key], dim=2)
        value = torch.cat([prefix_values.to(value.dtype), value], dim=2)
        attended = F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask_B11K)
        attended = attended.transpose(1, 2).reshape(x_BSW.shape[0], x_BSW.shape[1], -1)
        x_BSW = x_BSW + gate_a[:, None] * self.attention_out(attended)
        h = _modulate(self.mlp_norm(x_BSW), shift_m, scale_m)
        return x_BSW + gate_m[:, None] * self.mlp_out(F.gelu(self.mlp_in(h), approximate="tanh"))


class FlowExpert(nn.Module):
    """The velocity network (module docstring): `encode_prefix(prefix, mask)` once, then `forward(cache, x_t, time,
    proprio)` per Euler step.

    At initialisation the velocity is exactly zero: every block's gates and the output projection start at zero
    (adaLN-Zero), so the untrained expert adds nothing to x_t, the loss starts at E[|noise - actions|^2] rather than
    at a random network's, and each block opens its gate as it learns something useful.

    Args:
        options: width, depth, heads, MLP ratio.
        llm_dim: the width of the VLM's hidden states.
        action_dim: the width of one action.
        chunk_size: H, the actions per chunk (each chunk position has a learned embedding).
        proprio_dim: P, the proprio values read as one extra token; 0 for none.
    """

    def __init__(
        self, options: FlowExpertOptions, llm_dim: int, action_dim: int, chunk_size: int, proprio_dim: int = 0
    ) -> None:
        super().__init__()
        width = options.width
        self.options, self.llm_dim, self.action_dim = options, llm_dim, action_dim
        self.chunk_size, self.proprio_dim = chunk_size, proprio_dim
        # The prefix, normalised (LLM hidden states run to large magnitudes) and narrowed to the expert's width once.
        self.prefix_norm = nn.LayerNorm(llm_dim)
        self.prefix_in = nn.Linear(llm_dim, width)
        self.action_in = nn.Linear(action_dim, width)
        self.position = nn.Parameter(torch.empty(chunk_size, width))
        nn.init.normal_(self.position, std=0.02)
        self.proprio_in = nn.Linear(proprio_dim, width) if proprio_dim else None
        # π0.5's time MLP (two layers, swish) between the sine-cosine embedding and the blocks' modulations.
        self.time_in = nn.Linear(width, width)
        self.time_out = nn.Linear(width, width)
        self.blocks = nn.ModuleList(FlowExpertBlock(options) for _ in range(options.depth))
        self.output_norm = nn.LayerNorm(width, elementwise_affine=False)
        self.output_modulation = nn.Linear(width, 2 * width)
        self.output = nn.Linear(width, action_dim)
        for layer in (self.output_modulation, self.output):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def encode_prefix(
        self, prefix_BLE: torch.Tensor, prefix_mask_BL: torch.Tensor, *, per_block: bool = True
    ) -> PrefixCache:
        """The prefix, narrowed, and every block's keys and values of it: computed once per observation, reused by
        each `forward`. With `per_block` False the blocks' keys and values are left to each block's `forward`, for
        a velocity wanted once per observation (a training step: the same numbers, and under FSDP2 each block's
        weights gathered once).

        Padded positions (`prefix_mask_BL` False) are zeroed before anything reads them, and masked out of the
        attention, so what they hold (even NaN) cannot reach the velocity. It runs inside the head module's
        `forward`, whose FSDP2 unit (the root) holds the expert's parameters outside its blocks.

        Args:
            prefix_BLE: the VLM's hidden states `[B, L, llm_dim]`.
            prefix_mask_BL: bool `[B, L]`, True at real positions.
            per_block: whether to project the blocks' keys and values now.
        """
        if prefix_BLE.ndim != 3 or prefix_BLE.shape[-1] != self.llm_dim:
            raise ValueError(f"prefix {tuple(prefix_BLE.shape)} is not [B, L, llm_dim={self.llm_dim}]")
        if prefix_mask_BL.dtype != torch.bool or prefix_mask_BL.shape != prefix_BLE.shape[:2]:
            raise ValueError(
                f"prefix mask must be bool [B, L] = {tuple(prefix_BLE.shape[:2])}; got {prefix_mask_BL.dtype} "
                f"{tuple(prefix_mask_BL.shape)}"
            )
        prefix = prefix_BLE.to(self.prefix_in.weight.dtype).masked_fill(~prefix_mask_BL[..., None], 0.0)
        narrowed = self.prefix_in(self.prefix_norm(prefix))
        if not per_block:
            return PrefixCache(mask_BL=prefix_mask_BL, narrowed_BLW=narrowed)
        keys, values = zip(*(block.project_prefix(narrowed) for block in self.blocks), strict=True)
        return PrefixCache(prefix_mask_BL, narrowed, keys=tuple(keys), values=tuple(values))

    def forward(
        self,
        cache: PrefixCache,
        x_t_BHD: torch.Tensor,
        time_B: torch.Tensor,
        proprio_BP: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The velocity `[B, H, action_dim]`, float32 (the flow loss and the sampler's sums are taken in float32).

        Args:
            cache: `encode_prefix`'s result for these samples.
            x_t_BHD: the noisy action chunk at time t.
            time_B: the flow time per sample, in (0, 1] (1 is pure noise).
            proprio_BP: normalised proprio, for an expert built with `proprio_dim` > 0 (None otherwise).
        """
        batch = x_t_BHD.shape[0]
        if x_t_BHD.shape[1:] != (self.chunk_size, self.action_dim):
            raise ValueError(
                f"x_t {tuple(x_t_BHD.shape)} is not [B, chunk_size={self.chunk_size}, action_dim={self.action_dim}]"
            )
        if time_B.shape != (batch,) or cache.mask_BL.shape[0] != batch:
            raise ValueError(
                f"time {tuple(time_B.shape)} and the prefix cache's batch {cache.mask_BL.shape[0]} must match x_t's "
                f"batch {batch}"
            )
        dtype = self.action_in.weight.dtype
        tokens = [self.action_in(x_t_BHD.to(dtype)) + self.position.to(dtype)]
        if self.proprio_in is not None:
            if proprio_BP is None or proprio_BP.shape != (batch, self.proprio_dim):
                got = None if proprio_BP is None else tuple(proprio_BP.shape)
                raise ValueError(f"this expert reads proprio [B, {self.proprio_dim}]; got {got}")
            tokens.insert(0, self.proprio_in(proprio_BP.to(dtype))[:, None])
        elif proprio_BP is not None:
            raise ValueError("this expert was built without proprio (proprio_dim 0) but was given some")
        x = torch.cat(tokens, dim=1)
        time_cond = F.silu(
            self.time_out(F.silu(self.time_in(time_embedding(time_B, self.options.width).to(dtype))))
        )
        suffix_mask = torch.ones(batch, x.shape[1], dtype=torch.bool, device=x.device)
        key_mask = torch.cat([cache.mask_BL, suffix_mask], dim=1)[:, None, None, :]
        if cache.keys is None or cache.values is None:
            prefixes = [cache.narrowed_BLW] * len(self.blocks)
        else:
            prefixes = list(zip(cache.keys, cache.values, strict=True))
        for block, prefix in zip(self.blocks, prefixes, strict=True):
            x = block(x, time_cond, prefix, key_mask)
        shift, scale = self.output_modulation(time_cond).chunk(2, dim=-1)
        x = _modulate(self.output_norm(x[:, -self.chunk_size :]), shift, scale)
        # A fresh float32 tensor, never a view of the projection's output (FSDP2 warns of views a unit returns).
        return self.output(x).to(torch.float32, copy=True)
