"""OpenVLA's LIBERO evaluation protocol: what happens between the simulator and the policy, in both directions.

Read from openvla/openvla `experiments/robot/` (`libero/run_libero_eval.py`, `libero/libero_utils.py`,
`robot_utils.py`, `openvla_utils.py`) and, for chunk heads, openvla-oft's `experiments/robot/libero/`:

- image: the 256x256 render, rotated 180 degrees (the simulator's `env.py` does that), JPEG-encoded and decoded
  as the RLDS builder stored training frames, resized with TensorFlow's Lanczos-3 (antialiased) to the model's
  input, rounded and clipped (`resize_image`); for a run trained with image augmentation, the centre crop of 0.9
  of the area resized back (`crop_and_resize`), as `get_vla_action` / OFT's `center_crop_image` do;
- action: the gripper of the policy's `[0, 1]` (1 = open) convention mapped to `[-1, 1]`, binarised with
  `np.sign` and inverted, since LIBERO's controller takes -1 = open, +1 = close (`normalize_gripper_action` +
  `invert_gripper_action`);
- statistics: the suite's name, or its `_no_noops` variant when only that one is in the checkpoint.

The image steps live in `prismatic/sim/images.py` (every benchmark's frames go through them); TensorFlow does the
image maths because OpenVLA's does: the same kernels give the same pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from prismatic.util.errors import ConfigError


def gripper_to_env(actions: np.ndarray) -> np.ndarray:
    """Policy actions (`[..., D]`, gripper last in [0, 1], 1 = open) as LIBERO executes them: the gripper mapped
    to [-1, 1], binarised (`np.sign`: exactly 0.5 gives 0, as in OpenVLA) and inverted (-1 = open). A copy."""
    out = np.array(actions, dtype=np.float64, copy=True)
    out[..., -1] = -np.sign(2.0 * out[..., -1] - 1.0)
    return out


def suite_unnorm_key(suite: str, available: Sequence[str]) -> str:
    """The statistics key of `suite` in a checkpoint: the suite's name, else `<suite>_no_noops` (OpenVLA's rule).

    Raises:
        ConfigError: neither is among `available` (they are listed).
    """
    for key in (suite, f"{suite}_no_noops"):
        if key in available:
            return key
    keys = ", ".join(sorted(available)) or "none"
    raise ConfigError(
        f"The checkpoint has no action statistics for LIBERO suite '{suite}' (looked for '{suite}' and "
        f"'{suite}_no_noops'); its keys are: {keys}. Evaluate it on the suite it was fine-tuned on, or pass "
        "--unnorm_key <one of those keys> to un-normalise with another dataset's statistics."
    )
