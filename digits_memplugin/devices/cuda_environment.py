"""The CUDA environment of a training child: which GPUs it may see, and the number CUDA gives each inside it.

NVML numbers GPUs in PCI bus order (nvidia-smi shows the same numbers); CUDA numbers them fastest first unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID``. `child_cuda_environment` is where the two numberings are reconciled, and
`allowed_gpus` where the server's own CUDA_VISIBLE_DEVICES (which NVML ignores) is applied.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Literal

from ..core.device_kinds import GPU
from .records import Device


class DeviceSelectionError(ValueError):
    """The GPUs asked for cannot be given to a child process; the message says why."""


@dataclasses.dataclass(frozen=True)
class ChildDevices:
    """What a training child gets: environment variables to set, and the CUDA device number of each chosen GPU."""

    environment: Mapping[str, str]
    cuda_index: Mapping[str, int]
    """GPU UUID -> the device number CUDA (so Caffe's ``device_id``) uses for it inside the child."""


def allowed_gpus(gpus: Sequence[Device], environ: Mapping[str, str] | None = None) -> tuple[Device, ...]:
    """The GPUs this server may hand out: all of them, or those its own CUDA_VISIBLE_DEVICES lets it see.

    NVML ignores CUDA_VISIBLE_DEVICES and lists every GPU, so the server's restriction must be applied here.
    Entries are read as CUDA reads them: integers are positions in CUDA's numbering, "GPU-..." a UUID or a unique
    prefix of one, and the list ends at the first entry that names no GPU. Integers are only understood with
    CUDA_DEVICE_ORDER=PCI_BUS_ID (or a single GPU): CUDA's default fastest-first order cannot be rebuilt from NVML.
    """
    environ = os.environ if environ is None else environ
    gpus = [gpu for gpu in gpus if gpu.kind == GPU]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return tuple(gpus)
    in_cuda_order: list[Device] | None = None
    chosen: list[Device] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.startswith("MIG-"):
            raise DeviceSelectionError(
                f"CUDA_VISIBLE_DEVICES={visible!r} names a MIG instance; training on MIG slices is not supported"
            )
        if entry.lstrip("-").isdigit():
            if in_cuda_order is None:
                if environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and len(gpus) > 1:
                    raise DeviceSelectionError(
                        f"CUDA_VISIBLE_DEVICES={visible!r} numbers GPUs in CUDA's default fastest-first order, "
                        "which NVML cannot reproduce: start the server with CUDA_DEVICE_ORDER=PCI_BUS_ID, or name "
                        "the GPUs by UUID"
                    )
                in_cuda_order = _pci_order(gpus)
            position = int(entry)
            if not 0 <= position < len(in_cuda_order):
                break
            match = in_cuda_order[position]
        else:
            matches = [gpu for gpu in gpus if entry and gpu.uuid and gpu.uuid.startswith(entry)]
            if len(matches) != 1:
                break
            match = matches[0]
        if match in chosen:
            break
        chosen.append(match)
    return tuple(chosen)


def child_cuda_environment(
    chosen: Sequence[str],
    gpus: Sequence[Device],
    environ: Mapping[str, str] | None = None,
    *,
    style: Literal["index", "uuid"] = "index",
) -> ChildDevices:
    """The CUDA environment for a child that may use exactly the GPUs `chosen` (UUIDs); none means CPU only.

    The child gets CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA numbers GPUs the way NVML does (PCI bus order), and
    CUDA_VISIBLE_DEVICES listing the chosen GPUs in PCI bus order, by position in that order (`style="index"`,
    understood by every CUDA version) or by UUID (`style="uuid"`). Inside the child, CUDA numbers the visible GPUs
    0, 1, ... in the order listed: `cuda_index` says which number each UUID gets. The position is computed from
    the PCI bus ids, not taken from NVML's index, so the result does not rest on NVML's enumeration order.

    A GPU outside the server's own CUDA_VISIBLE_DEVICES (see `allowed_gpus`), unknown, or in error is refused.
    """
    gpu_list = [gpu for gpu in gpus if gpu.kind == GPU]
    by_uuid = {gpu.uuid: gpu for gpu in gpu_list if gpu.uuid}
    allowed = {gpu.uuid for gpu in allowed_gpus(gpu_list, environ)}
    if len(set(chosen)) != len(chosen):
        raise DeviceSelectionError(f"a GPU is chosen twice: {', '.join(chosen)}")
    selected = []
    for uuid in chosen:
        gpu = by_uuid.get(uuid)
        if gpu is None:
            raise DeviceSelectionError(f"no GPU has UUID {uuid!r}")
        if gpu.error:
            raise DeviceSelectionError(f"GPU {gpu.index} ({uuid}) cannot be used: {gpu.error}")
        if uuid not in allowed:
            raise DeviceSelectionError(
                f"GPU {gpu.index} ({uuid}) is outside this server's CUDA_VISIBLE_DEVICES; it may not be used"
            )
        selected.append(gpu)
    try:
        in_pci_order = _pci_order(gpu_list)
    except DeviceSelectionError:
        if style == "index":
            raise
        in_pci_order = sorted(gpu_list, key=lambda gpu: gpu.index or 0)  # UUIDs do not depend on the order
    selected.sort(key=in_pci_order.index)
    if style == "uuid":
        names = [str(gpu.uuid) for gpu in selected]
    elif style == "index":
        names = [str(in_pci_order.index(gpu)) for gpu in selected]
    else:
        raise ValueError(f"style must be 'index' or 'uuid', got {style!r}")
    return ChildDevices(
        environment={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(names)},
        cuda_index={str(gpu.uuid): position for position, gpu in enumerate(selected)},
    )


def _pci_order(gpus: Sequence[Device]) -> list[Device]:
    """The GPUs in the order CUDA numbers them under CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    missing = [gpu for gpu in gpus if not gpu.pci_bus_id]
    if missing:
        raise DeviceSelectionError(
            f"NVML gave no PCI bus id for GPU {missing[0].index}, so CUDA's numbering of the GPUs is unknown"
        )
    return sorted(gpus, key=lambda gpu: _bus_key(str(gpu.pci_bus_id)))


def _bus_key(bus_id: str) -> tuple[int, ...]:
    """A bus id such as 00000000:3B:00.0 as numbers, so that buses compare numerically whatever their case."""
    domain, bus, rest = bus_id.split(":")
    device, _, function = rest.partition(".")
    return (int(domain, 16), int(bus, 16), int(device, 16), int(function or "0", 16))
