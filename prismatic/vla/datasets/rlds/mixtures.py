"""Named dataset mixtures: mixture name -> [(dataset name, sampling weight)], and their weight balancing.

Weights are relative to dataset *size*: `balance_sample_weights` multiplies each by the dataset's number of
transitions before normalising (OpenVLA's `balance_weights=True`), so equal weights mean "one pass over each
dataset per mixture epoch" rather than "equal number of frames from each". Every registered dataset is also a
valid one-dataset mixture under its own name. Mixtures follow OpenVLA's `oxe/mixtures.py`; the remaining Open-X
mixtures slot in as more `register_mixture` calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from prismatic.util.errors import lookup
from prismatic.vla.datasets.rlds.configs import DATASET_CONFIGS

MixtureSpec = list[tuple[str, float]]

MIXTURES: dict[str, MixtureSpec] = {}


def register_mixture(name: str, spec: Sequence[tuple[str, float]]) -> MixtureSpec:
    """Add a mixture; names are unique, datasets must be registered and appear once, weights positive."""
    if name in MIXTURES:
        raise ValueError(f"Mixture '{name}' is already registered.")
    names = [dataset for dataset, _ in spec]
    if not spec or len(set(names)) != len(names):
        raise ValueError(f"Mixture '{name}' must list each dataset exactly once, got {names}.")
    for dataset, weight in spec:
        if dataset not in DATASET_CONFIGS:
            raise ValueError(f"Mixture '{name}' names unregistered dataset '{dataset}'.")
        if not weight > 0:
            raise ValueError(f"Mixture '{name}': weight of '{dataset}' must be > 0, got {weight}.")
    MIXTURES[name] = [(dataset, float(weight)) for dataset, weight in spec]
    return MIXTURES[name]


def get_mixture(name: str) -> MixtureSpec:
    """The (dataset, weight) list of mixture `name`; a registered dataset name is a one-dataset mixture.

    Raises:
        ConfigError: `name` is neither a mixture nor a dataset (the message lists both, with a did-you-mean).
    """
    choices = {dataset: [(dataset, 1.0)] for dataset in DATASET_CONFIGS} | MIXTURES
    return list(lookup(choices, name, "dataset mixture"))


def balance_sample_weights(weights: Sequence[float], num_transitions: Sequence[int]) -> np.ndarray:
    """Per-dataset sampling probabilities: `weights * num_transitions`, normalised to sum to 1."""
    balanced = np.asarray(weights, dtype=np.float64) * np.asarray(num_transitions, dtype=np.float64)
    if balanced.shape != (len(weights),) or not np.all(balanced > 0):
        raise ValueError(
            f"Need one positive weight and size per dataset, got {weights} and {num_transitions}."
        )
    return balanced / balanced.sum()


# === Toy ===
register_mixture("toy", [("toy_pick_place", 1.0), ("toy_push", 1.0)])
register_mixture("toy_pick_place", [("toy_pick_place", 1.0)])

# === Bridge V2 / RT-1 (OpenVLA) ===
register_mixture("bridge", [("bridge_orig", 1.0)])
register_mixture("rt_1", [("fractal20220817_data", 1.0)])
register_mixture("bridge_rt_1", [("bridge_orig", 1.0), ("fractal20220817_data", 1.0)])
