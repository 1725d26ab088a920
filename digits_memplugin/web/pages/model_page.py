"""The "New model" page: the form beside the live GPU memory panel, its plain form POST and its JSON twin.

Views stay thin: the form validates, `core.estimate` predicts and plans (what the panel shows, and a definition
error with its line), `model_job` maps the form onto a job request, and `api_jobs.submit` (the REST API's own
path) creates the job.

    GET  <prefix>/models/new     the form (works without JavaScript; the panel then shows the devices as read)
    POST <prefix>/models         the form's plain POST: 303 to the new job's page, or the form with its errors (400)
    GET  <prefix>/models         the address a failed POST leaves in the browser: 303 to the form
    POST <prefix>/models/estimate.json  the page's own estimate: api/estimate's document, its validation errors
                                 answered 200 with {"errors": ...} (an unfinished form is an expected answer)
    POST <prefix>/models.json    the JSON twin: 201 with the job document, or {"errors": {field: ...}} with 400
    POST <prefix>/models/preview.json   the plan the job would get (the manager's preview), nothing created
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flask import Blueprint, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from wtforms.fields.choices import SelectChoice

from ... import __version__
from ...core.errors import NetError
from ...core.planning.fit import LIMITED_BY_MAX_BATCH, Decision
from ...core.planning.job_plan import PlanningPolicy
from ...core.planning.planner import MAX_BATCH
from ...core.sizes import format_size
from ...devices.reader import Device, DeviceList, is_simulated
from ...estimate import dataset_scan
from ...estimate.dataset_scan import FoundDataset
from ...jobs.definition.definition import JobDefinition, test_iters
from ...jobs.errors import JobValidationError
from ...jobs.scheduling.scheduler import MEMORY_CAP_ON_GPU
from ...jobs.store.records import Job
from ...networks import STANDARD_NETWORKS, standard_network
from ..api import estimate as api_estimate
from ..api.envelope import json_error, read_form, read_json
from ..plugin_state import current_plugin
from . import panel_words
from .forms import BATCH_AUTO, DEVICE_CPU, DEVICE_NEXT, FormError, ModelSpec, NewModelForm, formdata_from_json
from .job_clone import clone_form_data
from .model_job import SIMULATED_GPU, MappingError, RequestRefused, TypedJob, form_errors, job_request, manager_device

DATA_LAYER_TYPES = frozenset({"Data", "ImageData", "HDF5Data", "WindowData"})
TOP_LAYERS = 10


class PlanError(Exception):
    """The form is valid but the job cannot be planned: a definition error (with its line) or a device problem."""

    def __init__(self, field: str, detail: str | dict[str, Any]) -> None:
        super().__init__(detail if isinstance(detail, str) else detail["message"])
        self.field = field
        self.detail = detail


PLANNED_BY_JOB = "job"
"""The plan is the job manager's preview of the typed request: what the job's first attempt gets."""
PLANNED_BY_FORM = "form"
"""The dataset cannot be read yet (Auto before the data is in place): planned on the form's item shape, by the
same function and policy."""


@dataclasses.dataclass(frozen=True)
class PlannedJob:
    """A job as it would be queued: what was asked, the device it was planned on, the plan its first attempt gets,
    and the estimate there (the report the panel shows)."""

    spec: ModelSpec
    device: Device
    engine: str
    estimate: dict[str, Any]
    plan: dict[str, Any]
    """batch_size, iter_size, fits, bytes, effective_batch."""
    test_plan: dict[str, int] | None = None
    usable_bytes: int = 0
    free_bytes: int = 0
    """The memory the job may use on the device (free, less what running jobs reserved, or its cap)."""
    limited_by: str = "memory"
    planned_by: str = PLANNED_BY_JOB
    typed: TypedJob | None = None
    """The typed request the manager previewed (None when planned by the form)."""
    dataset: FoundDataset | None = None
    """The training dataset the form names, when it was found and read (its size caps "auto")."""
    auto_cap: str | None = None
    """Why "auto" stops at its batch when its cap chose it (planner.AutoCap.note), else None."""
    length: dict[str, Any] | None = None
    """How long the job trains and how often it validates at the planned batch (JobDefinition.length: max_iter,
    test_interval, per_epoch, epochs), and its validation iterations (test_iter); None when planned by the form."""

    def preview_document(self) -> dict[str, Any]:
        """The plan as the JSON twin's preview answers it."""
        return {
            "device": self.device.key, "engine": self.engine, "planned_by": self.planned_by,
            "free_bytes": self.free_bytes, "usable_bytes": self.usable_bytes, "plan": self.plan,
            "test_plan": self.test_plan, "max_batch_limited_by": self.limited_by,
            "total_bytes": self.estimate["total_bytes"], "auto_cap": self.auto_cap, "length": self.length,
        }

    @property
    def verdict(self) -> str:
        return verdict(self.plan)

    @property
    def network_title(self) -> str:
        return standard_network(self.spec.network_key).title if self.spec.network_key else "custom network"

    @property
    def device_label(self) -> str:
        return device_label(self.device)

    @property
    def batch_note(self) -> str:
        """What Auto chose and why, as the page's script words it (new-model.js: autoNote)."""
        return auto_note(self.plan["batch_size"], self.device_label, self.usable_bytes, self.free_bytes, self.auto_cap,
                         self.limited_by)

    @property
    def top_layers(self) -> list[dict[str, Any]]:
        return sorted(self.estimate["layers"], key=lambda layer: layer["bytes"], reverse=True)[:TOP_LAYERS]

    @property
    def categories(self) -> list[tuple[panel_words.Term, int]]:
        """The estimate by kind of memory, in the memory model's order, without the kinds this net has none of."""
        found = self.estimate["categories"]
        return [(term, found[key]) for key, term in panel_words.CATEGORY_TERMS.items() if found.get(key)]


def device_label(device: Device) -> str:
    where = f" of {device.host}" if device.host else ""
    return f"CPU{where}" if device.kind == "cpu" else f"GPU {device.index}{where}"


def auto_note(
    batch: int, label: str, usable: int, free: int, auto_cap: str | None, limited_by: str = "memory"
) -> str:
    """"Batch 71: capped at 71 so that an epoch of the 1438 training items has 21 iterations (...); CPU has memory
    for more." (new-model.js: autoNote)."""
    if auto_cap:
        return f"Batch {batch}: {auto_cap}; {label} has memory for more."
    if limited_by == "blob_limit":
        return (f"Batch {batch}: the largest Caffe can build in one pass (one more item would make a blob over its "
                f"limit of 2147483647 elements), though {label} has memory for more.")
    return f"Batch {batch}: the largest that fits on {label} ({format_size(usable)} usable of {format_size(free)} free)."


def train_dataset(spec: ModelSpec) -> FoundDataset | None:
    """The training dataset the form names, read from it; None when there is none there (yet) or it cannot be
    read (the job's own checks then say why, beside the field)."""
    roots = current_plugin().jobs.config.dataset_roots
    found = dataset_scan.source_dataset(spec.train_source, spec.data_backend, roots)
    return found if found is not None and found.error is None else None


def spec_of(form: NewModelForm) -> ModelSpec:
    """The form's spec; an item shape left empty is the training dataset's own (read from it, as the job does),
    else the standard network's."""
    spec = form.to_spec()
    if not (form.item_shape.data or "").strip():
        dataset = train_dataset(spec)
        if dataset is not None and dataset.shape:
            spec = dataclasses.replace(spec, item_shape=dataset.shape)
    return spec


def verdict(plan: dict[str, Any] | None) -> str:
    """The panel's words for a plan: "fits", "fits with iter_size k" or "does not fit"."""
    if not plan or not plan["fits"]:
        return "does not fit"
    if plan["iter_size"] > 1:
        return f"fits with iter_size {plan['iter_size']}"
    return "fits"


def target_device(choice: str, devices: DeviceList) -> Device:
    """The device a job is planned on: the one chosen, or for "next available" the GPU with the most free memory
    now (the CPU when there is none). The job manager decides for itself when the job starts."""
    if choice == DEVICE_NEXT:
        usable = [gpu for gpu in devices.gpus if gpu.error is None and gpu.memory_free is not None]
        return max(usable, key=lambda gpu: gpu.memory_free or 0) if usable else devices.cpu
    device = devices.get(choice)
    if device is None:
        raise PlanError("device", f"the device {choice!r} is gone; choose another")
    if device.error is not None or device.memory_free is None:
        raise PlanError("device", f"{device_label(device)} cannot be planned on: {device.error or 'free memory unknown'}")
    return device


def plan_model(spec: ModelSpec, devices: DeviceList, *, strict: bool = True) -> PlannedJob:
    """Plan the job on its device as its first attempt will be planned: the form's estimate gives the report (and
    which data layers the nets have), the typed request goes to the job manager's preview (the same definition
    checks, memory and planning function as the job's attempts). `strict` False (Auto): a dataset the job cannot
    read yet does not stop the suggestion, which is then planned on the form's item shape, by the same function
    and policy."""
    plugin = current_plugin()
    policy = plugin.jobs.config.policy
    device = target_device(spec.device, devices)
    if spec.memory_cap is not None and device.kind != "cpu":
        raise PlanError("memory_cap", MEMORY_CAP_ON_GPU)  # before anything else the GPU would say
    engine = policy.engine(device.kind)
    batch = spec.batch if isinstance(spec.batch, int) else None
    dataset = train_dataset(spec)
    cap = Cap(spec.batch == BATCH_AUTO, dataset.entries if dataset else None)
    document = _estimate(spec, engine, device, batch, cap, policy)
    if document["plan"] is None:
        raise PlanError("custom_network" if spec.network_key is None else "standard_network",
                        "the network has no data layer whose batch could be planned")
    if not document["plan"]["fits"]:  # not even batch 1 on the form's item shape: said before the data's errors
        raise PlanError(
            "device",
            f"does not fit on {device_label(device)}: even batch 1 needs more than the "
            f"{format_size(document['usable_bytes'])} usable there; choose another device",
        )
    try:
        typed = job_request(spec, document, manager_device(spec.device, device.index), plugin.settings.job_max_attempts)
        preview = plugin.started_jobs().preview(typed.request, device.key)
    except MappingError as error:
        raise PlanError(error.field, error.message) from None
    except (RequestRefused, JobValidationError) as refused:
        errors = refused.errors if isinstance(refused, RequestRefused) else form_errors(
            refused.errors, spec, typed.sources
        )
        if strict or not set(errors) <= DATA_FIELDS:
            raise Refused(errors) from None
        return _planned_by_form(spec, device, engine, document, cap, policy, dataset)
    decision = preview.decision
    if decision.plan is None:
        raise PlanError("device", f"does not fit on {device_label(device)}: {decision.message}; choose another device")
    if decision.plan.batch_size != document["batch_size"]:
        document = _estimate(spec, engine, device, decision.plan.batch_size, cap, policy)  # the panel's report
    return PlannedJob(
        spec=spec, device=device, engine=engine, estimate=document, plan=decision.plan.to_dict(),
        test_plan=decision.test_plan, usable_bytes=decision.budget, free_bytes=preview.limit_bytes,
        limited_by=decision.limited_by, typed=typed, dataset=dataset, auto_cap=decision.auto_cap,
        length=_length(preview.definition, decision),
    )


@dataclasses.dataclass(frozen=True)
class Cap:
    """How the form's estimate caps its batch: as "auto" is capped (planner.auto_cap), from the training set's size."""

    auto: bool
    train_items: int | None


def _length(definition: JobDefinition, decision: Decision) -> dict[str, Any] | None:
    """The job's length and validation at its planned batch, as its first attempt will train (JobDefinition)."""
    if decision.plan is None:
        return None
    length = definition.length(decision.plan.effective_batch).to_dict()
    test_batch = decision.test_plan["batch_size"] if decision.test_plan else None
    iters = test_iters(definition, test_batch)
    return {**length, "test_iter": iters[0] if iters else None}


DATA_FIELDS = frozenset({"train_source", "val_source", "data_backend", "item_shape"})
"""Form fields about the dataset: Auto still suggests a batch while they cannot be read."""


def _planned_by_form(
    spec: ModelSpec, device: Device, engine: str, document: dict[str, Any], cap: Cap,
    policy: PlanningPolicy, dataset: FoundDataset | None,
) -> PlannedJob:
    """Auto before the dataset can be read: the form's estimate plans (core.planning.job_plan, the server's policy). The
    caller found that batch 1 fits there, so the largest batch that fits does too."""
    if spec.batch == BATCH_AUTO and document["max_batch_size"]:
        document = _estimate(spec, engine, device, document["max_batch_size"], cap, policy)
    capped = document.get("auto_cap")
    at_cap = (capped is not None and document.get("max_batch_limited_by") == LIMITED_BY_MAX_BATCH
              and document["plan"] is not None and document["plan"]["batch_size"] >= capped["batch_size"])
    return PlannedJob(
        spec=spec, device=device, engine=engine, estimate=document, plan=document["plan"],
        test_plan=document["test_plan"], usable_bytes=document["usable_bytes"], free_bytes=document["free_bytes"],
        limited_by=document.get("max_batch_limited_by", "memory"), planned_by=PLANNED_BY_FORM, dataset=dataset,
        auto_cap=capped["note"] if at_cap and capped else None,
    )


def _estimate(
    spec: ModelSpec, engine: str, device: Device, batch: int | None, cap: Cap, policy: PlanningPolicy
) -> dict[str, Any]:
    """The estimate, in a worker process for large texts (estimate_pool.py; a full queue is a 503)."""
    plugin = current_plugin()
    try:
        request = spec.estimate_request(engine, device.memory_free, batch, policy=policy, auto=cap.auto,
                                        train_items=cap.train_items)
        return plugin.estimates.estimate(request)
    except NetError as error:
        field = _error_field(error, spec)
        raise PlanError(field, _error_detail(error, field, spec)) from None


TYPED_TEXT_FIELDS = frozenset({"custom_network", "solver_text"})
"""Fields whose text the user typed or uploaded: only there does a line number point at something they can see."""


def _error_field(error: NetError, spec: ModelSpec) -> str:
    """The form field a definition error belongs beside: the field that caused it, where the user looks.

    A standard network is known to build at its own dataset's shape and batch, so an error in it comes from what
    the user changed: the item shape if one was given, else the batch."""
    if error.source is not None and error.source.startswith(spec.solver_source) and spec.solver_source != spec.net_source:
        return "solver_text" if spec.solver_settings is None else "solver_type"
    if error.field == "top" and error.layer_type in DATA_LAYER_TYPES and spec.item_shape is None:
        return "item_shape"
    if error.field == "inner_product_param.num_output" and spec.classes is None:
        return "classes"
    if error.field in ("batch", "classes"):
        return "batch_size" if error.field == "batch" else "classes"
    if spec.network_key is not None:
        if spec.item_shape != standard_network(spec.network_key).item_shape:
            return "item_shape"
        if isinstance(spec.batch, int):
            return "batch_size"
        return "standard_network"
    return "custom_network"


def _error_detail(error: NetError, field: str, spec: ModelSpec) -> dict[str, Any]:
    """The error as the form shows it: line numbers only beside text the user typed, and the standard network
    named (its text is never shown, so "layer conv1" alone would say nothing)."""
    detail = error.to_dict()
    if field not in TYPED_TEXT_FIELDS:
        detail.update(line=None, column=None)
    if spec.network_key is not None and error.layer is not None:
        detail["network"] = standard_network(spec.network_key).title
    return detail


# --- views --------------------------------------------------------------------------------------------------------


def _read_devices() -> DeviceList:
    return current_plugin().devices.read()


def _device_choices(devices: DeviceList) -> list[SelectChoice]:
    """"Next available", each GPU with its free memory now (one that cannot be read is shown but disabled), the CPU."""
    choices = [
        SelectChoice(DEVICE_NEXT, "Next available GPU" if devices.gpus else "Next available (the CPU)")
    ]
    for gpu in devices.gpus:
        state = f"{format_size(gpu.memory_free)} free" if gpu.error is None else f"unavailable: {gpu.error}"
        choices.append(
            SelectChoice(gpu.key, f"{device_label(gpu)}: {gpu.name or 'n/a'} ({state})", {"disabled": gpu.error is not None})
        )
    choices.append(SelectChoice(DEVICE_CPU, f"CPU ({format_size(devices.cpu.memory_free)} free)"))
    for cpu in devices.other_cpus:  # a cluster's hosts (the Ray backend)
        choices.append(SelectChoice(cpu.key, f"{device_label(cpu)} ({format_size(cpu.memory_free)} free)"))
    return choices


def _form(devices: DeviceList, **kwargs: Any) -> NewModelForm:
    if devices.simulated:
        # Demo mode: a job on a simulated GPU is refused, so the device a new user trains on first is the CPU.
        kwargs.setdefault("device", DEVICE_CPU)
    form = NewModelForm(**kwargs)
    form.device.choices = _device_choices(devices)
    return form


def _check_size() -> None:
    """Parse the posted form within MEMPLUGIN_MAX_REQUEST_BYTES (a chunked body stops at the limit too): a 413
    before the form's fields are looked at."""
    read_form(current_plugin().settings.max_request_bytes)


def _render_form(
    form: NewModelForm, devices: DeviceList, planned: PlannedJob | None = None, status: int = 200,
    cloned: dict[str, Any] | None = None,
) -> ResponseReturnValue:
    networks = [
        {
            "key": network.key,
            "title": network.title,
            "description": network.description,
            "dataset": network.dataset,
            "item_shape": ",".join(str(d) for d in network.item_shape),
            "classes": network.classes,
            "text": network.text,
        }
        for network in STANDARD_NETWORKS
    ]
    page = render_template(
        "memplugin/new_model.html",
        form=form,
        devices=devices,
        networks=networks,
        planned=planned,
        first_error=first_error(form),
        max_curve_batch=MAX_BATCH,
        terms=panel_words.page_terms(current_plugin().jobs.config.policy),
        dataset_roots=[str(root) for root in current_plugin().jobs.config.dataset_roots],
        datasets=dataset_scan.scan(current_plugin().jobs.config.dataset_roots),
        cloned=cloned,
        version=__version__,
    )
    return page, status


PAGE_ORDER = (
    "csrf_token", "data_backend", "train_source", "val_source", "item_shape", "classes", "network",
    "standard_network", "custom_network", "custom_network_file", "solver", "solver_type", "base_lr", "lr_policy",
    "gamma", "power", "stepsize", "stepvalues", "momentum", "weight_decay", "max_iter", "snapshot", "test_interval",
    "test_iter", "solver_text", "solver_file", "divergence", "batch_size", "device", "model_name",
)
"""The form's fields in the order the page shows them (new_model.html); one it does not name comes after them."""


def first_error(form: NewModelForm) -> str | None:
    """The field whose error comes first on the page: it gets the focus when the form comes back (`autofocus`,
    so even without JavaScript the page opens at the error, not at its top)."""
    wrong = [name for name, field in form._fields.items() if field.errors]
    order = {name: index for index, name in enumerate(PAGE_ORDER)}
    return min(wrong, key=lambda name: order.get(name, len(order)), default=None)


def new_model() -> ResponseReturnValue:
    """The form; with ?clone=<job id>, filled in with that job's settings (web/pages/job_clone.py), as DIGITS' Clone Job."""
    devices = _read_devices()
    clone = request.args.get("clone")
    if clone is None:
        return _render_form(_form(devices), devices)
    job, fields, notes = clone_form_data(clone, devices)
    return _render_form(_form(devices, **fields), devices, cloned={"job": job, "notes": notes})


def models_address() -> ResponseReturnValue:
    """GET of the address a failed Create leaves in the browser (the form's POST target): the form, not a 405.
    Nothing of the failed post is kept (it may hold uploads), so this is the empty form; reloading the failed
    page itself posts again and shows the same errors."""
    return redirect(url_for(".new_model"), code=303)


class Refused(Exception):
    """The form is valid but no job came of it: {form field: message} to show beside the fields."""

    def __init__(self, errors: dict[str, Any]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def submit_model(spec: ModelSpec, devices: DeviceList) -> tuple[Job, PlannedJob]:
    """Plan the job (a definition error comes back beside its field, with its line), refuse a simulated GPU, then
    create the job through the REST API's own path."""
    try:
        planned = plan_model(spec, devices)
    except PlanError as error:
        raise Refused({error.field: error.detail}) from None
    if planned.device.kind == "gpu" and is_simulated():
        label = planned.device_label if spec.device != DEVICE_NEXT else f"“Next available GPU” ({planned.device_label})"
        raise Refused({"device": SIMULATED_GPU.format(label=label)})
    assert planned.typed is not None  # strict planning previews the typed request
    try:
        job = current_plugin().started_jobs().submit(planned.typed.request)
    except JobValidationError as error:
        raise Refused(form_errors(error.errors, spec, planned.typed.sources)) from None
    return job, planned


def create_model() -> ResponseReturnValue:
    """The form's plain POST: the job is created and the browser goes to its page (303, so a reload does not post
    again). The "Auto" button posts here too (action=suggest) when JavaScript is off: the form comes back with the
    suggested batch filled in, and no job is created."""
    _check_size()
    devices = _read_devices()
    form = _form(devices)
    suggest = request.form.get("action") == "suggest"
    if not form.validate_on_submit():
        return _render_form(form, devices, status=400)
    try:
        spec = spec_of(form)
        if suggest:
            planned = plan_model(dataclasses.replace(spec, batch=BATCH_AUTO), devices, strict=False)
            form.batch_size.data = str(planned.plan["batch_size"])
            return _render_form(form, devices, planned=planned)
        job, _ = submit_model(spec, devices)
    except FormError as error:
        return _refuse(form, devices, {error.field: error.message})
    except PlanError as error:
        return _refuse(form, devices, {error.field: error.detail})
    except Refused as refused:
        return _refuse(form, devices, refused.errors)
    return redirect(url_for(".job_page", job_id=job.id), code=303)


def _refuse(form: NewModelForm, devices: DeviceList, errors: dict[str, Any]) -> ResponseReturnValue:
    """The form again with each error beside its field (a field the form does not have: beside the name)."""
    for name, message in errors.items():
        field = form._fields.get(name, form.model_name)
        field.errors = [*field.errors, message]
    return _render_form(form, devices, status=400)


def create_model_json() -> ResponseReturnValue:
    """The JSON twin: a JSON body (for scripts; a cross-site page cannot send one without CORS, so no CSRF token)
    or the form's own fields (token required, as for the page). 201 with the job document, as POST api/jobs.
    Its errors are JSON too, as the API's are."""
    try:
        return _create_model_json()
    except Exception as error:  # noqa: BLE001 - json_error logs what was not expected and answers 500
        return json_error(error)


def _json_form(devices: DeviceList) -> NewModelForm | ResponseReturnValue:
    """The JSON twins' form: a JSON body (no CSRF token: a cross-site page cannot send one without CORS) or the
    form's own fields (token required); a 400 answer when it does not validate."""
    _check_size()
    if request.is_json:
        body = read_json(current_plugin().settings.max_request_bytes)
        try:
            formdata = formdata_from_json(body)
        except FormError as error:
            return jsonify(errors={error.field: error.message}), 400
        form = _form(devices, formdata=formdata, meta={"csrf": False})
    else:
        form = _form(devices)
    if not form.validate():
        return jsonify(errors=form.errors_by_field()), 400
    return form


def _create_model_json() -> ResponseReturnValue:
    devices = _read_devices()
    form = _json_form(devices)
    if not isinstance(form, NewModelForm):
        return form
    try:
        job, _ = submit_model(spec_of(form), devices)
    except FormError as error:
        return jsonify(errors={error.field: error.message}), 400
    except Refused as refused:
        return jsonify(errors=refused.errors), 400
    response = jsonify(job.to_json())
    response.status_code = 201
    response.headers["Location"] = url_for(".api_job", job_id=job.id)
    return response


def preview_model_json() -> ResponseReturnValue:
    """What the form would create, without creating it: the plan the job's first attempt would get on the device
    chosen (the job manager's preview of the typed request), as JSON. Same body as models.json."""
    try:
        devices = _read_devices()
        form = _json_form(devices)
        if not isinstance(form, NewModelForm):
            return form
        try:
            planned = plan_model(spec_of(form), devices)
        except FormError as error:
            return jsonify(errors={error.field: error.message}), 400
        except PlanError as error:
            return jsonify(errors={error.field: error.detail}), 400
        except Refused as refused:
            return jsonify(errors=refused.errors), 400
        return jsonify(planned.preview_document())
    except Exception as error:  # noqa: BLE001 - json_error logs what was not expected and answers 500
        return json_error(error)


def estimate_for_page() -> ResponseReturnValue:
    """The New model page's estimates: the body and the document of POST api/estimate, but a request that cannot be
    estimated is answered 200 with {"errors": {field: message}}, as the API words it with its 400.

    Why not the API's 400: the page estimates the form while it is being typed, so "not valid yet" is an expected
    answer, several times per edit (one request per device); browsers report every 4xx answer of a fetch in the
    console, which no script can prevent, and that noise hides real failures. A failure of the request itself
    (too large, a server busy, not allowed) keeps its status. Scripts use the API, whose 400s stay."""
    try:
        body = read_json(current_plugin().settings.max_request_bytes)
        try:
            return jsonify(api_estimate.estimate_document(body))
        except api_estimate.Invalid as invalid:
            return jsonify(errors=invalid.errors)
    except Exception as error:  # noqa: BLE001 - json_error logs what was not expected and answers 500
        return json_error(error)


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule("/models/new", "new_model", new_model)
    blueprint.add_url_rule("/models", "create_model", create_model, methods=["POST"])
    blueprint.add_url_rule("/models", "models_address", models_address, methods=["GET"])
    blueprint.add_url_rule("/models/estimate.json", "estimate_for_page", estimate_for_page, methods=["POST"])
    blueprint.add_url_rule("/models.json", "create_model_json", create_model_json, methods=["POST"])
    blueprint.add_url_rule("/models/preview.json", "preview_model_json", preview_model_json, methods=["POST"])
