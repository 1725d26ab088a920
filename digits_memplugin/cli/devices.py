"""`digits-memplugin devices`: the devices as the server would see them, as a table or as the API's JSON."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "devices",
        help="list the GPUs and the CPU with their memory",
        description=(
            "List the GPUs NVML reports and the CPU, with total, free, used and reserved memory. Without an NVIDIA "
            "driver only the CPU is listed, with the reason."
        ),
    )
    parser.add_argument(
        "--json", action="store_true", help="print the document GET <prefix>/api/devices returns, instead of a table"
    )
    parser.add_argument(
        "--simulate-gpus",
        metavar="SPEC",
        type=gpu_spec,
        help="list fake GPUs of these sizes instead of the driver's, e.g. '2x24GiB' or '24GiB,16GiB'",
    )
    parser.add_argument(
        "--caffe-root", metavar="DIR",
        help="the Caffe build that would train (default: MEMPLUGIN_CAFFE_ROOT, then CAFFE_ROOT and CAFFE_HOME in the "
        "environment, else the bundled pycaffe)",
    )
    parser.set_defaults(run=run)


def gpu_spec(text: str) -> str:
    """An argparse type: a `--simulate-gpus` spec, refused with the reason when it does not parse."""
    from ..core.sizes import parse_gpu_spec

    try:
        parse_gpu_spec(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def run(args: argparse.Namespace) -> int:
    import json
    import os

    from ..devices import reader as devices
    from ..jobs.child.caffe_build import CaffeBuildError, devices_document, find_caffe
    from . import CommandError

    try:
        caffe = find_caffe(args.caffe_root or os.environ.get("MEMPLUGIN_CAFFE_ROOT"))
    except CaffeBuildError as error:
        raise CommandError(str(error)) from None
    if args.simulate_gpus:
        devices.simulate_gpus(args.simulate_gpus)
    document = devices_document(devices.read_devices(), caffe)
    if args.json:
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print(format_table(document))
    return 0


def format_table(document: dict[str, Any]) -> str:
    """The device document as a table, every unknown value shown as "n/a"; processes listed under the table."""
    from ..core.sizes import format_size

    header = ("DEVICE", "NAME", "TOTAL", "FREE", "USED", "RESERVED", "GPU%", "TEMP", "PROCS", "UUID", "PCI BUS ID")
    rows: list[tuple[str, ...]] = [header]
    notes: list[str] = []
    for device in document["devices"]:
        label = f"gpu{device['index']}" if device["kind"] == "gpu" else "cpu"
        processes = device["processes"]
        memory: tuple[str, ...]
        if device["error"]:
            memory = ("error", "", "", "")
            notes.append(f"{label}: error: {device['error']}")
        else:
            memory = tuple(
                format_size(device[field])
                for field in ("memory_total", "memory_free", "memory_used", "memory_reserved")
            )
        rows.append(
            (
                label,
                device["name"] or "n/a",
                *memory,
                _na(device["utilization_gpu"], " %"),
                _na(device["temperature_c"], " C"),
                "n/a" if processes is None else str(len(processes)),
                device["uuid"] or "-",
                device["pci_bus_id"] or "-",
            )
        )
        for process in processes or ():
            notes.append(
                f"{label}: pid {process['pid']} {process['name'] or 'n/a'} uses {format_size(process['used_memory'])}"
            )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    if document["gpu_reason"]:
        lines.append(f"No GPUs: {document['gpu_reason']}")
    if document["simulated"]:
        lines.append("The GPUs are simulated (--simulate-gpus): not this machine's hardware.")
    if document["simulated"]:
        lines.append("NVIDIA driver: simulated (no driver is behind the simulated GPUs)")
    elif document["driver_version"]:
        lines.append(f"NVIDIA driver {document['driver_version']}")
    caffe = document.get("caffe")
    if caffe:
        lines.append(caffe_line(caffe))
        notes.extend(f"caffe: {note}" for note in caffe["notes"])
    return "\n".join(lines + notes)


def caffe_line(caffe: dict[str, Any]) -> str:
    """"Training with BVLC Caffe 1.0.0 (the bundled pycaffe): CPU only, through pycaffe"."""
    abilities = "CPU only" if not caffe["cuda"] else "CUDA and cuDNN" if caffe["cudnn"] else "CUDA without cuDNN"
    through = "pycaffe" if caffe["runner"] == "pycaffe" else f"its caffe binary ({caffe['binary']})"
    return f"Training with {caffe['label']}: {abilities}, through {through}"


def _na(value: int | None, unit: str) -> str:
    return "n/a" if value is None else f"{value}{unit}"
