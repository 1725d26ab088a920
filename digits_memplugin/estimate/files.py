"""Reading the net files a solver names, confined to one folder.

Caffe opens a solver's `net:`, `train_net:` and `test_net:` paths relative to its working directory, which DIGITS
sets to the job's folder. A server that estimates uploaded or stored jobs must not let a definition read anything
else: `net: "../../etc/passwd"`, an absolute path, a symlink pointing out of the folder, a FIFO that blocks the
reader or a file of gigabytes. `confined_loader` gives the core's `training_definition` a `load` callback that
reads only regular UTF-8 files of bounded size inside one folder, and refuses everything else with a NetError.

The check is done on the fully resolved path, and the file is then opened one component at a time with
O_NOFOLLOW from the folder's own descriptor, so a symlink swapped in between the check and the open is refused
too instead of being followed.

`open_regular` is the same promise for the data files the server itself reads (an LMDB's data file, HDF5 files,
list files): a descriptor of a regular file inside the dataset roots, or a NetError. Both take the file with
O_PATH first, which opens nothing: opening a FIFO, even without blocking, is an open its writer sees (and a
blocking one stops the server), and opening a device acts on the device. Only a handle that fstat calls a regular
file is then opened for reading, through /proc/self/fd, so the file read is the very file checked.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from ..core.errors import NetError
from ..core.prototxt import DEFAULT_LIMITS

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
    fd = open_confined(root, relative, path)
    try:
        return _read_regular(fd, path, max_bytes)
    finally:
        os.close(fd)


def open_confined(root: Path, relative: PurePosixPath, path: str | None = None, *, where: str = "the solver's folder") -> int:
    """A read-only descriptor of the regular file `relative` names under `root`, opened one component at a time
    from `root`'s own descriptor with O_NOFOLLOW: a link anywhere on the way (a folder or the file itself, swapped
    in at any time) is refused, never followed, and a FIFO or device is never opened. The caller closes it.
    Refusals are NetErrors naming `path` (default: `relative`) and `where` it was looked for."""
    shown = path if path is not None else str(relative)
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
        handle = _handle(name, fds[-1])
        fds.append(handle)
        mode = os.fstat(handle).st_mode
        if stat.S_ISLNK(mode):  # O_PATH | O_NOFOLLOW takes a link itself rather than failing
            raise NetError(f"{shown!r} changed while it was read (a symlink appeared); not read")
        if not stat.S_ISREG(mode):
            raise NetError(f"{shown!r} is not a regular file")
        return _reopen(handle)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR) and fds and _is_symlink(component, fds[-1]):
            raise NetError(f"{shown!r} changed while it was read (a symlink appeared); not read") from None
        if error.errno == errno.ENOENT:
            raise NetError(f"{shown!r} does not exist in {where}") from None
        raise NetError(f"cannot read {shown!r}: {_reason(error)}") from None
    finally:
        for fd in reversed(fds):
            os.close(fd)


_O_PATH = getattr(os, "O_PATH", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _handle(path: str, dir_fd: int | None = None) -> int:
    """A descriptor naming `path` (its last component not followed) that has opened nothing: O_PATH. Where O_PATH
    is missing (not Linux), a non-blocking read-only open, so that at least a FIFO does not wait for a writer."""
    flags = _NOFOLLOW | (_O_PATH or os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    return os.open(path, flags, dir_fd=dir_fd)


def _reopen(handle: int) -> int:
    """The file behind an O_PATH handle, opened for reading (the same inode, whatever its path names now)."""
    if not _O_PATH:
        return os.dup(handle)
    return os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages: "a FIFO", "a folder"..."""
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def inside(path: Path | str, roots: Iterable[Path]) -> bool:
    """Whether the resolved `path` is one of `roots` (resolved) or lies under one."""
    target = Path(path)
    return any(target == root or target.is_relative_to(root) for root in roots)


def open_regular(
    path: Path | str, *, name: str | None = None, roots: Iterable[Path] | None = None, **where: Any
) -> int:
    """A read-only descriptor of the regular file `path` names, links followed; the caller closes it.

    With `roots` (resolved folders), the file must lie inside one of them, as the kernel names the opened handle:
    a folder on the path swapped for a link after the check is caught, not followed out. A FIFO, a device, a
    socket or a folder is refused without being opened. Refusals are NetErrors naming the path as `name` (default:
    `path`) with `where` (layer, field...) and never the target of a link.
    """
    shown = name or str(path)
    allowed = None if roots is None else [Path(root) for root in roots]
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError) as error:
        raise NetError(f"cannot read {shown}: {_reason(error)}", **where) from None
    if allowed is not None and not inside(real, allowed):
        raise NetError(f"{shown} is outside the dataset folders this server may read", **where)
    try:
        handle = _handle(real)
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise NetError(f"{shown} does not exist", **where) from None
        if error.errno == errno.ELOOP:
            raise NetError(f"{shown} changed while it was opened (a link appeared); not read", **where) from None
        raise NetError(f"cannot read {shown}: {_reason(error)}", **where) from None
    try:
        mode = os.fstat(handle).st_mode
        if stat.S_ISLNK(mode):  # resolved a moment ago: a link swapped in since (O_PATH takes the link itself)
            raise NetError(f"{shown} changed while it was opened (a link appeared); not read", **where)
        if not stat.S_ISREG(mode):
            raise NetError(f"{shown} is not a regular file ({file_kind(mode)}); not read", **where)
        if allowed is not None and _O_PATH:
            opened = os.readlink(f"/proc/self/fd/{handle}")
            if not inside(opened, allowed):
                raise NetError(f"{shown} is outside the dataset folders this server may read", **where)
        return _reopen(handle)
    except OSError as error:
        raise NetError(f"cannot read {shown}: {_reason(error)}", **where) from None
    finally:
        os.close(handle)


def read_regular(
    path: Path | str, max_bytes: int, *, name: str | None = None, roots: Iterable[Path] | None = None, **where: Any
) -> bytes:
    """The bytes of the regular file `path` (see open_regular), at most max_bytes (more is a NetError)."""
    shown = name or str(path)
    fd = open_regular(path, name=shown, roots=roots, **where)
    try:
        return _read_regular(fd, shown, max_bytes, quote=False, **where)
    finally:
        os.close(fd)


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _read_regular(fd: int, path: str, max_bytes: int, *, quote: bool = True, **where: Any) -> bytes:
    shown = repr(path) if quote else path
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise NetError(f"{shown} is not a regular file", **where)
    if info.st_size > max_bytes:
        raise NetError(f"{shown} is {info.st_size} bytes; the limit is {max_bytes}", **where)
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes:
        chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > max_bytes:
        raise NetError(f"{shown} grew past {max_bytes} bytes while it was read; the limit is {max_bytes}", **where)
    return b"".join(chunks)


def _reason(error: BaseException) -> str:
    """An OS error's reason without the absolute path it names (messages go to web users)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return str(error)
