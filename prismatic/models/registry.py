"""Base-VLM registry: Prismatic model id -> vision backbone, LLM backbone, projector and image preprocessing.

A VLA fine-tunes one of these. The published ids are Prismatic's (`prismatic/conf/models.py` in
TRI-ML/prismatic-vlms); OpenVLA starts from `prism-dinosiglip-224px+7b` (OpenVLA 7B) and `siglip-224px+7b`
(OpenVLA v0.1). This module is plain data: importing it loads neither torch nor any model code. `SpecRegistry`
is the dict the three model registries share (base VLMs here, vision and LLM backbones in `backbones/`): register
and look up once, for all of them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from prismatic.util.errors import ConfigError, lookup
from prismatic.util.lazy import import_file

T = TypeVar("T")


class SpecRegistry(dict[str, T]):
    """id -> spec for one kind of model part: base VLMs here, vision and LLM backbones in `backbones/`.

    A plain dict otherwise (iterate it, index it); `register` refuses a taken id unless `replace=True` (two
    plugins picking one name must not silently replace each other), and `get_spec` answers an unknown id with a
    did-you-mean `ConfigError`.
    """

    def __init__(self, what: str, entries: Mapping[str, T]) -> None:
        super().__init__(entries)
        self.what = what  # the noun error messages use, e.g. "LLM backbone"

    def register(self, key: str, spec: T, *, replace: bool = False) -> None:
        """Add `key` -> `spec`.

        Raises:
            ConfigError: `key` is already registered (pass `replace=True` to override it on purpose).
        """
        if key in self and not replace:
            raise ConfigError(
                f"{self.what[:1].upper()}{self.what[1:]} '{key}' is already registered; pick another id."
            )
        self[key] = spec

    def get_spec(self, key: str) -> T:
        """The spec registered as `key`.

        Raises:
            ConfigError: unknown `key`, with the closest registered ids.
        """
        return lookup(self, key, self.what)


@dataclass(frozen=True)
class BaseVLMSpec:
    """What a base VLM is made of; every id must exist in its own registry."""

    vision_backbone_id: str
    llm_backbone_id: str
    arch_specifier: str
    image_resize_strategy: str


# fmt: off
BASE_VLMS: SpecRegistry[BaseVLMSpec] = SpecRegistry("base VLM", {
    # === Tiny (random init, CPU tests and smoke runs) ===
    "tiny-vit+tiny-llama": BaseVLMSpec("tiny-vit-64px", "tiny-llama", "gelu-mlp", "resize-naive"),
    "tiny-dinosiglip+tiny-llama": BaseVLMSpec("tiny-dinosiglip-64px", "tiny-llama", "fused-gelu-mlp", "resize-naive"),

    # === Section 4.2: single 224px representations (Vicuna v1.5, letterbox) ===
    "siglip-224px+7b": BaseVLMSpec("siglip-vit-so400m", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),
    "clip-224px+7b": BaseVLMSpec("clip-vit-l", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),
    "dinov2-224px+7b": BaseVLMSpec("dinov2-vit-l", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),
    "in1k-224px+7b": BaseVLMSpec("in1k-vit-l", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),

    # === Section 4.3: Llama-2 base LLM (CLIP 336px, letterbox) ===
    "llama2+7b": BaseVLMSpec("clip-vit-l-336px", "llama2-7b-pure", "no-align+gelu-mlp", "letterbox"),

    # === Section 5: Prisms (Llama-2 base LLM, naive resize) ===
    "prism-clip-controlled+7b": BaseVLMSpec("clip-vit-l-336px", "llama2-7b-pure", "no-align+gelu-mlp", "resize-naive"),
    "prism-clip+7b": BaseVLMSpec("clip-vit-l-336px", "llama2-7b-pure", "no-align+gelu-mlp", "resize-naive"),
    "prism-siglip-controlled+7b": BaseVLMSpec(
        "siglip-vit-so400m-384px", "llama2-7b-pure", "no-align+gelu-mlp", "resize-naive"
    ),
    "prism-siglip+7b": BaseVLMSpec("siglip-vit-so400m-384px", "llama2-7b-pure", "no-align+gelu-mlp", "resize-naive"),
    "prism-dinosiglip-controlled+7b": BaseVLMSpec(
        "dinosiglip-vit-so-384px", "llama2-7b-pure", "no-align+fused-gelu-mlp", "resize-naive"
    ),
    "prism-dinosiglip+7b": BaseVLMSpec(
        "dinosiglip-vit-so-384px", "llama2-7b-pure", "no-align+fused-gelu-mlp", "resize-naive"
    ),

    # === Inference-optimised 224px Prisms (OpenVLA's base VLMs) ===
    "dinosiglip-224px-resize-naive+7b": BaseVLMSpec(
        "dinosiglip-vit-so-224px", "vicuna-v15-7b", "no-align+fused-gelu-mlp", "resize-naive"
    ),
    "prism-dinosiglip-224px-controlled+7b": BaseVLMSpec(
        "dinosiglip-vit-so-224px", "llama2-7b-pure", "no-align+fused-gelu-mlp", "resize-naive"
    ),
    "prism-dinosiglip-224px+7b": BaseVLMSpec(
        "dinosiglip-vit-so-224px", "llama2-7b-pure", "no-align+fused-gelu-mlp", "resize-naive"
    ),

    # === Section 4.3 extras: other LLMs on the one-stage recipe (CLIP 336px, letterbox, gelu-mlp) ===
    "one-stage+7b": BaseVLMSpec("clip-vit-l-336px", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),
    "one-stage+13b": BaseVLMSpec("clip-vit-l-336px", "vicuna-v15-13b", "no-align+gelu-mlp", "letterbox"),
    "llama2-chat+7b": BaseVLMSpec("clip-vit-l-336px", "llama2-7b-chat", "no-align+gelu-mlp", "letterbox"),
    "llama2-chat+13b": BaseVLMSpec("clip-vit-l-336px", "llama2-13b-chat", "no-align+gelu-mlp", "letterbox"),
    "mistral-v0.1+7b": BaseVLMSpec("clip-vit-l-336px", "mistral-v0.1-7b-pure", "no-align+gelu-mlp", "letterbox"),
    "mistral-instruct-v0.1+7b": BaseVLMSpec(
        "clip-vit-l-336px", "mistral-v0.1-7b-instruct", "no-align+gelu-mlp", "letterbox"
    ),
    "phi-2+3b": BaseVLMSpec("clip-vit-l-336px", "phi-2-3b", "no-align+gelu-mlp", "letterbox"),
    # === Section 4.2D: stacked DINOv2 + CLIP at 336px ===
    "dinoclip-336px-letterbox+7b": BaseVLMSpec(
        "dinoclip-vit-l-336px", "vicuna-v15-7b", "no-align+fused-gelu-mlp", "letterbox"
    ),
    "dinoclip-336px-resize-naive+7b": BaseVLMSpec(
        "dinoclip-vit-l-336px", "vicuna-v15-7b", "no-align+fused-gelu-mlp", "resize-naive"
    ),
    # MiniVLA's base VLM: Qwen2.5 0.5B with the 224px DINO-SigLIP backbone.
    "prism-qwen25-dinosiglip-224px+0_5b": BaseVLMSpec(
        "dinosiglip-vit-so-224px", "qwen25-0_5b-pure", "no-align+fused-gelu-mlp", "resize-naive"
    ),
})
# fmt: on


# The public paths for new base VLMs (docs/adding_a_model.md); an unknown id gets a did-you-mean ConfigError.
register_base_vlm = BASE_VLMS.register
get_base_vlm_spec = BASE_VLMS.get_spec


PLUGINS_ENV = "PRISMATIC_PLUGINS"


def import_plugins(argv: list[str]) -> list[str]:
    """Import the modules named by `--plugins a.b,c.d` (and `$PRISMATIC_PLUGINS`); return argv without the flag.

    A plugin is an importable module, or a `.py` file given by its path, that registers backbones, base VLMs, VLA
    presets, RLDS datasets, standardisation functions or mixtures at import time
    (`register_llm_backbone`, `register_vision_backbone`, `register_base_vlm`, `register_vla`): entry points
    import them before parsing flags, so `--vla.type` can name what they add. See docs/adding_a_model.md.

    Raises:
        ConfigError: a named module cannot be imported.
    """
    names = [n for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--plugins" and i + 1 < len(argv):
            names += argv[i + 1].split(",")
            i += 2
            continue
        if arg.startswith("--plugins="):
            names += arg.split("=", 1)[1].split(",")
        else:
            rest.append(arg)
        i += 1
    names = [n.strip() for n in names if n.strip()]
    for name in names:  # a missing file or package is refused in a second, before TensorFlow loads
        if name.endswith(".py"):
            if not Path(name).expanduser().is_file():
                raise ConfigError(
                    f"Plugin file '{name}' (from --plugins / ${PLUGINS_ENV}) does not exist. Pass the path of a "
                    "Python file that registers datasets, mixtures or models, or an importable module name."
                )
        elif importlib.util.find_spec(name.split(".")[0]) is None:  # the top-level package: imports nothing
            raise _not_importable(name, f"No module named '{name.split('.')[0]}'")
    if names:
        # A plugin may import TensorFlow (a dataset's standardisation function): load torch, torchvision and
        # TensorFlow in the one order that does not crash the process first (`prismatic/util/tf.py`). Lazy: only
        # runs that name a plugin need that loader.
        from prismatic.util.tf import import_tensorflow

        import_tensorflow()

    for name in names:
        if name.endswith(".py"):
            _import_plugin_file(name)
            continue
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise _not_importable(name, str(err)) from err
    return rest


def _not_importable(name: str, reason: str) -> ConfigError:
    return ConfigError(
        f"Plugin module '{name}' (from --plugins / ${PLUGINS_ENV}) cannot be imported: {reason}. Put its folder on "
        "PYTHONPATH, or pass the file's path (a name ending in .py)."
    )


def _import_plugin_file(path_text: str) -> None:
    """Import a plugin given as a file path (`--plugins my_robot.py`), once per process, under a module name
    derived from its resolved path (two files with the same name in different folders do not collide)."""
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(
            f"Plugin file '{path_text}' (from --plugins / ${PLUGINS_ENV}) does not exist. Pass the path of a "
            "Python file that registers datasets, mixtures or models, or an importable module name."
        )
    module_name = f"prismatic_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    try:
        import_file(module_name, path)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 (whatever the user's file raises, name the file)
        raise ConfigError(
            f"Plugin file '{path}' (from --plugins / ${PLUGINS_ENV}) failed while being imported: "
            f"{type(err).__name__}: {err}"
        ) from err
