"""The devices module: GPUs read through the real nvidia-ml-py bindings over the fake NVML library, the CPU read
from /proc and cgroup trees the tests write, and the mapping of chosen GPUs to a child's CUDA environment."""

from __future__ import annotations

import ast
import ctypes
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from digits_memplugin.core.sizes import GIB, MIB
from digits_memplugin.devices import reader as devices
from digits_memplugin.devices.fake_nvml import ERROR_DRIVER_NOT_LOADED, FakeGpu, FakeNvml, FakeProcess
from digits_memplugin.devices.reader import (
    Device,
    DeviceReader,
    DeviceSelectionError,
    allowed_gpus,
    child_cuda_environment,
)

Install = Callable[[FakeNvml], FakeNvml]
HostTree = Callable[..., devices.HostPaths]
PACKAGE = Path(devices.__file__).parents[1]

# --- GPUs -------------------------------------------------------------------------------------------------------


def test_two_gpus_with_processes(fake_gpus: FakeNvml, fixed_host: devices.HostPaths) -> None:
    listing = devices.read_devices()
    assert (listing.gpu_count, listing.gpu_reason, listing.driver_version, listing.simulated) == (
        2,
        None,
        "550.54.15",
        True,
    )
    first, second = listing.gpus
    used = 200 * MIB + 8 * GIB
    assert first == Device(
        key="GPU-aaaaaaaa-1111-2222-3333-444444444444",
        kind="gpu",
        index=0,
        name="NVIDIA GeForce RTX 3090",
        uuid="GPU-aaaaaaaa-1111-2222-3333-444444444444",
        pci_bus_id="00000000:01:00.0",
        memory_total=24 * GIB,
        memory_free=24 * GIB - 300 * MIB - used,
        memory_used=used,
        memory_reserved=300 * MIB,
        memory_source="nvml_v2",
        utilization_gpu=87,
        utilization_memory=41,
        temperature_c=71,
        processes=(
            devices.GpuProcess(pid=4242, name="/usr/bin/python3", used_memory=6 * GIB),
            devices.GpuProcess(pid=4343, name=None, used_memory=2 * GIB),  # another user's: NVML won't name it
        ),
    )
    assert (second.index, second.key, second.processes, second.memory_free) == (
        1,
        "GPU-bbbbbbbb-1111-2222-3333-444444444444",
        (),
        12 * GIB - 100 * MIB,
    )
    assert listing.devices[-1] == listing.cpu
    assert listing.cpu.key == "cpu"
    assert listing.get("GPU-bbbbbbbb-1111-2222-3333-444444444444") == second
    assert listing.get("GPU-nope") is None


def test_zero_gpus_lists_the_cpu_with_the_reason(install_nvml: Install) -> None:
    install_nvml(FakeNvml([]))
    listing = devices.read_devices()
    assert listing.gpus == ()
    assert listing.gpu_reason == "the NVIDIA driver reports no GPU"
    assert [device.kind for device in listing.devices] == ["cpu"]


def _libnvidia_ml_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_libnvidia_ml_present(), reason="this machine has an NVIDIA driver")
def test_without_the_nvml_library_there_are_no_gpus_and_the_reason_says_why() -> None:
    listing = devices.read_devices()  # the real bindings, loading the real (absent) libnvidia-ml.so.1
    assert not listing.simulated
    assert listing.gpus == ()
    assert listing.gpu_reason == (  # issue 14, 8: the reason says what is missing, in a user's words
        "NVML is missing (libnvidia-ml.so.1 was not found): no NVIDIA driver is installed on this machine "
        "(NVML: NVML Shared Library Not Found)"
    )
    assert listing.driver_version is None
    assert listing.cpu.memory_total is not None


def test_a_driver_that_is_not_loaded_means_no_gpus_and_is_tried_once(install_nvml: Install) -> None:
    library = install_nvml(FakeNvml([], init_error=ERROR_DRIVER_NOT_LOADED))
    for _ in range(3):
        listing = devices.read_devices()
        assert listing.gpus == ()
        assert listing.gpu_reason == (
            "no NVIDIA driver is running: NVML is installed but the driver (the nvidia kernel module) is not loaded "
            "(NVML: Driver Not Loaded)"
        )
    assert library.init_calls == 1


@pytest.mark.parametrize(
    "driver",
    [
        pytest.param({"missing": {"nvmlDeviceGetMemoryInfo_v2"}}, id="no v2 symbol"),
        pytest.param({"unsupported": {"nvmlDeviceGetMemoryInfo_v2"}}, id="v2 not supported"),
    ],
)
def test_a_driver_without_memory_v2_falls_back_to_v1(
    install_nvml: Install, gpus: list[FakeGpu], driver: dict[str, set[str]]
) -> None:
    for gpu in gpus:
        gpu.unsupported = frozenset(driver.get("unsupported", ()))
    install_nvml(FakeNvml(gpus, missing=driver.get("missing", ())))
    first = devices.read_devices().gpus[0]
    assert first.memory_source == "nvml_v1"
    assert first.memory_reserved is None  # unknown, not 0
    assert first.memory_used == 200 * MIB + 8 * GIB + 300 * MIB  # v1 counts the reservation as used
    assert first.memory_total == first.memory_free + first.memory_used  # type: ignore[operator]


def test_fields_nvml_does_not_support_are_none_not_zero(install_nvml: Install, gpus: list[FakeGpu]) -> None:
    gpus[0].unsupported = frozenset(
        {
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetPciInfo_v3",
        }
    )
    install_nvml(FakeNvml(gpus))
    first, second = devices.read_devices().gpus
    assert (first.utilization_gpu, first.utilization_memory, first.temperature_c) == (None, None, None)
    assert first.processes is None  # "cannot list" differs from "lists none"
    assert first.pci_bus_id is None
    assert first.memory_total == 24 * GIB and first.error is None
    assert second.utilization_gpu == 0 and second.temperature_c == 33  # the other GPU is unaffected
    document = first.to_json()
    assert document["utilization_gpu"] is None and document["processes"] is None


def test_an_older_driver_gets_the_older_calls(install_nvml: Install, gpus: list[FakeGpu]) -> None:
    install_nvml(FakeNvml(gpus, missing={"nvmlDeviceGetTemperatureV", "nvmlDeviceGetComputeRunningProcesses_v3"}))
    first = devices.read_devices().gpus[0]
    assert first.temperature_c == 71
    assert [process.pid for process in first.processes or ()] == [4242, 4343]


def test_a_process_name_that_is_not_utf8_is_unknown(install_nvml: Install, gpus: list[FakeGpu]) -> None:
    gpus[1].processes = [FakeProcess(pid=99, name=b"caffe-\xff\xfe", used_memory=GIB)]
    install_nvml(FakeNvml(gpus))
    assert devices.read_devices().gpus[1].processes == (devices.GpuProcess(pid=99, name=None, used_memory=GIB),)


def test_a_gpu_lost_mid_run_becomes_an_error_row_and_the_others_still_show(fake_gpus: FakeNvml) -> None:
    before = devices.read_devices()
    assert before.gpus[1].error is None
    fake_gpus.lose_gpu(1)
    after = devices.read_devices()
    first, lost = after.gpus
    assert first == before.gpus[0]
    assert lost.error == "GPU is lost"
    # What was learnt before the loss stays, so the row is still the same GPU; nothing else is claimed.
    assert (lost.key, lost.index, lost.name, lost.pci_bus_id) == (
        before.gpus[1].key,
        1,
        "NVIDIA TITAN X (Pascal)",
        "00000000:02:00.0",
    )
    assert (lost.memory_total, lost.memory_free, lost.processes) == (None, None, None)
    assert after.gpu_reason is None


def test_a_gpu_lost_before_the_first_read_is_keyed_by_index(install_nvml: Install, gpus: list[FakeGpu]) -> None:
    gpus[0].lost = True
    install_nvml(FakeNvml(gpus))
    lost, fine = devices.read_devices().gpus
    assert (lost.key, lost.uuid, lost.name, lost.error) == ("gpu-index-0", None, None, "GPU is lost")
    assert fine.error is None and fine.key == gpus[1].uuid


def test_nvml_is_initialised_once_whatever_the_threads(fake_gpus: FakeNvml) -> None:
    threads = [threading.Thread(target=devices.read_devices) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    devices.read_devices()
    assert fake_gpus.init_calls == 1
    assert fake_gpus.shutdown_calls == 0
    devices.install_library(None)  # swapping the library shuts NVML down on the old one
    assert fake_gpus.shutdown_calls == 1 and not fake_gpus.initialized


def test_swapping_the_library_clears_the_bindings_function_cache(install_nvml: Install, gpus: list[FakeGpu]) -> None:
    install_nvml(FakeNvml(gpus))
    assert devices.read_devices().gpus[0].memory_source == "nvml_v2"
    older = install_nvml(FakeNvml(gpus, missing={"nvmlDeviceGetMemoryInfo_v2"}))
    assert devices.read_devices().gpus[0].memory_source == "nvml_v1"
    assert older.calls["nvmlDeviceGetMemoryInfo"] == 2


@pytest.fixture
def gevent_hub() -> Iterator[None]:
    """gevent's hub for this thread, destroyed afterwards with its threadpool."""
    import gevent

    yield
    gevent.get_hub().destroy()


def test_reads_under_gevent_run_in_the_threadpool_and_leave_the_hub_free(
    install_nvml: Install, gpus: list[FakeGpu], gevent_hub: None
) -> None:
    import gevent

    release = threading.Event()
    released_in_time: list[bool] = []

    def slow_driver(name: str) -> None:
        # Blocks the calling OS thread until another greenlet sets `release`: if the read ran on the hub, that
        # greenlet could never run, the wait would time out and the assertion below would fail.
        if name == "nvmlDeviceGetCount_v2":
            released_in_time.append(release.wait(timeout=10))

    library = install_nvml(FakeNvml(gpus, before_call=slow_driver))
    reader = DeviceReader(devices.gevent_threadpool_runner())
    reading = gevent.spawn(reader.read)
    gevent.spawn(release.set)
    listing = reading.get(timeout=30)
    assert released_in_time == [True]
    assert listing.gpu_count == 2
    assert threading.get_ident() not in library.call_threads


def test_the_inline_runner_reads_in_the_calling_thread(fake_gpus: FakeNvml) -> None:
    assert DeviceReader().read().gpu_count == 2
    assert fake_gpus.call_threads == {threading.get_ident()}


def test_device_json_shape(fake_gpus: FakeNvml, fixed_host: devices.HostPaths) -> None:
    document = devices.read_devices().to_json()
    assert set(document) == {"devices", "gpu_count", "gpu_reason", "driver_version", "simulated"}
    row_keys = {
        "key", "kind", "index", "name", "uuid", "pci_bus_id", "memory_total", "memory_free", "memory_used",
        "memory_reserved", "memory_source", "utilization_gpu", "utilization_memory", "temperature_c", "processes",
        "error",
    }  # fmt: skip
    assert all(set(row) == row_keys for row in document["devices"])
    assert document["devices"][0]["processes"][0] == {"pid": 4242, "name": "/usr/bin/python3", "used_memory": 6 * GIB}
    assert [row["kind"] for row in document["devices"]] == ["gpu", "gpu", "cpu"]


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module.split(".")[0])
    return modules


def test_only_the_devices_module_imports_pynvml() -> None:
    importers = [
        path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py") if "pynvml" in _imported_modules(path)
    ]
    assert importers == ["devices/reader.py"]


def test_the_devices_module_loads_neither_flask_nor_gevent() -> None:
    probe = "import sys, digits_memplugin.devices.reader; print(sorted({'flask', 'gevent'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


# --- the CPU ----------------------------------------------------------------------------------------------------


MEM_TOTAL = 16384000 * 1024
MEM_AVAILABLE = 8192000 * 1024


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cpu_without_a_cgroup_limit_is_meminfo(host_tree: HostTree) -> None:
    cpu = devices.read_cpu_device(host_tree())
    assert (cpu.key, cpu.kind, cpu.name, cpu.index, cpu.uuid) == ("cpu", "cpu", "Test CPU @ 2.00GHz", None, None)
    assert (cpu.memory_total, cpu.memory_free, cpu.memory_used) == (MEM_TOTAL, MEM_AVAILABLE, MEM_TOTAL - MEM_AVAILABLE)
    assert (cpu.memory_source, cpu.memory_reserved, cpu.error) == ("meminfo", None, None)


def test_cpu_under_a_cgroup_v2_limit(host_tree: HostTree) -> None:
    host = host_tree(cgroup="0::/jobs/train\n")
    write(host.cgroup / "cgroup.controllers", "cpuset cpu io memory pids\n")
    job = host.cgroup / "jobs" / "train"
    write(job / "memory.max", f"{4 * GIB}\n")
    write(job / "memory.current", f"{3 * GIB}\n")
    write(job / "memory.stat", f"anon {2 * GIB}\ninactive_file {512 * MIB}\nactive_file 0\n")
    cpu = devices.read_cpu_device(host)
    # The page cache the kernel can drop (inactive files) counts as free, as it does in MemAvailable.
    assert (cpu.memory_total, cpu.memory_free, cpu.memory_source) == (4 * GIB, 4 * GIB - 2560 * MIB, "cgroup_v2")
    assert cpu.memory_used == 2560 * MIB


def test_a_parents_cgroup_v2_limit_applies_to_its_children(host_tree: HostTree) -> None:
    host = host_tree(cgroup="0::/jobs/train\n")
    write(host.cgroup / "cgroup.controllers", "memory\n")
    write(host.cgroup / "jobs" / "memory.max", f"{2 * GIB}\n")
    write(host.cgroup / "jobs" / "memory.current", f"{GIB}\n")
    write(host.cgroup / "jobs" / "train" / "memory.max", "max\n")
    write(host.cgroup / "jobs" / "train" / "memory.current", f"{GIB // 2}\n")
    cpu = devices.read_cpu_device(host)
    assert (cpu.memory_total, cpu.memory_free) == (2 * GIB, GIB)


def test_machine_memory_bounds_a_looser_cgroup(host_tree: HostTree) -> None:
    host = host_tree(cgroup="0::/\n")
    write(host.cgroup / "cgroup.controllers", "memory\n")
    write(host.cgroup / "memory.max", f"{12 * GIB}\n")  # under MemTotal, above MemAvailable's headroom
    write(host.cgroup / "memory.current", f"{GIB}\n")
    cpu = devices.read_cpu_device(host)
    assert (cpu.memory_total, cpu.memory_free, cpu.memory_source) == (12 * GIB, MEM_AVAILABLE, "cgroup_v2")


def test_a_cgroup_v2_limit_above_the_machine_is_no_limit(host_tree: HostTree) -> None:
    host = host_tree(cgroup="0::/\n")
    write(host.cgroup / "cgroup.controllers", "memory\n")
    write(host.cgroup / "memory.max", f"{64 * GIB}\n")
    write(host.cgroup / "memory.current", f"{GIB}\n")
    assert devices.read_cpu_device(host).memory_source == "meminfo"


@pytest.mark.parametrize("path", ["/docker/abc123", "/../../outside"])
def test_cpu_under_a_cgroup_v1_limit_seen_from_a_container(host_tree: HostTree, path: str) -> None:
    # The hybrid layout of many hosts: v1 controllers, plus an empty unified line. Inside a container the path
    # /proc shows is the host's (or climbs out), while the mounted memory folder is the container's own cgroup.
    host = host_tree(cgroup=f"5:cpu,cpuacct:/\n4:memory:{path}\n0::/\n")
    memory = host.cgroup / "memory"
    write(memory / "memory.limit_in_bytes", f"{GIB}\n")
    write(memory / "memory.usage_in_bytes", f"{600 * MIB}\n")
    write(memory / "memory.stat", f"inactive_file 1\ntotal_inactive_file {100 * MIB}\n")
    cpu = devices.read_cpu_device(host)
    assert (cpu.memory_total, cpu.memory_free, cpu.memory_source) == (GIB, GIB - 500 * MIB, "cgroup_v1")


def test_cgroup_v1_unlimited_is_no_limit(host_tree: HostTree) -> None:
    host = host_tree(cgroup="4:memory:/\n")
    write(host.cgroup / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    write(host.cgroup / "memory" / "memory.usage_in_bytes", f"{GIB}\n")
    cpu = devices.read_cpu_device(host)
    assert (cpu.memory_total, cpu.memory_source) == (MEM_TOTAL, "meminfo")


def test_an_unreadable_cgroup_usage_makes_free_unknown(host_tree: HostTree) -> None:
    host = host_tree(cgroup="0::/\n")
    write(host.cgroup / "cgroup.controllers", "memory\n")
    write(host.cgroup / "memory.max", f"{GIB}\n")
    cpu = devices.read_cpu_device(host)
    assert (cpu.memory_total, cpu.memory_free, cpu.memory_used) == (GIB, None, None)


def test_no_memavailable_means_free_is_unknown(host_tree: HostTree) -> None:
    cpu = devices.read_cpu_device(host_tree(meminfo="MemTotal: 1000 kB\nMemFree: 10 kB\n"))
    assert (cpu.memory_total, cpu.memory_free, cpu.memory_used, cpu.error) == (1024000, None, None, None)


def test_unreadable_meminfo_is_an_error_row_and_still_listed(host_tree: HostTree) -> None:
    host = host_tree()
    (host.proc / "meminfo").unlink()
    (host.proc / "cpuinfo").unlink()
    cpu = devices.read_cpu_device(host)
    assert cpu.key == "cpu" and cpu.name == "CPU"
    assert cpu.error is not None and "meminfo" in cpu.error
    assert (cpu.memory_total, cpu.memory_free, cpu.memory_source) == (None, None, None)


def test_this_machines_cpu_memory_is_read() -> None:
    cpu = devices.read_cpu_device()
    assert cpu.error is None
    assert cpu.memory_total is not None and cpu.memory_free is not None
    assert 0 < cpu.memory_free <= cpu.memory_total


# --- CUDA_VISIBLE_DEVICES for children --------------------------------------------------------------------------


def gpu(index: int, uuid: str, bus: str, error: str | None = None) -> Device:
    return Device(
        key=uuid, kind="gpu", index=index, name="G", uuid=uuid, pci_bus_id=bus, memory_total=GIB, memory_free=GIB,
        memory_used=0, memory_reserved=0, memory_source="nvml_v2", utilization_gpu=0, utilization_memory=0,
        temperature_c=30, processes=(), error=error,
    )  # fmt: skip


# NVML numbers GPUs in PCI bus order; these three are deliberately not, to show the mapping sorts by bus id itself.
A = gpu(0, "GPU-aaaa0000", "00000000:02:00.0")
B = gpu(1, "GPU-bbbb0000", "00000000:81:00.0")
C = gpu(2, "GPU-cccc0000", "00000000:01:00.0")
GPUS = [A, B, C]


def test_child_sees_the_chosen_gpus_in_pci_order_numbered_from_zero() -> None:
    child = child_cuda_environment([B.key, A.key], GPUS, {})
    # PCI order is C (rank 0), A (rank 1), B (rank 2); the child lists A then B and calls them 0 and 1.
    assert child.environment == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,2"}
    assert child.cuda_index == {A.key: 0, B.key: 1}


def test_child_environment_by_uuid() -> None:
    child = child_cuda_environment([B.key, C.key], GPUS, {}, style="uuid")
    assert child.environment["CUDA_VISIBLE_DEVICES"] == "GPU-cccc0000,GPU-bbbb0000"
    assert child.cuda_index == {C.key: 0, B.key: 1}


def test_a_cpu_only_child_sees_no_gpu() -> None:
    child = child_cuda_environment([], GPUS, {})
    assert child.environment == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ""}
    assert child.cuda_index == {}


def test_with_gpus_in_pci_order_the_child_index_is_nvmls_index(install_nvml: Install) -> None:
    install_nvml(FakeNvml.from_spec("4x8GiB"))
    listing = devices.read_devices().gpus
    for device in listing:
        child = child_cuda_environment([device.key], listing, {})
        assert child.environment["CUDA_VISIBLE_DEVICES"] == str(device.index)


@pytest.mark.parametrize(
    ("chosen", "message"),
    [
        (["GPU-nope"], "no GPU has UUID 'GPU-nope'"),
        (["GPU-aaaa0000", "GPU-aaaa0000"], "chosen twice"),
    ],
)
def test_bad_choices_are_refused(chosen: list[str], message: str) -> None:
    with pytest.raises(DeviceSelectionError, match=message):
        child_cuda_environment(chosen, GPUS, {})


def test_a_gpu_in_error_is_refused() -> None:
    lost = gpu(1, "GPU-bbbb0000", "00000000:81:00.0", error="GPU is lost")
    with pytest.raises(DeviceSelectionError, match="cannot be used: GPU is lost"):
        child_cuda_environment([lost.key], [A, lost, C], {})


def test_index_style_needs_pci_bus_ids_but_uuid_style_does_not() -> None:
    unknown_bus = gpu(1, "GPU-bbbb0000", "")
    with pytest.raises(DeviceSelectionError, match="no PCI bus id"):
        child_cuda_environment([A.key], [A, unknown_bus], {})
    assert child_cuda_environment([A.key], [A, unknown_bus], {}, style="uuid").cuda_index == {A.key: 0}


@pytest.mark.parametrize(
    ("environ", "allowed"),
    [
        ({}, [A, B, C]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-cccc"}, [C]),  # a unique UUID prefix, as CUDA accepts
        ({"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [C, B]),
        ({"CUDA_VISIBLE_DEVICES": "1,-1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [A]),  # CUDA stops at -1
        ({"CUDA_VISIBLE_DEVICES": "GPU-aaaa0000, 7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [A]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-"}, []),  # ambiguous prefix: names no GPU
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ],
)
def test_the_servers_own_cuda_visible_devices(environ: dict[str, str], allowed: list[Device]) -> None:
    assert allowed_gpus(GPUS, environ) == tuple(allowed)


def test_a_gpu_outside_the_servers_cuda_visible_devices_is_refused() -> None:
    environ = {"CUDA_VISIBLE_DEVICES": "GPU-cccc0000"}
    assert child_cuda_environment([C.key], GPUS, environ).environment["CUDA_VISIBLE_DEVICES"] == "0"
    with pytest.raises(DeviceSelectionError, match="outside this server's CUDA_VISIBLE_DEVICES"):
        child_cuda_environment([A.key], GPUS, environ)


def test_the_servers_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb")
    assert allowed_gpus(GPUS) == (B,)


def test_integers_in_cuda_default_order_cannot_be_mapped() -> None:
    with pytest.raises(DeviceSelectionError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        allowed_gpus(GPUS, {"CUDA_VISIBLE_DEVICES": "1"})
    assert allowed_gpus([A], {"CUDA_VISIBLE_DEVICES": "0"}) == (A,)  # one GPU: both orders agree


def test_mig_instances_are_refused() -> None:
    with pytest.raises(DeviceSelectionError, match="MIG"):
        allowed_gpus(GPUS, {"CUDA_VISIBLE_DEVICES": "MIG-1234"})
