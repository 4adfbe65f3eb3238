"""Frame images: decode + resize the encoded camera images, and augment them with stateless, position-keyed ops.

Images travel through the pipeline as JPEG/PNG bytes and are decoded only after shuffling and skipping, so the
shuffle buffer holds encoded frames and resuming by skipping costs reading, not decoding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prismatic.util.tf import import_tensorflow

AUGMENT_SCALE = 0.9  # random resized crop keeps 90% of the area, square (OpenVLA's settings)


def decode_and_resize(image_bytes: Any, resize_resolution: tuple[int, int]) -> Any:
    """JPEG/PNG bytes -> uint8[H, W, 3] at `resize_resolution` (lanczos3, antialiased); "" -> black image."""
    tf = import_tensorflow()
    height, width = resize_resolution

    def decode() -> Any:
        image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
        image.set_shape([None, None, 3])
        return image

    image = tf.cond(
        tf.strings.length(image_bytes) > 0, decode, lambda: tf.zeros([height, width, 3], tf.uint8)
    )
    shape = tf.shape(image)

    def resize() -> Any:
        resized = tf.image.resize(image, (height, width), method="lanczos3", antialias=True)
        return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)

    image = tf.cond(tf.logical_and(shape[0] == height, shape[1] == width), lambda: image, resize)
    return tf.ensure_shape(image, [height, width, 3])


def augment_image(image: Any, seed: Any) -> Any:
    """Random resized crop (90% area, square) + brightness / contrast / saturation / hue jitter.

    Stateless ops keyed by `seed` (int64[2]): the same frame position always gets the same augmentation.
    """
    tf = import_tensorflow()
    seeds = tf.random.experimental.stateless_split(seed, num=5)
    height, width = image.shape[0], image.shape[1]
    x = tf.image.convert_image_dtype(image, tf.float32)

    side = math.sqrt(AUGMENT_SCALE)
    offset = tf.random.stateless_uniform([2], seed=seeds[0], minval=0.0, maxval=1.0 - side)
    box = tf.stack([offset[0], offset[1], offset[0] + side, offset[1] + side])[None]
    x = tf.image.crop_and_resize(x[None], box, box_indices=[0], crop_size=(height, width))[0]
    x = tf.clip_by_value(tf.image.stateless_random_brightness(x, 0.2, seed=seeds[1]), 0.0, 1.0)
    x = tf.clip_by_value(tf.image.stateless_random_contrast(x, 0.8, 1.2, seed=seeds[2]), 0.0, 1.0)
    x = tf.clip_by_value(tf.image.stateless_random_saturation(x, 0.8, 1.2, seed=seeds[3]), 0.0, 1.0)
    x = tf.clip_by_value(tf.image.stateless_random_hue(x, 0.05, seed=seeds[4]), 0.0, 1.0)
    return tf.cast(tf.round(x * 255.0), tf.uint8)


def frame_image_decoder(
    resize_resolution: tuple[int, int],
    image_views: Sequence[str],
    augment_seeds: Mapping[str, int] | None,
    windowed: bool,
) -> Callable[[Any, dict[str, Any]], dict[str, Any]]:
    """`decode(position, frame) -> frame` with every `observation.image_<view>` decoded and resized.

    `augment_seeds` ({view: seed}, None: no augmentation) augments each view with a draw of its own, keyed by the
    frame's `position` in the stream: every image of a history window (`windowed`) gets the same augmentation,
    and padding images (empty bytes) stay black, as OpenVLA's `augment` skips them.
    """
    tf = import_tensorflow()

    def decode_one(image_bytes: Any, position: Any, view: str) -> Any:
        image = decode_and_resize(image_bytes, resize_resolution)
        if augment_seeds is not None:
            view_seed = tf.stack([tf.constant(augment_seeds[view], tf.int64), position])
            image = tf.cond(
                tf.strings.length(image_bytes) > 0, lambda: augment_image(image, view_seed), lambda: image
            )
        return image

    def decode(position: Any, frame: dict[str, Any]) -> dict[str, Any]:
        for view in image_views:
            key = f"image_{view}"
            images = frame["observation"][key]
            if windowed:
                frame["observation"][key] = tf.map_fn(
                    functools.partial(decode_one, position=position, view=view),
                    images,
                    fn_output_signature=tf.uint8,
                )
            else:
                frame["observation"][key] = decode_one(images, position, view)
        return frame

    return decode
