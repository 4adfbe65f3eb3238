"""The Hugging Face Hub as a place models are loaded from: which ids name a Hub repo, and fetching one.

Only configs, weights, tokenizer files and statistics are ever fetched (never code); offline, the local cache
answers. `prismatic.models.loading` and `prismatic.models.architecture` go through here.
"""

from __future__ import annotations

from pathlib import Path

import huggingface_hub

from prismatic.util.errors import ConfigError

# What a Hub snapshot needs: configs, weights, tokenizer files, statistics (never code).
HUB_PATTERNS = ["*.json", "*.safetensors", "*.pt", "*.model", "tokenizer*", "checkpoints/*"]
# What describing a Hub checkpoint needs (a run's base): configs and tokenizer, no weights.
HUB_CONFIG_PATTERNS = ["*.json", "*.model", "tokenizer*"]


def looks_like_hub_id(source: str) -> bool:
    """Whether `source` reads as "org/name" or "org/name/subfolder" (not a relative or home path)."""
    parts = source.split("/")
    return 2 <= len(parts) <= 3 and all(parts) and not source.startswith((".", "~"))


def hub_snapshot(source: str, hf_token: str | None, patterns: list[str] = HUB_PATTERNS) -> Path:
    """Download (or find in the local cache) a Hub repo, or one subfolder of it, and return the local folder.

    Offline (`HF_HUB_OFFLINE=1` or no network), `snapshot_download` answers from the cache.

    Raises:
        ConfigError: the repo cannot be fetched nor found in the cache, or it has no such subfolder.
    """
    owner, name, *rest = source.split("/")
    repo_id, subfolder = f"{owner}/{name}", "/".join(rest)
    allow = [f"{subfolder}/{p}" for p in patterns] if subfolder else patterns
    try:
        root = huggingface_hub.snapshot_download(repo_id, token=hf_token, allow_patterns=allow)
    except Exception as err:  # noqa: BLE001 (offline, gated, unknown repo: all the same user error)
        raise ConfigError(
            f"'{source}' is neither a local folder nor a base-VLM registry id, and the Hugging Face Hub repo "
            f"'{repo_id}' could not be fetched or found in the local cache (offline? gated repos need "
            f"hf_token). Cause: {err}"
        ) from err
    folder = Path(root) / subfolder if subfolder else Path(root)
    if not folder.is_dir():
        raise ConfigError(f"Hub repo '{repo_id}' has no folder '{subfolder}'.")
    return folder
