"""The "New model" page: the form beside the live GPU memory panel, its plain form POST and its JSON twin.

Views stay thin: the form validates, `model_plan` plans the job as its first attempt will be planned (the job
manager's preview, with the estimate the panel shows), and the job manager's `submit` (the REST API's own path)
creates the job.

    GET  <prefix>/models/new     the form (works without JavaScript; the panel then shows the devices as read)
    POST <prefix>/models         the form's plain POST: 303 to the new job's page, or the form with its errors (400)
    GET  <prefix>/models         the address a failed POST leaves in the browser: 303 to the form
    POST <prefix>/models/estimate.json  the page's own estimate: api/estimate's document, its validation errors
                                 answered 200 with {"errors": ...} (an unfinished form is an expected answer)
    POST <prefix>/models.json    the JSON twin: 201 with the job document, or {"errors": {field: ...}} with 400
    POST <prefix>/models/preview.json   the plan the job would get (the manager's preview), nothing created
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from wtforms.fields.choices import SelectChoice

from ... import __version__
from ...core.device_kinds import AUTO, CPU
from ...core.errors import FieldErrors
from ...core.planning.planner import MAX_BATCH
from ...core.sizes import format_size
from ...devices.reader import DeviceList, is_simulated
from ...estimate import dataset_scan
from ...jobs.errors import JobValidationError
from ...jobs.store.records import Job
from ...networks import STANDARD_NETWORKS
from ..api import estimate as api_estimate
from ..api.envelope import created, json_error, read_form, read_json
from ..plugin_state import current_plugin
from . import panel_words
from .forms import DEVICE_NEXT, TESTER_CHOICES, NewModelForm, formdata_from_json
from .job_clone import clone_form_data
from .model_job import SIMULATED_GPU, SIMULATED_TESTER, form_errors
from .model_plan import Asked, PlannedJob, asked_of, device_label, plan_model


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
    choices.append(SelectChoice(CPU, f"CPU ({format_size(devices.cpu.memory_free)} free)"))
    for cpu in devices.other_cpus:  # a cluster's hosts (the Ray backend)
        choices.append(SelectChoice(cpu.key, f"{device_label(cpu)} ({format_size(cpu.memory_free)} free)"))
    return choices


def _tester_choices(devices: DeviceList) -> list[SelectChoice]:
    """Where a tester may run: auto, the training device, the CPU, then each GPU as the device field lists it."""
    choices = [SelectChoice(value, label) for value, label in TESTER_CHOICES]
    for gpu in devices.gpus:
        state = f"{format_size(gpu.memory_free)} free" if gpu.error is None else f"unavailable: {gpu.error}"
        choices.append(
            SelectChoice(gpu.key, f"{device_label(gpu)}: {gpu.name or 'n/a'} ({state})", {"disabled": gpu.error is not None})
        )
    return choices


def _form(devices: DeviceList, **kwargs: Any) -> NewModelForm:
    if devices.simulated:
        # Demo mode: a job on a simulated GPU is refused, so the device a new user trains on first is the CPU.
        kwargs.setdefault("device", CPU)
    form = NewModelForm(**kwargs)
    form.device.choices = _device_choices(devices)
    form.tester_device.choices = _tester_choices(devices)
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
        apart_refused=current_plugin().jobs.config.apart_refused,
        version=__version__,
    )
    return page, status


PAGE_ORDER = (
    "csrf_token", "data_backend", "train_source", "val_source", "item_shape", "classes", "network",
    "standard_network", "custom_network", "custom_network_file", "solver", "solver_type", "base_lr", "lr_policy",
    "gamma", "power", "stepsize", "stepvalues", "momentum", "weight_decay", "max_iter", "snapshot", "test_interval",
    "test_iter", "solver_text", "solver_file", "divergence", "batch_size", "device", "memory_cap", "test_net",
    "tester_device", "model_name",
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


def submit_model(asked: Asked, devices: DeviceList) -> tuple[Job, PlannedJob]:
    """Plan the job (a definition error comes back beside its field, with its line), refuse a simulated GPU, then
    create the job through the REST API's own path."""
    planned = plan_model(asked, devices)
    if planned.device.kind == "gpu" and is_simulated():
        label = planned.device_label if asked.spec.device != DEVICE_NEXT else f"“Next available GPU” ({planned.device_label})"
        raise FieldErrors.one("device", SIMULATED_GPU.format(label=label))
    tester = devices.get(asked.spec.tester_device)
    if tester is not None and tester.kind == "gpu" and is_simulated():
        raise FieldErrors.one("tester_device", SIMULATED_TESTER.format(label=device_label(tester)))
    assert planned.typed is not None  # strict planning previews the typed request
    try:
        job = current_plugin().started_jobs().submit(planned.typed.request)
    except JobValidationError as error:
        raise FieldErrors(form_errors(error.errors, asked.spec, planned.typed.sources)) from None
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
        asked = asked_of(form)
        if suggest:
            planned = plan_model(asked.with_batch(AUTO), devices, strict=False)
            form.batch_size.data = str(planned.plan["batch_size"])
            return _render_form(form, devices, planned=planned)
        job, _ = submit_model(asked, devices)
    except FieldErrors as refused:
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
        except FieldErrors as refused:
            return jsonify(errors=refused.errors), 400
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
        job, _ = submit_model(asked_of(form), devices)
    except FieldErrors as refused:
        return jsonify(errors=refused.errors), 400
    return created(job)


def preview_model_json() -> ResponseReturnValue:
    """What the form would create, without creating it: the plan the job's first attempt would get on the device
    chosen (the job manager's preview of the typed request), as JSON. Same body as models.json."""
    try:
        devices = _read_devices()
        form = _json_form(devices)
        if not isinstance(form, NewModelForm):
            return form
        try:
            planned = plan_model(asked_of(form), devices)
        except FieldErrors as refused:
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
        except FieldErrors as invalid:
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
