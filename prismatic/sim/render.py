"""MuJoCo's headless rendering back-end, shared by every simulator benchmark (LIBERO through robosuite, Meta-World).

A process picks its OpenGL back-end once, from `MUJOCO_GL`, when MuJoCo (or robosuite) is first imported; so an
entry point calls `check_render_backend()` before anything imports a simulator, and worker processes started
afterwards inherit the choice.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from prismatic.util.errors import ConfigError

RENDER_BACKENDS = ("egl", "osmesa")  # MuJoCo's headless OpenGL back-ends, in order of preference
SIM_INSTALL_HINT = (
    "pip install -e '.[sim,sim-assets]' && pip install --no-deps hf-libero==0.1.4 (or `make install`)"
)
RENDER_FIX = (
    "The simulators render their cameras off-screen with MuJoCo: install Mesa's EGL (`apt-get install libegl1 "
    "libegl-mesa0 libgl1-mesa-dri libopengl0`), or install OSMesa (`apt-get install libosmesa6`) and set "
    "MUJOCO_GL=osmesa."
)

# Opens and frees a tiny off-screen context, as robosuite does for each camera.
_PROBE = "import mujoco\nctx = mujoco.GLContext(8, 8)\nctx.make_current()\nctx.free()\n"


def probe_render_backend(backend: str) -> str | None:
    """Open an off-screen OpenGL context with `MUJOCO_GL=backend` in a fresh interpreter (a process picks its
    back-end once, at import). Returns None when it works, else the error's last line."""
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
        )
    except subprocess.TimeoutExpired:
        return "opening a context did not finish within 120 s"
    if done.returncode == 0:
        return None
    # Drop the noise of destructors that run after the failure; keep the error itself.
    lines = [line.strip() for line in done.stderr.split("Exception ignored")[0].splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {done.returncode}"


def check_render_backend() -> str:
    """Choose MuJoCo's headless rendering back-end and check that it opens a context; call before importing
    a simulator (robosuite, LIBERO, Meta-World). `MUJOCO_GL` when set (egl or osmesa) is the only one tried; unset, EGL then OSMesa.
    Sets `MUJOCO_GL` and `PYOPENGL_PLATFORM` to the choice (worker processes inherit them).

    Returns:
        The back-end: "egl" or "osmesa".

    Raises:
        ConfigError: MuJoCo is not installed, `MUJOCO_GL` names another back-end, or none opens a context.
    """
    if importlib.util.find_spec("mujoco") is None:
        raise ConfigError(f"MuJoCo is not installed, so no simulator can run. {SIM_INSTALL_HINT}.")
    requested = os.environ.get("MUJOCO_GL", "").strip().lower()
    if requested and requested not in RENDER_BACKENDS:
        raise ConfigError(
            f"MUJOCO_GL={requested} is not a headless rendering back-end MuJoCo can use. Valid choices: "
            f"{', '.join(RENDER_BACKENDS)}; or unset MUJOCO_GL to take the first that works."
        )
    errors = {}
    for backend in [requested] if requested else RENDER_BACKENDS:
        error = probe_render_backend(backend)
        if error is None:
            os.environ["MUJOCO_GL"] = backend
            os.environ["PYOPENGL_PLATFORM"] = backend
            return backend
        errors[backend] = error
    if requested:
        raise ConfigError(
            f"MUJOCO_GL={requested} cannot render on this machine ({errors[requested]}). {RENDER_FIX} Or unset "
            f"MUJOCO_GL to take the first of {', '.join(RENDER_BACKENDS)} that works."
        )
    tried = "; ".join(f"MUJOCO_GL={backend} fails with: {error}" for backend, error in errors.items())
    raise ConfigError(f"No MuJoCo rendering back-end works on this machine ({tried}). {RENDER_FIX}")
