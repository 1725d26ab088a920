"""The JSON API's envelope: errors are JSON with a message, for every way a request can go wrong."""

from __future__ import annotations

import pytest
from flask import Flask
from flask.testing import FlaskClient

import digits_memplugin


def test_health_reports_version_and_gpu_state(client: FlaskClient) -> None:
    body = client.get("/memplugin/api/health").get_json()
    assert body["status"] == "ok"
    assert body["version"] == digits_memplugin.__version__
    assert body["gpu_count"] == 0
    assert "NVML" in body["gpu_reason"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/memplugin/api/no-such-thing", 404),
        ("GET", "/memplugin/api", 404),
        ("DELETE", "/memplugin/api/a/b/c", 404),
        ("POST", "/memplugin/api/health", 405),
    ],
)
def test_api_errors_are_json_with_a_message(client: FlaskClient, method: str, path: str, status: int) -> None:
    response = client.open(path, method=method)
    assert response.status_code == status
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert body["status"] == status
    assert isinstance(body["error"], str) and body["error"]


def test_method_not_allowed_lists_the_allowed_methods(client: FlaskClient) -> None:
    response = client.post("/memplugin/api/health")
    assert set(response.headers["Allow"].split(", ")) >= {"GET", "HEAD"}


def test_a_crash_in_an_api_view_is_a_json_500_without_a_traceback(app: Flask) -> None:
    # A view that fails the way a bug would; the response must not leak the exception text or a stack trace.
    def broken() -> str:
        raise ZeroDivisionError("secret internals")

    app.view_functions["memplugin.api_health"] = broken
    app.config["PROPAGATE_EXCEPTIONS"] = False
    response = app.test_client().get("/memplugin/api/health")
    assert response.status_code == 500
    assert response.mimetype == "application/json"
    assert "secret internals" not in response.text
    assert "Traceback" not in response.text
    assert response.get_json()["error"].startswith("internal error")


def test_errors_outside_the_api_keep_the_host_behaviour(client: FlaskClient) -> None:
    response = client.get("/no-such-page")
    assert response.status_code == 404
    assert response.mimetype == "text/html"


BODY_READERS = ["/memplugin/api/estimate", "/memplugin/api/jobs", "/memplugin/models.json"]
"""Every endpoint that reads a JSON body: the REST API's and the New model form's JSON twin."""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"net": "x",}', (
            "the body is not valid JSON: Expecting property name enclosed in double quotes at line 1, column 13 "
            "(character 12)"
        )),
        (b'{"net": "x"}\n{}', "the body is not valid JSON: Extra data at line 2, column 1 (character 13)"),
        (b"", "the body is not valid JSON: it is empty"),
        (b'{"net": "\xff"}', "the body is not valid JSON: it is not UTF-8 text (invalid start byte at byte 9)"),
    ],    ids=["syntax", "extra-data", "empty", "not-utf8"],
)
def test_every_endpoint_words_a_body_that_is_not_json_alike(client: FlaskClient, body: bytes, message: str) -> None:
    """One message, saying where the JSON failed, whichever endpoint was sent it (issue 14: /api/estimate said "the
    body must be JSON", /api/jobs "the body is not valid JSON")."""
    for path in BODY_READERS:
        response = client.post(path, data=body, content_type="application/json")
        assert (response.status_code, response.get_json()) == (400, {"error": message, "status": 400}), path


@pytest.mark.parametrize(("content_type", "given"), [("text/plain", "Content-Type text/plain"), (None, "no Content-Type")])
def test_every_api_endpoint_words_a_body_of_the_wrong_type_alike(
    client: FlaskClient, content_type: str | None, given: str
) -> None:
    """Each says what it takes, the same way, and what the request sent: jobs also take a form."""
    headers = {"Content-Type": content_type} if content_type else {}
    takes = {
        "/memplugin/api/estimate": "JSON (Content-Type: application/json)",
        "/memplugin/api/jobs": "JSON (Content-Type: application/json) or a form (multipart/form-data or "
                               "application/x-www-form-urlencoded)",
    }
    for path, accepted in takes.items():
        response = client.post(path, data=b'{"net": "x"}', headers=headers)
        expected = {"error": f"the body must be {accepted}; this request has {given}", "status": 400}
        assert (response.status_code, response.get_json()) == (400, expected), path
