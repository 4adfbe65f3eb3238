"""The frame-level shuffle: a window shuffle whose order depends on positions only, run inside tf.data.

The mixed stream of encoded frames ("the reader") is cut into consecutive windows of `window_frames(B)` =
B // 2 frames (B: `shuffle_buffer_size`); each window is emitted in an order drawn statelessly from
(seed, window index), and the next window is read while this one is emitted. So the shuffle holds at most two
windows, B frames, as tf.data's `shuffle(B)` did, and which reader frame leaves at output n is a function of
(seed, n) alone, never of the frames' contents or of a random state carried from frame to frame.

That is what makes a snapshot of the stream small: under tf.data's symbolic checkpointing
(`experimental_symbolic_checkpoint`), the `flat_map` over windows saves the reader's cursors as they were before
the current window and the index inside it, and a restore re-reads that one window (at most B / 2 encoded
frames, never decoded) instead of storing it. tf.data's own `shuffle` cannot do that: its order depends on a
random state advanced per frame and its checkpoint is the buffer's frames (~10 GiB at 256k Bridge frames).

Statistics, against `shuffle(B)`: each window is a uniform random permutation of B / 2 consecutive reader frames,
so a minibatch is a draw without replacement from that window; `shuffle(B)` draws uniformly from the B frames
buffered, which mix a geometric tail of frames that waited several buffer lengths. Here no frame moves more
than B / 2 - 1 places and every frame of window k leaves before any of window k + 1 (no tail, no mixing across
a window edge); `shuffle(B)` moves most frames less than B places and a few (probability (1 - 1/B)^d of waiting
d outputs) much further. docs/data_pipeline.md says more.
"""

from __future__ import annotations

from typing import Any

from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.trajectories import graph_only

WINDOWS_HELD = 2  # the window being emitted and the next one, being read: the buffer's RAM is two windows


def window_frames(shuffle_buffer_size: int) -> int:
    """Frames per shuffle window: half the buffer (at least 1), so that the two windows held fit in it."""
    return max(1, shuffle_buffer_size // WINDOWS_HELD)


def window_shuffle(frames: Any, shuffle_buffer_size: int, seed: int, start: int = 0) -> Any:
    """`frames` (a tf.data dataset of encoded frames) window-shuffled, as (output index, frame) pairs from output
    `start` on.

    Window k (frames k*W .. k*W + W - 1 of `frames`, W = `window_frames(shuffle_buffer_size)`) leaves in the order
    `tf.random.experimental.stateless_shuffle(tf.range(W), seed=[seed, k])`; a shorter last window (finite input)
    is permuted alike over its own length. The output index (k*W + place in that order) is what `enumerate()`
    would give, numbered here because every op per frame costs (under symbolic checkpointing, ~10 us a frame).
    Whole windows before `start` are skipped as reader frames, before batching (measured ~25% faster than
    skipping shuffled frames), the rest of the way after shuffling.
    """
    tf = import_tensorflow()
    width = window_frames(shuffle_buffer_size)
    first_window, offset = divmod(start, width)
    if first_window:
        frames = frames.skip(first_window * width)
    windows = frames.batch(width).prefetch(1)  # read ahead: the second window

    def emit(index: Any, window: Any) -> Any:
        length = tf.shape(tf.nest.flatten(window)[0], out_type=tf.int64)[0]
        order = tf.random.experimental.stateless_shuffle(
            tf.range(length), seed=tf.stack([tf.constant(seed, tf.int64), index])
        )
        # One slice per frame (no gathered copy of the window): the window's memory is held once.
        return tf.data.Dataset.from_tensor_slices((index * width + tf.range(length), order)).map(
            graph_only(lambda n, i: (n, tf.nest.map_structure(lambda leaf: leaf[i], window)))
        )

    numbered = windows.enumerate(start=first_window).flat_map(graph_only(emit))
    return numbered.skip(offset) if offset else numbered
