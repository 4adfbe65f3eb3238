"""Fixtures of the LIBERO simulator tests: LIBERO configured once per session in a temporary folder, its rendering
back-end checked, or the test skipped when LIBERO is not installed (`make install` installs it)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from prismatic.sim.libero.setup import prepare_libero
from prismatic.sim.render import check_render_backend

LIBERO_MISSING = [
    name for name in ("libero", "robosuite", "mujoco") if importlib.util.find_spec(name) is None
]
SKIP_REASON = (
    f"LIBERO is not installed (missing {', '.join(LIBERO_MISSING)}): `make install` installs it, or "
    "pip install -e '.[sim,sim-assets]' && pip install --no-deps hf-libero==0.1.4"
)
# What prepare_libero and check_render_backend set; restored when the session ends.
_SETUP_VARIABLES = ("LIBERO_CONFIG_PATH", "MUJOCO_GL", "PYOPENGL_PLATFORM")


@pytest.fixture(scope="session")
def libero_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """LIBERO's config folder for this session (assets: the wheels when installed, else LIBERO's own), with the
    rendering back-end chosen; the variables are inherited by the simulator workers the tests start."""
    if LIBERO_MISSING:
        pytest.skip(SKIP_REASON)
    saved = {name: os.environ.get(name) for name in _SETUP_VARIABLES}
    try:
        check_render_backend()
        yield prepare_libero(config_root=tmp_path_factory.mktemp("libero_config"))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
