"""Which devices a job may run on, and how much memory an attempt there may use.

A device's limit is what is free now (NVML's `free` counts what other processes hold) less what our own attempts
on it have been planned but not yet allocated; on the CPU it is the memory cap when one is set (enforced on the
child), else the memory available. "Next available" means the GPUs this server may use, in NVML order, or the
CPU on a machine without GPUs.
"""

from __future__ import annotations

import dataclasses

from ..devices import CPU_KEY, GPU, Device, DeviceList, DeviceSelectionError, allowed_gpus

AUTO = "auto"


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
        if lowered == CPU_KEY:
            return CPU_KEY
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


def candidates(choice: str, devices: DeviceList) -> tuple[list[Device], str | None]:
    """The devices a job with this (normalised) choice may use, and why there are none."""
    if choice == CPU_KEY:
        return ([devices.cpu], None) if devices.cpu.error is None else ([], f"the CPU cannot be read: {devices.cpu.error}")
    try:
        usable = [gpu for gpu in allowed_gpus(devices.gpus) if gpu.error is None]
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
