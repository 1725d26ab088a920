"""The fake NVML library, driven through the real nvidia-ml-py bindings exactly as the devices module drives it.

These tests pin the fake to NVML's C contract (return codes, struct versions, the size-query protocol), so that the
device tests built on it say something about the real library.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pynvml
import pytest

from digits_memplugin.core.sizes import GIB, MIB
from digits_memplugin.devices import fake_nvml
from digits_memplugin.devices.fake_nvml import FakeGpu, FakeNvml, FakeProcess

Install = Callable[[FakeNvml], FakeNvml]


@pytest.fixture
def nvml(fake_gpus: FakeNvml) -> FakeNvml:
    """Two fake GPUs, installed and initialised through the bindings (shut down by the conftest's clean-up)."""
    pynvml.nvmlInit()
    return fake_gpus


def test_the_structures_match_the_bindings_layouts_and_versions() -> None:
    # Written from nvml.h independently of pynvml; the versions encode the sizes, so both must agree.
    pairs = [
        (fake_nvml.Memory, pynvml.c_nvmlMemory_t),
        (fake_nvml.MemoryV2, pynvml.c_nvmlMemory_v2_t),
        (fake_nvml.PciInfo, pynvml.nvmlPciInfo_t),
        (fake_nvml.Utilization, pynvml.c_nvmlUtilization_t),
        (fake_nvml.ProcessInfo, pynvml.c_nvmlProcessInfo_v3_t),
        (fake_nvml.TemperatureV1, pynvml.c_nvmlTemperature_v1_t),
    ]
    for ours, theirs in pairs:
        assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), ours.__name__
    assert fake_nvml.MEMORY_V2_VERSION == pynvml.nvmlMemory_v2 == 0x02000028
    assert pynvml.nvmlTemperature_v1 == fake_nvml.TEMPERATURE_V1_VERSION


def test_calls_before_init_answer_uninitialized(install_nvml: Install, gpus: list[FakeGpu]) -> None:
    install_nvml(FakeNvml(gpus))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_init_and_shutdown_are_counted(install_nvml: Install, gpus: list[FakeGpu]) -> None:
    library = install_nvml(FakeNvml(gpus))
    pynvml.nvmlInit()
    assert library.initialized and library.init_calls == 1
    pynvml.nvmlShutdown()
    assert not library.initialized
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_a_driver_that_is_not_loaded_fails_init(install_nvml: Install) -> None:
    install_nvml(FakeNvml([], init_error=fake_nvml.ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


def test_identity_of_each_gpu(nvml: FakeNvml) -> None:
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(2)]
    assert [pynvml.nvmlDeviceGetName(h) for h in handles] == ["NVIDIA GeForce RTX 3090", "NVIDIA TITAN X (Pascal)"]
    assert pynvml.nvmlDeviceGetUUID(handles[1]) == "GPU-bbbbbbbb-1111-2222-3333-444444444444"
    assert [pynvml.nvmlDeviceGetIndex(h) for h in handles] == [0, 1]
    pci = pynvml.nvmlDeviceGetPciInfo(handles[1])
    assert (pci.busId, pci.domain, pci.bus, pci.device) == ("00000000:02:00.0", 0, 2, 0)  # the bindings decode it
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(2)


def test_memory_v2_splits_reserved_out_of_used_and_v1_does_not(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    used = 200 * MIB + 8 * GIB  # other use + the two processes
    assert (v2.total, v2.reserved, v2.used) == (24 * GIB, 300 * MIB, used)
    assert v2.free == 24 * GIB - 300 * MIB - used
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    assert (v1.total, v1.free, v1.used) == (v2.total, v2.free, used + 300 * MIB)


def test_a_wrong_struct_version_is_refused_with_nvmls_own_message(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch) as caught:
        pynvml.nvmlDeviceGetMemoryInfo(handle, version=0x01000028)
    # The bindings have no text for this code and ask the library's nvmlErrorString, with restype set on it.
    assert str(caught.value) == "Argument version mismatch"


def test_a_missing_symbol_is_function_not_found(install_nvml: Install, gpus: list[FakeGpu]) -> None:
    install_nvml(FakeNvml(gpus, missing={"nvmlDeviceGetMemoryInfo_v2"}))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert pynvml.nvmlDeviceGetMemoryInfo(handle).total == 24 * GIB


def test_processes_through_the_size_query_protocol(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for listing in (pynvml.nvmlDeviceGetComputeRunningProcesses_v3, pynvml.nvmlDeviceGetComputeRunningProcesses_v2):
        processes = listing(handle)
        assert [(p.pid, p.usedGpuMemory) for p in processes] == [(4242, 6 * GIB), (4343, 2 * GIB)]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses_v3(pynvml.nvmlDeviceGetHandleByIndex(1)) == []
    assert pynvml.nvmlSystemGetProcessName(4242) == "/usr/bin/python3"
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlSystemGetProcessName(4343)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlSystemGetProcessName(1)


def test_too_small_a_process_array_answers_insufficient_size_with_the_count(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(1)
    array = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    result = nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), array)
    assert (result, count.value) == (fake_nvml.ERROR_INSUFFICIENT_SIZE, 2)


def test_a_short_string_buffer_answers_insufficient_size(nvml: FakeNvml) -> None:
    buffer = ctypes.create_string_buffer(4)
    assert nvml.nvmlSystemGetDriverVersion(buffer, ctypes.c_uint(4)) == fake_nvml.ERROR_INSUFFICIENT_SIZE
    assert buffer.value == b""


def test_unknown_process_memory_reads_as_none(install_nvml: Install) -> None:
    gpu = FakeGpu("G", "GPU-1", "00000000:01:00.0", 8 * GIB, processes=[FakeProcess(7, "p", None)])
    install_nvml(FakeNvml([gpu]))
    pynvml.nvmlInit()
    (process,) = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert process.usedGpuMemory is None  # NVML_VALUE_NOT_AVAILABLE, as WDDM reports it


def test_utilization_and_both_temperature_calls(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
    assert (rates.gpu, rates.memory) == (87, 41)
    assert pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU) == 71
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 71


def test_unsupported_functions_answer_not_supported_for_that_gpu_only(
    install_nvml: Install, gpus: list[FakeGpu]
) -> None:
    gpus[1].unsupported = frozenset({"nvmlDeviceGetUtilizationRates"})
    install_nvml(FakeNvml(gpus))
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(0)).gpu == 87
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(1))


def test_a_lost_gpu_answers_gpu_is_lost_to_every_call(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    nvml.lose_gpu(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA GeForce RTX 3090"


def test_a_handle_the_library_did_not_give_is_an_invalid_argument(nvml: FakeNvml) -> None:
    stray = ctypes.create_string_buffer(1)
    handle = ctypes.cast(stray, pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(handle)


def test_from_spec_builds_idle_gpus_in_pci_order() -> None:
    library = FakeNvml.from_spec("2x24GiB,16GiB")
    assert [gpu.memory_total for gpu in library.gpus] == [24 * GIB, 24 * GIB, 16 * GIB]
    assert [gpu.pci_bus_id for gpu in library.gpus] == sorted(gpu.pci_bus_id for gpu in library.gpus)
    assert len({gpu.uuid for gpu in library.gpus}) == 3
    assert all(gpu.processes == [] and 0 < gpu.memory_reserved < gpu.memory_total // 50 for gpu in library.gpus)


def test_update_refuses_unknown_fields(gpus: list[FakeGpu]) -> None:
    library = FakeNvml(gpus)
    library.update(0, temperature_c=90)
    assert library.gpus[0].temperature_c == 90
    with pytest.raises(AttributeError, match="no field 'temprature'"):
        library.update(0, temprature=90)
