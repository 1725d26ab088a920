"""What a training attempt may open, enforced by the kernel: `confine_attempt(job_folder, read_roots, write_roots)`.

The server checks every path a job names when it is submitted and again when each attempt starts
(jobs.definition.confiner, jobs.definition.recheck), but Caffe opens files all through training: HDF5Data opens each file of its list again whenever it moves on to it,
ImageData opens every image, the HDF5 library follows a dataset's external storage and external links, and
HDF5Output creates its file by name, following any link on the way. A check made before cannot hold for an open
made later. So the training child confines itself with Landlock (digits_memplugin.confine.landlock) before it loads Caffe:
from then on the kernel refuses, with EACCES, every open outside

* reading: the job's folder (its generated nets, list files, snapshots to resume from), the dataset paths the job
  was checked to read (`read_roots`: each LMDB data file, HDF5 file, mean file, the folders of its images), and
  what the interpreter, pycaffe and the BLAS need (the Python prefix and sys.path, /usr and /lib, a few files of
  /etc, /proc/self, the CPU's description in /sys and /proc, /dev/null and /dev/urandom; on a GPU its /dev/nvidia*
  nodes, /proc/driver/nvidia and /sys);
* writing (write, truncate, create files and folders; never remove, rename across folders or make links):
  `write_roots`, folders beneath the job's folder (its outputs, snapshots, the attempt's own folder, the LMDB
  folders where Caffe's LMDB keeps its lock table).

Landlock checks each open against the real file, once links are resolved: a link in the job's folder to a
dataset's data file (the attempt's own LMDB folders hold such links) can be read through but never written
through, and a dataset file swapped for a link out of the granted paths cannot be opened at all. TCP bind and
connect, abstract Unix sockets and signals to processes outside are refused too where the ABI knows them. The
confinement is inherited by every thread and process started after it, so a runner that execs the `caffe` binary
can call this first and the binary is confined as well (grant the binary with `executables`).

Where the kernel has no Landlock (before Linux 5.13, or the LSM not enabled), `confine_attempt` confines nothing
and says so in the `Confinement` it returns (the runner puts it in its "started" record and in caffe.log): the
server's own checks then are the only wall (docs/security.md says what then holds).
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ...confine import landlock
from ...confine.landlock import EXECUTE, IOCTL_DEV, READ, READ_FILE, WRITE, WRITE_FILE, LandlockError, Ruleset

SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
"""Shared libraries, the dynamic loader and the interpreter's own files: read and execute (a runner may exec)."""
ETC_READ = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/locale.alias",
            "/etc/ssl/openssl.cnf")
"""Only these files of /etc: the loader's cache, the time zone (glog's timestamps), locale aliases and OpenSSL's
defaults (hashlib, imported by numpy). Not /etc/passwd: glog then calls the user "invalid-user", which no log
line shows (every readable file is one a dataset's HDF5 external storage could copy into the training data)."""
PROC_READ = ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys/vm/overcommit_memory")
PROC_SELF_READ = ("status",)
"""Of the process's own /proc folder, only what the runner reads (VmData): not environ, cmdline or fd/."""
SYS_READ = ("/sys/devices/system/cpu", "/sys/devices/system/node", "/sys/fs/cgroup")
"""The CPU's topology and the cgroup's limits (OpenBLAS, OpenMP and glibc count the cores from them)."""
DEV_READ_WRITE = ("/dev/null",)
DEV_READ = ("/dev/zero", "/dev/urandom", "/dev/random")
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia-caps")
GPU_READ = ("/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices", "/sys/module/nvidia")
"""What the CUDA driver reads besides its device nodes (the PCI topology, the driver's parameters). Not tried on a
GPU here: this machine has none, and its pycaffe is CPU-only."""


class ConfinementError(OSError):
    """The attempt could not be confined as it must be (a write folder that is a link, a dataset path that became
    one, a thread already running, a rule the kernel refused): the runner trains nothing."""

    def __str__(self) -> str:  # the sentence alone, not "[Errno 40] ...": it is the attempt's message
        return str(self.strerror or super().__str__())


@dataclasses.dataclass(frozen=True)
class Confinement:
    """What `confine_attempt` did: what the runner reports in its "started" record."""

    confined: bool
    landlock_abi: int
    """The kernel's Landlock ABI version (0: none)."""
    reason: str | None = None
    """Why nothing is confined, where it is not."""
    rules: int = 0
    writes: tuple[str, ...] = ()
    """The folders writable (relative to the job's folder)."""
    reads: int = 0
    """How many dataset paths were granted for reading (besides the job's folder and the runtime's)."""

    def to_dict(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"confined": self.confined, "landlock_abi": self.landlock_abi}
        if self.confined:
            fields.update(rules=self.rules, writes=list(self.writes), reads=self.reads)
        else:
            fields["reason"] = self.reason
        return fields


def confine_attempt(
    job_folder: str | os.PathLike[str],
    read_roots: Iterable[str | os.PathLike[str]],
    write_roots: Iterable[str | os.PathLike[str]],
    *,
    gpu: bool = False,
    executables: Iterable[str | os.PathLike[str]] = (),
) -> Confinement:
    """Confine this process for good to reading `job_folder`, `read_roots` and the runtime's files, and writing
    beneath `write_roots` (see the module's docstring). Call it before any thread starts (Landlock confines the
    calling thread and what it starts later, not threads already running) and before Caffe is loaded.

    `write_roots` are folders beneath `job_folder` (relative to it, or absolute and lexically inside it); each is
    opened from the job's folder one component at a time without following a link, so a link planted there is a
    ConfinementError, never a grant on its target. A missing one is skipped (nothing can be created in its place).
    `read_roots` are absolute real paths (files or folders), opened the same way from /: a path that became a link
    is a ConfinementError; a missing one is skipped (Caffe says what it could not open). `gpu` grants the NVIDIA
    device nodes. `executables` are what a runner that execs `caffe` adds: the binary and the folders of its own
    libraries, read and executed, links followed (the server's own paths, never a job's).

    Returns what was done; `confined` is False, with the reason, where the kernel has no Landlock. Raises
    ConfinementError where Landlock is there but the confinement cannot be made as asked."""
    version = landlock.abi()
    if version < 1:
        return Confinement(False, 0, landlock.unavailable())
    threads = _threads()
    if threads > 1:
        raise ConfinementError(
            errno.EBUSY, f"{threads} threads already run in this process; confine it before starting any (Landlock "
            "confines the calling thread and what it starts, not threads already running)",
        )
    folder = os.path.abspath(job_folder)
    try:
        with Ruleset() as rules:
            _runtime(rules, gpu, folder)
            rules.allow_all(executables, READ | EXECUTE)
            folder_fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                rules.allow_fd(folder_fd, READ, is_dir=True)
                writes = []
                for root in write_roots:
                    relative = _beneath(folder, root)
                    fd = _open_nofollow(folder_fd, relative, directory=True, what="write folder")
                    if fd is None:
                        continue
                    try:
                        rules.allow_fd(fd, READ | WRITE, is_dir=True)
                    finally:
                        os.close(fd)
                    writes.append(relative)
            finally:
                os.close(folder_fd)
            reads = 0
            for path in read_roots:
                reads += _allow_read(rules, os.fspath(path))
            count = rules.rules
            rules.restrict()
    except LandlockError as error:
        raise ConfinementError(error.errno or errno.EPERM, f"the attempt could not be confined: {error.strerror}") from None
    return Confinement(True, version, None, count, tuple(writes), reads)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # pragma: no cover - /proc is always there on Linux
        return 1


def _runtime(rules: Ruleset, gpu: bool, folder: str) -> None:
    """What the interpreter, pycaffe and the BLAS read after the confinement (imports, the loader, CPU counts).
    No sys.path entry that is the job's folder (`python -m` puts it first), lies in it or holds it: the job's
    folder is read, never executed, and a folder above it would grant the other jobs and perhaps the datasets."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    package = Path(__file__).resolve().parents[2]  # the package root, from jobs/child/; an editable install's package is outside site-packages
    paths = {p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)} | prefixes | {str(package)}
    job = Path(folder).resolve()
    paths = {p for p in paths if not _related(Path(p).resolve(), job)}
    rules.allow_all(sorted(paths), READ | EXECUTE)
    rules.allow_all(SYSTEM_READ, READ | EXECUTE)
    rules.allow_all(ETC_READ + PROC_READ + SYS_READ, READ)
    rules.allow_all((f"/proc/{os.getpid()}/{name}" for name in PROC_SELF_READ), READ_FILE)  # /proc/self leads here
    rules.allow_all(DEV_READ_WRITE, READ_FILE | WRITE_FILE)
    rules.allow_all(DEV_READ, READ_FILE)
    if gpu:
        nodes = [*GPU_DEVICES, *sorted(glob.glob("/dev/nvidia[0-9]*"))]
        rules.allow_all(nodes, READ | WRITE_FILE | IOCTL_DEV)
        rules.allow_all(GPU_READ, READ)


def _related(path: Path, job: Path) -> bool:
    """Whether `path` is the job's folder, lies in it, or holds it."""
    return path == job or path in job.parents or job in path.parents


def _beneath(folder: str, root: str | os.PathLike[str]) -> str:
    """A write folder as a path relative to the job's folder, lexically inside it."""
    path = os.path.normpath(os.path.join(folder, root))
    relative = os.path.relpath(path, folder)
    if relative == os.curdir or relative.startswith(os.pardir + os.sep) or relative == os.pardir:
        raise ConfinementError(errno.EINVAL, f"{root} is not a folder beneath the job's folder; not made writable")
    return relative


def _open_nofollow(start: int, relative: str, *, directory: bool, what: str, base: str = "") -> int | None:
    """An O_PATH descriptor of `relative` beneath the folder `start` (`base` names it in messages), opened a
    component at a time without following a link; None when it does not exist; ConfinementError when a link or a
    non-folder stands on it."""
    fd = os.dup(start)
    parts = [part for part in relative.split(os.sep) if part]
    whole = base + "/".join(parts)

    def where(index: int) -> str:
        reached = base + "/".join(parts[: index + 1])
        return reached if reached == whole else f"{whole}: {reached}"

    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            if part == os.pardir:
                raise ConfinementError(errno.EINVAL, f"{whole}: '..' in a {what}'s path")
            try:
                child = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                return None
            os.close(fd)
            fd = child
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                raise ConfinementError(errno.ELOOP, f"{where(index)} is a link; a {what} is never reached through a "
                                       "link, so this attempt trains nothing")
            if (not last or directory) and not stat.S_ISDIR(mode):
                raise ConfinementError(errno.ENOTDIR, f"{where(index)} is not a folder; this attempt trains nothing")
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _allow_read(rules: Ruleset, path: str) -> int:
    """Grant reading one dataset path (a real absolute path, checked by the server): 1, or 0 when it is gone."""
    if not os.path.isabs(path):
        raise ConfinementError(errno.EINVAL, f"{path}: a dataset path must be absolute")
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _open_nofollow(root, os.path.normpath(path), directory=False, what="dataset path", base="/")
    finally:
        os.close(root)
    if fd is None:
        return 0
    try:
        rules.allow_fd(fd, READ, is_dir=stat.S_ISDIR(os.fstat(fd).st_mode))
    finally:
        os.close(fd)
    return 1


def describe(confinement: Confinement) -> str:
    """One line for caffe.log."""
    if not confinement.confined:
        return f"not confined: {confinement.reason}; only the server's checks of the job's paths hold"
    return (f"confined with Landlock ABI {confinement.landlock_abi}: writes only beneath "
            f"{', '.join(confinement.writes) or 'nothing'}; reads the job's folder, {confinement.reads} dataset "
            "path(s) and the runtime's files")


__all__: Sequence[str] = ["Confinement", "ConfinementError", "confine_attempt", "describe"]
