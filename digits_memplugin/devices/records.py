"""A device's record: one row per GPU or CPU with the same fields for both, and one reading of them all.

The records are plain data: `reader.py` fills the GPU rows from NVML, `host_memory.py` the CPU row from the kernel,
`devices.cluster` the rows of a cluster's other hosts; the API, the CLI's --json and the `devices` event show them
with `to_json`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal


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
