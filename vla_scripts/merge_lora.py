r"""Merge a LoRA run's adapters into plain weights: a run folder anyone can load without peft (and export).

    python vla_scripts/merge_lora.py --checkpoint runs/<run_id>/checkpoints/step-000300-epoch-04 \
        --out_dir runs/<run_id>-merged [--hf_out_dir hf/<run_id>]

Or keep the adapters alone (a few MB per run, peft's format) and merge them onto their base on demand:

    python vla_scripts/merge_lora.py --checkpoint runs/<run_id> --adapter_out adapters/<run_id>
    python vla_scripts/merge_lora.py --adapter adapters/<run_id> [--base <base model>] --out_dir runs/<run_id>-merged

`--adapter_out` writes `adapter_config.json` + `adapter_model.safetensors` (`peft.PeftModel.from_pretrained(base,
folder)` loads them) and records the base model's id and a fingerprint of its weights; `--adapter` checks that the
base (default: the recorded id) holds those weights before merging (prismatic/models/peft_adapters.py).

Writes `<out_dir>/config.json` (Prismatic's `model` block plus the run's `vla` block), `<out_dir>/checkpoints/
latest-checkpoint.pt` (`{"model": {vision_backbone, projector, llm_backbone}}`, FP32, keys as a model built
without LoRA has them) and the run's `dataset_statistics.json`; `--hf_out_dir` also writes the HF OpenVLA layout.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from prismatic.models.checkpoint_format import group_by_module, run_folder_of
from prismatic.run_layout import (
    ACTION_MODEL_FILE,
    CHECKPOINTS_DIR,
    DATASET_STATISTICS_FILE,
    LEGACY_LATEST,
    RUN_CONFIG_FILE,
)
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError
from prismatic.util.files import write_json_atomic
from prismatic.util.logging import setup_logging

HF_DTYPES = ("bfloat16", "float32", "float16")


@dataclass
class MergeConfig:
    """Flags of vla_scripts/merge_lora.py (example above)."""

    checkpoint: Path | None = (
        None  # a LoRA run's checkpoints/step-* folder or older *.pt (or the run folder: its newest)
    )
    out_dir: Path | None = None  # the merged run folder to write
    adapter_out: Path | None = None  # write the checkpoint's adapters as a peft adapter folder here
    adapter: Path | None = None  # merge this adapter folder (from --adapter_out) instead of a checkpoint
    base: str | None = None  # with --adapter: the base model (default: the id the adapter records)
    hf_out_dir: Path | None = None  # also export the merged model in the HF OpenVLA layout
    hf_dtype: str = "bfloat16"  # dtype of the HF export: bfloat16, float32 or float16
    hf_token: str | None = None  # for backbones whose config / tokenizer come from a gated Hub repo

    def __post_init__(self) -> None:
        # Checked while parsing, before torch and the model load.
        if (self.checkpoint is None) == (self.adapter is None):
            raise ConfigError(
                "Pass exactly one of --checkpoint (a LoRA run or checkpoint) and --adapter (an adapter folder)."
            )
        if self.out_dir is None and self.adapter_out is None:
            raise ConfigError(
                "Pass --out_dir (the merged run folder to write) and/or --adapter_out (with --checkpoint)."
            )
        if self.adapter_out is not None and self.checkpoint is None:
            raise ConfigError(
                "--adapter_out writes a checkpoint's adapters: pass --checkpoint, not --adapter."
            )
        source = self.checkpoint if self.checkpoint is not None else self.adapter
        if not source.exists():
            flag = "--checkpoint" if self.checkpoint is not None else "--adapter"
            raise ConfigError(f"{flag} '{source}' does not exist.")
        if self.hf_dtype not in HF_DTYPES:
            raise ConfigError(f"Unknown --hf_dtype '{self.hf_dtype}'. Valid choices: {', '.join(HF_DTYPES)}.")
        for name in ("out_dir", "hf_out_dir", "adapter_out"):
            path = getattr(self, name)
            if path is not None and path.exists() and not path.is_dir():
                raise ConfigError(f"--{name} '{path}' is a file; pass a folder to write into.")


def merge(cfg: MergeConfig) -> Path:
    """Load the checkpoint (adapters merged on load) and write the plain run folder. Returns `cfg.out_dir`."""
    # lazy: torch, peft and the model code load after the flags are checked (--help and refusals stay instant)
    from prismatic.models.action_heads.registry import copy_head_files
    from prismatic.models.hf_openvla import export_hf_openvla
    from prismatic.models.loading import load_vla, model_config, spec_of
    from prismatic.models.peft_adapters import load_adapter
    from prismatic.training.checkpointing import atomic_torch_save

    if cfg.adapter is not None:
        run_dir = cfg.adapter
        loaded = load_adapter(cfg.adapter, base=cfg.base, hf_token=cfg.hf_token)
    else:
        run_dir = run_folder_of(cfg.checkpoint)
        loaded = load_vla(cfg.checkpoint, hf_token=cfg.hf_token)
    spec = spec_of(loaded.vlm)
    config = model_config(loaded.vlm)
    if not loaded.vlm.action_spec.is_default:
        write_json_atomic(
            cfg.out_dir / ACTION_MODEL_FILE, loaded.vlm.action_spec.to_dict(), "the action spec"
        )
        head, source = loaded.vlm.action_spec.head, getattr(loaded.vlm, "run_files_dir", None)
        copy_head_files(head, source, cfg.out_dir)  # FAST's vocabulary
    if (run_dir / RUN_CONFIG_FILE).is_file():
        vla = json.loads((run_dir / RUN_CONFIG_FILE).read_text()).get("vla")
        if vla is not None:
            config["vla"] = {**vla, "use_lora": False, "merged_from": str(cfg.checkpoint)}
    write_json_atomic(cfg.out_dir / RUN_CONFIG_FILE, config, "the merged model's config")
    if loaded.norm_stats is not None:
        write_json_atomic(
            cfg.out_dir / DATASET_STATISTICS_FILE, loaded.norm_stats, "the merged model's statistics"
        )
    weights = {k: v.detach().cpu() for k, v in loaded.vlm.state_dict().items()}
    atomic_torch_save({"model": group_by_module(weights)}, cfg.out_dir / CHECKPOINTS_DIR / LEGACY_LATEST)
    if cfg.hf_out_dir is not None:
        export_hf_openvla(loaded.vlm, spec, cfg.hf_out_dir, norm_stats=loaded.norm_stats, dtype=cfg.hf_dtype)
    return cfg.out_dir


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them) and merge; a mistake exits 2 in one paragraph."""
    cfg = parse_config(MergeConfig, argv, doc=__doc__)
    setup_logging(0)
    if cfg.adapter_out is not None:
        # lazy: peft and torch load only once the flags are checked
        from prismatic.models.peft_adapters import export_adapter

        print(f"Wrote {export_adapter(cfg.checkpoint, cfg.adapter_out)}")
    if cfg.out_dir is not None:
        print(f"Wrote {merge(cfg)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
