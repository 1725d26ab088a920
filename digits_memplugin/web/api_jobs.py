"""Training jobs under `<prefix>/api/jobs`: submit (JSON, or multipart with prototxt files), list, show with
attempts, cancel, resume, delete, and Caffe's log.

    POST   /jobs               201 job            400 {"errors": {field: message}}
    GET    /jobs               200 {"jobs": [job, ...]}
    GET    /jobs/<id>          200 job + {"attempts": [attempt, ...]}
    POST   /jobs/<id>/cancel   200 job            409 when it is not queued or running
    POST   /jobs/<id>/resume   200 job            409 unless interrupted, cancelled or failed
    DELETE /jobs/<id>          204                409 while running
    GET    /jobs/<id>/log      200 text/plain     ?attempt=N (default: the latest), ?tail=N lines

The job and attempt documents are `Job.to_json()` and `Attempt.to_json()` (jobs/records.py); the socketio events
carry the same documents.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import BadRequest, Conflict, NotFound, RequestEntityTooLarge, ServiceUnavailable

from ..jobs.manager import DataFolderInUse, JobManager, JobNotFound, JobStateError, JobValidationError
from ..jobs.request import parse_job_request
from .api import API_PATH

JSON_FORM_FIELDS = ("data", "data_shapes", "fallback")
INT_FORM_FIELDS = ("batch", "classes", "max_iter", "memory_cap")
MAX_TAIL = 100_000


def _manager() -> JobManager:
    plugin = current_app.extensions["memplugin"]
    try:
        return plugin.started_jobs()  # type: ignore[no-any-return]
    except DataFolderInUse as error:
        raise ServiceUnavailable(str(error)) from None


def _job_or_404(manager: JobManager, job_id: str) -> Any:
    try:
        return manager.get(job_id)
    except JobNotFound as error:
        raise NotFound(str(error)) from None


def _body() -> dict[str, Any]:
    """The submission as a dict: a JSON object, or a multipart/urlencoded form whose prototxts may be files."""
    limit = current_app.extensions["memplugin"].settings.max_request_bytes
    if request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge(f"the request is {request.content_length} bytes; the limit is {limit}")
    if request.mimetype == "application/json":
        if len(request.get_data(cache=True)) > limit:
            raise RequestEntityTooLarge(f"the request is over {limit} bytes")
        body = request.get_json(silent=True)
        if body is None:
            raise BadRequest("the body is not valid JSON")
        return body  # type: ignore[no-any-return]
    if request.mimetype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        return _form_body()
    raise BadRequest("send JSON (Content-Type: application/json) or a multipart form with the prototxt files")


def _form_body() -> dict[str, Any]:
    body: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for key in ("net", "solver"):
        upload = request.files.get(key)
        if upload is not None:
            try:
                body[key] = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                errors[key] = "the uploaded file is not UTF-8 text"
    for key, value in request.form.items():
        if key in body:
            errors[key] = "given both as a file and as a field"
        elif key in JSON_FORM_FIELDS:
            try:
                body[key] = json.loads(value)
            except json.JSONDecodeError:
                errors[key] = "must be a JSON object"
        elif key in INT_FORM_FIELDS and value.strip().isdigit():
            body[key] = int(value)
        else:
            body[key] = value
    for key in request.files:
        if key not in ("net", "solver"):
            errors[key] = "only the net and solver prototxts may be uploaded as files"
    if errors:
        raise _Invalid(errors)
    return body


class _Invalid(Exception):
    def __init__(self, errors: dict[str, Any]) -> None:
        super().__init__("invalid")
        self.errors = errors


def create_job() -> ResponseReturnValue:
    manager = _manager()
    settings = current_app.extensions["memplugin"].settings
    try:
        body = _body()
    except _Invalid as invalid:
        return jsonify(errors=invalid.errors), 400
    job_request, errors = parse_job_request(
        body, default_attempts=settings.job_max_attempts
    )
    if job_request is None:
        return jsonify(errors=errors), 400
    try:
        job = manager.submit(job_request)
    except JobValidationError as error:
        return jsonify(errors=error.errors), 400
    response = jsonify(job.to_json())
    response.status_code = 201
    response.headers["Location"] = url_for(".api_job", job_id=job.id)
    return response


def list_jobs() -> ResponseReturnValue:
    return jsonify(jobs=[job.to_json() for job in _manager().list_jobs()])


def show_job(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    _job_or_404(manager, job_id)
    return jsonify(manager.document(job_id))


def cancel_job(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    _job_or_404(manager, job_id)
    try:
        return jsonify(manager.cancel(job_id).to_json())
    except JobStateError as error:
        raise Conflict(str(error)) from None


def resume_job(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    _job_or_404(manager, job_id)
    try:
        return jsonify(manager.resume(job_id).to_json())
    except JobStateError as error:
        raise Conflict(str(error)) from None


def delete_job(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    _job_or_404(manager, job_id)
    try:
        manager.delete(job_id)
    except JobStateError as error:
        raise Conflict(str(error)) from None
    return "", 204


def job_log(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    _job_or_404(manager, job_id)
    attempt = _positive_arg("attempt")
    tail = _positive_arg("tail")
    try:
        path = manager.log_path(job_id, attempt)
    except JobNotFound as error:
        raise NotFound(str(error)) from None
    except JobStateError as error:
        raise NotFound(str(error)) from None
    if not path.is_file():
        raise NotFound("the attempt has no log yet")
    with path.open("r", encoding="utf-8", errors="replace") as log:
        text = "".join(deque(log, maxlen=min(tail, MAX_TAIL))) if tail else log.read()
    return Response(text, mimetype="text/plain")


def _positive_arg(name: str) -> int | None:
    value = request.args.get(name)
    if value is None:
        return None
    if not value.isdigit() or int(value) <= 0:
        raise BadRequest(f"{name} must be a positive integer")
    return int(value)


def register(blueprint: Blueprint) -> None:
    base = f"{API_PATH}/jobs"
    blueprint.add_url_rule(base, "api_jobs", list_jobs, methods=["GET"])
    blueprint.add_url_rule(base, "api_create_job", create_job, methods=["POST"])
    blueprint.add_url_rule(f"{base}/<job_id>", "api_job", show_job, methods=["GET"])
    blueprint.add_url_rule(f"{base}/<job_id>", "api_delete_job", delete_job, methods=["DELETE"])
    blueprint.add_url_rule(f"{base}/<job_id>/cancel", "api_cancel_job", cancel_job, methods=["POST"])
    blueprint.add_url_rule(f"{base}/<job_id>/resume", "api_resume_job", resume_job, methods=["POST"])
    blueprint.add_url_rule(f"{base}/<job_id>/log", "api_job_log", job_log, methods=["GET"])

