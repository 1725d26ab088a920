"""`GET <prefix>/api/devices`: every device with its memory, as JSON (the document of `DeviceList.to_json`)."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from flask.typing import ResponseReturnValue

from ..caffe_build import devices_document
from .api import API_PATH


def list_devices() -> ResponseReturnValue:
    """The GPUs NVML reports (an error row for one that cannot be read) and the CPU, which is always listed, with the
    Caffe that trains on them."""
    plugin = current_app.extensions["memplugin"]
    return jsonify(devices_document(plugin.devices.read(), plugin.caffe))


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule(f"{API_PATH}/devices", "api_devices", list_devices)
