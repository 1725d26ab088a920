"""The disk under the data folder: whether an error means it is full, what is free on it, what a folder takes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ...core.sizes import format_size

LOW_DISK_BYTES = 1 << 20
"""Less than this free on the job folder's disk when an attempt failed: the disk is said to be full."""


def disk_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still put on the disk holding `path`."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def free_note(path: Path) -> str:
    free = free_bytes(path)
    return "free space unknown" if free is None else f"{format_size(free)} free"


def folder_bytes(path: Path) -> int:
    """What a folder takes on its disk, as du counts it: every file and folder in it, links not followed."""
    total = 0
    folders = [path]
    while folders:
        try:
            entries = os.scandir(folders.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
                except OSError:
                    continue
    return total
