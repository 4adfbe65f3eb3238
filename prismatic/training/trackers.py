"""Metric trackers behind one small interface: jsonl (one object per optimiser step) and Weights & Biases.

`TRACKERS` is the registry `--trackers` chooses from (the config reads it while parsing: this module imports no
torch). A new tracker is a `Tracker` subclass (`from_run`, `log`, `finish`) plus one `TRACKERS.register` line.
Only rank 0 tracks. Both continue, rather than restart, when a run is resumed: the jsonl file is cut back to the
resumed step and appended to; the W&B run id is kept in the run folder and the same W&B run is resumed.
Secrets stay out of W&B: its config has them blanked and the command line it records has their values redacted
(`prismatic/util/redact.py`). A metrics log that cannot be written (full disk) is a `ConfigError` naming it.
`check_trackers` refuses `--trackers wandb` without W&B credentials before the model loads (entry scripts call it
right after parsing), where `wandb.init` would otherwise fail minutes later with a traceback.
"""

from __future__ import annotations

import configparser
import json
import logging
import netrc
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonlines

from prismatic.conf.registries import TRACKERS  # the names --trackers takes; the classes are these below
from prismatic.run_layout import METRICS_FILE, WANDB_ID_FILE
from prismatic.util.errors import ConfigError
from prismatic.util.files import atomic_write, write_error, write_text_atomic
from prismatic.util.redact import argv_redacted, redact_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrackerRun:
    """What a tracker may need of the run it tracks; `build_trackers` hands the same one to every tracker."""

    run_dir: Path
    run_id: str
    config: dict[str, Any]  # the run's config as plain data (what W&B records)
    resume_step: int | None  # the step resumed from; None for a new run
    wandb_project: str = "openvla"
    wandb_entity: str | None = None


class Tracker(ABC):
    """One metrics sink. `from_run` builds it for a run (on rank 0 only); the loop calls `log` once per optimiser
    step and `finish` at the end."""

    @classmethod
    def from_run(cls, run: TrackerRun) -> Tracker:
        """This tracker for `run`, continuing its earlier records when `run.resume_step` is set (default:
        `cls(run)`; a tracker with other constructor arguments overrides it)."""
        return cls(run)

    @abstractmethod
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics of optimiser step `step`."""

    @abstractmethod
    def finish(self) -> None:
        """Flush and close, at the end of the run."""


class JSONLinesTracker(Tracker):
    """Appends `{"step": N, ...metrics}` to `<run_dir>/metrics.jsonl`, flushed every step."""

    def __init__(self, run_dir: Path, resume_step: int | None) -> None:
        self.path = run_dir / METRICS_FILE
        if self.path.exists():
            # Steps after the checkpoint we resume from are re-run, so their old records are dropped.
            keep_until = resume_step if resume_step is not None else -1
            with jsonlines.open(self.path) as reader:
                kept = [r for r in reader.iter(skip_invalid=True) if r.get("step", 0) <= keep_until]
            with atomic_write(self.path, "metrics log", text=True) as f:
                jsonlines.Writer(f).write_all(kept)
        try:
            self._writer = jsonlines.open(self.path, mode="a", flush=True)
        except OSError as e:
            raise write_error(self.path, "metrics log", e) from e

    @classmethod
    def from_run(cls, run: TrackerRun) -> JSONLinesTracker:
        return cls(run.run_dir, run.resume_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        try:
            self._writer.write({"step": step, **metrics})
        except OSError as e:
            raise write_error(self.path, f"metrics of step {step}", e) from e

    def finish(self) -> None:
        self._writer.close()


class WandBTracker(Tracker):
    """Logs to W&B (online, or offline with WANDB_MODE=offline); never asks for a login itself."""

    def __init__(self, run: TrackerRun) -> None:
        import wandb  # lazy: ~0.5 s, paid only by runs that log to W&B (the config reads this module)

        id_file = run.run_dir / WANDB_ID_FILE
        # W&B ids are short lowercase alphanumerics; keeping ours in the run folder lets a resume find it.
        resume = run.resume_step is not None
        wandb_id = id_file.read_text().strip() if (resume and id_file.exists()) else uuid.uuid4().hex[:12]
        write_text_atomic(id_file, wandb_id + "\n", "W&B run id")
        with argv_redacted():  # W&B records the command line in the run's metadata
            self._run = wandb.init(
                project=run.wandb_project,
                entity=run.wandb_entity,
                name=run.run_id,
                id=wandb_id,
                resume="allow",
                dir=str(run.run_dir),
                config=redact_config(run.config),
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def finish(self) -> None:
        self._run.finish()


def build_trackers(names: Sequence[str], run: TrackerRun) -> list[Tracker]:
    """The trackers `names` (`--trackers`) for `run`, in that order. Call it on rank 0 only."""
    return [TRACKERS.get_class(name).from_run(run) for name in names]


# W&B modes that need no login (`WANDB_MODE`, or `mode` in its settings files).
WANDB_LOCAL_MODES = ("offline", "dryrun", "disabled")
# The API hosts wandb reads a key for when no base_url is set: api.wandb.ai (W&B's cloud, older wandb's default)
# and CoreWeave Forge's (recent wandb's default, which also takes an api.wandb.ai entry: the API behind Forge).
WANDB_DEFAULT_HOSTS = ("api.wandb.ai", "api.forge.coreweave.com")


def check_trackers(names: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Refuse `wandb` among `names` when W&B would ask for a login, before anything heavy loads.

    Reads what wandb reads, without network or importing wandb: WANDB_MODE, else `mode` in its settings files
    (`<WANDB_CONFIG_DIR or ~/.config/wandb>/settings`, then `<WANDB_DIR or .>/wandb/settings`, as `wandb
    offline` writes it); then the key in WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, the settings' `api_key`, or
    the netrc file (`$NETRC`, else `~/.netrc`) entry `wandb login` writes for the host (WANDB_BASE_URL, the
    settings' `base_url`, else W&B's cloud). Only rank 0 logs, but the entry scripts call this on every rank:
    ranks sharing a machine see the same environment, so all stop together instead of waiting for rank 0.

    Raises:
        ConfigError: `wandb` is in `names`, W&B is online and no key is configured.
    """
    if "wandb" not in names:
        return
    env = os.environ if environ is None else environ
    settings = _wandb_settings_files(env)
    if (env.get("WANDB_MODE") or settings.get("mode")) in WANDB_LOCAL_MODES:
        return
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE") or settings.get("api_key"):
        return
    base_url = env.get("WANDB_BASE_URL") or settings.get("base_url")
    hosts = ((urlsplit(base_url).netloc or base_url),) if base_url else WANDB_DEFAULT_HOSTS
    if base_url and urlsplit(base_url).hostname in ("forge.coreweave.com", "api.forge.coreweave.com"):
        hosts += ("api.wandb.ai",)  # wandb falls back to the API host behind Forge
    netrc_path = Path(env["NETRC"]).expanduser() if env.get("NETRC") else _default_netrc(env)
    if _netrc_has_key(netrc_path, hosts):
        return
    raise ConfigError(
        f"--trackers includes wandb, but W&B has no login here: WANDB_API_KEY is not set and {netrc_path} holds "
        f"no key for {hosts[0]}, so W&B would stop the run once the model has loaded. Log in once with "
        "`wandb login` (it stores the key in that file; on a cluster set WANDB_API_KEY on every node), or log "
        "to local files with WANDB_MODE=offline (upload them later with `wandb sync`), or leave W&B out with "
        "--trackers jsonl."
    )


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def _default_netrc(env: Mapping[str, str]) -> Path:
    """`~/.netrc`, else `~/_netrc` where only that one exists (wandb's order)."""
    unix, windows = _home(env) / ".netrc", _home(env) / "_netrc"
    return windows if windows.exists() and not unix.exists() else unix


def _netrc_has_key(path: Path, hosts: Sequence[str]) -> bool:
    """Whether `path` holds a password for one of `hosts` (an unreadable or malformed file holds none, as for
    wandb, which warns and goes on)."""
    try:
        parsed = netrc.netrc(str(path))
    except (OSError, netrc.NetrcParseError):
        return False
    return any((parsed.authenticators(host) or (None, None, ""))[2] for host in hosts)


def _wandb_settings_files(env: Mapping[str, str]) -> dict[str, str]:
    """The `[default]` section of W&B's global settings file, overridden by the workspace one (wandb's order)."""
    config_dir = Path(env["WANDB_CONFIG_DIR"]).expanduser() if env.get("WANDB_CONFIG_DIR") else None
    root = Path(env.get("WANDB_DIR") or ".").expanduser()
    workspace = root / (".wandb" if (root / ".wandb").exists() else "wandb")
    merged: dict[str, str] = {}
    for path in ((config_dir or _home(env) / ".config" / "wandb") / "settings", workspace / "settings"):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
            merged.update(parser.items("default"))
        except (OSError, configparser.Error):
            continue  # no file, or one wandb itself would skip
    return merged


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All records of a run's metrics.jsonl (for tests and analysis)."""
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines() if line.strip()]
