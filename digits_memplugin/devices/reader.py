"""GPUs as NVML (nvidia-ml-py) reports them, and every device read at once: the devices' one interface, and the
only pynvml importer.

Every NVML read goes through one guarded call (`_call`): a field NVML cannot give becomes None, shown as "n/a", never
a 0 a planner could trust; a GPU that is gone turns its row into an error row while the other GPUs still show; no
library or no driver means "no GPUs" with the reason. NVML is initialised once per process, lazily, under a lock.

NVML calls block. This module imports neither Flask nor gevent: a `DeviceReader` takes a runner, and the web layer
gives it `gevent_threadpool_runner()` so reads run in gevent's threadpool instead of stalling the hub.

The rest of the package imports the devices from here: the records (`records.py`), the CPU's row (`host_memory.py`)
and a child's CUDA environment (`cuda_environment.py`) are re-exported, so that one module stays the interface.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from ..core.device_kinds import CPU, GPU
from .cuda_environment import ChildDevices, DeviceSelectionError, allowed_gpus, child_cuda_environment
from .host_memory import HostPaths, read_cpu_device
from .records import Device, DeviceList, GpuProcess

__all__ = [
    "CPU",
    "GPU",
    "ChildDevices",
    "Device",
    "DeviceList",
    "DeviceReader",
    "DeviceSelectionError",
    "GpuProcess",
    "HostPaths",
    "Runner",
    "allowed_gpus",
    "child_cuda_environment",
    "gevent_threadpool_runner",
    "install_library",
    "is_simulated",
    "read_cpu_device",
    "read_devices",
    "run_inline",
    "simulate_gpus",
]

log = logging.getLogger(__name__)


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
