"""prismatic: fine-tune Vision-Language-Action policies (vision backbone + projector + LLM) on RLDS data.

`prismatic.load_policy(path_or_id)` turns a trained run into robot actions (`prismatic/inference/`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.inference.policy import VLAPolicy, load_policy

__getattr__ = lazy_getattr(
    __name__, {"load_policy": "prismatic.inference.policy", "VLAPolicy": "prismatic.inference.policy"}
)

__all__ = ["VLAPolicy", "load_policy"]
