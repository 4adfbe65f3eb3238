"""VLA data: RLDS datasets -> tokenized, padded batches for action prediction.

`RLDSDataset` (torch `IterableDataset` over the tf.data pipeline in `rlds/`), `RLDSBatchTransform` (frame ->
prompt + action token ids + labels), `PaddedCollatorForActionPrediction`, `save_dataset_statistics`.
"""

from prismatic.vla.datasets.collator import PaddedCollatorForActionPrediction
from prismatic.vla.datasets.datasets import RLDSBatchTransform, RLDSDataset
from prismatic.vla.datasets.rlds import build_toy_datasets, get_mixture, save_dataset_statistics

__all__ = [
    "PaddedCollatorForActionPrediction",
    "RLDSBatchTransform",
    "RLDSDataset",
    "build_toy_datasets",
    "get_mixture",
    "save_dataset_statistics",
]
