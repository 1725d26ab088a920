"""The data folder's lock (one manager, a server or a `train` command, uses a data folder at a time) and the
training processes a previous manager left behind."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import signal
from pathlib import Path
from typing import IO

from ..errors import DataFolderInUse
from .records import Attempt

log = logging.getLogger(__name__)

LOCK_FILE = "jobs.lock"
RUNNER_MODULE = "digits_memplugin.jobs.child.runner"
TESTER_MODULE = "digits_memplugin.jobs.child.tester"
"""The children an attempt runs: its runner, and with the test nets apart its testers (jobs.scheduling.apart_run)."""


def take_folder(data_dir: Path) -> IO[str]:
    """Hold the data folder (flock on its jobs.lock, which names this process) until the handle is closed;
    DataFolderInUse when another manager holds it."""
    handle = (data_dir / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        handle.close()
        if error.errno in (errno.EAGAIN, errno.EACCES):
            raise DataFolderInUse(f"another server or train command is using the data folder {data_dir}") from None
        raise
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def kill_leftover(attempt: Attempt, jobs_root: Path) -> None:
    """A runner or tester the previous server left (its death signal normally took it along): killed, never
    adopted. The attempt's handle names the child it started last."""
    if attempt.pid is None:
        return
    try:
        cmdline = Path(f"/proc/{attempt.pid}/cmdline").read_bytes().split(b"\0")
        cwd = Path(os.readlink(f"/proc/{attempt.pid}/cwd"))
    except OSError:
        return
    ours = RUNNER_MODULE.encode() in cmdline or TESTER_MODULE.encode() in cmdline
    if ours and cwd == (jobs_root / attempt.job_id).resolve():
        log.warning("killing training process %d left by a previous server (job %s)", attempt.pid, attempt.job_id)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(attempt.pid, signal.SIGKILL)
