"""`GET <prefix>/api/devices`: every device with its memory, as JSON (the document of `DeviceList.to_json`); and
`GET <prefix>/api/devices/attempts`: which of this server's training attempts each device runs now (the Devices
page lists them beside the device's processes)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, url_for
from flask.typing import ResponseReturnValue

from ...jobs.child.caffe_build import devices_document
from ..plugin_state import current_plugin
from .envelope import API_PATH


def list_devices() -> ResponseReturnValue:
    """The GPUs NVML reports (an error row for one that cannot be read) and the CPU, which is always listed, with the
    Caffe that trains on them."""
    plugin = current_plugin()
    return jsonify(devices_document(plugin.devices.read(), plugin.caffe))


def running_attempts() -> list[dict[str, Any]]:
    """Each running job's attempt now training, with the device it trains on (its key: "cpu", "GPU-<uuid>"), its
    process (the local child's pid, None under another backend) and the job's page."""
    manager = current_plugin().started_jobs()
    return [
        {
            "device": attempt.device, "job_id": job.id, "job_name": job.name, "attempt": attempt.number,
            "batch_size": attempt.batch_size, "iter_size": attempt.iter_size, "pid": attempt.pid,
            "started_at": attempt.started_at, "iteration": job.iteration, "max_iter": job.max_iter,
            "url": url_for("memplugin.job_page", job_id=job.id),
        }
        for job, attempt in manager.running_attempts()
    ]


def list_device_attempts() -> ResponseReturnValue:
    return jsonify(attempts=running_attempts())


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule(f"{API_PATH}/devices", "api_devices", list_devices)
    blueprint.add_url_rule(f"{API_PATH}/devices/attempts", "api_device_attempts", list_device_attempts)
