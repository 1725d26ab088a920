"""The devices of a cluster's hosts, as one DeviceList the panel, the form and the planner use like this host's own.

Each node's agent (`python -m digits_memplugin.jobs.backends.node --agent ROOT`, started with the node) writes its devices,
read with the plugin's own devices.read_devices (NVML), to ROOT/nodes/<host>.json every few seconds; the server
reads those files (the shared folder, no extra port). A host's GPUs keep their UUID as key (unique across hosts),
with `host` set; a host's CPU is "cpu@<host>". The server's own CPU stays "cpu" (a job placed there runs on any
node that has room). A report older than `max_age` is a host gone: its devices are left out, and jobs wait.

The names of the Ray resources that pin an attempt (jobs.backends.ray) live here too, next to the keys they mirror.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.device_kinds import CPU
from .reader import DeviceReader
from .records import Device, DeviceList, GpuProcess

log = logging.getLogger(__name__)

NODES_FOLDER = "nodes"
MAX_AGE_SECONDS = 30.0
GPU_RESOURCE = "memplugin_gpu:"
HOST_RESOURCE = "memplugin_cpu:"


def gpu_resource(uuid: str) -> str:
    return GPU_RESOURCE + uuid


def host_resource(host: str) -> str:
    return HOST_RESOURCE + host


def cpu_key(host: str) -> str:
    return f"{CPU}@{host}"


def cpu_host(key: str) -> str | None:
    """The host of a "cpu@<host>" key; None for any other key."""
    prefix = CPU + "@"
    return key[len(prefix):] if key.startswith(prefix) and len(key) > len(prefix) else None


def device_from_json(document: Mapping[str, Any], host: str) -> Device:
    """A Device as Device.to_json wrote it on another host, with `host` set (a CPU keyed "cpu@<host>")."""
    fields = dict(document)
    processes = fields.get("processes")
    fields["processes"] = None if processes is None else tuple(GpuProcess(**p) for p in processes)
    fields["host"] = host
    if fields.get("kind") == CPU:
        fields["key"] = cpu_key(host)
    return Device(**fields)


class ClusterDeviceReader(DeviceReader):
    """This server's devices (`local`) plus every host's GPUs and CPU from the nodes' reports under `root`."""

    def __init__(self, root: Path, local: DeviceReader, max_age: float = MAX_AGE_SECONDS) -> None:
        self.root = root
        self.local = local
        self.max_age = max_age

    def read(self) -> DeviceList:
        own = self.local.read()
        gpus: list[Device] = []
        cpus: list[Device] = []
        simulated = own.simulated
        for host, report in sorted(self.reports().items()):
            try:
                devices = [device_from_json(row, host) for row in report.get("devices", [])]
            except (TypeError, ValueError) as error:
                log.warning("the device report of %s cannot be read: %s", host, error)
                continue
            gpus += [device for device in devices if device.kind != CPU]
            cpus += [device for device in devices if device.kind == CPU]
            simulated = simulated or bool(report.get("simulated"))
        seen = {gpu.key for gpu in gpus}
        gpus = [gpu for gpu in own.gpus if gpu.key not in seen] + gpus  # a node on this host reports them too
        reason = own.gpu_reason if not gpus else None
        return DeviceList(
            gpus=tuple(gpus), cpu=own.cpu, gpu_reason=reason, driver_version=own.driver_version, simulated=simulated,
            other_cpus=tuple(cpus),
        )

    def reports(self) -> dict[str, dict[str, Any]]:
        """The hosts' latest reports that are fresh enough, by host name."""
        found: dict[str, dict[str, Any]] = {}
        now = time.time()
        for path in sorted((self.root / NODES_FOLDER).glob("*.json")):
            try:
                report = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # being replaced, or not ours
            if not isinstance(report, dict) or not isinstance(report.get("host"), str):
                continue
            if now - float(report.get("time") or 0) <= self.max_age:
                found[report["host"]] = report
        return found


__all__ = [
    "ClusterDeviceReader", "cpu_host", "cpu_key", "device_from_json", "gpu_resource", "host_resource",
]
