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
from prismatic.vla.datasets.rlds.configs import DATASET_CONFIGS, LIBERO_SUITES, TDROID_DATASETS

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

# === OpenVLA's named mixtures (`oxe/mixtures.py`) ===
# Where OpenVLA lists a dataset twice (rtx_franka) its loader keeps the first entry, and it skips datasets whose
# actions are not EEF deltas (berkeley_rpt): both are resolved here, so each list is what OpenVLA trains on.
register_mixture("bridge", [("bridge_orig", 1.0)])
register_mixture("rt_1", [("fractal20220817_data", 1.0)])
register_mixture("bridge_rt_1", [("bridge_orig", 1.0), ("fractal20220817_data", 1.0)])

_RTX: list[tuple[str, float]] = [
    ("fractal20220817_data", 0.54087122203),
    ("kuka", 0.8341046294),
    ("bridge_orig", 1.0),
    ("taco_play", 2.0),
    ("jaco_play", 2.0),
    ("berkeley_cable_routing", 3.0),
    ("roboturk", 1.0),
    ("viola", 2.0),
    ("berkeley_autolab_ur5", 1.0),
    ("toto", 1.0),
]
register_mixture("rtx", _RTX)
register_mixture(
    "rtx_franka",
    [
        *_RTX,
        ("stanford_hydra_dataset_converted_externally_to_rlds", 1.0),
        ("austin_buds_dataset_converted_externally_to_rlds", 3.0),
        ("nyu_franka_play_dataset_converted_externally_to_rlds", 3.0),
        ("maniskill_dataset_converted_externally_to_rlds", 0.1),
        ("furniture_bench_dataset_converted_externally_to_rlds", 0.1),
        ("cmu_franka_exploration_dataset_converted_externally_to_rlds", 5.0),
        ("austin_sailor_dataset_converted_externally_to_rlds", 1.0),
        ("austin_sirius_dataset_converted_externally_to_rlds", 1.0),
        ("kaist_nonprehensile_converted_externally_to_rlds", 3.0),
        ("stanford_robocook_converted_externally_to_rlds", 1.0),
        ("iamlab_cmu_pickup_insert_converted_externally_to_rlds", 1.0),
        ("utaustin_mutex", 1.0),
        ("cmu_play_fusion", 1.0),
    ],
)

_MAGIC_SOUP_CORE: list[tuple[str, float]] = [
    ("kuka", 0.8341046294),
    ("bridge_orig", 1.0),
    ("taco_play", 2.0),
    ("jaco_play", 1.0),
    ("berkeley_cable_routing", 1.0),
    ("roboturk", 2.0),
    ("viola", 2.0),
    ("berkeley_autolab_ur5", 2.0),
    ("toto", 1.0),
]
_MAGIC_SOUP_FRANKA: list[tuple[str, float]] = [
    ("stanford_hydra_dataset_converted_externally_to_rlds", 2.0),
    ("austin_buds_dataset_converted_externally_to_rlds", 1.0),
    ("nyu_franka_play_dataset_converted_externally_to_rlds", 3.0),
    ("furniture_bench_dataset_converted_externally_to_rlds", 0.1),
    ("ucsd_kitchen_dataset_converted_externally_to_rlds", 2.0),
    ("austin_sailor_dataset_converted_externally_to_rlds", 1.0),
    ("austin_sirius_dataset_converted_externally_to_rlds", 1.0),
    ("dlr_edan_shared_control_converted_externally_to_rlds", 1.0),
    ("iamlab_cmu_pickup_insert_converted_externally_to_rlds", 1.0),
    ("utaustin_mutex", 1.0),
    ("berkeley_fanuc_manipulation", 2.0),
    ("cmu_stretch", 1.0),
]
_LANGUAGE_TABLE = [("language_table", 0.1)]
_MAGIC_SOUP_PLUS_NEW = [("bc_z", 0.2), ("fmb_dataset", 1.0), ("dobbe", 0.2)]  # bc_z: OpenVLA used v0.1.0
register_mixture(
    "oxe_magic_soup",
    [("fractal20220817_data", 0.54087122203), *_MAGIC_SOUP_CORE, *_LANGUAGE_TABLE, *_MAGIC_SOUP_FRANKA],
)
register_mixture(
    "oxe_magic_soup_plus",
    [
        ("fractal20220817_data", 0.54087122203),
        *_MAGIC_SOUP_CORE,
        *_LANGUAGE_TABLE,
        *_MAGIC_SOUP_FRANKA,
        *_MAGIC_SOUP_PLUS_NEW,
        ("droid", 0.06),
    ],
)
register_mixture(  # no language_table, no droid, RT-1 at full weight
    "oxe_magic_soup_plus_minus",
    [("fractal20220817_data", 1.0), *_MAGIC_SOUP_CORE, *_MAGIC_SOUP_FRANKA, *_MAGIC_SOUP_PLUS_NEW],
)

# === Single-dataset fine-tuning mixtures (T-DROID, DROID wipe, LIBERO) ===
_LIBERO = [f"libero_{suite}_no_noops" for suite in LIBERO_SUITES]
for _name in (*TDROID_DATASETS, "droid_wipe", *_LIBERO):
    register_mixture(_name, [(_name, 1.0)])
register_mixture("libero_mix", [(name, 1.0) for name in _LIBERO])
