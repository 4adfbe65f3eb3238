"""The malloc arena cap that keeps the shuffle buffer's RSS near its payload (`prismatic/util/malloc.py`)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from prismatic.util.malloc import ARENA_ENV, DEFAULT_MAX_ARENAS, cap_malloc_arenas

REPO = Path(__file__).resolve().parents[2]


def test_a_user_set_malloc_arena_max_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ARENA_ENV, "8")
    assert cap_malloc_arenas() is False


_COUNT_ARENAS = """
import ctypes, tempfile
from prismatic.util.tf import import_tensorflow
tf = import_tensorflow()
work = lambda x: tf.strings.as_string(tf.zeros([2000]) + tf.cast(x, tf.float32))
for _ in tf.data.Dataset.range(800).map(work, num_parallel_calls=8):
    pass
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(f))
libc.fclose(ctypes.c_void_p(f))
print(open(path).read().count("<heap nr="))
"""


def _arenas_after_parallel_tf_work(env_value: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != ARENA_ENV}
    if env_value is not None:
        env[ARENA_ENV] = env_value
    proc = subprocess.run(
        [sys.executable, "-c", _COUNT_ARENAS], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_importing_tensorflow_caps_malloc_arenas() -> None:
    # tf.data's threads allocate concurrently: glibc opens one arena per contending thread unless capped
    # (malloc_info reports one <heap nr=...> per arena). A user's MALLOC_ARENA_MAX wins over the cap.
    assert _arenas_after_parallel_tf_work(None) <= DEFAULT_MAX_ARENAS
    assert _arenas_after_parallel_tf_work("16") > DEFAULT_MAX_ARENAS
