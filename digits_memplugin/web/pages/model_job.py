"""From the New model form to a job request, the way DIGITS turns its form into a job: the dataset's sources go to
the network's data layers, the dataset format sets how those layers read, the device choice becomes the manager's.

The request is checked by the REST API's own parser (jobs.definition.request) and handed to the job manager typed, for its
preview and its submission: this module maps fields (the net's data layers themselves are
jobs.definition.digits_data's), it does not validate a job. Errors come back onto the form's
fields.

    train_source -> every data layer of the training net (by layer name, so DIGITS' stage rules work too)
    val_source   -> every data layer of the validation nets
    data_backend -> "lmdb": those layers' Data backend is LMDB; "hdf5": they become HDF5Data layers
    device       -> "next": "auto"; a GPU's key: its UUID; "cpu": "cpu"
    divergence   -> "divergence" ("stop" or "continue": what a NaN or infinite loss does)
    memory_cap   -> "memory_cap" (bytes; CPU jobs only, which the manager says beside the field otherwise)
    test_net     -> "test_net" ("auto", "shared" or "apart": where the validation nets live)
    tester_device -> "tester_device" ("auto", "same", "cpu", a GPU's UUID; the manager refuses one beside
                    test nets kept shared, and says so beside the field)
    epochs, test_interval, test_iter -> the same (solver settings: the length by epochs, validation once per epoch
                    and one pass over the validation set unless given; core.epochs)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...core.device_kinds import AUTO, CPU
from ...core.errors import FieldErrors
from ...core.test_net_modes import SAME_DEVICE
from ...jobs.definition import digits_data
from ...jobs.definition.digits_data import DataLayerError
from ...jobs.definition.request import JobRequest, parse_job_request
from .forms import DATA_TOP, DEVICE_NEXT, ModelSpec

TRAIN_FIELD = "train_source"
VAL_FIELD = "val_source"
BACKEND_FIELD = "data_backend"
SIMULATED_GPU = (
    "{label} is simulated (--simulate-gpus): its memory is made up and no CUDA device is behind it, so a job there "
    "cannot train. The plan against it stands; choose the CPU to train."
)
SIMULATED_TESTER = (
    "{label} is simulated (--simulate-gpus): no CUDA device is behind it, so a tester there cannot run; choose the "
    "training device or the CPU."
)


@dataclasses.dataclass(frozen=True)
class JobBody:
    """The job request for a form, and which form field gave each data layer its source (to place errors)."""

    body: dict[str, Any]
    sources: dict[str, str]
    """Data layer name -> "train_source" or "val_source"."""


def job_body(spec: ModelSpec, estimate: dict[str, Any], device: str | int, tester: str | int = AUTO) -> JobBody:
    """The request `api_jobs.submit` takes for the form's `spec`. `estimate` is the form's estimate of the same
    network (its layers say which data layers the training and validation nets have); `device` and `tester` are
    the manager's names for the devices chosen (see `manager_device`)."""
    sources = _data_layers(estimate, spec)
    body: dict[str, Any] = {
        "net": _net_for_backend(spec, sources),
        "solver": spec.solver_text,
        "name": spec.name,
        "device": device,
        "data": {layer: spec.train_source if field == TRAIN_FIELD else str(spec.val_source)
                 for layer, field in sources.items()},
        "divergence": spec.divergence,
        "test_net": spec.test_net,
        "tester_device": tester,
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


def job_request(spec: ModelSpec, mapped: JobBody, default_attempts: int) -> TypedJob:
    """The typed job request for the form's `spec` and its `job_body` (checked by the same parser as the REST
    API's), with the form field of each data layer's source. Refused: FieldErrors, {form field: message}."""
    request, errors = parse_job_request(mapped.body, default_attempts=default_attempts)
    if request is None:
        raise FieldErrors(form_errors(errors, spec, mapped.sources))
    return TypedJob(request, mapped.sources)


@dataclasses.dataclass(frozen=True)
class TypedJob:
    """A form's job request, typed, and which form field gave each data layer its source (to place errors)."""

    request: JobRequest
    sources: dict[str, str]


def manager_device(choice: str, gpu_index: int | None) -> str | int:
    """The job manager's device name for the form's choice: "auto", "cpu", a GPU's UUID, or its index when the
    GPU has no UUID (its key is then "gpu-index-N"). The tester device's "same" stays as it is."""
    if choice in (DEVICE_NEXT, AUTO):
        return AUTO
    if choice in (CPU, SAME_DEVICE):
        return choice
    if choice.startswith("GPU-") or gpu_index is None:
        return choice
    return gpu_index


PARTS = {digits_data.TRAIN: TRAIN_FIELD, digits_data.VAL: VAL_FIELD, digits_data.FORMAT: BACKEND_FIELD}
"""The form field of each part of the dataset (jobs.definition.digits_data)."""


def _data_layers(estimate: dict[str, Any], spec: ModelSpec) -> dict[str, str]:
    """Data layers that read a source, by the net they are in (jobs.definition.digits_data): TRAIN ->
    train_source, TEST -> val_source (when given; without it a validation net keeps the sources its prototxt
    names)."""
    try:
        parts = digits_data.dataset_parts(
            digits_data.data_layer_phases(estimate["layers"]), validation=bool(spec.val_source),
            two_sets=spec.val_source != spec.train_source)
    except DataLayerError as error:
        raise FieldErrors.one(PARTS[error.part], error.message) from None
    return {name: PARTS[part] for name, part in parts.items()}


def _net_for_backend(spec: ModelSpec, sources: dict[str, str]) -> str:
    """The network text with the layers that read the form's datasets set to its format (jobs.definition.digits_data)."""
    try:
        return digits_data.net_for_format(spec.net_text, spec.net_source, sources, spec.data_backend)
    except DataLayerError as error:
        raise FieldErrors.one(PARTS[error.part], error.message) from None


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
