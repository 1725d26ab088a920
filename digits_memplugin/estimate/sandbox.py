"""Confining a child process that runs Caffe on a net someone sent: it may read files, but not create, truncate,
write, delete, rename or re-mode any, open a socket, or start a program.

The pycaffe shape oracle's child (`pycaffe_shapes`) calls `confine()` once `import caffe` is done and before it
builds the net, in its own empty temporary folder. The nets it is given are sanitized already (`core.sanitize`: no
layer that opens a file, no path-bearing field); this is the second wall, for whatever a Caffe layer might open that
the sanitizer does not know of.

What works for any user, root included, with no privilege and no kernel option beyond seccomp (Linux 3.5+):

* a seccomp filter (``PR_SET_NO_NEW_PRIVS``, then ``seccomp(2)`` on every thread): open/openat with a write, create, truncate or
  append flag, creat, openat2, open_by_handle_at, truncate, ftruncate and every call that changes names or metadata
  (rename, link, unlink, mkdir, rmdir, mknod, chmod, chown, utime, xattrs, mount and its new API) fail with EACCES;
  so do socket, execve, ptrace, process_vm_writev, io_uring (its requests would bypass the filter), bpf, unshare,
  setns and the calls that change the machine (reboot, modules, clock, hostname, swap, keys). Root does not bypass
  a seccomp filter, and it is inherited by every thread Caffe starts.
* RLIMIT_FSIZE 0: a write to a regular file through a descriptor that was open before fails (EFBIG; Python ignores
  SIGXFSZ), so stdout and stderr must be pipes (`confine` checks). On its own it is not enough: it stops neither
  ``O_TRUNC`` nor creating an empty file, and truncating a file is what the issue's probe did with HDF5Output.
* RLIMIT_CORE 0: a Caffe CHECK failure (SIGABRT) leaves no core file.

Not used: Landlock (an allow-list of paths; needs Linux 5.13+ with its LSM enabled, not the case on every host;
the training child uses it where it is there, jobs.child.confinement, since it must write),
a mount namespace or chroot (need CAP_SYS_ADMIN or CAP_SYS_CHROOT, which a server need not have). Only x86_64 and
aarch64 have a syscall table here; elsewhere `confine` raises, and the child refuses to build the net.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import stat
import struct

# linux/filter.h, linux/seccomp.h, linux/audit.h
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_JSET_K = 0x45
_BPF_RET_K = 0x06
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_X32_SYSCALL_BIT = 0x40000000

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_TMPFILE", 0)
"""open flags that write, create or truncate (O_TMPFILE creates an unnamed file that linkat could name)."""

# Syscall numbers: arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h.
_SECCOMP = {"x86_64": 317, "aarch64": 277}
_OPEN = {"x86_64": {"open": 2, "openat": 257}, "aarch64": {"openat": 56}}
"""The calls that open a file, by number; their flags are argument 1 (open) or 2 (openat)."""
_SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    # machine: (AUDIT_ARCH_*, {denied call: number})
    "x86_64": (
        0xC000003E,
        {
            "creat": 85, "truncate": 76, "ftruncate": 77, "rename": 82, "mkdir": 83, "rmdir": 84, "link": 86,
            "unlink": 87, "symlink": 88, "chmod": 90, "fchmod": 91, "chown": 92, "fchown": 93, "lchown": 94,
            "utime": 132, "mknod": 133, "utimes": 235, "mkdirat": 258, "mknodat": 259, "fchownat": 260,
            "futimesat": 261, "unlinkat": 263, "renameat": 264, "linkat": 265, "symlinkat": 266, "fchmodat": 268,
            "utimensat": 280, "renameat2": 316, "fchmodat2": 452, "openat2": 437, "open_by_handle_at": 304,
            "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
            "fremovexattr": 199, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428,
            "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
            "socket": 41, "socketpair": 53, "execve": 59, "execveat": 322, "ptrace": 101, "process_vm_writev": 311,
            "pidfd_getfd": 438, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
            "perf_event_open": 298, "unshare": 272, "setns": 308, "acct": 163, "settimeofday": 164,
            "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305, "swapon": 167, "swapoff": 168,
            "reboot": 169, "sethostname": 170, "setdomainname": 171, "init_module": 175, "finit_module": 313,
            "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "syslog": 103, "iopl": 172,
            "ioperm": 173, "add_key": 248, "request_key": 249, "keyctl": 250,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "truncate": 45, "ftruncate": 46, "mknodat": 33, "mkdirat": 34, "unlinkat": 35, "symlinkat": 36,
            "linkat": 37, "renameat": 38, "renameat2": 276, "fchmod": 52, "fchmodat": 53, "fchmodat2": 452,
            "fchownat": 54, "fchown": 55, "utimensat": 88, "openat2": 437, "open_by_handle_at": 265,
            "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
            "fremovexattr": 16, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428,
            "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
            "socket": 198, "socketpair": 199, "execve": 221, "execveat": 281, "ptrace": 117,
            "process_vm_writev": 271, "pidfd_getfd": 438, "io_uring_setup": 425, "io_uring_enter": 426,
            "io_uring_register": 427, "bpf": 280, "perf_event_open": 241, "unshare": 97, "setns": 268, "acct": 89,
            "settimeofday": 170, "clock_settime": 112, "adjtimex": 171, "clock_adjtime": 266, "swapon": 224,
            "swapoff": 225, "reboot": 142, "sethostname": 161, "setdomainname": 162, "init_module": 105,
            "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "syslog": 116,
            "add_key": 217, "request_key": 218, "keyctl": 219,
        },
    ),
}


class ConfinementError(OSError):
    """The process could not be confined (an architecture without a table, or a kernel that refused the filter)."""


def _filter(machine: str) -> bytes:
    """The seccomp BPF program for `machine`: struct sock_filter entries (u16 code, u8 jt, u8 jf, u32 k)."""
    arch, denied = _SYSCALLS[machine]
    # Jump targets are "allow", "deny" or a relative offset; resolved once the program's length is known.
    program: list[tuple[int, int | str, int | str, int]] = [
        (_BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_BPF_JEQ_K, 0, "deny", arch),  # another ABI (32-bit calls on a 64-bit kernel) has other numbers
        (_BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        program.append((_BPF_JGE_K, "deny", 0, _X32_SYSCALL_BIT))
    for number in sorted(set(denied.values())):
        program.append((_BPF_JEQ_K, "deny", 0, number))
    for name, number in _OPEN[machine].items():
        argument = 1 if name == "open" else 2
        program.append((_BPF_JEQ_K, 0, 2, number))
        program.append((_BPF_LD_W_ABS, 0, 0, 16 + 8 * argument))  # the low half of seccomp_data.args[argument]
        program.append((_BPF_JSET_K, "deny", "allow", _WRITE_FLAGS))
    allow, deny = len(program), len(program) + 1
    program.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    program.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EACCES))

    def target(index: int, jump: int | str) -> int:
        if isinstance(jump, int):
            return jump
        offset = (allow if jump == "allow" else deny) - index - 1
        assert 0 <= offset <= 255, "a BPF jump reaches 255 instructions at most"
        return offset

    return b"".join(
        struct.pack("HBBI", code, target(index, jt), target(index, jf), k)
        for index, (code, jt, jf, k) in enumerate(program)
    )


def confine() -> None:
    """Confine this process (and the threads it starts later) for good: see the module's docstring. Raises
    ConfinementError when it cannot, so that the caller refuses to go on unconfined."""
    machine = platform.machine()
    if machine not in _SYSCALLS:
        raise ConfinementError(errno.ENOSYS, f"no seccomp syscall table for this machine ({machine})")
    for fd in (1, 2):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            # RLIMIT_FSIZE 0 would make every message written there fail (EFBIG), the child's errors with them.
            raise ConfinementError(errno.EINVAL, f"descriptor {fd} is a file: a confined child writes to pipes only")
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    program = _filter(machine)
    buffer = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise ConfinementError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    # seccomp(2) with TSYNC rather than prctl(PR_SET_SECCOMP): the filter reaches every thread already running
    # (a BLAS library may have started its pool when numpy was imported), not only the calling one.
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(
        ctypes.c_long(_SECCOMP[machine]), ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
        ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(fprog),
    ) != 0:
        raise ConfinementError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")
