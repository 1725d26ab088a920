"""JSON API under `<prefix>/api`: errors are JSON with a message, never an HTML page or a stack trace.

Error handling stays inside the blueprint, so the host app's own error pages are left alone: the blueprint's
handlers cover its views, and a catch-all route answers unknown API paths and wrong methods with JSON.
"""

from __future__ import annotations

from typing import Any, NoReturn

from flask import Blueprint, current_app, jsonify, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException, InternalServerError, MethodNotAllowed, NotFound

from .. import __version__

API_PATH = "/api"
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def health() -> dict[str, Any]:
    """Liveness and what the plugin sees: its version and whether GPUs are visible."""
    devices = current_app.extensions["memplugin"].devices.read()
    return {
        "status": "ok",
        "version": __version__,
        "gpu_count": devices.gpu_count,
        "gpu_reason": devices.gpu_reason,
        "simulated": devices.simulated,
    }


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
    if not isinstance(error, HTTPException):
        current_app.logger.exception("unhandled error in %s %s", request.method, request.path)
        error = InternalServerError("internal error; the server log has the details")
    response = jsonify(error=error.description or error.name, status=error.code)
    if isinstance(error, MethodNotAllowed) and error.valid_methods:
        response.headers["Allow"] = ", ".join(error.valid_methods)
    return response, error.code or 500


def _is_api_request() -> bool:
    prefix = current_app.config["MEMPLUGIN_URL_PREFIX"].rstrip("/") + API_PATH
    return request.path == prefix or request.path.startswith(prefix + "/")


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule(f"{API_PATH}/health", "api_health", health)
    blueprint.add_url_rule(
        f"{API_PATH}/<path:rest>", "api_unknown", unknown_api_path, methods=ALL_METHODS, provide_automatic_options=False
    )
    blueprint.add_url_rule(
        API_PATH, "api_root", unknown_api_path, defaults={"rest": ""}, methods=ALL_METHODS,
        provide_automatic_options=False,
    )

    @blueprint.errorhandler(Exception)
    def _error(error: Exception) -> ResponseReturnValue:
        if _is_api_request():
            return json_error(error)
        if isinstance(error, HTTPException):
            return error
        raise error
