"""jobs.scheduling.scheduler's decision, driven with plain values: devices built by hand, a plan function of the limit, the
jobs running on each device and what they hold back. No threads, no processes, no store, no NVML."""

from __future__ import annotations

from typing import Any

import pytest

from digits_memplugin.core.errors import FieldErrors
from digits_memplugin.core.planning.fit import Decision
from digits_memplugin.core.planning.planner import BatchPlan
from digits_memplugin.core.sizes import GIB, MIB
from digits_memplugin.devices.reader import Device, DeviceList
from digits_memplugin.jobs.scheduling.scheduler import (
    AUTO,
    SIMULATED_GPUS,
    Never,
    Place,
    Wait,
    admit,
    memory_cap,
    place,
)

NO_ENV: dict[str, str] = {}


def gpu(index: int, free: int | None = 8 * GIB, total: int | None = 16 * GIB, error: str | None = None) -> Device:
    uuid = f"GPU-{index}000"
    return Device(
        key=uuid, kind="gpu", index=index, name="Fake", uuid=uuid, pci_bus_id=None, memory_total=total,
        memory_free=free, memory_used=None, memory_reserved=0, memory_source="nvml_v2", utilization_gpu=None,
        utilization_memory=None, temperature_c=None, processes=(), error=error,
    )


def cpu(free: int | None = 4 * GIB, total: int | None = 8 * GIB) -> Device:
    return Device(
        key="cpu", kind="cpu", index=None, name=None, uuid=None, pci_bus_id=None, memory_total=total,
        memory_free=free, memory_used=None, memory_reserved=None, memory_source="meminfo", utilization_gpu=None,
        utilization_memory=None, temperature_c=None, processes=None,
    )


def devices(*gpus: Device, host: Device | None = None) -> DeviceList:
    return DeviceList(tuple(gpus), host or cpu(), None if gpus else "no GPU", None, simulated=False)


class Needs:
    """A plan that fits where the limit is at least `needs` bytes (per device key), with `iter_size` per key;
    it records the limits it was asked about."""

    def __init__(self, needs: dict[str, int], iter_size: dict[str, int] | None = None) -> None:
        self.needs = needs
        self.iter_size = iter_size or {}
        self.asked: list[tuple[str, int]] = []

    def __call__(self, device: Device, limit: int) -> Decision:
        self.asked.append((device.key, limit))
        need = self.needs[device.key]
        if limit < need:
            return Decision(None, None, 1.0, limit, None, f"needs {need // MIB} MiB")
        size = self.iter_size.get(device.key, 1)
        return Decision(BatchPlan(64 // size, size, True, need, 64), None, 1.0, limit, need, "fits")


def decide(choice: str, listed: DeviceList, plan: Needs, **given: Any) -> Place | Wait | Never:
    options: dict[str, Any] = {"running": {}, "reserved": {}, "jobs_per_gpu": 1, "jobs_per_cpu": 1, "environ": NO_ENV}
    return place(choice, listed, plan, **{**options, **given})


def test_a_job_that_fits_is_placed_with_the_limit_and_the_plan() -> None:
    listed = devices(gpu(0))
    where = decide(AUTO, listed, Needs({"GPU-0000": GIB}))
    assert isinstance(where, Place)
    assert where.device.key == "GPU-0000" and where.limit.limit_bytes == 8 * GIB
    assert where.decision.message == "fits" and where.decision.estimated_bytes == GIB


def test_auto_without_gpus_means_the_cpu() -> None:
    where = decide(AUTO, devices(), Needs({"cpu": GIB}))
    assert isinstance(where, Place) and where.device.key == "cpu"


def test_the_smallest_iter_size_wins_and_a_tie_goes_to_the_first() -> None:
    listed = devices(gpu(0), gpu(1), gpu(2))
    needs = {"GPU-0000": GIB, "GPU-1000": GIB, "GPU-2000": GIB}
    where = decide(AUTO, listed, Needs(needs, {"GPU-0000": 4, "GPU-1000": 2, "GPU-2000": 2}))
    assert isinstance(where, Place) and where.device.key == "GPU-1000"
    where = decide(AUTO, listed, Needs(needs))
    assert isinstance(where, Place) and where.device.key == "GPU-0000"


def test_a_device_with_every_slot_taken_makes_the_job_wait() -> None:
    listed = devices(gpu(0))
    plan = Needs({"GPU-0000": GIB})
    assert decide(AUTO, listed, plan, running={"GPU-0000": 1}) == Wait("waiting for a device: GPU 0 is busy")
    assert plan.asked == []  # a busy device is not planned against
    where = decide(AUTO, listed, plan, running={"GPU-0000": 1}, jobs_per_gpu=2)
    assert isinstance(where, Place)


def test_the_cpus_own_slots_count_for_cpu_jobs() -> None:
    where = decide("cpu", devices(gpu(0)), Needs({"cpu": GIB}), running={"cpu": 1}, jobs_per_gpu=4)
    assert where == Wait("waiting for a device: the CPU is busy")


def test_a_device_whose_memory_is_unknown_makes_the_job_wait() -> None:
    where = decide(AUTO, devices(gpu(0, free=None)), Needs({"GPU-0000": GIB}))
    assert where == Wait("waiting for a device: the memory of GPU 0 is unknown")


def test_what_our_running_attempts_hold_back_is_taken_off_the_limit() -> None:
    plan = Needs({"GPU-0000": 6 * GIB})
    where = decide(AUTO, devices(gpu(0)), plan, reserved={"GPU-0000": 3 * GIB}, jobs_per_gpu=2)
    # 8 GiB free less 3 GiB held back: 5 GiB now, too little; the device's 16 GiB would do: wait, not never
    assert where == Wait("waiting for a device: GPU 0: needs 6144 MiB")
    assert plan.asked == [("GPU-0000", 5 * GIB), ("GPU-0000", 16 * GIB)]


def test_a_job_too_large_for_every_device_can_never_run() -> None:
    where = decide(AUTO, devices(gpu(0), gpu(1)), Needs({"GPU-0000": 32 * GIB, "GPU-1000": 32 * GIB}))
    assert where == Never(
        "does not fit even when nothing else runs; GPU 0: needs 32768 MiB; GPU 1: needs 32768 MiB"
    )


def test_too_large_for_one_device_and_busy_on_the_other_waits() -> None:
    listed = devices(gpu(0), gpu(1))
    where = decide(AUTO, listed, Needs({"GPU-0000": 32 * GIB, "GPU-1000": GIB}), running={"GPU-1000": 1})
    assert where == Wait("waiting for a device: GPU 1 is busy; GPU 0: needs 32768 MiB")


def test_the_cpu_cap_less_the_stacks_is_the_cpu_limit() -> None:
    plan = Needs({"cpu": GIB})
    where = decide("cpu", devices(), plan, cap=2 * GIB, cap_overhead=64 * MIB)
    assert isinstance(where, Place) and where.limit.cap_bytes == 2 * GIB
    assert plan.asked == [("cpu", 2 * GIB - 64 * MIB)]


def test_no_device_to_choose_from_waits_with_the_reason() -> None:
    where = decide("GPU-9000", devices(gpu(0)), Needs({}))
    assert where == Wait("waiting: GPU GPU-9000 is not available to this server now")
    where = decide(AUTO, devices(gpu(0, error="lost")), Needs({}))
    assert where == Wait("waiting: no GPU this server may use can be read now")


def test_the_servers_cuda_visible_devices_restricts_the_gpus() -> None:
    listed = devices(gpu(0), gpu(1))
    where = decide(AUTO, listed, Needs({"GPU-1000": GIB}), environ={"CUDA_VISIBLE_DEVICES": "GPU-1000"})
    assert isinstance(where, Place) and where.device.key == "GPU-1000"


@pytest.mark.parametrize(
    ("choice", "listed", "cap", "simulated", "expected"),
    [
        ("auto", devices(gpu(0)), None, False, AUTO),
        ("gpu:0", devices(gpu(0)), None, False, "GPU-0000"),
        ("cpu", devices(gpu(0)), GIB, True, "cpu"),
        ("auto", devices(), GIB, False, AUTO),  # no GPU: auto is the CPU, which a cap applies to
        ("auto", devices(), None, True, AUTO),  # simulated, but no GPU to be refused
    ],
)
def test_admitted_devices(choice: str, listed: DeviceList, cap: int | None, simulated: bool, expected: str) -> None:
    assert admit(choice, listed, memory_cap=cap, gpus_simulated=simulated) == expected


@pytest.mark.parametrize(
    ("choice", "listed", "cap", "simulated", "field", "message"),
    [
        ("gpu:3", devices(gpu(0)), None, False, "device", "no GPU has index 3"),
        ("auto", devices(gpu(0)), GIB, False, "memory_cap", "a memory cap applies to CPU jobs only"),
        ("gpu:0", devices(gpu(0)), GIB, False, "memory_cap", "a memory cap applies to CPU jobs only"),
        ("auto", devices(gpu(0)), None, True, "device", SIMULATED_GPUS),
    ],
)
def test_refused_devices(
    choice: str, listed: DeviceList, cap: int | None, simulated: bool, field: str, message: str
) -> None:
    with pytest.raises(FieldErrors) as refused:
        admit(choice, listed, memory_cap=cap, gpus_simulated=simulated)
    assert refused.value.field == field and message in str(refused.value)


def test_the_memory_cap_is_the_smaller_of_the_jobs_and_the_servers() -> None:
    assert memory_cap(None, None) is None
    assert memory_cap(GIB, None) == GIB and memory_cap(None, GIB) == GIB
    assert memory_cap(GIB, 2 * GIB) == GIB
