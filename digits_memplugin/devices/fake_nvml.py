"""A fake NVML C library in pure Python: the GPUs of the tests and of the `--simulate-gpus` demo.

It stands where libnvidia-ml.so would: the real nvidia-ml-py bindings call its functions with the ctypes arguments
they pass to C (pointers from ``byref``, arrays, ``c_uint`` values, string buffers), it writes through those pointers
and answers NVML return codes. So the bindings' own structures, versioned calls and error mapping all run, which a
mock of the ``pynvml`` module would skip. `digits_memplugin.devices.reader.install_library` plugs it in.

The structures below are written from ``nvml.h``, not taken from the bindings, so a layout mistake on either side
shows up as wrong numbers in the tests. This module imports no pynvml: `devices/reader.py` stays its only importer.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import threading
from collections.abc import Callable, Iterable, Sequence
from ctypes import POINTER, Structure, c_char, c_int, c_uint, c_ulonglong, c_void_p
from typing import Any

from ..core.sizes import MIB, format_size, parse_gpu_spec

# nvmlReturn_t values (nvml.h).
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_GPU_IS_LOST = 15
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

_ERROR_STRINGS = {
    SUCCESS: b"Success",
    ERROR_UNINITIALIZED: b"Uninitialized",
    ERROR_INVALID_ARGUMENT: b"Invalid Argument",
    ERROR_NOT_SUPPORTED: b"Not Supported",
    ERROR_NO_PERMISSION: b"Insufficient Permissions",
    ERROR_NOT_FOUND: b"Not Found",
    ERROR_INSUFFICIENT_SIZE: b"Insufficient Size",
    ERROR_DRIVER_NOT_LOADED: b"Driver Not Loaded",
    ERROR_GPU_IS_LOST: b"GPU is lost",
    ERROR_ARGUMENT_VERSION_MISMATCH: b"Argument version mismatch",
    ERROR_UNKNOWN: b"Unknown Error",
}

TEMPERATURE_GPU = 0
VALUE_NOT_AVAILABLE_ULL = 0xFFFFFFFFFFFFFFFF
VALUE_NOT_AVAILABLE_UINT = 0xFFFFFFFF


class Memory(Structure):
    """nvmlMemory_t (v1): `used` counts the memory the driver reserves."""

    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class MemoryV2(Structure):
    """nvmlMemory_v2_t: `reserved` is split out of `used`."""

    _fields_ = [
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]


class PciInfo(Structure):
    """nvmlPciInfo_t as filled by nvmlDeviceGetPciInfo_v3."""

    _fields_ = [
        ("busIdLegacy", c_char * 16),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * 32),
    ]


class Utilization(Structure):
    """nvmlUtilization_t, in percent."""

    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class ProcessInfo(Structure):
    """nvmlProcessInfo_t as used by nvmlDeviceGetComputeRunningProcesses_v2 and _v3."""

    _fields_ = [
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


class TemperatureV1(Structure):
    """nvmlTemperature_v1_t (nvmlDeviceGetTemperatureV)."""

    _fields_ = [("version", c_uint), ("sensorType", c_int), ("temperature", c_int)]


def struct_version(struct: type[Structure], version: int) -> int:
    """NVML_STRUCT_VERSION: the size of the structure with the version number in the top byte."""
    return ctypes.sizeof(struct) | (version << 24)


MEMORY_V2_VERSION = struct_version(MemoryV2, 2)
TEMPERATURE_V1_VERSION = struct_version(TemperatureV1, 1)


@dataclasses.dataclass
class FakeProcess:
    """A compute process on a fake GPU. `name` None: NVML may not tell its name (another user's process)."""

    pid: int
    name: str | bytes | None
    """bytes: a name that is not UTF-8, as a process may have."""
    used_memory: int | None
    """Bytes; None is what Windows' WDDM driver reports (NVML_VALUE_NOT_AVAILABLE)."""


@dataclasses.dataclass
class FakeGpu:
    """One fake GPU. Memory is in bytes, as NVML reports it."""

    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int
    memory_reserved: int = 0
    """What the driver keeps for itself (NVML memory v2 `reserved`)."""
    memory_used: int = 0
    """Used by something other than the listed processes (a context, a display)."""
    utilization_gpu: int = 0
    utilization_memory: int = 0
    temperature_c: int = 40
    processes: list[FakeProcess] = dataclasses.field(default_factory=list)
    unsupported: frozenset[str] = frozenset()
    """NVML functions that answer NOT_SUPPORTED for this GPU, e.g. {"nvmlDeviceGetTemperatureV"}."""
    lost: bool = False
    """Every call about this GPU answers GPU_IS_LOST (it fell off the bus)."""

    @property
    def used_v2(self) -> int:
        return self.memory_used + sum(p.used_memory or 0 for p in self.processes)

    @property
    def free(self) -> int:
        return max(0, self.memory_total - self.memory_reserved - self.used_v2)


class _CFunction:
    """An exported symbol: callable like a ctypes function, with the attributes the bindings may set on one."""

    def __init__(self, library: FakeNvml, name: str, implementation: Callable[..., Any]) -> None:
        self.__name__ = name
        self._library = library
        self._implementation = implementation
        self.restype: Any = c_int
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self._library._dispatch(self.__name__, self._implementation, args)


def _symbol(name: str, device: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a method as the C function `name`. `device`: its first argument is an nvmlDevice_t handle."""

    def mark(method: Callable[..., Any]) -> Callable[..., Any]:
        method._nvml_symbol = (name, device)  # type: ignore[attr-defined]
        return method

    return mark


def _pointer(argument: Any, ctype: type[Any]) -> Any:
    """What a C function sees for a pointer argument (``byref(x)``, an array, a pointer): a typed pointer, or None."""
    if argument is None:
        return None
    return ctypes.cast(argument, POINTER(ctype))


def _uint(argument: Any) -> int:
    return int(argument.value if isinstance(argument, ctypes._SimpleCData) else argument)


def _write_text(buffer: Any, length: Any, text: str | bytes) -> int:
    """Copy `text` NUL-terminated into a caller's char buffer of `length` bytes, as NVML does."""
    data = (text if isinstance(text, bytes) else text.encode()) + b"\0"
    if buffer is None:
        return ERROR_INVALID_ARGUMENT
    if len(data) > _uint(length):
        return ERROR_INSUFFICIENT_SIZE
    ctypes.memmove(buffer, data, len(data))
    return SUCCESS


class FakeNvml:
    """The fake library: pass it to `devices.install_library`. Thread-safe; counts its calls for the tests.

    `missing` lists symbols the library does not export (an older driver: the bindings raise FUNCTION_NOT_FOUND);
    `init_error` makes nvmlInit fail with that return code (e.g. ERROR_DRIVER_NOT_LOADED); `before_call` runs
    with the symbol's name before each call, in the calling thread (a slow or hanging driver, for the tests).
    """

    def __init__(
        self,
        gpus: Sequence[FakeGpu] = (),
        *,
        driver_version: str = "550.54.15",
        missing: Iterable[str] = (),
        init_error: int | None = None,
        before_call: Callable[[str], object] | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.before_call = before_call
        self.driver_version = driver_version
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: collections.Counter[str] = collections.Counter()
        self.call_threads: set[int] = set()
        self._lock = threading.RLock()
        self._refcount = 0
        # One real byte per GPU: its address is the opaque nvmlDevice_t handle, so a handle is valid memory.
        self._handles = [ctypes.create_string_buffer(1) for _ in self.gpus]
        self._by_address = {ctypes.addressof(token): index for index, token in enumerate(self._handles)}
        missing = set(missing)
        self._symbols: dict[str, _CFunction] = {}
        for attribute in dir(type(self)):
            mark = getattr(getattr(type(self), attribute), "_nvml_symbol", None)
            if mark is None or mark[0] in missing:
                continue
            name, device = mark
            method = getattr(self, attribute)
            self._symbols[name] = _CFunction(self, name, self._device_call(name, method) if device else method)

    @classmethod
    def from_spec(cls, spec: str) -> FakeNvml:
        """Idle GPUs with the memory sizes of a `--simulate-gpus` spec ("2x24GiB", "24GiB,16GiB")."""
        gpus = []
        for index, total in enumerate(parse_gpu_spec(spec)):
            # Drivers reserve a little over 1% of the memory; keep it on a MiB boundary like real reports.
            reserved = max(MIB, total // 80 // MIB * MIB)
            gpus.append(
                FakeGpu(
                    name=f"Simulated GPU {format_size(total)}",
                    uuid=f"GPU-51a1a7ed-0000-4000-8000-{index:012x}",
                    pci_bus_id=f"00000000:{0x17 + index:02X}:00.0",
                    memory_total=total,
                    memory_reserved=reserved,
                    temperature_c=35,
                )
            )
        return cls(gpus)

    def __getattr__(self, name: str) -> _CFunction:
        """Symbol lookup, as the bindings do it with ``getattr(nvmlLib, name)``; a missing symbol is AttributeError."""
        symbols = self.__dict__.get("_symbols", {})
        if name in symbols:
            return symbols[name]  # type: ignore[no-any-return]
        raise AttributeError(f"fake NVML library has no symbol {name!r}")

    @property
    def initialized(self) -> bool:
        return self._refcount > 0

    def update(self, index: int, **changes: Any) -> None:
        """Change a GPU between reads (its memory, processes, ...), safely against concurrent calls."""
        with self._lock:
            gpu = self.gpus[index]
            for name, value in changes.items():
                if not hasattr(gpu, name):
                    raise AttributeError(f"FakeGpu has no field {name!r}")
                setattr(gpu, name, value)

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus: from now on every call about it answers GPU_IS_LOST."""
        self.update(index, lost=True)

    # --- plumbing -----------------------------------------------------------------------------------------------

    def _dispatch(self, name: str, implementation: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self.before_call is not None:
            self.before_call(name)
        with self._lock:
            self.calls[name] += 1
            self.call_threads.add(threading.get_ident())
            return implementation(*args)

    def _device_call(self, name: str, method: Callable[..., int]) -> Callable[..., int]:
        """Resolve the handle to its GPU, answering what NVML answers for a bad, lost or limited device."""

        def call(handle: Any, *args: Any) -> int:
            if not self._refcount:
                return ERROR_UNINITIALIZED
            index = self._by_address.get(ctypes.cast(handle, c_void_p).value or 0)
            if index is None:
                return ERROR_INVALID_ARGUMENT
            gpu = self.gpus[index]
            if gpu.lost:
                return ERROR_GPU_IS_LOST
            if name in gpu.unsupported:
                return ERROR_NOT_SUPPORTED
            return method(gpu, *args)

        return call

    # --- system -------------------------------------------------------------------------------------------------

    @_symbol("nvmlInitWithFlags")
    def _init_with_flags(self, flags: Any) -> int:
        self.init_calls += 1
        if self.init_error is not None:
            return self.init_error
        self._refcount += 1
        return SUCCESS

    @_symbol("nvmlInit_v2")
    def _init(self) -> int:
        return self._init_with_flags(c_uint(0))

    @_symbol("nvmlShutdown")
    def _shutdown(self) -> int:
        self.shutdown_calls += 1
        if not self._refcount:
            return ERROR_UNINITIALIZED
        self._refcount -= 1
        return SUCCESS

    @_symbol("nvmlErrorString")
    def _error_string(self, result: Any) -> bytes:
        return _ERROR_STRINGS.get(_uint(result), b"Unknown Error")

    @_symbol("nvmlSystemGetDriverVersion")
    def _driver_version(self, buffer: Any, length: Any) -> int:
        if not self._refcount:
            return ERROR_UNINITIALIZED
        return _write_text(buffer, length, self.driver_version)

    @_symbol("nvmlSystemGetProcessName")
    def _process_name(self, pid: Any, buffer: Any, length: Any) -> int:
        if not self._refcount:
            return ERROR_UNINITIALIZED
        wanted = _uint(pid)
        for gpu in self.gpus:
            for process in gpu.processes:
                if process.pid == wanted:
                    if process.name is None:
                        return ERROR_NO_PERMISSION
                    return _write_text(buffer, length, process.name)
        return ERROR_NOT_FOUND

    @_symbol("nvmlDeviceGetCount_v2")
    def _count(self, count: Any) -> int:
        if not self._refcount:
            return ERROR_UNINITIALIZED
        _pointer(count, c_uint)[0] = len(self.gpus)
        return SUCCESS

    @_symbol("nvmlDeviceGetHandleByIndex_v2")
    def _handle_by_index(self, index: Any, device: Any) -> int:
        if not self._refcount:
            return ERROR_UNINITIALIZED
        position = _uint(index)
        if position >= len(self.gpus) or device is None:
            return ERROR_INVALID_ARGUMENT
        if self.gpus[position].lost:
            return ERROR_GPU_IS_LOST
        _pointer(device, c_void_p)[0] = ctypes.addressof(self._handles[position])
        return SUCCESS

    # --- per device ---------------------------------------------------------------------------------------------

    @_symbol("nvmlDeviceGetIndex", device=True)
    def _index(self, gpu: FakeGpu, index: Any) -> int:
        _pointer(index, c_uint)[0] = self.gpus.index(gpu)
        return SUCCESS

    @_symbol("nvmlDeviceGetName", device=True)
    def _name(self, gpu: FakeGpu, buffer: Any, length: Any) -> int:
        return _write_text(buffer, length, gpu.name)

    @_symbol("nvmlDeviceGetUUID", device=True)
    def _uuid(self, gpu: FakeGpu, buffer: Any, length: Any) -> int:
        return _write_text(buffer, length, gpu.uuid)

    @_symbol("nvmlDeviceGetPciInfo_v3", device=True)
    def _pci_info(self, gpu: FakeGpu, info: Any) -> int:
        pci = _pointer(info, PciInfo)[0]
        domain, bus, rest = gpu.pci_bus_id.split(":")
        device, _function = rest.split(".")
        pci.domain, pci.bus, pci.device = int(domain, 16), int(bus, 16), int(device, 16)
        pci.busIdLegacy = f"{int(domain, 16):04x}:{bus}:{rest}".encode()[:15]
        pci.busId = gpu.pci_bus_id.encode()
        pci.pciDeviceId = 0x233510DE
        return SUCCESS

    @_symbol("nvmlDeviceGetMemoryInfo", device=True)
    def _memory_v1(self, gpu: FakeGpu, memory: Any) -> int:
        out = _pointer(memory, Memory)[0]
        out.total, out.free = gpu.memory_total, gpu.free
        out.used = gpu.memory_total - gpu.free  # v1 counts the reserved memory as used
        return SUCCESS

    @_symbol("nvmlDeviceGetMemoryInfo_v2", device=True)
    def _memory_v2(self, gpu: FakeGpu, memory: Any) -> int:
        out = _pointer(memory, MemoryV2)[0]
        if out.version != MEMORY_V2_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        out.total, out.reserved, out.free, out.used = gpu.memory_total, gpu.memory_reserved, gpu.free, gpu.used_v2
        return SUCCESS

    @_symbol("nvmlDeviceGetUtilizationRates", device=True)
    def _utilization(self, gpu: FakeGpu, utilization: Any) -> int:
        out = _pointer(utilization, Utilization)[0]
        out.gpu, out.memory = gpu.utilization_gpu, gpu.utilization_memory
        return SUCCESS

    @_symbol("nvmlDeviceGetTemperature", device=True)
    def _temperature(self, gpu: FakeGpu, sensor: Any, temperature: Any) -> int:
        if _uint(sensor) != TEMPERATURE_GPU:
            return ERROR_INVALID_ARGUMENT
        _pointer(temperature, c_uint)[0] = gpu.temperature_c
        return SUCCESS

    @_symbol("nvmlDeviceGetTemperatureV", device=True)
    def _temperature_v(self, gpu: FakeGpu, temperature: Any) -> int:
        out = _pointer(temperature, TemperatureV1)[0]
        if out.version != TEMPERATURE_V1_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        if out.sensorType != TEMPERATURE_GPU:
            return ERROR_INVALID_ARGUMENT
        out.temperature = gpu.temperature_c
        return SUCCESS

    def _processes(self, gpu: FakeGpu, count: Any, infos: Any) -> int:
        """The size-query protocol: too small an array answers INSUFFICIENT_SIZE with the count needed."""
        capacity = _pointer(count, c_uint)
        if capacity is None:
            return ERROR_INVALID_ARGUMENT
        needed = len(gpu.processes)
        if capacity[0] < needed or (needed and infos is None):
            capacity[0] = needed
            return ERROR_INSUFFICIENT_SIZE
        array = _pointer(infos, ProcessInfo)
        for position, process in enumerate(gpu.processes):
            entry = array[position]
            entry.pid = process.pid
            entry.usedGpuMemory = VALUE_NOT_AVAILABLE_ULL if process.used_memory is None else process.used_memory
            entry.gpuInstanceId = entry.computeInstanceId = VALUE_NOT_AVAILABLE_UINT
        capacity[0] = needed
        return SUCCESS

    @_symbol("nvmlDeviceGetComputeRunningProcesses_v3", device=True)
    def _processes_v3(self, gpu: FakeGpu, count: Any, infos: Any) -> int:
        return self._processes(gpu, count, infos)

    @_symbol("nvmlDeviceGetComputeRunningProcesses_v2", device=True)
    def _processes_v2(self, gpu: FakeGpu, count: Any, infos: Any) -> int:
        return self._processes(gpu, count, infos)
