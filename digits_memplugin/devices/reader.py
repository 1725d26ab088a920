"""The devices training can run on: GPUs as NVML (nvidia-ml-py) reports them, and the CPU. The only pynvml importer.

Every NVML read goes through one guarded call (`_call`): a field NVML cannot give becomes None, shown as "n/a", never
a 0 a planner could trust; a GPU that is gone turns its row into an error row while the other GPUs still show; no
library or no driver means "no GPUs" with the reason. NVML is initialised once per process, lazily, under a lock.

NVML calls block. This module imports neither Flask nor gevent: a `DeviceReader` takes a runner, and the web layer
gives it `gevent_threadpool_runner()` so reads run in gevent's threadpool instead of stalling the hub.

NVML numbers GPUs in PCI bus order (nvidia-smi shows the same numbers); CUDA numbers them fastest first unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID``. `child_cuda_environment` is where the two numberings are reconciled.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal

import pynvml

log = logging.getLogger(__name__)

GPU: Final = "gpu"
CPU: Final = "cpu"
CPU_KEY: Final = "cpu"


@dataclasses.dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU."""

    pid: int
    name: str | None
    """As NVML gives it (often the executable's path); None where NVML may not tell (another user's process)."""
    used_memory: int | None
    """Bytes; None where the driver does not account per process."""


@dataclasses.dataclass(frozen=True)
class Device:
    """One device, GPU or CPU, with the same fields for both so that consumers budget them alike.

    Memory is in bytes. With NVML memory v2, total = free + used + reserved; with the v1 fallback `reserved` is
    None and `used` includes it. A row with `error` set could not be read and must not be planned against.
    """

    key: str
    """Stable identity: the GPU's UUID, "cpu" for the CPU, "gpu-index-N" for a GPU lost before its UUID was read."""
    kind: Literal["gpu", "cpu"]
    index: int | None
    """NVML's index (PCI bus order, as nvidia-smi shows it); None for the CPU."""
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    memory_total: int | None
    memory_free: int | None
    memory_used: int | None
    memory_reserved: int | None
    memory_source: str | None
    """Where the memory numbers come from: nvml_v2, nvml_v1, meminfo, cgroup_v1 or cgroup_v2."""
    utilization_gpu: int | None
    """Percent of the last sample period a kernel was running."""
    utilization_memory: int | None
    """Percent of the last sample period device memory was read or written."""
    temperature_c: int | None
    processes: tuple[GpuProcess, ...] | None
    """None where the driver does not list processes; () where it lists none."""
    error: str | None = None
    host: str | None = None
    """The cluster host the device is on (devices.cluster, the Ray backend); None for this server's own."""

    def to_json(self) -> dict[str, Any]:
        """The device as the API, the CLI's --json and the `devices` event show it."""
        document = dataclasses.asdict(self)
        if self.host is None:
            del document["host"]  # one machine: the documents stay as they were
        document["processes"] = None if self.processes is None else [dataclasses.asdict(p) for p in self.processes]
        return document


@dataclasses.dataclass(frozen=True)
class DeviceList:
    """One reading of every device: the GPUs in NVML index order, then the CPU (always present)."""

    gpus: tuple[Device, ...]
    cpu: Device
    gpu_reason: str | None
    """Why no GPU is listed (no NVML library, no driver, none installed); None when there are GPUs."""
    driver_version: str | None
    simulated: bool
    """The GPUs come from the fake NVML library (`--simulate-gpus`, or a test), not from hardware."""
    other_cpus: tuple[Device, ...] = ()
    """The CPUs of a cluster's other hosts (keys "cpu@<host>"), after this server's own `cpu`."""

    @property
    def devices(self) -> tuple[Device, ...]:
        return (*self.gpus, self.cpu, *self.other_cpus)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def get(self, key: str) -> Device | None:
        """The device with this key (a GPU's UUID or "cpu")."""
        return next((device for device in self.devices if device.key == key), None)

    def to_json(self) -> dict[str, Any]:
        """The document `GET <prefix>/api/devices` returns, `devices --json` prints and the `devices` event carries."""
        return {
            "devices": [device.to_json() for device in self.devices],
            "gpu_count": self.gpu_count,
            "gpu_reason": self.gpu_reason,
            "driver_version": self.driver_version,
            "simulated": self.simulated,
        }


# --- NVML ---------------------------------------------------------------------------------------------------------


class _Unavailable(Exception):
    """NVML could not give a value; `code` is the NVML return code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _GpuGone(Exception):
    """The GPU no longer answers (fell off the bus, needs a reset): its whole row becomes an error."""


# Codes that only mean "this driver or this GPU does not offer that": no need to tell the server log.
_EXPECTED_GAPS = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_NO_DATA,
    }
)
_GONE = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_ResetRequired)


def _call(function: Callable[..., Any], *args: Any) -> Any:
    """The one place pynvml is called: its errors become `_GpuGone` or `_Unavailable`, nothing else escapes."""
    try:
        return function(*args)
    except _GONE as error:
        raise _GpuGone(str(error)) from error
    except pynvml.NVMLError as error:
        raise _Unavailable(str(error), error.value) from error
    except UnicodeDecodeError as error:  # the bindings decode names strictly; a process name need not be UTF-8
        raise _Unavailable(f"NVML returned text that is not UTF-8 ({error.reason})", pynvml.NVML_ERROR_UNKNOWN) from error


_warned: set[tuple[str, int]] = set()


def _field(function: Callable[..., Any], *args: Any) -> Any:
    """A value NVML may not have: None instead (logged once per call and error when it is not an ordinary gap)."""
    try:
        return _call(function, *args)
    except _Unavailable as error:
        name = getattr(function, "__name__", repr(function))
        if error.code not in _EXPECTED_GAPS and (name, error.code) not in _warned:
            _warned.add((name, error.code))
            log.warning("NVML %s failed: %s (shown as n/a)", name, error)
        return None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value or None


def _native_lock() -> Any:
    """A lock of the OS, even under gevent's monkey-patching: it is taken in gevent's threadpool threads."""
    if "gevent.monkey" in sys.modules:
        from gevent import monkey

        return monkey.get_original("threading", "Lock")()
    return threading.Lock()


@dataclasses.dataclass(frozen=True)
class _Identity:
    """What does not change while NVML is initialised: read once per GPU."""

    name: str | None
    uuid: str | None
    pci_bus_id: str | None


# Why NVML would not start, in the words a user acts on: no NVIDIA driver at all, a driver installed but not
# running, or one this user may not use. Other codes keep NVML's own words.
_INIT_FAILURES = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML is missing (libnvidia-ml.so.1 was not found): no NVIDIA driver is "
    "installed on this machine",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "no NVIDIA driver is running: NVML is installed but the driver (the nvidia "
    "kernel module) is not loaded",
    pynvml.NVML_ERROR_NO_PERMISSION: "NVML refused this user: no permission to use the NVIDIA driver's devices",
}


def _init_failure(error: _Unavailable) -> str:
    """The reason there are no GPUs when nvmlInit fails."""
    known = _INIT_FAILURES.get(error.code)
    return f"{known} (NVML: {error})" if known else f"NVML is not available: {error}"


class _NvmlSession:
    """NVML in this process: initialised at the first read and kept; the outcome of a failed start is kept too."""

    def __init__(self) -> None:
        self.lock = _native_lock()
        self.simulated = False
        self._started = False
        self._failure: str | None = None
        self._driver_version: str | None = None
        self._handles: dict[int, Any] = {}
        self._identities: dict[int, _Identity] = {}

    def _start(self) -> str | None:
        """Initialise NVML if not done yet; the reason there are no GPUs when it cannot be."""
        if not self._started:
            self._started = True
            try:
                _call(pynvml.nvmlInit)
            except _Unavailable as error:
                self._failure = _init_failure(error)
                log.info("%s; listing the CPU only", self._failure)
            except _GpuGone as error:
                self._failure = f"NVML is not available: {error}"
                log.info("%s; listing the CPU only", self._failure)
            else:
                self._driver_version = _text(_field(pynvml.nvmlSystemGetDriverVersion))
        return self._failure

    def stop(self) -> None:
        """Shut NVML down (before the library is swapped); the next read starts it again. Hold `lock`."""
        if self._started and self._failure is None:
            try:
                _call(pynvml.nvmlShutdown)
            except (_Unavailable, _GpuGone) as error:
                log.warning("NVML shutdown failed: %s", error)
        self._started = False
        self._failure = None
        self._driver_version = None
        self._handles.clear()
        self._identities.clear()

    def read_gpus(self) -> tuple[tuple[Device, ...], str | None, str | None]:
        """(GPU rows, reason there are none, driver version). Hold `lock`."""
        failure = self._start()
        if failure is not None:
            return (), failure, None
        try:
            count = _call(pynvml.nvmlDeviceGetCount)
        except (_Unavailable, _GpuGone) as error:
            return (), f"NVML could not count the GPUs: {error}", self._driver_version
        rows = tuple(self._read_gpu(index) for index in range(count))
        return rows, None if rows else "the NVIDIA driver reports no GPU", self._driver_version

    def _read_gpu(self, index: int) -> Device:
        try:
            handle = self._handles.get(index)
            if handle is None:
                handle = self._handles[index] = _call(pynvml.nvmlDeviceGetHandleByIndex, index)
            identity = self._identities.get(index)
            if identity is None:
                identity = self._identities[index] = self._identity(handle)
            return self._gpu_row(index, handle, identity)
        except _GpuGone as error:
            return _error_row(index, self._identities.get(index), str(error))
        except _Unavailable as error:
            return _error_row(index, self._identities.get(index), f"NVML cannot open this GPU: {error}")

    @staticmethod
    def _identity(handle: Any) -> _Identity:
        pci = _field(pynvml.nvmlDeviceGetPciInfo, handle)
        return _Identity(
            name=_text(_field(pynvml.nvmlDeviceGetName, handle)),
            uuid=_text(_field(pynvml.nvmlDeviceGetUUID, handle)),
            pci_bus_id=None if pci is None else _text(pci.busId),
        )

    @staticmethod
    def _gpu_row(index: int, handle: Any, identity: _Identity) -> Device:
        # Memory v2 splits the driver's reservation out of `used`; drivers before 510 lack it (FUNCTION_NOT_FOUND)
        # or refuse the version (ARGUMENT_VERSION_MISMATCH, NOT_SUPPORTED): then v1, where `used` includes it.
        memory = _field(pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
        if memory is not None:
            total, free, used, reserved, source = memory.total, memory.free, memory.used, memory.reserved, "nvml_v2"
        else:
            memory = _field(pynvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                total, free, used, reserved, source = memory.total, memory.free, memory.used, None, "nvml_v1"
            else:
                total = free = used = reserved = source = None
        utilization = _field(pynvml.nvmlDeviceGetUtilizationRates, handle)
        temperature = _field(pynvml.nvmlDeviceGetTemperatureV, handle, pynvml.NVML_TEMPERATURE_GPU)
        if temperature is None:
            temperature = _field(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        return Device(
            key=identity.uuid or f"gpu-index-{index}",
            kind=GPU,
            index=index,
            name=identity.name,
            uuid=identity.uuid,
            pci_bus_id=identity.pci_bus_id,
            memory_total=total,
            memory_free=free,
            memory_used=used,
            memory_reserved=reserved,
            memory_source=source,
            utilization_gpu=None if utilization is None else utilization.gpu,
            utilization_memory=None if utilization is None else utilization.memory,
            temperature_c=temperature,
            processes=_processes(handle),
        )


def _processes(handle: Any) -> tuple[GpuProcess, ...] | None:
    listed = _field(pynvml.nvmlDeviceGetComputeRunningProcesses_v3, handle)
    if listed is None:  # drivers before 510 export only _v2
        listed = _field(pynvml.nvmlDeviceGetComputeRunningProcesses_v2, handle)
    if listed is None:
        return None
    return tuple(
        GpuProcess(
            pid=int(process.pid),
            name=_text(_field(pynvml.nvmlSystemGetProcessName, process.pid)),
            used_memory=process.usedGpuMemory,
        )
        for process in listed
    )


def _error_row(index: int, identity: _Identity | None, error: str) -> Device:
    """A GPU that could not be read: what is known of it (from an earlier read) and why."""
    identity = identity or _Identity(None, None, None)
    return Device(
        key=identity.uuid or f"gpu-index-{index}",
        kind=GPU,
        index=index,
        name=identity.name,
        uuid=identity.uuid,
        pci_bus_id=identity.pci_bus_id,
        memory_total=None,
        memory_free=None,
        memory_used=None,
        memory_reserved=None,
        memory_source=None,
        utilization_gpu=None,
        utilization_memory=None,
        temperature_c=None,
        processes=None,
        error=error,
    )


_session = _NvmlSession()


def install_library(library: object | None) -> None:
    """Make NVML calls go to `library` (a `fake_nvml.FakeNvml`), or back to the real libnvidia-ml with None.

    The bindings are process-wide, so this is too: every reader in the process sees the new library. NVML is shut
    down on the old library first, and the bindings' cache of function pointers is cleared so no call reaches it.
    """
    with _session.lock:
        _session.stop()
        with pynvml.libLoadLock:
            pynvml.nvmlLib = library
            pynvml._nvmlGetFunctionPointer_cache.clear()
        _session.simulated = library is not None


def simulate_gpus(spec: str) -> None:
    """Install fake GPUs with the memory sizes of `spec` ("2x24GiB", "24GiB,16GiB"): the demo mode."""
    from .fake_nvml import FakeNvml

    install_library(FakeNvml.from_spec(spec))
    log.warning("GPUs are simulated (%s): the device list does not come from hardware", spec)


def is_simulated() -> bool:
    """Whether the GPUs come from a fake library rather than from the driver."""
    return _session.simulated


# --- the CPU ------------------------------------------------------------------------------------------------------


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
        key=CPU_KEY,
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


# --- reading ------------------------------------------------------------------------------------------------------


def read_devices(host: HostPaths | None = None) -> DeviceList:
    """Read every device now. Blocks on NVML: in a gevent server, go through a `DeviceReader` instead."""
    with _session.lock:
        gpus, reason, driver = _session.read_gpus()
        simulated = _session.simulated
    cpu = read_cpu_device(host)
    return DeviceList(gpus=gpus, cpu=cpu, gpu_reason=reason, driver_version=driver, simulated=simulated)


Runner = Callable[[Callable[[], DeviceList]], DeviceList]


def run_inline(read: Callable[[], DeviceList]) -> DeviceList:
    """Run a read in the calling thread: right for the CLI, tests and threaded servers."""
    return read()


def gevent_threadpool_runner() -> Runner:
    """Run reads in gevent's threadpool, so the blocking NVML calls never stall the hub (and every greenlet)."""
    import gevent

    def run(read: Callable[[], DeviceList]) -> DeviceList:
        return gevent.get_hub().threadpool.apply(read)  # type: ignore[no-any-return]

    return run


class DeviceReader:
    """Reads the devices for one app, through `runner` (inline, or gevent's threadpool)."""

    def __init__(self, runner: Runner = run_inline, host: HostPaths | None = None) -> None:
        self._runner = runner
        self._host = host

    def read(self) -> DeviceList:
        return self._runner(lambda: read_devices(self._host))


# --- child processes ----------------------------------------------------------------------------------------------


class DeviceSelectionError(ValueError):
    """The GPUs asked for cannot be given to a child process; the message says why."""


@dataclasses.dataclass(frozen=True)
class ChildDevices:
    """What a training child gets: environment variables to set, and the CUDA device number of each chosen GPU."""

    environment: Mapping[str, str]
    cuda_index: Mapping[str, int]
    """GPU UUID -> the device number CUDA (so Caffe's ``device_id``) uses for it inside the child."""


def allowed_gpus(gpus: Sequence[Device], environ: Mapping[str, str] | None = None) -> tuple[Device, ...]:
    """The GPUs this server may hand out: all of them, or those its own CUDA_VISIBLE_DEVICES lets it see.

    NVML ignores CUDA_VISIBLE_DEVICES and lists every GPU, so the server's restriction must be applied here.
    Entries are read as CUDA reads them: integers are positions in CUDA's numbering, "GPU-..." a UUID or a unique
    prefix of one, and the list ends at the first entry that names no GPU. Integers are only understood with
    CUDA_DEVICE_ORDER=PCI_BUS_ID (or a single GPU): CUDA's default fastest-first order cannot be rebuilt from NVML.
    """
    environ = os.environ if environ is None else environ
    gpus = [gpu for gpu in gpus if gpu.kind == GPU]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return tuple(gpus)
    in_cuda_order: list[Device] | None = None
    chosen: list[Device] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.startswith("MIG-"):
            raise DeviceSelectionError(
                f"CUDA_VISIBLE_DEVICES={visible!r} names a MIG instance; training on MIG slices is not supported"
            )
        if entry.lstrip("-").isdigit():
            if in_cuda_order is None:
                if environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and len(gpus) > 1:
                    raise DeviceSelectionError(
                        f"CUDA_VISIBLE_DEVICES={visible!r} numbers GPUs in CUDA's default fastest-first order, "
                        "which NVML cannot reproduce: start the server with CUDA_DEVICE_ORDER=PCI_BUS_ID, or name "
                        "the GPUs by UUID"
                    )
                in_cuda_order = _pci_order(gpus)
            position = int(entry)
            if not 0 <= position < len(in_cuda_order):
                break
            match = in_cuda_order[position]
        else:
            matches = [gpu for gpu in gpus if entry and gpu.uuid and gpu.uuid.startswith(entry)]
            if len(matches) != 1:
                break
            match = matches[0]
        if match in chosen:
            break
        chosen.append(match)
    return tuple(chosen)


def child_cuda_environment(
    chosen: Sequence[str],
    gpus: Sequence[Device],
    environ: Mapping[str, str] | None = None,
    *,
    style: Literal["index", "uuid"] = "index",
) -> ChildDevices:
    """The CUDA environment for a child that may use exactly the GPUs `chosen` (UUIDs); none means CPU only.

    The child gets CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA numbers GPUs the way NVML does (PCI bus order), and
    CUDA_VISIBLE_DEVICES listing the chosen GPUs in PCI bus order, by position in that order (`style="index"`,
    understood by every CUDA version) or by UUID (`style="uuid"`). Inside the child, CUDA numbers the visible GPUs
    0, 1, ... in the order listed: `cuda_index` says which number each UUID gets. The position is computed from
    the PCI bus ids, not taken from NVML's index, so the result does not rest on NVML's enumeration order.

    A GPU outside the server's own CUDA_VISIBLE_DEVICES (see `allowed_gpus`), unknown, or in error is refused.
    """
    gpu_list = [gpu for gpu in gpus if gpu.kind == GPU]
    by_uuid = {gpu.uuid: gpu for gpu in gpu_list if gpu.uuid}
    allowed = {gpu.uuid for gpu in allowed_gpus(gpu_list, environ)}
    if len(set(chosen)) != len(chosen):
        raise DeviceSelectionError(f"a GPU is chosen twice: {', '.join(chosen)}")
    selected = []
    for uuid in chosen:
        gpu = by_uuid.get(uuid)
        if gpu is None:
            raise DeviceSelectionError(f"no GPU has UUID {uuid!r}")
        if gpu.error:
            raise DeviceSelectionError(f"GPU {gpu.index} ({uuid}) cannot be used: {gpu.error}")
        if uuid not in allowed:
            raise DeviceSelectionError(
                f"GPU {gpu.index} ({uuid}) is outside this server's CUDA_VISIBLE_DEVICES; it may not be used"
            )
        selected.append(gpu)
    try:
        in_pci_order = _pci_order(gpu_list)
    except DeviceSelectionError:
        if style == "index":
            raise
        in_pci_order = sorted(gpu_list, key=lambda gpu: gpu.index or 0)  # UUIDs do not depend on the order
    selected.sort(key=in_pci_order.index)
    if style == "uuid":
        names = [str(gpu.uuid) for gpu in selected]
    elif style == "index":
        names = [str(in_pci_order.index(gpu)) for gpu in selected]
    else:
        raise ValueError(f"style must be 'index' or 'uuid', got {style!r}")
    return ChildDevices(
        environment={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(names)},
        cuda_index={str(gpu.uuid): position for position, gpu in enumerate(selected)},
    )


def _pci_order(gpus: Sequence[Device]) -> list[Device]:
    """The GPUs in the order CUDA numbers them under CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    missing = [gpu for gpu in gpus if not gpu.pci_bus_id]
    if missing:
        raise DeviceSelectionError(
            f"NVML gave no PCI bus id for GPU {missing[0].index}, so CUDA's numbering of the GPUs is unknown"
        )
    return sorted(gpus, key=lambda gpu: _bus_key(str(gpu.pci_bus_id)))


def _bus_key(bus_id: str) -> tuple[int, ...]:
    """A bus id such as 00000000:3B:00.0 as numbers, so that buses compare numerically whatever their case."""
    domain, bus, rest = bus_id.split(":")
    device, _, function = rest.partition(".")
    return (int(domain, 16), int(bus, 16), int(device, 16), int(function or "0", 16))
