"""The one place that imports TensorFlow.

TensorFlow must be imported *after* torch and torchvision in a process: the other order segfaults (triton's and
torchvision's native libraries clash with TensorFlow's). It must also never grab a GPU that torch trains on,
its C++ logs are quieted (unless `TF_CPP_MIN_LOG_LEVEL` is set), and the process's malloc arenas are capped before
TensorFlow starts its threads (`malloc.py` says why).
Every module that needs TensorFlow calls `import_tensorflow()` instead of importing it directly.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from prismatic.util.malloc import cap_malloc_arenas

_TF: ModuleType | None = None
# Loaded in this order, through importlib so that no import sorter can reorder them.
_LOAD_ORDER = ("torch", "torchvision", "tensorflow")


def import_tensorflow() -> ModuleType:
    """Import torch, torchvision, then TensorFlow (hidden from GPUs); return the `tensorflow` module."""
    global _TF
    if _TF is None:
        cap_malloc_arenas()
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO / warning lines
        modules = [importlib.import_module(name) for name in _LOAD_ORDER]
        tf = modules[-1]
        tf.config.set_visible_devices([], "GPU")
        _TF = tf
    return _TF
