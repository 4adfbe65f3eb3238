"""Writing the files the tool produces: atomically, with the user's normal permissions, and with a clear error.

Every file the tool writes (checkpoints, statistics JSON, run configs, the metrics log's rewrite, the W&B run id)
goes through `atomic_write`:

- the bytes go to a temporary file beside the target, are fsynced, then renamed over it, so a crash, a Ctrl-C or
  a full disk never leaves a half-written file under the target's name (the previous file, if any, stays);
- the temporary file is created with mode 0o666 and the kernel applies the process umask (and any default ACL),
  exactly as for a plain `open(path, "w")`. `tempfile.mkstemp` would create it 0o600, and the rename would carry
  that mode over: files in a shared lab folder would then be unreadable by the group. Files that a library
  writes 0600 itself (safetensors' `save_file`) get the same mode from `normal_permissions`;
- an `OSError` (read-only file system, full disk, a path component that is a file, permission denied) becomes a
  `ConfigError` naming the path and what was being written, in one paragraph.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from prismatic.util.errors import ConfigError

_REASONS = {
    errno.ENOSPC: ("the disk is full", "Free some space, or write to another disk."),
    errno.EDQUOT: ("the disk quota is exceeded", "Free some space, or write to another disk."),
    errno.EFBIG: ("the file is larger than the file system or the process's file-size limit allows", ""),
    errno.EROFS: ("the file system is read-only", "Choose a writable folder."),
    errno.EACCES: ("permission denied", "Choose a folder you can write to, or fix its permissions."),
    errno.EPERM: ("permission denied", "Choose a folder you can write to, or fix its permissions."),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "Choose another path, or move that file."),
    errno.EEXIST: ("a part of the path is a file, not a folder", "Choose another path, or move that file."),
    errno.EISDIR: ("the target is a folder", "Choose a file path, or remove that folder."),
}


def write_error(path: Path, what: str, error: OSError) -> ConfigError:
    """The one-paragraph `ConfigError` for an `OSError` met while writing `what` to `path`."""
    reason, hint = _REASONS.get(error.errno or 0, (error.strerror or str(error), ""))
    return ConfigError(
        f"Could not write the {what} to '{path}': {reason}. Nothing was written there (a previous file of that "
        f"name is unchanged). {hint}".rstrip()
    )


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (`os.umask` can only be read by setting
    it, which would briefly affect files other threads create)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def normal_permissions(path: Path) -> Path:
    """Give a file written by a library that creates it 0600 (safetensors' `save_file`, `tempfile`) the mode a
    plain `open()` would have given it: 0o666 minus the umask. Returns `path`."""
    os.chmod(path, 0o666 & ~current_umask())
    return Path(path)


def _first_file_component(path: Path) -> Path | None:
    """The first ancestor of `path` (or `path` itself) that exists and is not a folder, if any."""
    for part in reversed([path, *path.parents]):
        if part.exists() and not part.is_dir():
            return part
    return None


def check_dir_writable(folder: Path, what: str) -> None:
    """Refuse early a folder that could not be created or written (a file in its place, a read-only parent).

    Nothing is created. Use it at start-up on every rank, before minutes of loading, for folders written later.

    Raises:
        ConfigError: `folder` or one of its parents is a file, or the nearest existing ancestor is not writable.
    """
    folder = Path(folder)
    blocker = _first_file_component(folder)
    if blocker is not None:
        raise ConfigError(
            f"The {what} '{folder}' cannot be created: '{blocker}' is a file, not a folder. Choose another path, "
            "or move that file."
        )
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"The {what} '{folder}' cannot be written: '{existing}' is not writable (read-only file system or "
            "permissions). Choose a folder you can write to."
        )


def make_dirs(folder: Path, what: str) -> Path:
    """`folder.mkdir(parents=True, exist_ok=True)`, with a `ConfigError` naming the path when it cannot be made."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        blocker = _first_file_component(folder)
        if blocker is not None:
            raise ConfigError(
                f"Could not create the folder '{folder}' for the {what}: '{blocker}' is a file, not a folder. "
                "Choose another path, or move that file."
            ) from e
        raise write_error(folder, what, e) from e
    return folder


def _fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems (network mounts) do not support fsync on directories
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: Path, what: str, *, text: bool = False) -> Iterator[IO[Any]]:
    """Yield a file object; when the block ends without error, its content replaces `path` atomically.

    Args:
        path: the file to write (its folder is created if needed).
        what: what is being written, for error messages ("checkpoint", "run config").
        text: yield a UTF-8 text file instead of a binary one.

    Raises:
        ConfigError: the file could not be written (see `write_error`); the temporary file is removed.
    """
    path = Path(path)
    make_dirs(path.parent, what)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        # Mode 0o666 minus the umask, as `open()` gives; O_EXCL: never follow or reuse another writer's file.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w" if text else "wb", **({"encoding": "utf-8"} if text else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as e:
        raise write_error(path, what, e) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text_atomic(path: Path, content: str, what: str) -> Path:
    """Write `content` to `path` through `atomic_write`; return `path`."""
    with atomic_write(path, what, text=True) as f:
        f.write(content)
    return Path(path)


def write_json_atomic(path: Path, data: Any, what: str) -> Path:
    """Write `data` as indented JSON through `atomic_write`; return `path`."""
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n", what)


def looks_like_local_path(source: str) -> bool:
    """Whether a `--checkpoint` value can only be a local file or folder (a `.pt` file, an absolute, relative or
    home path, or more slashes than a Hub id's `org/name[/subfolder]`), so that a missing one is a typo to report
    before anything loads, rather than a Hub or registry id."""
    return source.endswith(".pt") or source.startswith(("/", ".", "~")) or source.count("/") > 2
