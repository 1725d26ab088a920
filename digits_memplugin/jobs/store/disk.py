"""The disk under the data folder: whether an error means it is full, what is free on it, what a folder takes."""

from __future__ import annotations

import contextlib
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


def remove_folder(path: Path) -> None:
    """`path` and everything in it removed, links not followed, errors ignored; iterative, where shutil.rmtree
    (Python 3.11) recurses once per level and dies of RecursionError on a deep tree, leaving it all behind."""
    folders: list[tuple[Path, bool]] = [(path, False)]
    while folders:
        folder, emptied = folders.pop()
        if emptied:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
            continue
        try:
            entries = os.scandir(folder)
        except NotADirectoryError:
            _unlink(folder)
            continue
        except OSError:
            continue
        folders.append((folder, True))
        with entries:
            for entry in entries:
                try:
                    is_folder = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_folder = False
                if is_folder:
                    folders.append((Path(entry.path), False))
                else:
                    _unlink(Path(entry.path))


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


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
