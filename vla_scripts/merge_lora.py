"""Merge a LoRA run's adapters into plain weights: a run folder anyone can load without peft (and export).

    python vla_scripts/merge_lora.py --checkpoint runs/<run_id>/checkpoints/step-000300-epoch-01-loss=0.1234.pt \
        --out_dir runs/<run_id>-merged [--hf_out_dir hf/<run_id>]

Writes `<out_dir>/config.json` (Prismatic's `model` block plus the run's `vla` block), `<out_dir>/checkpoints/
latest-checkpoint.pt` (`{"model": {vision_backbone, projector, llm_backbone}}`, FP32, keys as a model built
without LoRA has them) and the run's `dataset_statistics.json`; `--hf_out_dir` also writes the HF OpenVLA layout.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import draccus

from prismatic.models.registry import import_plugins
from prismatic.util.errors import ConfigError


@dataclass
class MergeConfig:
    checkpoint: Path  # a LoRA run's checkpoints/*.pt (or the run folder: its latest checkpoint)
    out_dir: Path  # the merged run folder to write
    hf_out_dir: Path | None = None  # also export the merged model in the HF OpenVLA layout
    hf_dtype: str = "bfloat16"
    hf_token: str | None = None


def merge(cfg: MergeConfig) -> Path:
    """Load the checkpoint (adapters merged on load) and write the plain run folder. Returns `cfg.out_dir`."""
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import LATEST_CHECKPOINT, load_vla, spec_of
    from prismatic.training.checkpointing import atomic_torch_save, group_by_module

    if not cfg.checkpoint.exists():
        raise ConfigError(f"--checkpoint '{cfg.checkpoint}' does not exist.")
    run_dir = cfg.checkpoint.parent.parent if cfg.checkpoint.is_file() else cfg.checkpoint
    loaded = load_vla(cfg.checkpoint, hf_token=cfg.hf_token)
    spec = spec_of(loaded.vlm)
    config = {
        "model": {
            "model_id": loaded.vlm.model_id,
            "vision_backbone_id": spec.vision_backbone_id,
            "llm_backbone_id": spec.llm_backbone_id,
            "arch_specifier": spec.arch_specifier,
            "image_resize_strategy": spec.image_resize_strategy,
            "llm_max_length": loaded.vlm.llm_backbone.tokenizer.model_max_length,
        }
    }
    if (run_dir / "config.json").is_file():
        vla = json.loads((run_dir / "config.json").read_text()).get("vla")
        if vla is not None:
            config["vla"] = {**vla, "use_lora": False, "merged_from": str(cfg.checkpoint)}
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    (cfg.out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if loaded.norm_stats is not None:
        (cfg.out_dir / "dataset_statistics.json").write_text(json.dumps(loaded.norm_stats, indent=2) + "\n")
    weights = {k: v.detach().cpu() for k, v in loaded.vlm.state_dict().items()}
    atomic_torch_save({"model": group_by_module(weights)}, cfg.out_dir / "checkpoints" / LATEST_CHECKPOINT)
    if cfg.hf_out_dir is not None:
        export_hf_openvla(loaded.vlm, spec, cfg.hf_out_dir, norm_stats=loaded.norm_stats, dtype=cfg.hf_dtype)
    return cfg.out_dir


def main() -> None:
    from prismatic.util.logging import setup_logging

    try:
        args = import_plugins(sys.argv[1:])
        cfg = draccus.parse(config_class=MergeConfig, args=args)
        setup_logging(0)
        print(f"Wrote {merge(cfg)}")
    except ConfigError as e:
        print(f"\nerror: {e}\n", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
