"""Inputs that used to get a 5xx or a flood back (issue 18, items 10 and 11): lone surrogates, integers Python
cannot read (5000 digits), numbers written with other digits than 0-9, numbers past what a solver field holds,
socket events with such values, a URL over gevent's 8 KiB, 300 000 unknown keys, and a damaged jobs database.

Each answer is a 4xx (or the 503 of a damaged database) in JSON that names the field, never a 5xx or a traceback,
and a refused request leaves nothing behind: no job, no job folder.
"""

from __future__ import annotations

import io
import json
import re
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER

from digits_memplugin import create_app
from digits_memplugin.host.extension import get_plugin

pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api"
NS = "/memplugin"
HUGE = "9" * 5000
"""More digits than Python turns into an int (4300): int() and json.loads raise ValueError."""
VALID_JOB: dict[str, Any] = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2}
VALID_ESTIMATE: dict[str, Any] = {"net": LENET, "data_shapes": {"*": [1, 28, 28]}, "free_bytes": 1 << 30}
FILES = {"net": LENET, "solver": SHORT_SOLVER}


@pytest.fixture
def input_app(tmp_path: Path, datasets: Path) -> Iterator[Flask]:
    app = create_app(
        {
            "MEMPLUGIN_DATA_DIR": tmp_path / "data",
            "MEMPLUGIN_ASYNC_MODE": "threading",
            "MEMPLUGIN_DATASET_ROOTS": [str(datasets)],
            "MEMPLUGIN_CPU_MEMORY_CAP": 1 << 20,  # jobs that validate fail at placement: no training child
            "TESTING": True,
        }
    )
    yield app
    get_plugin(app).close()


@pytest.fixture
def api(input_app: Flask) -> FlaskClient:
    return input_app.test_client()


def raw_json(body: dict[str, Any], **replacements: str) -> str:
    """`body` as JSON text with each `"@name@"` placeholder replaced by raw JSON text (5000 digits, \\ud800)."""
    text = json.dumps(body)
    for name, raw in replacements.items():
        text = text.replace(f'"@{name}@"', raw)
    return text


def refused(response: Any, field: str, *words: str) -> dict[str, Any]:
    """A 400 in JSON whose errors name `field` (with `words` in its message); never a traceback."""
    text = response.get_data(as_text=True)
    assert response.status_code == 400, (response.status_code, text[:500])
    assert response.is_json and "Traceback" not in text, text[:500]
    errors = response.get_json().get("errors") or {}
    assert field in errors, (field, text[:500])
    for word in words:
        assert word in json.dumps(errors[field]), (word, errors[field])
    return errors  # type: ignore[no-any-return]


def no_jobs(app: Flask) -> None:
    manager = get_plugin(app).jobs
    if manager.started:
        assert manager.list_jobs() == []
    jobs = get_plugin(app).settings.data_dir / "jobs"
    assert not jobs.exists() or list(jobs.iterdir()) == []


# ============================================================================ lone surrogates


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("net", {**VALID_JOB, "net": "@x@"}),
        ("solver", {**VALID_JOB, "solver": "@x@"}),
        ("name", {**VALID_JOB, "name": "@x@"}),
        ("device", {**VALID_JOB, "device": "@x@"}),
        ("data", {**VALID_JOB, "data": {"train": "@x@"}}),
        ("data_shapes", {**VALID_JOB, "data_shapes": {"@x@": [1, 28, 28]}}),
        ("fallback", {**VALID_JOB, "fallback": {"start": "@x@"}}),
    ],
)
def test_a_lone_surrogate_in_a_job_is_a_400_naming_the_field(
    input_app: Flask, api: FlaskClient, field: str, body: dict[str, Any]
) -> None:
    text = raw_json(body, x=json.dumps(LENET + "\ud800" if field in ("net", "solver") else "a\ud800b"))
    response = api.post(f"{API}/jobs", data=text, content_type="application/json")
    refused(response, field, "surrogate")
    no_jobs(input_app)


@pytest.mark.parametrize("field", ["net", "solver", "engine", "device"])
def test_a_lone_surrogate_in_an_estimate_is_a_400_naming_the_field(api: FlaskClient, field: str) -> None:
    text = raw_json({**VALID_ESTIMATE, field: "@x@"}, x=json.dumps("\ud800"))
    refused(api.post(f"{API}/estimate", data=text, content_type="application/json"), field, "surrogate")


@pytest.mark.parametrize("field", ["model_name", "custom_network", "train_source", "item_shape", "batch_size"])
def test_a_lone_surrogate_in_the_model_form_json_is_a_400_naming_the_field(
    input_app: Flask, api: FlaskClient, field: str
) -> None:
    body = {"model_name": "m", "train_source": "mnist_train_lmdb", "device": "cpu", "max_iter": 2, field: "@x@"}
    response = api.post("/memplugin/models.json", data=raw_json(body, x=json.dumps("a\ud800")),
                        content_type="application/json")
    refused(response, field, "surrogate")
    no_jobs(input_app)


# ============================================================================ integers Python cannot read


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("max_iter", {**VALID_JOB, "max_iter": "@n@"}),
        ("batch", {**VALID_JOB, "batch": "@n@"}),
        ("classes", {**VALID_JOB, "classes": "@n@"}),
        ("memory_cap", {**VALID_JOB, "memory_cap": "@n@"}),
        ("device", {**VALID_JOB, "device": "@n@"}),
        ("data_shapes.data", {**VALID_JOB, "data_shapes": {"data": [1, "@n@", 28]}}),
        ("data", {**VALID_JOB, "data": {"train": "@n@"}}),
        ("fallback", {**VALID_JOB, "fallback": {"max_attempts": "@n@"}}),
    ],
)
def test_a_5000_digit_integer_in_job_json_is_a_400_naming_the_field(
    input_app: Flask, api: FlaskClient, field: str, body: dict[str, Any]
) -> None:
    response = api.post(f"{API}/jobs", data=raw_json(body, n=HUGE), content_type="application/json")
    refused(response, field)
    no_jobs(input_app)


@pytest.mark.parametrize("field", ["batch", "test_batch", "free_bytes", "classes", "max_batch", "safety_margin"])
def test_a_5000_digit_integer_in_estimate_json_is_a_400_naming_the_field(api: FlaskClient, field: str) -> None:
    response = api.post(f"{API}/estimate", data=raw_json({**VALID_ESTIMATE, field: "@n@"}, n=HUGE),
                        content_type="application/json")
    refused(response, field, "5000 digits")


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("data_shapes.data", {**VALID_ESTIMATE, "data_shapes": {"data": ["@n@"]}}),
        ("curve_batches", {**VALID_ESTIMATE, "curve_batches": [1, "@n@"]}),
    ],
)
def test_a_5000_digit_integer_inside_estimate_lists_is_a_400_naming_the_field(
    api: FlaskClient, field: str, body: dict[str, Any]
) -> None:
    response = api.post(f"{API}/estimate", data=raw_json(body, n=HUGE), content_type="application/json")
    refused(response, field)


def multipart(form: dict[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = {"data": json.dumps(LENET_DATA), "device": "cpu", "max_iter": "2", **form}
    for name, text in FILES.items():
        data[name] = (io.BytesIO(text.encode()), f"{name}.prototxt")
    return data


def raw_multipart(fields: dict[str, bytes]) -> tuple[bytes, str]:
    """A multipart body whose field values are raw bytes (the test client encodes str values as UTF-8, which a
    lone surrogate cannot be): what a client that sends invalid UTF-8 sends."""
    boundary = "memplugin-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value + b"\r\n"
        for name, value in fields.items()
    ]
    for name, text in FILES.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}.prototxt"\r\n'
            "Content-Type: text/plain\r\n\r\n".encode() + text.encode() + b"\r\n"
        )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("field", ["max_iter", "batch", "classes", "memory_cap"])
@pytest.mark.parametrize("value", [HUGE, "\u00b2", "\u0661\u0662\u0663", "1_000"],
                         ids=["5000-digits", "superscript-two", "arabic-indic-123", "underscore"])
def test_a_number_in_a_multipart_job_is_read_with_ascii_digits_only(
    input_app: Flask, api: FlaskClient, field: str, value: str
) -> None:
    response = api.post(f"{API}/jobs", data=multipart({field: value}), content_type="multipart/form-data")
    refused(response, field)
    no_jobs(input_app)


@pytest.mark.parametrize("field", ["max_iter", "name", "data", "device"])
def test_an_encoded_surrogate_in_a_multipart_job_is_a_400(input_app: Flask, api: FlaskClient, field: str) -> None:
    """The UTF-8-like bytes of \\ud800 (ED A0 80) are not UTF-8: the form reads them as U+FFFD, never a surrogate."""
    fields = {"data": json.dumps(LENET_DATA).encode(), "device": b"cpu", "max_iter": b"2"}
    fields[field] = b"\xed\xa0\x80" if field != "data" else b'{"train": "\xed\xa0\x80"}'
    body, content_type = raw_multipart(fields)
    response = api.post(f"{API}/jobs", data=body, content_type=content_type)
    if field == "name":  # a name may be any text: it is taken, as the replacement characters
        assert response.status_code == 201 and response.get_json()["name"] == "\ufffd" * 3, response.get_json()
        return
    assert response.status_code == 400 and response.is_json, response.get_data(as_text=True)[:300]
    no_jobs(input_app)


@pytest.mark.parametrize("field", ["data", "fallback"])
def test_a_5000_digit_integer_in_a_multipart_json_field_is_a_400_naming_it(
    input_app: Flask, api: FlaskClient, field: str
) -> None:
    response = api.post(f"{API}/jobs", data=multipart({field: '{"train": ' + HUGE + '}'}),
                        content_type="multipart/form-data")
    refused(response, field)
    no_jobs(input_app)


def test_a_multipart_part_whose_name_is_not_utf8_is_a_400_saying_the_form_cannot_be_read(
    input_app: Flask, api: FlaskClient
) -> None:
    """Werkzeug gives up on such a body midway and returns an empty form (the answer was "give the net prototxt
    text", and the uploads it had spooled were left open): now a 400 that says the form cannot be read."""
    body, content_type = raw_multipart({"device": b"cpu"})
    body = body.replace(b'name="device"', b'name="\xed\xa0\x80"')
    response = api.post(f"{API}/jobs", data=body, content_type=content_type)
    assert response.status_code == 400 and "the form could not be read" in response.get_json()["error"]
    no_jobs(input_app)


@pytest.fixture
def job_id(api: FlaskClient) -> str:
    created = api.post(f"{API}/jobs", json=VALID_JOB)
    assert created.status_code == 201, created.get_json()
    return str(created.get_json()["id"])


@pytest.mark.parametrize("name", ["tail", "attempt"])
@pytest.mark.parametrize("value", ["%C2%B2", "%D9%A1", HUGE, "1_0", "0", "-1"])
def test_a_log_query_that_is_not_a_small_ascii_number_is_a_400_naming_it(
    api: FlaskClient, job_id: str, name: str, value: str
) -> None:
    response = api.get(f"{API}/jobs/{job_id}/log?{name}={value}")
    text = response.get_data(as_text=True)
    assert response.status_code == 400 and response.is_json, (response.status_code, text[:300])
    assert name in response.get_json()["error"] and "Traceback" not in text


# ============================================================================ the New model form's numbers


FORM_JSON: dict[str, Any] = {"model_name": "m", "train_source": "mnist_train_lmdb", "val_source": "mnist_test_lmdb",
                             "device": "cpu", "max_iter": 2}
INT_FORM_FIELDS = ("max_iter", "stepsize", "test_interval", "test_iter", "snapshot", "classes")


@pytest.mark.parametrize("field", INT_FORM_FIELDS)
@pytest.mark.parametrize("value", [int("9" * 401), 2**31, "9" * 401, "\u0661\u0662", "\u00b2"],
                         ids=["401-digits", "int32-plus-one", "401-digit-text", "arabic-indic", "superscript"])
def test_a_form_number_past_what_caffe_holds_is_a_400_beside_its_field(
    input_app: Flask, api: FlaskClient, field: str, value: Any
) -> None:
    response = api.post("/memplugin/models.json", json={**FORM_JSON, field: value})
    refused(response, field)
    no_jobs(input_app)


def test_a_5000_digit_form_number_in_json_is_a_400_beside_its_field(input_app: Flask, api: FlaskClient) -> None:
    for field in (*INT_FORM_FIELDS, "base_lr", "batch_size"):
        response = api.post("/memplugin/models.json", data=raw_json({**FORM_JSON, field: "@n@"}, n=HUGE),
                            content_type="application/json")
        refused(response, field)
    no_jobs(input_app)


@pytest.mark.parametrize(("field", "value"), [("stepvalues", "1000," + "9" * 401), ("stepvalues", "\u0661,\u0662"),
                                              ("batch_size", "9" * 401), ("batch_size", "\u0661\u0662")])
def test_form_text_numbers_are_ascii_and_within_caffe(
    input_app: Flask, api: FlaskClient, field: str, value: str
) -> None:
    policy = {"lr_policy": "multistep"} if field == "stepvalues" else {}
    response = api.post("/memplugin/models.json", json={**FORM_JSON, **policy, field: value})
    refused(response, field)
    no_jobs(input_app)


def test_the_html_form_shows_a_huge_number_beside_its_field(input_app: Flask, api: FlaskClient) -> None:
    """The plain form POST takes the same fields: a 400 page, the message beside the field, no 500."""
    page = api.get("/memplugin/models/new").get_data(as_text=True)
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    form = {"csrf_token": token, "model_name": "m", "network": "standard", "standard_network": "lenet", "solver": "settings",
            "solver_type": "SGD", "base_lr": "0.01", "lr_policy": "step", "gamma": "0.1", "stepsize": "9" * 401,
            "momentum": "0.9", "weight_decay": "0.0005", "max_iter": HUGE, "snapshot": "0", "data_backend": "lmdb",
            "train_source": "mnist_train_lmdb", "device": "cpu"}
    response = api.post("/memplugin/models", data=form)
    assert response.status_code == 400, response.status_code
    page = response.get_data(as_text=True)
    assert 'id="max_iter-error"' in page and 'id="stepsize-error"' in page and "Traceback" not in page
    no_jobs(input_app)


@pytest.mark.parametrize("name", ["a" * 300, "d/" + "b" * 5000, "\u00e9" * 200])
def test_a_data_source_name_longer_than_the_file_system_takes_is_a_400(
    input_app: Flask, api: FlaskClient, name: str
) -> None:
    """A path component over NAME_MAX (255 bytes) made stat() fail with ENAMETOOLONG: a 500 (found by
    bench/fuzz_api.py through the New model form)."""
    response = api.post(f"{API}/jobs", json={**VALID_JOB, "data": {"train": name, "test": "mnist_test_lmdb"}})
    errors = refused(response, "data")
    assert len(json.dumps(errors)) < 2000, errors  # the name is not echoed whole
    form = api.post("/memplugin/models.json", json={**FORM_JSON, "train_source": name})
    refused(form, "train_source")
    no_jobs(input_app)


def test_an_estimate_reading_a_dataset_name_longer_than_the_file_system_takes_is_a_400(api: FlaskClient) -> None:
    net = LENET.replace("examples/mnist/mnist_train_lmdb", "a" * 300)
    assert net != LENET
    response = api.post(f"{API}/estimate", json={"net": net, "read_datasets": True})
    refused(response, "read_datasets", "cannot be looked up")


# ============================================================================ socket events


def test_socket_events_with_odd_ids_are_answered_never_dropped(input_app: Flask) -> None:
    socketio = get_plugin(input_app).socketio
    client = socketio.test_client(input_app, namespace=NS)
    client.get_received(NS)
    for value in ("\ud800", "a" * 5000, 12, None, ["x"], {"id": 1}, "../../etc", "\u0661"):
        client.emit("subscribe_job", {"id": value}, namespace=NS)
        received = client.get_received(NS)
        assert [event["name"] for event in received] == ["job_error"], (value, received)
        assert "no job" in received[0]["args"][0]["error"]
        client.emit("unsubscribe_job", {"id": value}, namespace=NS)
        assert client.get_received(NS) == []
    assert client.is_connected(NS)


def raw_event(app: Flask, client: Any, text: str) -> list[dict[str, Any]]:
    """Send a socket.io EVENT packet as raw text (what a browser could send; the test client cannot encode an
    integer of 5000 digits) and return what came back."""
    socketio = get_plugin(app).socketio
    socketio.server._handle_eio_message(client.eio_sid, f"2{NS},{text}")
    return client.get_received(NS)  # type: ignore[no-any-return]


@pytest.mark.parametrize("event", ["subscribe_job", "unsubscribe_job", "subscribe_jobs", "subscribe_devices",
                                   "unsubscribe_devices", "unsubscribe_jobs", "nonsense"])
def test_a_socket_event_with_a_5000_digit_integer_is_handled(input_app: Flask, event: str) -> None:
    client = get_plugin(input_app).socketio.test_client(input_app, namespace=NS)
    client.get_received(NS)
    received = raw_event(input_app, client, json.dumps([event, {"id": "@n@"}]).replace('"@n@"', HUGE))
    if event == "subscribe_job":
        assert [e["name"] for e in received] == ["job_error"], received
    assert client.is_connected(NS)
    client.emit("subscribe_job", {"id": "nope"}, namespace=NS)  # and the connection still answers
    assert [e["name"] for e in client.get_received(NS)] == ["job_error"]


# ============================================================================ a URL over 8 KiB


def test_a_url_over_8_kib_is_a_json_414_from_the_real_server(tmp_path: Path) -> None:
    from test_jobs_restart import serve

    server = serve(tmp_path / "data", tmp_path / "serve.log")
    try:
        host, port = server.url.split("//")[1].rstrip("/").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            connection.sendall(f"GET /memplugin/api/jobs/{'a' * 9000} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            received = b""
            while chunk := connection.recv(65536):
                received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 414"), received[:300]
        assert b"application/json" in head.lower()
        document = json.loads(body)
        assert document["status"] == 414 and "8192" in document["error"], document
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)


# ============================================================================ a flood of unknown keys


@pytest.fixture
def big_app(tmp_path: Path, datasets: Path) -> Iterator[Flask]:
    """The default request limit (4 MiB), which holds 300 000 short keys."""
    app = create_app({"MEMPLUGIN_DATA_DIR": tmp_path / "data", "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "TESTING": True})
    yield app
    get_plugin(app).close()


def flood(count: int, valid: dict[str, Any], where: str | None = None) -> bytes:
    keys = {f"k{i}": 0 for i in range(count)}
    body = {**valid, where: keys} if where else {**valid, **keys}
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("path", "valid", "where", "field"),
    [
        ("/jobs", VALID_JOB, None, None),
        ("/estimate", VALID_ESTIMATE, None, None),
        ("/jobs", VALID_JOB, "fallback", "fallback"),
        ("/jobs", VALID_JOB, "data_shapes", None),
        ("/estimate", VALID_ESTIMATE, "data_shapes", None),
    ],
)
def test_300k_unknown_keys_get_a_short_answer_that_counts_them(
    big_app: Flask, path: str, valid: dict[str, Any], where: str | None, field: str | None
) -> None:
    body = flood(300_000, valid, where)
    assert len(body) < 4 * 1024 * 1024
    response = big_app.test_client().post(f"{API}{path}", data=body, content_type="application/json")
    text = response.get_data(as_text=True)
    assert response.status_code == 400 and response.is_json, (response.status_code, text[:300])
    assert len(text) < 16 * 1024, len(text)
    errors = response.get_json()["errors"]
    listed = errors[field] if field else errors
    assert len(listed) <= 21 and "299980 more" in listed["..."], listed


def test_long_unknown_key_names_are_cut(big_app: Flask) -> None:
    body = {**VALID_ESTIMATE, **{f"{i}" + "x" * 100_000: 1 for i in range(30)}}
    response = big_app.test_client().post(f"{API}/estimate", json=body)
    assert response.status_code == 400 and len(response.get_data()) < 16 * 1024


# ============================================================================ a damaged jobs database


DAMAGED = b"this is not an SQLite database, whatever its name says\n" * 100


def damaged_app(tmp_path: Path, datasets: Path) -> Flask:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "jobs.sqlite").write_bytes(DAMAGED)
    return create_app({"MEMPLUGIN_DATA_DIR": data, "MEMPLUGIN_ASYNC_MODE": "threading",
                       "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "TESTING": True})


JOB_REQUESTS = [
    ("GET", "/jobs", None), ("POST", "/jobs", VALID_JOB), ("GET", "/jobs/20260101-000000-abcdef", None),
    ("POST", "/jobs/20260101-000000-abcdef/cancel", None), ("POST", "/jobs/20260101-000000-abcdef/resume", None),
    ("DELETE", "/jobs/20260101-000000-abcdef", None), ("GET", "/jobs/20260101-000000-abcdef/log", None),
    ("GET", "/jobs/20260101-000000-abcdef/progress", None),
]


def assert_damaged(response: Any, path: Path) -> None:
    text = response.get_data(as_text=True)
    assert response.status_code == 503, (response.status_code, text[:300])
    assert "damaged" in text and str(path) in text and "Traceback" not in text, text[:500]


def test_a_damaged_database_is_a_503_saying_so_and_where_on_every_jobs_endpoint(
    tmp_path: Path, datasets: Path
) -> None:
    app = damaged_app(tmp_path, datasets)
    try:
        api = app.test_client()
        path = tmp_path / "data" / "jobs.sqlite"
        for method, url, body in JOB_REQUESTS:
            response = api.open(f"{API}{url}", method=method, json=body)
            assert_damaged(response, path)
            assert response.is_json and response.get_json()["status"] == 503
        for url in ("/memplugin/jobs", "/memplugin/jobs/20260101-000000-abcdef"):
            assert_damaged(api.get(url), path)  # the pages say it too
        assert_damaged(api.post("/memplugin/models.json", json=FORM_JSON), path)
        assert path.read_bytes() == DAMAGED  # not "repaired" by starting afresh over it
        assert api.get(f"{API}/health").status_code == 200 and api.get(f"{API}/devices").status_code == 200
    finally:
        get_plugin(app).close()


def test_a_socket_subscription_on_a_damaged_database_gets_an_error_event(tmp_path: Path, datasets: Path) -> None:
    app = damaged_app(tmp_path, datasets)
    try:
        client = get_plugin(app).socketio.test_client(app, namespace=NS)
        client.get_received(NS)
        for event, args in (("subscribe_jobs", {}), ("subscribe_job", {"id": "x"})):
            client.emit(event, args, namespace=NS)
            received = client.get_received(NS)
            assert [e["name"] for e in received] == ["job_error"], received
            assert "damaged" in received[0]["args"][0]["error"]
        assert client.is_connected(NS)
    finally:
        get_plugin(app).close()


def test_a_database_damaged_while_the_server_runs_is_a_503(tmp_path: Path, datasets: Path) -> None:
    data = tmp_path / "data"
    app = create_app({"MEMPLUGIN_DATA_DIR": data, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "MEMPLUGIN_CPU_MEMORY_CAP": 1 << 20,
                      "TESTING": True})
    try:
        api = app.test_client()
        created = api.post(f"{API}/jobs", json=VALID_JOB)
        assert created.status_code == 201
        path = data / "jobs.sqlite"
        checkpoint = sqlite3.connect(path)  # everything into the main file, so that the damage below is what is read
        checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        checkpoint.close()
        size = path.stat().st_size
        with path.open("r+b") as database:  # in place (a truncated file that is mapped would be a SIGBUS)
            database.seek(100)  # the pages after the header: "database disk image is malformed"
            database.write(b"\xff" * (size - 100))
        # The server's connection may hold the pages in its cache (WAL mode trusts it while the WAL is unchanged):
        # dropped, as memory pressure or a restart would, so the next read goes to the file.
        store = get_plugin(app).jobs.store
        with store._lock:
            store._db.execute("PRAGMA shrink_memory")
        for method, url in (("GET", "/jobs"), ("GET", f"/jobs/{created.get_json()['id']}")):
            assert_damaged(api.open(f"{API}{url}", method=method), path)
    finally:
        get_plugin(app).close()
