"""How a script ends on a user mistake: one paragraph on stderr (once per node), exit code 2, no traceback, and
the message recorded for torchrun's failure summary; a bug keeps its traceback and is recorded the same way.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import ParamSpec

from prismatic.util.errors import ConfigError, RankError
from prismatic.util.openmp import prefer_passive_openmp_waits

P = ParamSpec("P")

USAGE_ERROR = 2  # exit code of a user mistake (argparse's convention)
NONZERO_RANK_EXIT_DELAY_S = 10.0  # how long a non-zero local rank lingers after a user error (see below)


def one_paragraph(message: str) -> str:
    """`message` with every run of whitespace (newlines included) as one space."""
    return " ".join(message.split())


def record_error_for_torchrun(message: str, details: str) -> None:
    """Write the error file torchrun's agent reads for its failure summary (`TORCHELASTIC_ERROR_FILE`, set only
    under torchrun), in the format of torch's `ErrorHandler.record_exception`; `details` is what the summary
    shows as the rank's "traceback". Written without importing torch, so a fast failure stays fast."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    extra = {"py_callstack": details, "timestamp": str(int(time.time()))}
    try:
        with open(path, "w") as f:
            json.dump({"message": {"message": message, "extraInfo": extra}}, f)
    except OSError:
        pass  # the summary then says less; the message itself was already printed


def report_user_error(error: ConfigError) -> None:
    """Print `error` as `error: <one paragraph>` on stderr, once per node (local rank 0; every rank of a torchrun
    job meets the same config error) or, for a `RankError`, on the rank that met it, and record it on every rank
    for torchrun's failure summary."""
    message = one_paragraph(str(error))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    own = isinstance(error, RankError)
    if local_rank == 0 or own:
        print(f"error: {message}", file=sys.stderr, flush=True)
    record_error_for_torchrun(f"{type(error).__name__}: {message}", f"error: {message}")
    if local_rank != 0 and not own:
        # torchrun stops every rank as soon as one exits: a rank that met the mistake first (a loaded machine)
        # would otherwise end the job before local rank 0 has printed it. Rank 0's exit ends this wait.
        time.sleep(NONZERO_RANK_EXIT_DELAY_S)


def entry_point(main: Callable[P, int | None]) -> Callable[P, int]:
    """Decorate a script's `main`: a `ConfigError` becomes one paragraph on stderr and `SystemExit(2)` without a
    traceback; any other exception (a bug) is recorded for torchrun, like torch's `@record`, and keeps its
    traceback. Returns `main`'s exit code (0 for None). Before `main`, torch's CPU thread team is told to sleep
    when idle (`prefer_passive_openmp_waits`: its spinning stalled CPU training), while torch is not loaded yet."""

    @functools.wraps(main)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> int:
        prefer_passive_openmp_waits()
        try:
            code = main(*args, **kwargs)
        except ConfigError as error:
            report_user_error(error)
            raise SystemExit(USAGE_ERROR) from None
        except Exception as error:
            record_error_for_torchrun(f"{type(error).__name__}: {error}", traceback.format_exc())
            raise
        return 0 if code is None else code

    return wrapper
