"""Landlock, the Linux security module that lets an unprivileged process shut itself (and everything it later
forks or execs) out of every file it was not granted: an allow-list of folders and files, each with what may be
done beneath it (read, write, create, execute...). The kernel checks each open against the real file, after links
are resolved, so a link cannot lead a confined process anywhere it was not granted.

The standard library and ctypes only, as `sandbox.py` (seccomp) is: the three system calls are small and fixed,
and the one Python binding on PyPI (`landlock`) is a pre-release that knows fewer ABI versions than this kernel has.
`jobs.child.confinement` says what a training attempt is granted; this module only speaks to the kernel.

* `abi()`: the Landlock ABI version the running kernel offers (0: none, with the reason in `unavailable()`).
  Linux 5.13 brought ABI 1 (files), 5.19 ABI 2 (renaming and linking across folders), 6.2 ABI 3 (truncation),
  6.7 ABI 4 (TCP bind/connect), 6.10 ABI 5 (device ioctls), 6.12 ABI 6 (abstract Unix sockets and signals
  scoped), 6.15 ABI 7 (audit logging).
* `Ruleset`: every right the ABI knows is handled (denied unless a rule grants it); `allow(path, rights)` grants
  rights beneath a folder or on a file; `restrict()` enforces the rules on the calling thread for good (and on
  the threads and processes it starts from then on). Threads already running are not confined: restrict before
  starting any.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterable

# include/uapi/asm-generic/unistd.h: the same numbers on every architecture (added after the tables merged).
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# include/uapi/linux/landlock.h: file system rights, and the ABI that brought each.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The rights a rule on a file (not a folder) may carry; the kernel refuses the others there."""
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
# Network (ABI 4) and scopes (ABI 6): handled without a rule, so denied outright.
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

READ = READ_FILE | READ_DIR
WRITE = WRITE_FILE | TRUNCATE | MAKE_REG | MAKE_DIR
"""Write, truncate and create files and folders: what Caffe does with snapshots, outputs and LMDB lock files.
Never removing, renaming across folders, or making links, FIFOs, sockets or device nodes."""


class LandlockError(OSError):
    """Landlock is missing, or the kernel refused a rule or the restriction."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _abi() -> tuple[int, str]:
    try:
        libc = _libc()
    except OSError as error:  # pragma: no cover - glibc is always there on Linux
        return 0, f"the C library cannot be loaded: {error}"
    version = libc.syscall(ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if version >= 1:
        return int(version), ""
    code = ctypes.get_errno()
    if code == errno.ENOSYS:
        return 0, "this kernel has no Landlock (Linux 5.13 or later, built with CONFIG_SECURITY_LANDLOCK)"
    if code == errno.EOPNOTSUPP:
        return 0, "Landlock is built into this kernel but not enabled (add landlock to the lsm= boot parameter)"
    return 0, f"Landlock cannot be used here: {os.strerror(code)}"


def abi() -> int:
    """The Landlock ABI version this kernel offers; 0 when it has none."""
    return _abi()[0]


def unavailable() -> str:
    """Why Landlock cannot be used here ("" when it can)."""
    return _abi()[1]


def fs_rights(version: int) -> int:
    """Every file system right ABI `version` knows (what a ruleset built for it handles)."""
    return _FS_BY_ABI.get(version, _FS_BY_ABI[5]) if version >= 1 else 0


class Ruleset:
    """An allow-list being built: rights handled per the kernel's ABI, rules added with `allow`, then `restrict`."""

    def __init__(self, version: int | None = None) -> None:
        found, reason = _abi()
        self.abi = found if version is None else min(version, found)
        if self.abi < 1:
            raise LandlockError(errno.ENOSYS, reason or "Landlock is not available")
        self.handled = fs_rights(self.abi)
        net = NET_BIND_TCP | NET_CONNECT_TCP if self.abi >= 4 else 0
        scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if self.abi >= 6 else 0
        # struct landlock_ruleset_attr grew with the ABI: handled_access_fs (1), handled_access_net (4), scoped (6).
        fields = [self.handled] + ([net] if self.abi >= 4 else []) + ([scoped] if self.abi >= 6 else [])
        attr = struct.pack(f"{len(fields)}Q", *fields)
        self._libc = _libc()
        fd = self._libc.syscall(
            ctypes.c_long(_CREATE_RULESET), ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)
        )
        if fd < 0:
            code = ctypes.get_errno()
            raise LandlockError(code, f"landlock_create_ruleset: {os.strerror(code)}")
        self.fd = int(fd)
        self.rules = 0

    def allow_fd(self, fd: int, rights: int, *, is_dir: bool) -> None:
        """Grant `rights` beneath the folder (or on the file) that `fd` (an O_PATH descriptor is enough) is."""
        rights &= self.handled if is_dir else self.handled & FILE_RIGHTS
        if not rights:
            return
        attr = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr is packed
        if self._libc.syscall(
            ctypes.c_long(_ADD_RULE), ctypes.c_int(self.fd), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.c_char_p(attr),
            ctypes.c_uint32(0),
        ) != 0:
            code = ctypes.get_errno()
            raise LandlockError(code, f"landlock_add_rule: {os.strerror(code)}")
        self.rules += 1

    def allow(self, path: str | os.PathLike[str], rights: int) -> bool:
        """Grant `rights` beneath `path` (links followed: for trusted paths such as the interpreter's own); False
        when it does not exist."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            self.allow_fd(fd, rights, is_dir=os.path.isdir(f"/proc/self/fd/{fd}"))
        finally:
            os.close(fd)
        return True

    def allow_all(self, paths: Iterable[str | os.PathLike[str]], rights: int) -> None:
        for path in paths:
            self.allow(path, rights)

    def restrict(self) -> None:
        """Enforce the rules on this thread, and everything it starts from now on, for good."""
        if self._libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            code = ctypes.get_errno()
            raise LandlockError(code, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(code)}")
        if self._libc.syscall(ctypes.c_long(_RESTRICT_SELF), ctypes.c_int(self.fd), ctypes.c_uint32(0)) != 0:
            code = ctypes.get_errno()
            raise LandlockError(code, f"landlock_restrict_self: {os.strerror(code)}")
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Ruleset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "EXECUTE", "FILE_RIGHTS", "IOCTL_DEV", "MAKE_DIR", "MAKE_REG", "MAKE_SYM", "READ", "READ_DIR", "READ_FILE",
    "REFER", "TRUNCATE", "WRITE", "WRITE_FILE", "LandlockError", "Ruleset", "abi", "fs_rights", "unavailable",
]
