"""JSON API under `<prefix>/api`: errors are JSON with a message, never an HTML page or a stack trace.

Error handling stays inside the blueprint, so the host app's own error pages are left alone: the blueprint's
handlers cover its views, and a catch-all route answers unknown API paths and wrong methods with JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from flask import Blueprint, Response, current_app, jsonify, request, url_for
from flask.blueprints import BlueprintSetupState
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import (
    BadRequest,
    HTTPException,
    InternalServerError,
    MethodNotAllowed,
    NotFound,
    RequestEntityTooLarge,
    ServiceUnavailable,
)
from werkzeug.formparser import FormDataParser, default_stream_factory
from werkzeug.routing import PathConverter
from werkzeug.wsgi import LimitedStream

from ... import __version__
from ...core import inputs
from ...estimate.pool import PoolBusy, PoolError
from ...jobs.errors import DataFolderInUse, DiskFull, JobNotFound
from ...jobs.manager import JobManager
from ...jobs.store.database import StoreError, StoreFull
from ...jobs.store.records import Job
from ..error_pages import error_page
from ..plugin_state import current_plugin

API_PATH = "/api"
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
T = TypeVar("T")


def job_or_404(manager: JobManager, job_id: str) -> Job:
    """The job by its id; a job that is not there is the 404 every view answers for it."""
    try:
        return manager.get(job_id)
    except JobNotFound as error:
        raise NotFound(str(error)) from None


def created(job: Job) -> Response:
    """The 201 a submission answers: the job's document, and its address in Location."""
    response = jsonify(job.to_json())
    response.status_code = 201
    response.headers["Location"] = url_for(".api_job", job_id=job.id)
    return response


def health() -> dict[str, Any]:
    """Liveness and what the plugin sees: its version and whether GPUs are visible."""
    devices = current_plugin().devices.read()
    return {
        "status": "ok",
        "version": __version__,
        "gpu_count": devices.gpu_count,
        "gpu_reason": devices.gpu_reason,
        "simulated": devices.simulated,
    }


class InsufficientStorage(HTTPException):
    """507: the server cannot store what the request needs (Werkzeug has no class for it)."""

    code = 507
    description = "the server has no room left to store this"


class AnyPathConverter(PathConverter):
    """Werkzeug's `path` converter, newlines included: its regex has no DOTALL, so a path with %0A would slip past
    the catch-all to the host app's HTML 404."""

    regex = "(?s:[^/].*?)"


def within_limit(limit: int, read: Callable[[], T]) -> T:
    """Run `read` (get the body, parse the form) with the request's body bounded by `limit` bytes: a Content-Length
    over it is a 413 before anything is read, a chunked body (no Content-Length) a 413 as soon as it passes it,
    never read to its end first.

    Werkzeug's bounded stream returns what it read, without an error, when a body stops exactly at the bound, so
    the bound is `limit` + 1: a stream that reached it held more than `limit` bytes."""
    if request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge(f"the request is {request.content_length} bytes; the limit is {limit}")
    request.max_content_length = limit + 1
    over = RequestEntityTooLarge(f"the request is over {limit} bytes; the limit is {limit}")
    try:
        value = read()
    except RequestEntityTooLarge:
        raise over from None
    stream = request.stream
    if isinstance(stream, LimitedStream) and stream.limit == limit + 1 and stream.is_exhausted:
        raise over
    return value


class _StrictFormParser(FormDataParser):
    """Werkzeug's form parser, failing where it would silently give an empty form (a part whose headers are not
    UTF-8, broken framing), and closing the uploads it had spooled when it fails: werkzeug drops them unclosed."""

    def __init__(self, **options: Any) -> None:
        factory = options.pop("stream_factory", None) or default_stream_factory
        self.spooled: list[Any] = []

        def spool(*args: Any, **kwargs: Any) -> Any:
            stream = factory(*args, **kwargs)
            self.spooled.append(stream)
            return stream

        options["silent"] = False
        super().__init__(stream_factory=spool, **options)

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().parse(*args, **kwargs)
        except BaseException:
            for stream in self.spooled:
                stream.close()
            raise


def read_form(limit: int) -> None:
    """Parse the form (`request.form`, `request.files`) within `limit` bytes, as `within_limit` does; a form that
    cannot be parsed is a 400 saying why, not an empty form."""
    request.form_data_parser_class = _StrictFormParser
    try:
        within_limit(limit, lambda: request.form)
    except UnicodeDecodeError:
        raise BadRequest("the form could not be read: a part's name or headers are not UTF-8") from None
    except ValueError as error:
        raise BadRequest(f"the form could not be read: {error}") from None


JSON_CONTENT_TYPE = "application/json"
NOT_JSON = "the body is not valid JSON"
"""How every endpoint that reads JSON begins the message for a body that does not parse; `not_json` adds where."""


def wrong_content_type(accepted: str = f"JSON (Content-Type: {JSON_CONTENT_TYPE})") -> BadRequest:
    """The 400 for a body of a kind the endpoint does not read, worded alike on every endpoint: what it takes, and
    what the request said it sent (a client that forgot the header learns it from the message)."""
    given = f"Content-Type {request.mimetype}" if request.mimetype else "no Content-Type"
    return BadRequest(f"the body must be {accepted}; this request has {given}")


def not_json(error: ValueError) -> BadRequest:
    """The 400 for a JSON body that does not parse, saying where it failed: line, column and character for a
    syntax error, the byte for text that is not in the encoding JSON's first bytes announce."""
    if isinstance(error, json.JSONDecodeError):
        if not error.doc.strip():
            return BadRequest(f"{NOT_JSON}: it is empty")
        return BadRequest(
            f"{NOT_JSON}: {error.msg} at line {error.lineno}, column {error.colno} (character {error.pos})"
        )
    if isinstance(error, UnicodeDecodeError):
        return BadRequest(f"{NOT_JSON}: it is not {error.encoding.upper()} text ({error.reason} at byte {error.start})")
    return BadRequest(f"{NOT_JSON}: {error}")


def read_json(limit: int) -> Any:
    """The JSON body, read within `limit` bytes; a body sent as another type, or that does not parse, is a 400 with
    the same words on every endpoint (`wrong_content_type`, `not_json`). JSON nested deeper than Python's parser
    recurses is a 400 like any other JSON it cannot read. An integer of more digits than Python converts (4300)
    would fail the whole body: it reads as an `inputs.LongNumber`, which the field's own check refuses by name."""
    data = within_limit(limit, lambda: request.get_data(cache=True))
    if not request.is_json:
        raise wrong_content_type()
    try:
        return inputs.loads(data)
    except RecursionError:
        raise BadRequest("the body's JSON is nested too deeply to read") from None
    except ValueError as error:  # not JSON, or not in a Unicode encoding JSON allows
        raise not_json(error) from None


def as_http_error(error: Exception) -> Exception:
    """The HTTP error an expected failure of the job store stands for: a full disk is a 507; the database locked by
    another process, damaged or otherwise unusable, or the data folder held by another server, a 503 with the
    message that says which (the jobs API is out of service, the rest of the plugin is not); anything else is left
    as it is."""
    if isinstance(error, (StoreFull, DiskFull)):
        return InsufficientStorage(str(error))
    if isinstance(error, (StoreError, DataFolderInUse)):
        return ServiceUnavailable(str(error))
    return _pool_http_error(error)


def _pool_http_error(error: Exception) -> Exception:
    """The estimate pool's refusals (estimate_pool.py) are 503s: a full queue says when to try again
    (Retry-After), a timeout or a worker that died says what happened."""
    if isinstance(error, PoolBusy):
        return ServiceUnavailable(str(error), retry_after=error.retry_after)
    if isinstance(error, PoolError):
        return ServiceUnavailable(str(error))
    return error


def unknown_api_path(rest: str) -> NoReturn:
    """Anything under /api that no API route took: 405 when another route has the path, else 404."""
    adapter = current_app.url_map.bind_to_environ(request.environ)
    allowed = {
        method
        for rule in current_app.url_map.iter_rules()
        if rule.endpoint != request.endpoint and rule.methods
        for method in rule.methods
        if _rule_matches(adapter, rule.endpoint, method)
    }
    if allowed:
        raise MethodNotAllowed(valid_methods=sorted(allowed))
    raise NotFound(f"no API endpoint at {request.path}")


def _rule_matches(adapter: Any, endpoint: str, method: str) -> bool:
    try:
        matched_endpoint, _ = adapter.match(request.path, method=method)
    except HTTPException:
        return False
    return bool(matched_endpoint == endpoint)


def json_error(error: Exception) -> ResponseReturnValue:
    """`{"error": message, "status": code}` for any error raised by an API view."""
    error = as_http_error(error)
    if not isinstance(error, HTTPException):
        current_app.logger.exception("unhandled error in %s %s", request.method, request.path)
        error = InternalServerError("internal error; the server log has the details")
    response = jsonify(error=error.description or error.name, status=error.code)
    if isinstance(error, MethodNotAllowed) and error.valid_methods:
        response.headers["Allow"] = ", ".join(error.valid_methods)
    if isinstance(error, ServiceUnavailable) and error.retry_after is not None:
        response.headers["Retry-After"] = dict(error.get_headers()).get("Retry-After", "")
    return response, error.code or 500


def is_api_request() -> bool:
    prefix = current_app.config["MEMPLUGIN_URL_PREFIX"].rstrip("/") + API_PATH
    return request.path == prefix or request.path.startswith(prefix + "/")


def register(blueprint: Blueprint) -> None:
    def add_converter(state: BlueprintSetupState) -> None:
        state.app.url_map.converters.setdefault("anypath", AnyPathConverter)

    blueprint.record_once(add_converter)
    blueprint.add_url_rule(f"{API_PATH}/health", "api_health", health)
    blueprint.add_url_rule(
        f"{API_PATH}/<anypath:rest>", "api_unknown", unknown_api_path, methods=ALL_METHODS,
        provide_automatic_options=False,
    )
    for root, endpoint in ((API_PATH, "api_root"), (f"{API_PATH}/", "api_root_slash")):
        blueprint.add_url_rule(
            root, endpoint, unknown_api_path, defaults={"rest": ""}, methods=ALL_METHODS,
            provide_automatic_options=False,
        )

    @blueprint.errorhandler(Exception)
    def _error(error: Exception) -> ResponseReturnValue:
        if is_api_request():
            return json_error(error)
        error = as_http_error(error)
        if isinstance(error, HTTPException):
            return error_page(error)
        raise error
