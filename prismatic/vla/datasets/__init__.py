"""VLA data: RLDS datasets -> tokenized, padded batches for action prediction.

`StreamSpec` (the one typed object that defines a rank's stream), `RLDSDataset` (torch `IterableDataset` over the
tf.data pipeline in `rlds/`), `RLDSBatchTransform` (frame -> prompt + action token ids + labels),
`PaddedCollatorForActionPrediction`, `save_dataset_statistics`.

Names load on first use (PEP 562): importing the registries in `rlds/` (e.g. to refuse an unknown mixture before
anything loads) does not pull in torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prismatic.vla.datasets.batch_transform import RLDSBatchTransform
    from prismatic.vla.datasets.collator import PaddedCollatorForActionPrediction
    from prismatic.vla.datasets.datasets import RLDSDataset
    from prismatic.vla.datasets.rlds import build_toy_datasets, get_mixture, save_dataset_statistics
    from prismatic.vla.datasets.stream_spec import StreamSpec

_MODULE_OF = {
    "PaddedCollatorForActionPrediction": "prismatic.vla.datasets.collator",
    "RLDSBatchTransform": "prismatic.vla.datasets.batch_transform",
    "RLDSDataset": "prismatic.vla.datasets.datasets",
    "build_toy_datasets": "prismatic.vla.datasets.rlds",
    "get_mixture": "prismatic.vla.datasets.rlds",
    "save_dataset_statistics": "prismatic.vla.datasets.rlds",
    "StreamSpec": "prismatic.vla.datasets.stream_spec",
}

__all__ = [
    "PaddedCollatorForActionPrediction",
    "RLDSBatchTransform",
    "RLDSDataset",
    "StreamSpec",
    "build_toy_datasets",
    "get_mixture",
    "save_dataset_statistics",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
