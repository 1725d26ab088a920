"""From the New model form to a job request, the way DIGITS turns its form into a job: the dataset's sources go to
the network's data layers, the dataset format sets how those layers read, the device choice becomes the manager's.

The request is checked by the REST API's own parser (jobs.definition.request) and handed to the job manager typed, for its
preview and its submission: this module maps fields, it does not validate a job. Errors come back onto the form's
fields.

    train_source -> every data layer of the training net (by layer name, so DIGITS' stage rules work too)
    val_source   -> every data layer of the validation nets
    data_backend -> "lmdb": those layers' Data backend is LMDB; "hdf5": they become HDF5Data layers
    device       -> "next": "auto"; a GPU's key: its UUID; "cpu": "cpu"
    divergence   -> "divergence" ("stop" or "continue": what a NaN or infinite loss does)
    memory_cap   -> "memory_cap" (bytes; CPU jobs only, which the manager says beside the field otherwise)
    epochs, test_interval, test_iter -> the same (solver settings: the length by epochs, validation once per epoch
                    and one pass over the validation set unless given; core.epochs)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from google.protobuf import text_format

from ...core.errors import NetError
from ...core.proto import caffe_pb2
from ...core.prototxt import parse_net
from ...jobs.definition.definition import DATA_SOURCE_FIELDS
from ...jobs.definition.request import JobRequest, parse_job_request
from .forms import DATA_TOP, DEVICE_CPU, DEVICE_NEXT, ModelSpec

TRAIN_FIELD = "train_source"
VAL_FIELD = "val_source"
BACKEND_FIELD = "data_backend"
SIMULATED_GPU = (
    "{label} is simulated (--simulate-gpus): its memory is made up and no CUDA device is behind it, so a job there "
    "cannot train. The plan against it stands; choose the CPU to train."
)


class MappingError(ValueError):
    """The form's choices do not fit the network (a dataset format its data layers cannot read)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclasses.dataclass(frozen=True)
class JobBody:
    """The job request for a form, and which form field gave each data layer its source (to place errors)."""

    body: dict[str, Any]
    sources: dict[str, str]
    """Data layer name -> "train_source" or "val_source"."""


def job_body(spec: ModelSpec, estimate: dict[str, Any], device: str | int) -> JobBody:
    """The request `api_jobs.submit` takes for the form's `spec`. `estimate` is the form's estimate of the same
    network (its layers say which data layers the training and validation nets have); `device` is the manager's
    name for the device chosen (see `manager_device`)."""
    sources = _data_layers(estimate, spec)
    body: dict[str, Any] = {
        "net": _net_for_backend(spec, sources),
        "solver": spec.solver_text,
        "name": spec.name,
        "device": device,
        "data": {layer: spec.train_source if field == TRAIN_FIELD else str(spec.val_source)
                 for layer, field in sources.items()},
        "divergence": spec.divergence,
    }
    if spec.batch is not None:
        body["batch"] = spec.batch
    if spec.item_shape:
        # A fallback only: the shape read from the dataset itself (keyed by layer) wins over one keyed by top.
        body["data_shapes"] = {DATA_TOP: list(spec.item_shape)}
    if spec.classes is not None:
        body["classes"] = spec.classes
    if spec.memory_cap is not None:
        body["memory_cap"] = spec.memory_cap
    for key in ("epochs", "test_interval", "test_iter"):  # the solver settings' length and validation, by dataset
        if getattr(spec, key) is not None:
            body[key] = getattr(spec, key)
    return JobBody(body, sources)


def job_request(spec: ModelSpec, estimate: dict[str, Any], device: str | int, default_attempts: int) -> TypedJob:
    """The typed job request for the form's `spec` (checked by the same parser as the REST API's), with the form
    field of each data layer's source. Refused: {form field: message}."""
    mapped = job_body(spec, estimate, device)
    request, errors = parse_job_request(mapped.body, default_attempts=default_attempts)
    if request is None:
        raise RequestRefused(form_errors(errors, spec, mapped.sources))
    return TypedJob(request, mapped.sources)


@dataclasses.dataclass(frozen=True)
class TypedJob:
    """A form's job request, typed, and which form field gave each data layer its source (to place errors)."""

    request: JobRequest
    sources: dict[str, str]


class RequestRefused(ValueError):
    """The job request the form makes is refused: {form field: message}."""

    def __init__(self, errors: dict[str, Any]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def manager_device(choice: str, gpu_index: int | None) -> str | int:
    """The job manager's device name for the form's choice: "auto", "cpu", a GPU's UUID, or its index when the
    GPU has no UUID (its key is then "gpu-index-N")."""
    if choice == DEVICE_NEXT:
        return "auto"
    if choice == DEVICE_CPU:
        return DEVICE_CPU
    if choice.startswith("GPU-") or gpu_index is None:
        return choice
    return gpu_index


def _data_layers(estimate: dict[str, Any], spec: ModelSpec) -> dict[str, str]:
    """Data layers that read a source, by the net they are in: TRAIN -> train_source, TEST -> val_source (when
    given; without it a validation net keeps the sources its prototxt names)."""
    phases: dict[str, set[str]] = {}
    for layer in estimate["layers"]:
        if layer["type"] in DATA_SOURCE_FIELDS:
            phases.setdefault(layer["name"], set()).add(layer["phase"])
    sources: dict[str, str] = {}
    for name, seen in phases.items():
        if "TRAIN" in seen and "TEST" in seen and spec.val_source and spec.val_source != spec.train_source:
            raise MappingError(
                VAL_FIELD,
                f"the data layer “{name}” is in both the training and the validation net, so it cannot read "
                "two datasets: give it include rules (a phase, or DIGITS' stages \"train\" and \"val\")",
            )
        if "TRAIN" in seen:
            sources[name] = TRAIN_FIELD
        elif spec.val_source:
            sources[name] = VAL_FIELD
    if not any(field == TRAIN_FIELD for field in sources.values()):
        raise MappingError(TRAIN_FIELD, "the network's training net has no data layer that reads a dataset")
    return sources


def _net_for_backend(spec: ModelSpec, sources: dict[str, str]) -> str:
    """The network text with the layers that read the form's datasets set to its format. Caffe's Data layer reads
    LevelDB unless told otherwise, so an LMDB dataset needs `backend: LMDB`; an HDF5 dataset needs HDF5Data
    layers. The text is rewritten only when a layer changes (comments do not survive a rewrite)."""
    try:
        net = parse_net(spec.net_text, spec.net_source)
    except NetError:  # pragma: no cover - the form's estimate parsed the same text already
        return spec.net_text
    changed = False
    for layer in net.layer:
        if layer.name not in sources:
            continue
        if spec.data_backend == "lmdb":
            if layer.type == "HDF5Data":
                raise MappingError(BACKEND_FIELD, f"the data layer “{layer.name}” reads HDF5 files: choose HDF5")
            if layer.type == "Data" and layer.data_param.backend != caffe_pb2.DataParameter.LMDB:
                layer.data_param.backend = caffe_pb2.DataParameter.LMDB
                changed = True
        elif layer.type == "Data":
            changed = _to_hdf5(layer) or changed
    return text_format.MessageToString(net) if changed else spec.net_text


def _to_hdf5(layer: Any) -> bool:
    """A Data layer turned into an HDF5Data layer with the same batch size (DIGITS does the same for HDF5)."""
    if layer.HasField("transform_param") and layer.transform_param.ListFields():
        raise MappingError(
            BACKEND_FIELD,
            f"the data layer “{layer.name}” transforms its data (transform_param), which Caffe's HDF5Data layer "
            "cannot do: choose LMDB, or scale in the network (a Power layer, as LeNet does)",
        )
    batch = layer.data_param.batch_size
    layer.ClearField("data_param")
    layer.ClearField("transform_param")
    layer.type = "HDF5Data"
    layer.hdf5_data_param.batch_size = batch
    return True


def form_errors(errors: dict[str, Any], spec: ModelSpec, sources: dict[str, str]) -> dict[str, Any]:
    """The submission's errors ({request field: message}) as the form's ({form field: message})."""
    network_field = "custom_network" if spec.network_key is None else "standard_network"
    mapped: dict[str, Any] = {}
    for key, message in errors.items():
        field = _form_field(str(key), message, spec, sources, network_field)
        mapped[field] = message if field not in mapped else f"{mapped[field]}; {message}"
    return mapped


def _form_field(key: str, message: Any, spec: ModelSpec, sources: dict[str, str], network_field: str) -> str:
    detail = message if isinstance(message, dict) else {}
    layer = detail.get("layer")
    if key in ("net", "data") and layer in sources and str(detail.get("field", "")).endswith(("source", "data")):
        return sources[layer]
    if key == "data":
        return TRAIN_FIELD
    if key == "net":
        if detail.get("field") == "top" and spec.item_shape is None:
            return "item_shape"
        return network_field
    if key == "solver":
        return "solver_text" if spec.solver_settings is None else "solver_type"
    if key.startswith("data_shapes"):
        return "item_shape"
    return {"name": "model_name", "batch": "batch_size", "max_iter": "max_iter"}.get(key, key)
