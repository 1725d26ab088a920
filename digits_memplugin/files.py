"""Reading the net files a solver names, confined to one folder.

Caffe opens a solver's `net:`, `train_net:` and `test_net:` paths relative to its working directory, which DIGITS
sets to the job's folder. A server that estimates uploaded or stored jobs must not let a definition read anything
else: `net: "../../etc/passwd"`, an absolute path, a symlink pointing out of the folder, a FIFO that blocks the
reader or a file of gigabytes. `confined_loader` gives the core's `training_definition` a `load` callback that
reads only regular UTF-8 files of bounded size inside one folder, and refuses everything else with a NetError.

The check is done on the fully resolved path, and the file is then opened one component at a time with
O_NOFOLLOW from the folder's own descriptor, so a symlink swapped in between the check and the open is refused
too instead of being followed.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from .core.errors import NetError
from .core.prototxt import DEFAULT_LIMITS

Loader = Callable[[str], tuple[str, str]]
"""The same shape as core.training.Loader: path named by the solver -> (text, source name for messages)."""

_READ_CHUNK = 1 << 16


def confined_loader(base_dir: Path | str, *, max_bytes: int = DEFAULT_LIMITS.max_bytes) -> Loader:
    """A loader that resolves solver paths against `base_dir` (the solver's folder) and reads only inside it.

    The source name it returns is the file's path relative to the folder, which is what messages should show.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive integer, got {max_bytes!r}")
    base = Path(base_dir)

    def load(path: str) -> tuple[str, str]:
        return _load(base, path, max_bytes)

    return load


def _load(base: Path, path: str, max_bytes: int) -> tuple[str, str]:
    if not isinstance(path, str) or not path:
        raise NetError(f"names no file ({path!r})")
    if "\x00" in path:
        raise NetError(f"file name {path!r} contains a NUL character")
    try:
        root = base.resolve(strict=True)
    except (OSError, RuntimeError) as error:
        raise NetError(f"cannot read {path!r}: the solver's folder is not available ({_reason(error)})") from None
    if not root.is_dir():
        raise NetError(f"cannot read {path!r}: the solver's folder is not a folder")
    try:
        # realpath follows every symlink that exists; what is left must still lie inside the folder.
        target = Path(os.path.realpath(root / path))
    except (OSError, ValueError) as error:
        raise NetError(f"cannot read {path!r}: {_reason(error)}") from None
    if target == root:
        raise NetError(f"{path!r} is not a regular file (it is the solver's folder)")
    if not target.is_relative_to(root):
        raise NetError(
            f"{path!r} is outside the solver's folder; a solver may only name files inside the folder it is in"
        )
    relative = PurePosixPath(*target.relative_to(root).parts)
    data = _read_confined(root, relative, path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise NetError(f"{path!r} is not UTF-8 text (line {line}, byte {error.start})") from None
    return text, str(relative)


def _read_confined(root: Path, relative: PurePosixPath, path: str, max_bytes: int) -> bytes:
    """Open `relative` under `root` without following any symlink, then read at most max_bytes of a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    directory = flags | getattr(os, "O_DIRECTORY", 0)
    fds: list[int] = []
    component = ""
    try:
        fds.append(os.open(root, directory))
        *folders, name = relative.parts
        for component in folders:
            fds.append(os.open(component, directory, dir_fd=fds[-1]))
        component = name
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fds.append(os.open(name, flags | getattr(os, "O_NONBLOCK", 0), dir_fd=fds[-1]))
        return _read_regular(fds[-1], path, max_bytes)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR) and fds and _is_symlink(component, fds[-1]):
            raise NetError(f"{path!r} changed while it was read (a symlink appeared); not read") from None
        if error.errno == errno.ENOENT:
            raise NetError(f"{path!r} does not exist in the solver's folder") from None
        raise NetError(f"cannot read {path!r}: {_reason(error)}") from None
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _read_regular(fd: int, path: str, max_bytes: int) -> bytes:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise NetError(f"{path!r} is not a regular file")
    if info.st_size > max_bytes:
        raise NetError(f"{path!r} is {info.st_size} bytes; the limit is {max_bytes}")
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes:
        chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > max_bytes:
        raise NetError(f"{path!r} grew past {max_bytes} bytes while it was read; the limit is {max_bytes}")
    return b"".join(chunks)


def _reason(error: BaseException) -> str:
    """An OS error's reason without the absolute path it names (messages go to web users)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return str(error)
