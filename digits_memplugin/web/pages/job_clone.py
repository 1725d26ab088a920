"""Cloning a job, as DIGITS' "Clone Job" does: its settings again, to change one and train anew.

    GET <prefix>/api/jobs/<id>/request     the job's request as a document POST <prefix>/api/jobs takes as it is
    GET <prefix>/models/new?clone=<id>     the New model form filled in with the job's settings (model_page.py)

DIGITS keeps the form's fields with each job and fills them in again; jobs here are made by the form, the REST API
and the command line alike, so the form is filled in from the request the job keeps (its spec, and the net and
solver as submitted in its folder): a net that is one of the standard networks (as the form rewrites it for the
dataset format) is chosen as that network, any other is pasted as a custom network; a solver the form's settings
make is read back into them, any other is pasted as a solver file. What the form has no field for (a memory cap
where the form has none, the fallback's settings, a data shape other than the item's) is named on the page, and
the REST document keeps it.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

from flask import Blueprint, jsonify, url_for
from flask.typing import ResponseReturnValue
from google.protobuf import text_format
from werkzeug.exceptions import NotFound

from ...core.device_kinds import AUTO, CPU
from ...core.errors import NetError
from ...core.planning.fallback import DEFAULT_GROWTH
from ...core.prototxt import parse_net, parse_solver
from ...core.sizes import format_size
from ...core.test_net_modes import SAME_DEVICE, TEST_NET_AUTO
from ...devices.reader import DeviceList
from ...jobs.definition.data_sources import data_phases
from ...jobs.definition.definition import NET_SOURCE, SOLVER_SOURCE
from ...jobs.definition.model_files import DownloadError, open_job_file
from ...jobs.definition.outline import Outline
from ...jobs.errors import JobNotFound
from ...jobs.manager import JobManager
from ...jobs.store.records import Job
from ...networks import STANDARD_NETWORKS
from ..api.envelope import API_PATH, job_or_404
from ..plugin_state import current_plugin
from .forms import (
    DATA_TOP,
    DEVICE_NEXT,
    NEEDS_GAMMA,
    NEEDS_POWER,
    NO_MOMENTUM,
    NewModelForm,
    solver_prototxt,
)

MAX_TEXT_BYTES = 8 * 1024 * 1024


def _manager() -> JobManager:
    return current_plugin().started_jobs()


def _read(manager: JobManager, job: Job, name: str) -> str:
    opened = open_job_file(manager.jobs_root, job, name)
    if opened.size > MAX_TEXT_BYTES:
        opened.close()
        raise DownloadError(f"the job's {name} is larger than {MAX_TEXT_BYTES} bytes", 409)
    return b"".join(opened.chunks()).decode("utf-8", errors="replace")


def request_document(manager: JobManager, job: Job) -> dict[str, Any]:
    """The job's request (jobs/definition/request.py's fields) as POST /jobs takes it: the net and solver as submitted, and
    what the job keeps of the rest; fields it left to the server's defaults are left out."""
    spec = job.spec
    document: dict[str, Any] = {
        "net": _read(manager, job, NET_SOURCE), "solver": _read(manager, job, SOLVER_SOURCE), "name": job.name,
    }
    for key in ("device", "batch", "data", "data_shapes", "classes", "max_iter", "memory_cap", "divergence"):
        value = spec.get(key)
        if value not in (None, {}, []):
            document[key] = value
    for key in ("test_net", "tester_device"):  # "auto", the default, left out as the server's
        if spec.get(key) not in (None, AUTO):
            document[key] = spec[key]
    fallback = {key: value for key, value in (spec.get("fallback") or {}).items() if value is not None}
    if fallback:
        document["fallback"] = fallback
    return document


def job_request(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    job = job_or_404(manager, job_id)
    try:
        return jsonify(request_document(manager, job))
    except DownloadError as error:
        raise NotFound(str(error)) from None


# --- the form, filled in ------------------------------------------------------------------------------------------


def clone_form_data(job_id: str, devices: DeviceList) -> tuple[Job, dict[str, Any], list[str]]:
    """The New model form's fields for a clone of the job, and notes on what the form cannot hold. NotFound for a
    job that is not there (or whose folder lost its net)."""
    manager = _manager()
    try:
        job = manager.get(job_id)
        document = request_document(manager, job)
    except (JobNotFound, DownloadError) as error:
        raise NotFound(str(error)) from None
    data, notes = form_fields(document, devices)
    return job, data, notes


def form_fields(document: dict[str, Any], devices: DeviceList) -> tuple[dict[str, Any], list[str]]:
    """A job request's fields (request_document) as the New model form's, and what it has no field for."""
    notes: list[str] = []
    fields: dict[str, Any] = {"model_name": document.get("name") or ""}
    net_text, solver_text, data = document["net"], document["solver"], document.get("data") or {}
    large = _large_texts(net_text, solver_text, data, document.get("max_iter"))
    if large is not None and net_text is large.net_text:  # never a standard network: pasted as it is
        layers, network = large.outline.layers, None
    else:
        try:
            net = parse_net(net_text, NET_SOURCE)
        except NetError:
            net = None
        layers = None if net is None else {layer.name: (layer.type, tuple(data_phases(layer))) for layer in net.layer}
        network = _standard_network(net)
    train, val, backend = _sources(layers, data, notes)
    fields.update(data_backend=backend, train_source=train, val_source=val)
    if network is not None:
        fields.update(network="standard", standard_network=network)
    else:
        fields.update(network="custom", custom_network=net_text)
    if large is not None and solver_text is large.solver_text:  # never one the form's settings make
        fields.update(solver="file", solver_text=large.outline.solver_text or solver_text)
    else:
        fields.update(_solver_fields(solver_text, document.get("max_iter"), validation=bool(val)))
    shapes = dict(document.get("data_shapes") or {})
    item = shapes.pop(DATA_TOP, None)
    if item:
        fields["item_shape"] = ",".join(str(d) for d in item)
    if shapes:
        notes.append("data shapes for other tops (" + ", ".join(sorted(shapes)) + ") have no field on the form")
    if document.get("classes") is not None:
        fields["classes"] = document["classes"]
    batch = document.get("batch")
    fields["batch_size"] = "" if batch is None else str(batch)
    fields["device"] = _device_choice(document.get("device"), devices, notes)
    if document.get("divergence"):
        fields["divergence"] = document["divergence"]
    fields["test_net"] = document.get("test_net") or TEST_NET_AUTO
    fields["tester_device"] = _tester_choice(document.get("tester_device"), devices, notes)
    cap = document.get("memory_cap")
    if cap is not None:
        if "memory_cap" in NewModelForm.__dict__:
            fields["memory_cap"] = exact_size(cap)
        else:
            notes.append(f"its memory cap ({format_size(cap)}) has no field on the form")
    defaults = {"max_attempts": current_plugin().settings.job_max_attempts,
                "growth": DEFAULT_GROWTH, "safety_margin": None, "start": "plan"}
    changed = {key: value for key, value in (document.get("fallback") or {}).items() if defaults.get(key) != value}
    if changed:
        notes.append("its out-of-memory fallback settings (" + ", ".join(f"{key} {value}" for key, value in
                     sorted(changed.items())) + ") have no field on the form: the server's defaults apply")
    return fields, notes


@dataclasses.dataclass(frozen=True)
class _Large:
    """The texts of a clone too large to parse in the server's thread (the one not large is None), and their
    outline, made in an estimate worker."""

    net_text: str | None
    solver_text: str | None
    outline: Outline


def _large_texts(net_text: str, solver_text: str, data: dict[str, str], max_iter: int | None) -> _Large | None:
    """None when both texts are small enough to parse here (the estimate pool's `inline_bytes`, 16 KiB: 30 ms at
    most); else what the page needs of the large ones, from a worker (jobs/definition/outline.py): a stored job's texts may be
    4 MiB each, seconds to parse, and the clone page is a read anyone allowed to read may repeat."""
    plugin = current_plugin()
    pool = plugin.estimates
    limit = pool.inline_bytes if pool is not None else None
    big_net = net_text if limit is not None and len(net_text) > limit else None
    big_solver = solver_text if limit is not None and len(solver_text) > limit else None
    if big_net is None and big_solver is None:
        return None
    found = plugin.jobs.planner.outline(big_net, big_solver, list(data), max_iter)
    return _Large(big_net, big_solver, found)


def _sources(
    layers: dict[str, tuple[str, tuple[str, ...]]] | None, data: dict[str, str], notes: list[str]
) -> tuple[str, str, str]:
    """The training and validation sources and the dataset format, from the request's data by layer or phase
    (`layers`: each layer's type and the phases it feeds, by name; None when the net does not parse)."""
    train: list[str] = []
    val: list[str] = []
    backend = "lmdb"
    for key, source in data.items():
        if key.lower() in ("train", "test"):
            phases = {key.lower()}
        elif layers is not None and key in layers:
            kind, fed = layers[key]
            phases = set(fed)
            if kind == "HDF5Data":
                backend = "hdf5"
        else:
            continue
        if "train" in phases and source not in train:
            train.append(source)
        elif "test" in phases and source not in val:
            val.append(source)
    if len(train) > 1 or len(val) > 1:
        notes.append("its data layers read several datasets (" + ", ".join(train + val) + "); the form takes one "
                     "training and one validation dataset, the first of each")
    return (train[0] if train else ""), (val[0] if val else ""), backend


def _normalised(net: Any) -> bytes:
    """A net as the form's dataset format leaves it, format undone: Data layers without a backend, HDF5Data layers
    (the form's HDF5 choice) back to Data layers of the same batch."""
    copy = type(net)()
    copy.CopyFrom(net)
    for layer in copy.layer:
        if layer.type == "HDF5Data":
            batch = layer.hdf5_data_param.batch_size
            layer.type = "Data"
            layer.ClearField("hdf5_data_param")
            layer.data_param.batch_size = batch
        if layer.type == "Data":
            layer.data_param.ClearField("backend")
            if not layer.data_param.ListFields():
                layer.ClearField("data_param")
    return bytes(copy.SerializeToString(deterministic=True))


def _standard_network(net: Any) -> str | None:
    """The key of the standard network this net is, as the form submitted it; None for any other net."""
    if net is None:
        return None
    wanted = _normalised(net)
    for network in STANDARD_NETWORKS:
        try:
            if _normalised(parse_net(network.text, network.filename)) == wanted:
                return network.key
        except NetError:  # pragma: no cover - the bundled networks parse
            continue
    return None


def _float32(value: float) -> str:
    """A float32 field's value as a person wrote it: the shortest decimal that is the same float32 (0.01, not
    0.009999999776482582)."""
    stored = struct.unpack("f", struct.pack("f", value))[0]
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == stored:
            return text
    return repr(value)


def _solver_fields(text: str, max_iter: int | None, *, validation: bool) -> dict[str, Any]:
    """The form's solver fields: its settings when the solver is one they make (read back, made again, the same
    text), else the solver pasted as a file (with the request's max_iter written into it)."""
    try:
        solver = parse_solver(text, SOLVER_SOURCE)
    except NetError:
        return {"solver": "file", "solver_text": text}
    settings: dict[str, Any] = {
        "type": solver.type or "SGD", "base_lr": float(_float32(solver.base_lr)), "lr_policy": solver.lr_policy,
        "weight_decay": float(_float32(solver.weight_decay)), "max_iter": solver.max_iter, "snapshot": solver.snapshot,
    }
    if settings["type"] not in NO_MOMENTUM:
        settings["momentum"] = float(_float32(solver.momentum))
    if solver.lr_policy in NEEDS_GAMMA:
        settings["gamma"] = float(_float32(solver.gamma))
    if solver.lr_policy in NEEDS_POWER:
        settings["power"] = float(_float32(solver.power))
    if solver.lr_policy == "step":
        settings["stepsize"] = solver.stepsize
    if solver.lr_policy == "multistep":
        settings["stepvalue"] = list(solver.stepvalue)
    tests = validation and len(solver.test_iter) == 1
    if tests:
        settings["test_interval"] = solver.test_interval
        settings["test_iter"] = solver.test_iter[0]
    try:
        made = solver_prototxt(settings, validation=tests)
    except (TypeError, ValueError):
        made = None
    if made != text:
        if max_iter is not None and solver.max_iter != max_iter:
            solver.max_iter = max_iter
            text = text_format.MessageToString(solver)
        return {"solver": "file", "solver_text": text}
    fields: dict[str, Any] = {"solver": "settings", "solver_type": settings["type"], "lr_policy": solver.lr_policy}
    for name in ("base_lr", "weight_decay", "momentum", "gamma", "power"):
        if name in settings:
            fields[name] = settings[name]
    for name in ("stepsize", "snapshot", "test_interval", "test_iter"):
        if name in settings:
            fields[name] = settings[name]
    fields["max_iter"] = max_iter if max_iter is not None else settings["max_iter"]
    if "stepvalue" in settings:
        fields["stepvalues"] = ",".join(str(step) for step in settings["stepvalue"])
    return fields


def _device_choice(device: Any, devices: DeviceList, notes: list[str]) -> str:
    """The form's device choice for the job's device: "next" for "auto", the CPU, or the GPU by its UUID."""
    if device in (None, AUTO):
        return DEVICE_NEXT
    if device == CPU:
        return CPU
    for gpu in devices.gpus:
        if device in (gpu.uuid, gpu.key):
            return gpu.key
    notes.append(f"its device {device} is not among this server's devices now: “next available” is chosen")
    return DEVICE_NEXT


def _tester_choice(device: Any, devices: DeviceList, notes: list[str]) -> str:
    """The form's tester device for the job's: "auto", the training device ("same"), the CPU, or a GPU by its key."""
    if device in (None, AUTO, SAME_DEVICE, CPU):
        return str(device or AUTO)
    for gpu in devices.gpus:
        if device in (gpu.uuid, gpu.key):
            return gpu.key
    notes.append(f"its tester's device {device} is not among this server's devices now: “auto” is chosen")
    return AUTO


def exact_size(count: int) -> str:
    """A byte count as a size that reads back as the same count ("62MiB", "1GiB", "1000B"): a form's size field
    takes a number with its unit, never a bare number."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count % factor == 0:
            return f"{count // factor}{unit}"
    return f"{count}B"


def clone_url(job_id: str) -> str:
    return url_for("memplugin.new_model", clone=job_id)


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule(f"{API_PATH}/jobs/<job_id>/request", "api_job_request", job_request, methods=["GET"])
