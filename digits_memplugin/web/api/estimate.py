"""`POST <prefix>/api/estimate`: the estimate document for prototxt texts sent as JSON.

    {"net": "...", "solver": "...", "batch": 64, "engine": "gpu-cudnn", "free_bytes": 8589934592,
     "device": "GPU-...", "data_shapes": {"data": [3, 256, 256]}, "classes": 10, "safety_margin": 0.1}

Only `net` (or a solver with an inline net) is required; `free_bytes` is a number of bytes or a size ("8GiB").
`device` takes the free memory from that device, and without `engine` the engine jobs train with there (the
server's policy, as `safety_margin` defaults to its margin for the engine: 3% on the CPU, 5% on GPUs); `devices` (a list of keys, or "all") adds `plans`, one per device,
from the same estimate. `curve_batches` adds the footprint at those batch sizes (`curve`) and a linear model of it.
`test_net` ("auto", the default, "shared" or "apart") plans the test nets as a job's `test_net` does, the tester on
the same device: each plan says where they are, why, and what the tester needs (`test_net`, `test_net_note`,
`tester_bytes`). `max_batch` caps the planned batch; `auto: true` caps it as a job's batch "auto" is capped
(planner.auto_cap: a twentieth of `train_items`, the training set's size, and at most 256), and `auto_cap` in the
answer says why. `data_shapes` maps a data top (or `layer/top`, or `*` for every data layer's
first top) to its item shape; `read_datasets: true` reads the shapes from the datasets the net names, inside
MEMPLUGIN_DATASET_ROOTS. openapi.json (served at `<prefix>/api/openapi.json`) describes every field.
Validation errors are 400 with `{"errors": {field: message}}`; a definition error carries its line and layer.
Texts over MEMPLUGIN_ESTIMATE_INLINE_BYTES are estimated in a worker process, off the server's thread; when every
worker is busy and MEMPLUGIN_ESTIMATE_QUEUE requests wait, the answer is a 503 with Retry-After.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from ...core import fields
from ...core.errors import FieldErrors, NetError
from ...core.estimate import EstimateRequest
from ...core.inputs import capped, not_text, surrogate_in, type_name
from ...core.layers.data import DataSpec
from ...core.sizes import byte_count
from ...core.test_net_modes import TEST_NET_MODES
from ...estimate.pool import DatasetsFailed
from ...jobs.definition.request import TEST_NET
from ..plugin_state import current_plugin
from .envelope import API_PATH, read_json

FIELDS: dict[str, type | tuple[type, ...]] = {
    "net": str,
    "solver": str,
    "batch": int,
    "test_batch": int,
    "engine": str,
    "free_bytes": (int, str),
    "device": str,
    "devices": (list, str),
    "safety_margin": (int, float),
    "data_shapes": dict,
    "classes": int,
    "curve_batches": list,
    "max_batch": int,
    "auto": bool,
    "train_items": int,
    "read_datasets": bool,
    "test_net": str,
}
CHOICE_FIELDS: dict[str, tuple[tuple[str, ...], str]] = {"test_net": (TEST_NET_MODES, TEST_NET)}
"""Words, with what to say when another is given: the same words, and the same refusal, as a job's request."""
SIZE_FIELDS = ("free_bytes",)
"""Byte counts, taken as a number of bytes or as a size with its unit ("8GiB"), as jobs and the command line do."""


def parse_request(body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request's fields, type-checked; unknown fields are errors so that typos do not pass silently."""
    if not isinstance(body, dict):
        return {}, {"body": "expected a JSON object"}
    refusals = fields.Refusals()
    capped(refusals.errors, (key for key in body if key not in FIELDS),
           f"unknown field (known: {', '.join(sorted(FIELDS))})")
    values: dict[str, Any] = {}
    for key, kind in FIELDS.items():
        if key not in body or body[key] is None:
            continue
        value = body[key]
        where = surrogate_in(value)
        if where is not None:
            refusals.errors[key] = not_text(where)
        elif key in SIZE_FIELDS:
            refusals.take(values, key, _size, value)
        elif key in CHOICE_FIELDS:
            refusals.take(values, key, fields.choice, value, options=CHOICE_FIELDS[key][0], must=CHOICE_FIELDS[key][1])
        else:
            refusals.take(values, key, fields.of_type, value, kind=kind)
    if "net" not in values and "solver" not in values and "net" not in refusals.errors:
        refusals.errors["net"] = "give the net prototxt text (or a solver with net_param)"
    # The one check of data_shapes, with the jobs' bounds (a dict by now: its type is checked above).
    refusals.take(values, "data_shapes", fields.shapes, values.pop("data_shapes", {}),
                  many="data_shapes entries that are not shapes")
    values["data_shapes"] = {top: DataSpec(shape) for top, shape in values.get("data_shapes", {}).items()}
    return values, refusals.errors


def _size(field: str, value: Any) -> int:
    try:
        return byte_count(value)
    except ValueError as error:
        fields.refuse(field, str(error) if isinstance(value, str) else f"{error}, got {type_name(value)}")


def post_estimate() -> ResponseReturnValue:
    """The REST API's answer: the document, or its validation errors with HTTP 400 (DIGITS' habit, which scripts
    check)."""
    body = read_json(current_plugin().settings.max_request_bytes)
    try:
        return jsonify(estimate_document(body))
    except FieldErrors as invalid:
        return jsonify(errors=invalid.errors), 400


def estimate_document(body: Any) -> dict[str, Any]:
    """The estimate document for a request body already read; raises `FieldErrors` with {field: message} when the
    request cannot be estimated (the New model page answers the same with 200: model_page.estimate_for_page)."""
    plugin = current_plugin()
    values, errors = parse_request(body)
    if errors:
        raise FieldErrors(errors)

    policy = plugin.jobs.config.policy
    values["policy"] = policy
    device_key = values.pop("device", None)
    device_keys = values.pop("devices", None)
    device_errors: dict[str, str] = {}
    if device_key is not None or device_keys is not None:
        listed = plugin.devices.read()
    if device_key is not None:
        if "free_bytes" in values:
            raise FieldErrors({"device": "give either device or free_bytes, not both"})
        device = listed.get(device_key)
        if device is None:
            raise FieldErrors({"device": f"no device {device_key!r} (see {API_PATH}/devices)"})
        if device.error or device.memory_free is None:
            raise FieldErrors({"device": f"the free memory of {device_key!r} is unknown: {device.error or 'n/a'}"})
        values["free_bytes"] = device.memory_free
        # The engine that trains there, as jobs plan (one policy for the form, this API and the job manager).
        values.setdefault("engine", policy.engine(device.kind))
    if device_keys is not None:
        if device_keys == "all":
            device_keys = [device.key for device in listed.devices]
        elif not isinstance(device_keys, list) or not all(isinstance(key, str) for key in device_keys):
            raise FieldErrors({"devices": 'must be a list of device keys or "all"'})
        budgets: dict[str, int] = {}
        for key in device_keys:
            device = listed.get(key)
            if device is None:
                raise FieldErrors({"devices": f"no device {key!r} (see {API_PATH}/devices)"})
            if device.error or device.memory_free is None:
                device_errors[key] = f"free memory unknown: {device.error or 'n/a'}"
            else:
                budgets[key] = device.memory_free
        values["budgets"] = budgets
    if "curve_batches" in values:
        values["curve_batches"] = tuple(values["curve_batches"])
    roots = None
    if values.pop("read_datasets", False):
        roots = plugin.settings.dataset_roots or (plugin.settings.data_dir / "datasets",)
    try:
        estimate_request = EstimateRequest(**values)
        # Large texts go to a worker process (estimate_pool.py): a full queue is a 503 with Retry-After.
        document = plugin.estimates.estimate(estimate_request, dataset_roots=roots)
    except DatasetsFailed as failed:
        raise FieldErrors({"read_datasets": failed.error.to_dict()}) from None
    except NetError as error:
        key = error.field if error.source is None and error.layer is None and error.field in FIELDS else "net"
        if error.source is not None and "solver" in str(error.source):
            key = "solver"
        raise FieldErrors({key: error.to_dict()}) from None
    if device_key is not None:
        document["device"] = device_key
    if device_keys is not None:
        document.setdefault("plans", {})
        for key, message in device_errors.items():
            document["plans"][key] = {"error": message}
    return document  # type: ignore[no-any-return]


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule(f"{API_PATH}/estimate", "api_estimate", post_estimate, methods=["POST"])
