"""The CPU as a device: the host's memory from /proc/meminfo, lowered to the limit of the cgroup the process runs in.

CPU-mode Caffe allocates from the host's memory, and jobs without a GPU budget against it. In a container the
kernel's OOM killer acts on the cgroup, not on the machine, so the tightest limit of the process's cgroup and its
ancestors (v1 or v2) bounds what is shown. Nothing here raises for a missing or odd file: an unknown value is None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from ..core.device_kinds import CPU
from .records import Device


@dataclasses.dataclass(frozen=True)
class HostPaths:
    """Where the kernel tells about memory; tests point these at a tree of their own."""

    proc: Path = Path("/proc")
    cgroup: Path = Path("/sys/fs/cgroup")


DEFAULT_HOST = HostPaths()


@dataclasses.dataclass(frozen=True)
class _CgroupBound:
    source: str
    limit: int
    available: int | None


def read_cpu_device(host: HostPaths | None = None) -> Device:
    """The CPU as a device: what CPU-mode Caffe allocates from and what jobs budget against without a GPU.

    Total and free come from /proc/meminfo (MemTotal, MemAvailable), lowered to the cgroup's memory limit when the
    process runs under one (a container): the kernel's OOM killer acts on the cgroup, not on the machine.
    """
    host = host or DEFAULT_HOST
    meminfo_path = host.proc / "meminfo"
    try:
        meminfo = _parse_meminfo(meminfo_path.read_text())
    except OSError as error:
        meminfo = {}
        problem: str | None = f"cannot read {meminfo_path}: {error.strerror or error}"
    else:
        problem = None if "MemTotal" in meminfo else f"{meminfo_path} has no MemTotal"
    total = meminfo.get("MemTotal")
    free = meminfo.get("MemAvailable")
    source: str | None = None if total is None else "meminfo"
    if total is not None:
        bound = _cgroup_bound(host, total)
        if bound is not None:
            source = bound.source
            total = min(total, bound.limit)
            free = None if free is None or bound.available is None else min(free, bound.available)
    return Device(
        key=CPU,
        kind=CPU,
        index=None,
        name=_cpu_model(host),
        uuid=None,
        pci_bus_id=None,
        memory_total=total,
        memory_free=free,
        memory_used=None if total is None or free is None else total - free,
        memory_reserved=None,
        memory_source=source,
        utilization_gpu=None,
        utilization_memory=None,
        temperature_c=None,
        processes=None,
        error=problem,
    )


def _parse_meminfo(text: str) -> dict[str, int]:
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[name.strip()] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return values


def _cpu_model(host: HostPaths) -> str:
    try:
        text = (host.proc / "cpuinfo").read_text()
    except OSError:
        return "CPU"
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    return "CPU"


def _cgroup_bound(host: HostPaths, mem_total: int) -> _CgroupBound | None:
    """The tightest memory limit of this process's cgroup and its ancestors, with the headroom left under it.

    The headroom counts inactive file cache as free, as MemAvailable does: the kernel reclaims it before an OOM kill.
    """
    try:
        lines = (host.proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    v1_path = v2_path = None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    if v1_path is not None:
        source, mount, path = "cgroup_v1", host.cgroup / "memory", v1_path
        limit_file, usage_file, inactive_key = "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
    elif v2_path is not None and "memory" in _read(host.cgroup / "cgroup.controllers", "").split():
        source, mount, path = "cgroup_v2", host.cgroup, v2_path
        limit_file, usage_file, inactive_key = "memory.max", "memory.current", "inactive_file"
    else:
        return None
    bounds = []
    for directory in _cgroup_levels(mount, path):
        limit = _read_int(directory / limit_file)
        if limit is None or limit >= mem_total:  # "max", or v1's "unlimited" (a number near 2**63)
            continue
        usage = _read_int(directory / usage_file)
        inactive = _read_stat(directory / "memory.stat", inactive_key) or 0
        available = None if usage is None else min(limit, max(0, limit - max(0, usage - inactive)))
        bounds.append(_CgroupBound(source, limit, available))
    if not bounds:
        return None
    availables = [bound.available for bound in bounds]
    return _CgroupBound(
        source,
        min(bound.limit for bound in bounds),
        None if None in availables else min(a for a in availables if a is not None),
    )


def _cgroup_levels(mount: Path, path: str) -> Iterator[Path]:
    """The process's cgroup folder, then each parent up to the mount point.

    Inside a container the path /proc shows may be the host's ("/docker/<id>") while the mount is the container's
    own cgroup, or may climb out of the namespace ("/../.."): then the mount point itself is the process's cgroup.
    """
    parts = PurePosixPath(path).parts[1:] if path.startswith("/") else ()
    directory = mount.joinpath(*parts) if parts and ".." not in parts else mount
    if not directory.is_dir():
        directory = mount
    while True:
        yield directory
        if directory == mount or mount not in directory.parents:
            return
        directory = directory.parent


def _read(path: Path, default: str) -> str:
    try:
        return path.read_text()
    except OSError:
        return default


def _read_int(path: Path) -> int | None:
    text = _read(path, "").strip()
    return int(text) if text.isdigit() else None


def _read_stat(path: Path, key: str) -> int | None:
    for line in _read(path, "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None
