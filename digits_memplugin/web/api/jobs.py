"""Training jobs under `<prefix>/api/jobs`: submit (JSON, or multipart with prototxt files), list, show with
attempts, cancel, resume, delete, and Caffe's log.

    POST   /jobs               201 job            400 {"errors": {field: message}}
    GET    /jobs               200 {"jobs": [job, ...], "total", "limit", "before", "older"}   ?limit=N&before=<id>
    GET    /jobs/<id>          200 job + {"attempts": [attempt, ...]}
    POST   /jobs/<id>/cancel   200 job            409 when it is not queued or running
    POST   /jobs/<id>/resume   200 job            409 unless interrupted, cancelled or failed
    DELETE /jobs/<id>          204                409 while running
    GET    /jobs/<id>/log      200 text/plain     ?attempt=N (default: the latest), ?tail=N lines
    GET    /jobs/<id>/progress 200 {"job_id", "records": [iteration and test records, each with its "attempt" and
                                    "superseded": a later attempt trains that iteration again]}

The job and attempt documents are `Job.to_json()` and `Attempt.to_json()` (jobs/store/records.py); the socketio events
carry the same documents.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path, PurePosixPath
from typing import Any

from flask import Blueprint, Response, jsonify, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import BadRequest, Conflict, NotFound

from ...core import inputs
from ...core.errors import FieldErrors
from ...jobs.definition.attempt_files import TESTER_FOLDER
from ...jobs.definition.request import parse_job_request
from ...jobs.errors import JobNotFound, JobPageError, JobStateError
from ...jobs.manager import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, JobManager
from ...jobs.store.records import Job
from ...jobs.turns import Turns
from ..plugin_state import current_plugin
from .envelope import API_PATH, JSON_CONTENT_TYPE, created, job_or_404, read_form, read_json, wrong_content_type

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
"""A submission may be a form: multipart when the prototxts are uploaded as files."""
JSON_FORM_FIELDS = ("data", "data_shapes", "fallback")
INT_FORM_FIELDS = ("batch", "classes", "max_iter", "memory_cap")
MAX_TAIL = 100_000
PROGRESS_FILE = "progress.jsonl"
"""The runner's records, beside each attempt's caffe.log (docs/jobs.md: the job's folder)."""
MAX_PROGRESS_POINTS = 2000
"""Iteration records per attempt that GET /jobs/<id>/progress returns at most: enough for a chart."""


def _manager() -> JobManager:
    """The started job manager; another server holding the data folder is a 503 (web/api/envelope.py as_http_error)."""
    return current_plugin().started_jobs()



def _body() -> dict[str, Any]:
    """The submission as a dict: a JSON object, or a multipart/urlencoded form whose prototxts may be files."""
    limit = current_plugin().settings.max_request_bytes
    if request.mimetype in FORM_TYPES:
        read_form(limit)
        return _form_body()
    if request.is_json:
        return read_json(limit)  # type: ignore[no-any-return]
    raise wrong_content_type(f"JSON (Content-Type: {JSON_CONTENT_TYPE}) or a form ({' or '.join(FORM_TYPES)})")


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
                body[key] = inputs.loads(value)  # an integer of 5000 digits reads as a LongNumber, refused by name
            except (ValueError, RecursionError):
                errors[key] = "must be a JSON object"
        elif key in INT_FORM_FIELDS and (number := inputs.ascii_int(value)) is not None:
            body[key] = number  # 0-9 only: int() would read "١٢٣" and "1_000", and raise on 5000 digits
        else:
            body[key] = value  # left as text: the field's check refuses it by name
    for key in request.files:
        if key not in ("net", "solver"):
            errors[key] = "only the net and solver prototxts may be uploaded as files"
    if errors:
        raise FieldErrors(errors)
    return body


def submit(body: Any) -> Job:
    """The one way a job is created over the web: the request checked by `parse_job_request`, then by the manager
    (devices, confinement, the definition). FieldErrors (the manager's JobValidationError is one) maps the
    request's fields to messages: the 400 body."""
    manager = _manager()
    settings = current_plugin().settings
    job_request, errors = parse_job_request(body, default_attempts=settings.job_max_attempts)
    if job_request is None:
        raise FieldErrors(errors)
    return manager.submit(job_request)


def create_job() -> ResponseReturnValue:
    try:
        job = submit(_body())
    except FieldErrors as refused:
        return jsonify(errors=refused.errors), 400
    return created(job)


def list_jobs() -> ResponseReturnValue:
    """A page of the jobs, newest first (?limit=N, default 50, at most 500; ?before=<id> for older ones):
    {"jobs": [...oldest first within the page...], "total", "limit", "before", "older": the next page's before}."""
    try:
        return jsonify(_manager().page(page_limit(request.args.get("limit")), request.args.get("before")).to_json())
    except JobPageError as error:
        raise BadRequest(str(error)) from None


def page_limit(text: str | None) -> int:
    """The `limit` query parameter of a jobs list: the default page size when absent; 400 unless 1 to 500."""
    if text is None:
        return DEFAULT_PAGE_SIZE
    if not (text.isascii() and text.isdigit() and len(text) <= 4) or not 1 <= int(text) <= MAX_PAGE_SIZE:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_PAGE_SIZE}")
    return int(text)


def show_job(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    job_or_404(manager, job_id)
    return jsonify(manager.document(job_id))


def cancel_job(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    job_or_404(manager, job_id)
    try:
        return jsonify(manager.cancel(job_id).to_json())
    except JobStateError as error:
        raise Conflict(str(error)) from None


def resume_job(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    job_or_404(manager, job_id)
    try:
        return jsonify(manager.resume(job_id).to_json())
    except JobStateError as error:
        raise Conflict(str(error)) from None


def delete_job(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    job_or_404(manager, job_id)
    try:
        manager.delete(job_id)
    except JobStateError as error:
        raise Conflict(str(error)) from None
    return "", 204


def job_log(job_id: str) -> ResponseReturnValue:
    manager = _manager()
    job_or_404(manager, job_id)
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


def job_progress(job_id: str) -> ResponseReturnValue:
    """The iteration and test records of every attempt so far, oldest first, each with its attempt's number and
    whether a later attempt trains its iteration again (`superseded`: that attempt restarted before it): what a
    page draws its chart from on first paint and after a reconnection (the events carry only what is new)."""
    manager = _manager()
    job_or_404(manager, job_id)
    folder = manager.folder(job_id)
    records: list[dict[str, Any]] = []
    attempts = manager.attempts(job_id)
    for index, attempt in enumerate(attempts):
        # A later attempt that started before an iteration trains it again: this attempt's record of it is no
        # longer the job's (a restart from 0, or a resume from an earlier snapshot).
        redone = min((later.start_iteration for later in attempts[index + 1:]), default=None)
        own = folder / PurePosixPath(attempt.log).parent
        for record in _chart_records([own / PROGRESS_FILE, own / TESTER_FOLDER / PROGRESS_FILE], attempt.number):
            iteration = record.get("iteration")
            record["superseded"] = redone is not None and isinstance(iteration, int) and iteration > redone
            records.append(record)
    return jsonify(job_id=job_id, records=records)


def _chart_records(paths: list[Path], attempt: int) -> list[dict[str, Any]]:
    """An attempt's iteration and test records, from its runner's progress file and, with the test nets apart, its
    testers' (their test records are the attempt's as the runner's would be); iterations thinned to
    MAX_PROGRESS_POINTS (the last one kept). A child may be writing the last line: a line that is not JSON yet is
    left for the next read."""
    iterations: list[dict[str, Any]] = []
    tests: list[dict[str, Any]] = []
    turns = Turns()  # a record an iteration: 100,000 of them held the server's thread 1.1 s a request
    for path in paths:
        if not path.is_file():
            continue
        with path.open("r", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                turns.take()
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(record, dict):
                    continue
                if record.get("event") == "iteration":
                    iterations.append({**record, "attempt": attempt})
                elif record.get("event") == "test":
                    tests.append({**record, "attempt": attempt})
    if len(iterations) > MAX_PROGRESS_POINTS:
        stride = -(-len(iterations) // MAX_PROGRESS_POINTS)
        iterations = iterations[::stride] + ([iterations[-1]] if (len(iterations) - 1) % stride else [])
    return sorted(iterations + tests, key=lambda record: (record.get("time") or 0))


def _positive_arg(name: str) -> int | None:
    """A query parameter that must be a positive integer written with 0-9 (at most 9 digits: "²", "١" and 5000
    digits are refused, not read or converted)."""
    value = request.args.get(name)
    if value is None:
        return None
    number = inputs.ascii_int(value, max_digits=9) if value.isascii() and value.isdigit() else None
    if number is None or number <= 0:
        raise BadRequest(f"{name} must be a positive integer (the digits 0-9, at most 9 of them)")
    return number


def register(blueprint: Blueprint) -> None:
    base = f"{API_PATH}/jobs"
    blueprint.add_url_rule(base, "api_jobs", list_jobs, methods=["GET"])
    blueprint.add_url_rule(base, "api_create_job", create_job, methods=["POST"])
    blueprint.add_url_rule(f"{base}/<job_id>", "api_job", show_job, methods=["GET"])
    blueprint.add_url_rule(f"{base}/<job_id>", "api_delete_job", delete_job, methods=["DELETE"])
    blueprint.add_url_rule(f"{base}/<job_id>/cancel", "api_cancel_job", cancel_job, methods=["POST"])
    blueprint.add_url_rule(f"{base}/<job_id>/resume", "api_resume_job", resume_job, methods=["POST"])
    blueprint.add_url_rule(f"{base}/<job_id>/log", "api_job_log", job_log, methods=["GET"])
    blueprint.add_url_rule(f"{base}/<job_id>/progress", "api_job_progress", job_progress, methods=["GET"])

