"""Export a trained run (or any loadable VLA) to the Hugging Face OpenVLA layout, so evaluation code that loads
`openvla/openvla-7b` (LIBERO, real-robot servers) loads it unchanged.

    python vla_scripts/export_hf.py --checkpoint runs/<run_id>/checkpoints/step-000300-epoch-01-loss=0.1234.pt \
        --out_dir hf/<run_id> [--dtype bfloat16] [--hf_code_dir /path/to/openvla/prismatic/extern/hf]

`--checkpoint` also takes a run folder (its latest checkpoint), a Prismatic run folder or an HF OpenVLA folder.
The action statistics (`config.json`'s `norm_stats`) come from the run folder's `dataset_statistics.json` unless
`--dataset_statistics` names another file. A LoRA checkpoint is merged into plain weights first. `--hf_code_dir`
copies OpenVLA's `configuration_prismatic.py`, `modeling_prismatic.py`, `processing_prismatic.py` beside the
weights (needed by `AutoModelForVision2Seq.from_pretrained(..., trust_remote_code=True)`).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import draccus

from prismatic.models.registry import import_plugins
from prismatic.util.errors import ConfigError

logger = logging.getLogger("vla_scripts.export_hf")


@dataclass
class ExportConfig:
    checkpoint: Path  # a checkpoints/*.pt of a run, a run folder, or an HF OpenVLA folder
    out_dir: Path  # the HF OpenVLA folder to write
    dataset_statistics: Path | None = None  # default: the run folder's dataset_statistics.json
    dtype: str = "bfloat16"  # bfloat16 (OpenVLA's release dtype), float32 or float16
    max_shard_size: str = "5GB"
    hf_code_dir: Path | None = (
        None  # OpenVLA's prismatic/extern/hf/ (modeling code to ship beside the weights)
    )
    hf_token: str | None = None  # for backbones whose config / tokenizer come from a gated Hub repo


def export(cfg: ExportConfig) -> Path:
    """Load, merge LoRA adapters if any, and write the HF OpenVLA folder. Returns `cfg.out_dir`."""
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import load_vla, spec_of

    if not cfg.checkpoint.exists():
        raise ConfigError(f"--checkpoint '{cfg.checkpoint}' does not exist.")
    loaded = load_vla(cfg.checkpoint, hf_token=cfg.hf_token)
    norm_stats = loaded.norm_stats
    if cfg.dataset_statistics is not None:
        if not cfg.dataset_statistics.is_file():
            raise ConfigError(f"--dataset_statistics '{cfg.dataset_statistics}' is not a file.")
        norm_stats = json.loads(cfg.dataset_statistics.read_text())
    if norm_stats is None:
        logger.warning(
            "No dataset statistics found: config.json gets norm_stats=null (actions can't be un-normalised)."
        )
    max_shard: str | int = int(cfg.max_shard_size) if cfg.max_shard_size.isdigit() else cfg.max_shard_size
    return export_hf_openvla(
        loaded.vlm,
        spec_of(loaded.vlm),
        cfg.out_dir,
        norm_stats=norm_stats,
        dtype=cfg.dtype,
        max_shard_size=max_shard,
        hf_code_dir=cfg.hf_code_dir,
    )


def main() -> None:
    from prismatic.util.logging import setup_logging

    try:
        args = import_plugins(sys.argv[1:])
        cfg = draccus.parse(config_class=ExportConfig, args=args)
        setup_logging(0)
        out = export(cfg)
        print(f"Wrote {out}")
    except ConfigError as e:
        print(f"\nerror: {e}\n", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
