"""What GPUs this machine has, read through NVML (nvidia-ml-py). The only module that imports pynvml."""

from __future__ import annotations

import dataclasses

import pynvml


@dataclasses.dataclass(frozen=True)
class GpuInventory:
    """How many GPUs NVML reports, or why none are listed."""

    count: int
    reason: str | None = None


def probe_gpus() -> GpuInventory:
    """Count the GPUs; a missing NVML library or driver means none, with the reason for the user."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return GpuInventory(0, f"NVML is not available: {error}")
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as error:
        return GpuInventory(0, f"NVML could not count the GPUs: {error}")
    finally:
        pynvml.nvmlShutdown()
    return GpuInventory(count, None if count else "the NVIDIA driver reports no GPU")
