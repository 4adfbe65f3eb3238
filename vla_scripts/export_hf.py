r"""Export a trained run (or any loadable VLA) to the Hugging Face OpenVLA layout, so evaluation code that loads
`openvla/openvla-7b` (LIBERO, real-robot servers) loads it unchanged; or, with `--format safetensors`, to one
consolidated model-only file (`<out_dir>/checkpoints/model.safetensors` + `config.json`) that this tool loads.

    python vla_scripts/export_hf.py --checkpoint runs/<run_id>/checkpoints/step-000300-epoch-04 \
        --out_dir hf/<run_id> [--dtype bfloat16] [--hf_code_dir /path/to/openvla/prismatic/extern/hf]

`--checkpoint` also takes a run folder (its latest checkpoint), a Prismatic run folder or an HF OpenVLA folder.
The action statistics (`config.json`'s `norm_stats`) come from the run folder's `dataset_statistics.json` unless
`--dataset_statistics` names another file (written as `norm_stats` and `dataset_statistics.json`). A LoRA
checkpoint is merged into plain weights first.

Under transformers 4.x (OpenVLA's pin) the folder loads with OpenVLA's two lines, `AutoProcessor` /
`AutoModelForVision2Seq.from_pretrained(folder, trust_remote_code=True)`; under 5.x, with `load_vla` / `load_policy`
(docs/checkpoints.md says which exports load where). Its `auto_map` names OpenVLA's modeling code in the Hub
repository `--hf_code_repo` (default openvla/openvla-7b; transformers fetches it on the first load and caches it),
so no OpenVLA checkout is needed. Offline sites pass `--hf_code_dir` instead: OpenVLA's
`configuration_prismatic.py`, `modeling_prismatic.py`, `processing_prismatic.py` are copied beside the weights and
`auto_map` names those local files.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from prismatic.run_layout import (
    ACTION_MODEL_FILE,
    CHECKPOINTS_DIR,
    DATASET_STATISTICS_FILE,
    MODEL_SAFETENSORS,
    RUN_CONFIG_FILE,
)
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError
from prismatic.util.files import atomic_write, write_json_atomic
from prismatic.util.logging import setup_logging

logger = logging.getLogger("vla_scripts.export_hf")


DTYPES = ("bfloat16", "float32", "float16")
FORMATS = ("hf", "safetensors")


@dataclass
class ExportConfig:
    """Flags of vla_scripts/export_hf.py (examples above)."""

    checkpoint: (
        Path  # a run's checkpoints/step-* folder (or older .pt), a run folder, or an HF OpenVLA folder
    )
    out_dir: Path  # the folder to write
    format: str = "hf"  # hf: the HF OpenVLA layout; safetensors: config.json + checkpoints/model.safetensors
    dataset_statistics: Path | None = None  # norm_stats JSON; default: the run's dataset_statistics.json
    dtype: str = "bfloat16"  # bfloat16 (OpenVLA's release dtype), float32 or float16
    max_shard_size: str = "5GB"  # largest safetensors shard, e.g. 5GB, 500MB or a number of bytes
    hf_code_dir: Path | None = (
        None  # OpenVLA's prismatic/extern/hf/, copied beside the weights (no Hub needed)
    )
    hf_code_repo: str = (
        "openvla/openvla-7b"  # without --hf_code_dir: the Hub repo auto_map names for that code
    )
    hf_token: str | None = None  # for backbones whose config / tokenizer come from a gated Hub repo

    def __post_init__(self) -> None:
        # Checked while parsing, before torch and the model load.
        if not self.checkpoint.exists():
            raise ConfigError(f"--checkpoint '{self.checkpoint}' does not exist.")
        if self.dataset_statistics is not None and not self.dataset_statistics.is_file():
            raise ConfigError(f"--dataset_statistics '{self.dataset_statistics}' is not a file.")
        if self.format not in FORMATS:
            raise ConfigError(f"Unknown --format '{self.format}'. Valid choices: {', '.join(FORMATS)}.")
        if self.dtype not in DTYPES:
            raise ConfigError(f"Unknown --dtype '{self.dtype}'. Valid choices: {', '.join(DTYPES)}.")
        if not re.fullmatch(r"\d+|\d+(\.\d+)?\s*[KMGT]B", self.max_shard_size.strip(), flags=re.IGNORECASE):
            raise ConfigError(
                f"--max_shard_size '{self.max_shard_size}' is not a size: write a number with KB, MB, GB or TB "
                "(e.g. 5GB, 500MB), or a number of bytes."
            )
        # transformers splits an auto_map entry `repo--module.Class` at "--": a repo id must not hold one.
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", self.hf_code_repo) or "--" in self.hf_code_repo:
            raise ConfigError(
                f"--hf_code_repo '{self.hf_code_repo}' is not a Hub repository id (owner/name, without '--'), e.g. "
                "openvla/openvla-7b."
            )
        if self.hf_code_dir is not None and not self.hf_code_dir.is_dir():
            raise ConfigError(
                f"--hf_code_dir '{self.hf_code_dir}' is not a folder: pass OpenVLA's prismatic/extern/hf/ (it holds "
                "configuration_prismatic.py, modeling_prismatic.py, processing_prismatic.py)."
            )
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ConfigError(f"--out_dir '{self.out_dir}' is a file; pass a folder to write the export in.")


def export(cfg: ExportConfig) -> Path:
    """Load, merge LoRA adapters if any, and write the HF OpenVLA folder. Returns `cfg.out_dir`.

    The weights stream straight into the export dtype (peak memory: one copy of the model in that dtype plus one
    shard). A run that started from an HF folder or Hub id takes its LLM config and tokenizer from that checkpoint
    (a Hub id from the local cache): nothing is downloaded again, so exporting works offline.
    """
    # lazy: torch and the model code load after the flags are checked (--help and refusals stay instant)
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import load_vla, spec_of
    from prismatic.vla.datasets.rlds.statistics import read_statistics_file

    loaded = load_vla(cfg.checkpoint, hf_token=cfg.hf_token, dtype=cfg.dtype)
    norm_stats = loaded.norm_stats
    if cfg.dataset_statistics is not None:
        norm_stats = read_statistics_file(
            cfg.dataset_statistics, "--dataset_statistics file", per_dataset=True
        )
    if norm_stats is None:
        logger.warning(
            "No dataset statistics found: config.json gets norm_stats=null (actions can't be un-normalised)."
        )
    if cfg.format == "safetensors":
        return write_model_folder(loaded.vlm, norm_stats, cfg.out_dir)
    max_shard: str | int = int(cfg.max_shard_size) if cfg.max_shard_size.isdigit() else cfg.max_shard_size
    return export_hf_openvla(
        loaded.vlm,
        spec_of(loaded.vlm),
        cfg.out_dir,
        norm_stats=norm_stats,
        dtype=cfg.dtype,
        max_shard_size=max_shard,
        hf_code_dir=cfg.hf_code_dir,
        hf_code_repo=cfg.hf_code_repo,
    )


def write_model_folder(vlm, norm_stats: dict | None, out_dir: Path) -> Path:
    """The consolidated model alone, in this tool's parameter names: `config.json` (architecture),
    `dataset_statistics.json` and `checkpoints/model.safetensors`. `load_vla` / `load_policy` read it, and
    `--vla.base_vlm <folder>` fine-tunes from it. Each file is written atomically."""
    # lazy: safetensors.torch and the model code import torch (kept out of --help)
    from safetensors.torch import save

    from prismatic.models.action_heads.registry import copy_head_files
    from prismatic.models.loading import model_config

    weights, seen = {}, set()
    for (
        name,
        tensor,
    ) in vlm.state_dict().items():  # safetensors refuses shared storage (tied embeddings): copy
        tensor = tensor.detach().cpu().contiguous()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        weights[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    with atomic_write(out_dir / CHECKPOINTS_DIR / MODEL_SAFETENSORS, "model weights") as f:
        f.write(save(weights, metadata={"format": "pt"}))
    write_json_atomic(out_dir / RUN_CONFIG_FILE, model_config(vlm), "model config")
    if not vlm.action_spec.is_default:
        write_json_atomic(out_dir / ACTION_MODEL_FILE, vlm.action_spec.to_dict(), "the model's action spec")
        copy_head_files(
            vlm.action_spec.head, getattr(vlm, "run_files_dir", None), out_dir
        )  # FAST's vocabulary
    if norm_stats is not None:
        write_json_atomic(out_dir / DATASET_STATISTICS_FILE, norm_stats, "dataset statistics")
    return out_dir


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them) and export; a mistake exits 2 in one paragraph."""
    cfg = parse_config(ExportConfig, argv, doc=__doc__)
    setup_logging(0)
    print(f"Wrote {export(cfg)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
