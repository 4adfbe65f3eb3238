"""Caps glibc's malloc arenas in a process that runs the tf.data pipeline.

glibc gives each thread that allocates concurrently its own arena (up to 8 per core). tf.data's reader threads
allocate the JPEG bytes of buffered frames in one arena and the consumer frees them into it, while other threads
allocate from theirs: freed memory piles up in arenas that the allocating thread no longer uses. Measured on
Bridge-like data (37.6 KB JPEG frames), the shuffle buffer then costs ~75 KB of RSS per frame instead of its
37.6 KB payload; with at most two arenas it costs 39-47 KB, at the same frames/s.

The cap is applied at run time with `mallopt(M_ARENA_MAX)` before TensorFlow starts its thread pools. It is left
alone when the user set `MALLOC_ARENA_MAX` (glibc honours that itself), and on non-glibc platforms.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

logger = logging.getLogger(__name__)

ARENA_ENV = "MALLOC_ARENA_MAX"
DEFAULT_MAX_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


def cap_malloc_arenas(max_arenas: int = DEFAULT_MAX_ARENAS) -> bool:
    """Limit glibc malloc to `max_arenas` arenas for arenas created from now on; True when the cap was set."""
    if os.environ.get(ARENA_ENV):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    ok = bool(mallopt(_M_ARENA_MAX, int(max_arenas)))
    if not ok:
        logger.debug("mallopt(M_ARENA_MAX, %d) was refused", max_arenas)
    return ok
