"""Per-trajectory filters of the pipeline, in OpenVLA's order around normalisation and chunking.

Before normalising: drop frames with NaN / inf action or proprio (`--data.nonfinite drop`). After normalising:
drop trajectories without any instruction (`skip_unlabeled`). After chunking: drop idle frames whose arm actions
are all zero (DROID's `zero_action_filter`), train and val alike.
"""

from __future__ import annotations

from typing import Any

from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import RLDSDatasetConfig
from prismatic.vla.datasets.rlds.normalization import normalize_tf

# OpenVLA's `zero_action_filter` (droid_utils.py) normalises 0 with these DROID bounds of the 6 arm dimensions,
# whatever the dataset's own statistics are, and keeps a frame when any arm action of its chunk differs from
# that normalised 0 by more than the tolerance.
DROID_ZERO_FILTER_Q01 = (
    -0.7776297926902771,
    -0.5803514122962952,
    -0.5795090794563293,
    -0.6464047729969025,
    -0.7041108310222626,
    -0.8895104378461838,
)
DROID_ZERO_FILTER_Q99 = (
    0.7597932070493698,
    0.5726242214441299,
    0.7351000607013702,
    0.6705610305070877,
    0.6464948207139969,
    0.8897542208433151,
)
ZERO_ACTION_TOLERANCE = 1e-5


def drop_nonfinite_frames(traj: dict[str, Any]) -> dict[str, Any]:
    """Drop the steps whose action or proprio holds NaN / inf (`--data.nonfinite drop`), before normalising."""
    tf = import_tensorflow()
    keep = tf.reduce_all(tf.math.is_finite(traj["action"]), axis=1)
    if "proprio" in traj["observation"]:
        keep = tf.logical_and(keep, tf.reduce_all(tf.math.is_finite(traj["observation"]["proprio"]), axis=1))
    return tf.nest.map_structure(lambda x: tf.boolean_mask(x, keep), traj)


def is_labeled(traj: dict[str, Any]) -> Any:
    """OpenVLA's `skip_unlabeled` predicate: some step has a non-empty instruction."""
    tf = import_tensorflow()
    return tf.reduce_any(traj["task"]["language_instruction"] != "")


def zero_action_reference(
    statistics: dict[str, Any], config: RLDSDatasetConfig, bounds: str
) -> tuple[list[int], Any]:
    """(arm dims, float32 normalised value of a zero action on them) for the zero-action filter.

    "openvla": OpenVLA's DROID constants, computed in float32 as its `zero_action_filter` does
    (`2 * (0 - q01) / (q99 - q01 + 1e-8) - 1`); "statistics": the same formula with the dataset's bounds
    (OpenVLA's normalisation arithmetic, `normalize_tf`), on every normalised dimension.
    """
    tf = import_tensorflow()
    if bounds == "openvla":
        q01 = tf.convert_to_tensor(DROID_ZERO_FILTER_Q01, tf.float32)
        q99 = tf.convert_to_tensor(DROID_ZERO_FILTER_Q99, tf.float32)
        zero = tf.zeros([len(DROID_ZERO_FILTER_Q01)], tf.float32)
        return list(range(len(DROID_ZERO_FILTER_Q01))), 2 * (zero - q01) / (q99 - q01 + 1e-8) - 1
    dims = [i for i, m in enumerate(config.action_normalization_mask) if m]
    zero = tf.zeros([1, config.action_dim], tf.float32)
    normalized = normalize_tf(
        zero, statistics["action"], config.action_normalization_type, config.action_normalization_mask
    )[0]
    return dims, tf.gather(normalized, dims)


def drop_zero_action_frames(traj: dict[str, Any], dims: list[int], reference: Any) -> dict[str, Any]:
    """Keep the frames where some arm action of the (normalised) chunk differs from the normalised zero by more
    than `ZERO_ACTION_TOLERANCE`: OpenVLA's `zero_action_filter`, train and val alike."""
    tf = import_tensorflow()
    arm = tf.gather(traj["action"], dims, axis=-1)
    moved = tf.math.abs(arm - reference) > ZERO_ACTION_TOLERANCE
    keep = tf.reduce_any(moved, axis=list(range(1, moved.shape.rank)))
    return tf.nest.map_structure(lambda x: tf.boolean_mask(x, keep), traj)
