"""Where a queued job runs: the devices it may use, the memory an attempt there may use, and the decision to place it
now, keep it waiting, or fail it because it can never run. Pure: it reads the plain values it is given (the
devices as last read, what our own attempts hold on each, the plans) and starts, stores and reads nothing; the
manager (jobs.manager) gathers those values and acts on the answer.

A device's limit is what is free now (NVML's `free` counts what other processes hold) less what our own attempts
on it have been planned but not yet allocated; on the CPU it is the memory cap when one is set (enforced on the
child), else the memory available. "Next available" means the GPUs this server may use, in NVML order, or the
CPU on a machine without GPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from ...core.device_kinds import AUTO
from ...core.errors import FieldErrors
from ...core.planning.fit import Decision
from ...core.test_net_modes import SAME_DEVICE, TEST_NET_APART, TEST_NET_AUTO, TEST_NET_SHARED
from ...devices.reader import CPU, GPU, Device, DeviceList, DeviceSelectionError, allowed_gpus

SIMULATED_GPUS = (
    "the GPUs are simulated (--simulate-gpus): their memory is made up and no CUDA device is behind them, so a job "
    'cannot train there; choose the CPU (device "cpu")'
)


@dataclasses.dataclass(frozen=True)
class Limit:
    """Memory an attempt on `device` may use now, and what it could use on the device when nothing else ran."""

    device: Device
    limit_bytes: int
    capacity_bytes: int
    cap_bytes: int | None
    """The RLIMIT_DATA cap to enforce on a CPU attempt (None: none)."""
    overhead_bytes: int = 0
    """What the cap counts that the estimate leaves out (already taken off `limit_bytes`)."""


def normalise_device(choice: str | int, devices: DeviceList) -> str:
    """"auto", "cpu" or a GPU's UUID, from what a client wrote ("auto", "cpu", "gpu", a UUID or its prefix, an
    index as 1 or "1" or "gpu:1"). ValueError with a message when no such device exists."""
    if isinstance(choice, str):
        text = choice.strip()
        lowered = text.lower()
        if lowered in ("", AUTO, "next", "next available", "any"):
            return AUTO
        if lowered == CPU:
            return CPU
        if lowered.startswith(CPU + "@"):  # a cluster host's CPU (devices.cluster)
            found = devices.get(text)
            if found is None or found.kind == GPU:
                hosts = ", ".join(cpu.key for cpu in devices.other_cpus) or "none"
                raise ValueError(f"no host's CPU is {text!r} (hosts' CPUs: {hosts})")
            return found.key
        if lowered.startswith("gpu:"):
            text = text[4:]
        if not text.isdigit():
            matches = [gpu for gpu in devices.gpus if gpu.uuid and gpu.uuid.lower().startswith(lowered)]
            if len(matches) == 1 and matches[0].uuid:
                return matches[0].uuid
            known = ", ".join(gpu.uuid for gpu in devices.gpus if gpu.uuid) or "none"
            raise ValueError(f"no GPU has UUID {text!r} (GPUs: {known})")
        choice = int(text)
    for gpu in devices.gpus:
        if gpu.index == choice and gpu.uuid:
            return gpu.uuid
    raise ValueError(f"no GPU has index {choice} ({devices.gpu_count} GPU(s) found)")


def candidates(
    choice: str, devices: DeviceList, environ: Mapping[str, str] | None = None
) -> tuple[list[Device], str | None]:
    """The devices a job with this (normalised) choice may use, and why there are none. `environ`: the server's
    environment, whose CUDA_VISIBLE_DEVICES restricts the GPUs (os.environ by default)."""
    if choice == CPU or choice.startswith(CPU + "@"):
        cpu = devices.get(choice)
        if cpu is None:
            return [], f"{choice} is not reported any more"
        return ([cpu], None) if cpu.error is None else ([], f"the CPU cannot be read: {cpu.error}")
    try:
        usable = [gpu for gpu in allowed_gpus(devices.gpus, environ) if gpu.error is None]
    except DeviceSelectionError as error:
        return [], str(error)
    if choice == AUTO:
        if devices.gpu_count == 0:
            return [devices.cpu], None
        return usable, None if usable else "no GPU this server may use can be read now"
    chosen = [gpu for gpu in usable if gpu.uuid == choice]
    if chosen:
        return chosen, None
    gone = devices.get(choice)
    if gone is not None and gone.error:
        return [], f"GPU {choice} cannot be read now: {gone.error}"
    return [], f"GPU {choice} is not available to this server now"


def limit_for(device: Device, *, reserved: int = 0, cap: int | None = None, cap_overhead: int = 0) -> Limit | None:
    """The memory an attempt may use on `device`, less `reserved` (planned by our own running attempts and not
    yet allocated); None when the device's memory is unknown. Under a cap, `cap_overhead` (what the cap counts
    but the estimate does not: the reserved stacks of Caffe's threads) is taken off the plannable part."""
    if device.kind == GPU:
        if device.memory_free is None or device.memory_total is None:
            return None
        capacity = device.memory_total - (device.memory_reserved or 0)
        return Limit(device, max(0, device.memory_free - reserved), capacity, None)
    plannable = None if cap is None else max(0, cap - cap_overhead)
    if device.memory_free is None or device.memory_total is None:
        if cap is None or plannable is None:
            return None
        return Limit(device, plannable, plannable, cap, cap_overhead)
    available = max(0, device.memory_free - reserved)
    if cap is not None and plannable is not None:  # each attempt is capped on its own; the machine must have room
        return Limit(device, min(plannable, available), min(plannable, device.memory_total), cap, cap_overhead)
    return Limit(device, available, device.memory_total, None)


MEMORY_CAP_ON_GPU = 'a memory cap applies to CPU jobs only (device "cpu")'
"""A memory cap is enforced on a CPU attempt's process (RLIMIT_DATA); GPU memory has no such limit."""


def admit(choice: str | int, devices: DeviceList, *, memory_cap: int | None, gpus_simulated: bool) -> str:
    """The device a submission asks for, normalised ("auto", "cpu" or a GPU's UUID); FieldErrors naming the
    request's field at fault when it names no device, gives a memory cap for a job that may run on a GPU, or may
    run only on simulated GPUs."""
    try:
        device = normalise_device(choice, devices)
    except ValueError as error:
        raise FieldErrors.one("device", str(error)) from None
    on_cpu = device == CPU or device.startswith(CPU + "@")
    if memory_cap is not None and not on_cpu and not (device == AUTO and not devices.gpus):
        raise FieldErrors.one("memory_cap", MEMORY_CAP_ON_GPU)
    if gpus_simulated and not on_cpu and devices.gpus:
        raise FieldErrors.one("device", SIMULATED_GPUS)
    return device


def admit_tester(
    choice: str | int, test_net: str, devices: DeviceList, *, apart_refused: str | None, gpus_simulated: bool
) -> str:
    """Where a submission's tester may run (`tester_device`), normalised: "auto", "same", "cpu" or a GPU's UUID;
    FieldErrors naming the field at fault when it names no device, names one for test nets that stay shared, or asks
    for the test nets apart where this server cannot keep them apart (`apart_refused` says why)."""
    if test_net == TEST_NET_APART and apart_refused:
        raise FieldErrors.one("test_net", f"cannot be {TEST_NET_APART!r} here: {apart_refused}")
    if isinstance(choice, str) and choice.strip().lower() == SAME_DEVICE:
        tester = SAME_DEVICE
    else:
        try:
            tester = normalise_device(choice, devices)
        except ValueError as error:
            raise FieldErrors.one("tester_device", str(error)) from None
    if test_net == TEST_NET_SHARED and tester != AUTO:
        raise FieldErrors.one("tester_device", f"names where a tester runs: give test_net {TEST_NET_APART!r} or "
                                               f"{TEST_NET_AUTO!r} with it (the test nets are {TEST_NET_SHARED!r})")
    if gpus_simulated and tester not in (AUTO, SAME_DEVICE, CPU) and not tester.startswith(CPU + "@"):
        raise FieldErrors.one("tester_device", SIMULATED_GPUS)
    return tester


@dataclasses.dataclass(frozen=True)
class Place:
    """Run the job now on `limit.device`, planned as `decision` says."""

    limit: Limit
    decision: Decision

    @property
    def device(self) -> Device:
        return self.limit.device


@dataclasses.dataclass(frozen=True)
class Wait:
    """Keep the job queued; `reason` is its message meanwhile."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Never:
    """The job fits on none of its devices even when nothing else runs there: it fails with `reason`."""

    reason: str


Plan = Callable[[Device, int], Decision]
"""The job's plan on a device under a memory limit in bytes (the fallback policy with no failure yet)."""


def place(
    choice: str,
    devices: DeviceList,
    plan: Plan,
    *,
    running: Mapping[str, int],
    reserved: Mapping[str, int],
    jobs_per_gpu: int,
    jobs_per_cpu: int,
    cap: int | None = None,
    cap_overhead: int = 0,
    environ: Mapping[str, str] | None = None,
) -> Place | Wait | Never:
    """Where a queued job with the (normalised) device `choice` runs now.

    `running`: our jobs running on each device (by key), `reserved`: bytes our attempts there were planned to take
    and have not taken yet; `cap` and `cap_overhead` as `limit_for` takes them, `environ` as `candidates`.

    Among the devices with a free slot whose limit the plan fits, the one with the smallest iter_size wins (the
    first in order on a tie). A device that is busy, whose memory is unknown, or where the plan fits only once
    the others' memory is free makes the job wait; where even the device's whole capacity is too small, it is
    never; never on every device fails the job."""
    choices, reason = candidates(choice, devices, environ)
    best: tuple[int, Place] | None = None
    waits: list[str] = []
    never: list[str] = []
    for order, device in enumerate(choices):
        slots = jobs_per_gpu if device.kind == GPU else jobs_per_cpu
        label = _label(device)
        if running.get(device.key, 0) >= slots:
            waits.append(f"{label} is busy")
            continue
        limit = limit_for(device, reserved=reserved.get(device.key, 0), cap=cap, cap_overhead=cap_overhead)
        if limit is None:
            waits.append(f"the memory of {label} is unknown")
            continue
        decision = plan(device, limit.limit_bytes)
        if decision.plan is not None:
            rank = decision.plan.iter_size * 1000 + order
            if best is None or rank < best[0]:
                best = (rank, Place(limit, decision))
            continue
        empty = plan(device, limit.capacity_bytes)
        (waits if empty.plan is not None else never).append(f"{label}: {decision.message}")
    if best is not None:
        return best[1]
    if choices and len(never) == len(choices):
        return Never("does not fit even when nothing else runs; " + "; ".join(never))
    return Wait("waiting for a device: " + "; ".join(waits + never) if (waits or never) else f"waiting: {reason}")


def _label(device: Device) -> str:
    where = f" of {device.host}" if device.host else ""
    return f"the CPU{where}" if device.kind != GPU else f"GPU {device.index}{where}"


def memory_cap(requested: int | None, server: int | None) -> int | None:
    """The RLIMIT_DATA cap of a job's CPU attempts: the smaller of the job's own and the server's (None: none)."""
    caps = [cap for cap in (requested, server) if cap is not None]
    return min(caps) if caps else None
