"""A simulator frame as the policy must see it: resized as the training pipeline resized the RLDS frames it was
trained on, and centre-cropped for runs trained with random-crop augmentation (OpenVLA's `get_vla_action`).

Every benchmark's frames go through these steps: its demonstrations were stored JPEG-encoded and resized by
TensorFlow's Lanczos-3 at training time, so the evaluation does the same with the same kernels.
"""

from __future__ import annotations

import numpy as np

from prismatic.util.tf import import_tensorflow

CENTER_CROP_SCALE = 0.9  # area kept by the evaluation's centre crop (OpenVLA: `crop_scale = 0.9`)


def resize_image(image: np.ndarray, size_hw: tuple[int, int]) -> np.ndarray:
    """OpenVLA's `resize_image`: JPEG round trip, Lanczos-3 antialiased resize, round, clip, uint8 `(H, W, 3)`."""
    tf = import_tensorflow()
    encoded = tf.image.encode_jpeg(np.ascontiguousarray(image))
    decoded = tf.io.decode_image(encoded, expand_animations=False, dtype=tf.uint8)
    resized = tf.image.resize(decoded, size_hw, method="lanczos3", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8).numpy()


def center_crop(image: np.ndarray, crop_scale: float = CENTER_CROP_SCALE) -> np.ndarray:
    """OpenVLA's centre crop for runs trained with random-crop augmentation: the central `crop_scale` of the area
    (sides scaled by its square root), bilinearly resized back to the image's size in float [0, 1], then saturated
    back to uint8."""
    tf = import_tensorflow()
    height, width = image.shape[:2]
    as_float = tf.image.convert_image_dtype(tf.convert_to_tensor(image), tf.float32)
    side = tf.reshape(tf.clip_by_value(tf.sqrt(crop_scale), 0, 1), (1,))
    offset = (1 - side) / 2
    boxes = tf.stack([offset, offset, offset + side, offset + side], axis=1)
    cropped = tf.image.crop_and_resize(as_float[None], boxes, tf.range(1), (height, width))[0]
    return tf.image.convert_image_dtype(tf.clip_by_value(cropped, 0, 1), tf.uint8, saturate=True).numpy()


def policy_image(image: np.ndarray, size_hw: tuple[int, int], crop: bool) -> np.ndarray:
    """A rotated simulator frame as the policy must see it: resized as at training time, centre-cropped when the
    run was trained with image augmentation."""
    resized = resize_image(image, size_hw)
    return center_crop(resized) if crop else resized
