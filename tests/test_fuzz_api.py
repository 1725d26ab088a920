"""REST fuzzing: hypothesis throws arbitrary JSON (wrong types, huge numbers, NaN, deep and wide nesting), field-aware
bodies built from the real nets, random bytes under random content types, multipart forms with random parts, and
random ids, paths, methods and query strings at every endpoint of the API. Whatever comes in, the answer is never a
5xx and never a stack trace: JSON with a message (`error` or `errors`), or the endpoint's own success document.
The work per input is bounded by the request limit the app is given, so nothing can hang.

Each target is tried `FUZZ_API_EXAMPLES` times (200 by default; bench/fuzz_api.py runs the same targets for many
more); the inputs tried per target are printed (pytest -s) and written to fuzz_api_counts.json in pytest's temp
folder. Jobs that validate are real jobs, but the app's CPU memory cap (1 MiB) fits no batch, so each fails at
placement instead of starting a training child.
"""

from __future__ import annotations

import collections
import io
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, write_lmdb
from werkzeug.test import TestResponse

from digits_memplugin import create_app
from digits_memplugin.extension import get_plugin

EXAMPLES = int(os.environ.get("FUZZ_API_EXAMPLES", "200"))
REQUEST_LIMIT = 32 * 1024
"""MEMPLUGIN_MAX_REQUEST_BYTES of the fuzzed app: bodies go up to twice that, so the limit is crossed often."""
API = "/memplugin/api"
TRIED: collections.Counter[str] = collections.Counter()
STATUSES: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


# ============================================================================ the app


def fuzz_app(folder: Path) -> Flask:
    """An app with small limits and datasets, whose jobs validate but never train."""
    datasets = folder / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    for name, records in (("mnist_train_lmdb", 16), ("mnist_test_lmdb", 8)):
        if not (datasets / name).exists():
            write_lmdb(datasets / name, records=records)
    return create_app(
        {
            "MEMPLUGIN_DATA_DIR": folder / "data",
            "MEMPLUGIN_ASYNC_MODE": "threading",
            "MEMPLUGIN_DATASET_ROOTS": [str(datasets)],
            "MEMPLUGIN_MAX_REQUEST_BYTES": REQUEST_LIMIT,
            "MEMPLUGIN_CPU_MEMORY_CAP": 1 << 20,
            "MEMPLUGIN_MAX_QUEUED_JOBS": 1000,
            "TESTING": True,
        }
    )


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    app = fuzz_app(tmp_path_factory.mktemp("fuzz-api"))
    yield app
    get_plugin(app).close()


@pytest.fixture(scope="module")
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture(scope="module")
def job_ids(client: FlaskClient) -> list[str]:
    """Real jobs for the id-taking endpoints (each fails at placement: resumable, deletable); replaced when the
    fuzzer deletes one."""
    ids = []
    for _ in range(3):
        created = client.post(f"{API}/jobs", json=VALID_JOB)
        assert created.status_code == 201, created.get_json()
        ids.append(created.get_json()["id"])
    return ids


@pytest.fixture(scope="module", autouse=True)
def report_counts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Print the inputs tried per target and the statuses they got (pytest -s), and write them to a file."""
    yield
    path = tmp_path_factory.getbasetemp() / "fuzz_api_counts.json"
    document = {"tried": dict(TRIED), "total": sum(TRIED.values()),
                "statuses": {name: dict(counts) for name, counts in STATUSES.items()}}
    path.write_text(json.dumps(document, indent=2, sort_keys=True))
    print(f"\nREST fuzz inputs tried: {dict(TRIED)}, {sum(TRIED.values())} in all (written to {path})")


# ============================================================================ the check


class Violation(AssertionError):
    """A response the API must never give."""


def check(target: str, response: TestResponse, allowed: set[int]) -> None:
    """Never 5xx, never a stack trace; an error is JSON with a message; only the endpoint's statuses."""
    TRIED[target] += 1
    STATUSES[target][response.status_code] += 1
    text = response.get_data(as_text=True)
    if response.status_code >= 500 or "Traceback (most recent call last)" in text:
        raise Violation(f"{target}: {response.status_code} {text[:600]}")
    if response.status_code not in allowed:
        raise Violation(f"{target}: status {response.status_code} not in {sorted(allowed)}: {text[:300]}")
    if response.request.method == "HEAD":
        return  # a HEAD answer has headers only
    if response.status_code >= 400:
        document = response.get_json(silent=True)
        if not isinstance(document, dict) or not (document.get("error") or document.get("errors")):
            raise Violation(f"{target}: a {response.status_code} without a JSON message: {text[:300]}")
    elif response.mimetype == "application/json" and not isinstance(response.get_json(silent=True), dict):
        raise Violation(f"{target}: a {response.status_code} whose body is not a JSON object: {text[:300]}")


# ============================================================================ strategies

FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e308, -1e-308, 0.5, 1.0])
INTS = (
    st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63)])
)
TEXT = st.text(max_size=40) | st.sampled_from(["", " ", "auto", "cpu", "gpu", "all", "\x00", "../../etc/passwd",
                                               "GPU-", "0", "-1", "1e9", "NaN", "{}", "[]", "%s", "\u202e"])
SCALARS = st.none() | st.booleans() | INTS | FLOATS | TEXT
JSON_VALUES = st.recursive(
    SCALARS, lambda children: st.lists(children, max_size=6) | st.dictionaries(TEXT, children, max_size=6),
    max_leaves=30,
)


def nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"a": value}
    return value


DEEP = st.integers(1, 400).map(nested)
"""Nesting as deep as a JSON parser takes without recursion trouble (deeper: test_api_json_deeper_than_the_parser)."""
NETS = st.sampled_from([
    LENET, SHORT_SOLVER, "", "layer {", 'name: "x"', "\x00\x01", "layer { type: 'Input' }",
    'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2147483647 dim: 2147483647 } } }',
    LENET.replace("num_output: 20", "num_output: 0"), LENET.replace("kernel_size: 5", "kernel_size: 4294967295"),
]) | st.text(max_size=200)


def field_values(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return good | JSON_VALUES | DEEP


ESTIMATE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "net": field_values(NETS),
    "solver": field_values(st.sampled_from([SHORT_SOLVER, "base_lr: -1", 'net: "/etc/passwd"', "type: 'Nope'"])),
    "batch": field_values(INTS),
    "test_batch": field_values(INTS),
    "engine": field_values(st.sampled_from(["cpu", "gpu", "gpu-cudnn", "tpu"])),
    "free_bytes": field_values(INTS),
    "device": field_values(st.sampled_from(["cpu", "GPU-x", "0", ""])),
    "devices": field_values(st.sampled_from(["all", ["cpu"], ["cpu", "cpu"], ["nope"], []])),
    "safety_margin": field_values(FLOATS),
    "data_shapes": field_values(st.dictionaries(st.sampled_from(["data", "*", "mnist/data", "x"]),
                                                st.lists(INTS, max_size=9), max_size=3)),
    "classes": field_values(INTS),
    "curve_batches": field_values(st.lists(INTS, max_size=40)),
    "max_batch": field_values(INTS),
    "read_datasets": field_values(st.booleans()),
}
JOB_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "net": field_values(NETS),
    "solver": field_values(st.sampled_from([SHORT_SOLVER, SHORT_SOLVER + 'test_net: "/etc/passwd"\n', "max_iter: 0",
                                            "type: 'Nope'", "base_lr: 0.01\nlr_policy: 'poly'"])),
    "name": field_values(TEXT),
    "device": field_values(st.sampled_from(["auto", "cpu", 0, 7, "gpu:0", "GPU-", -1])),
    "batch": field_values(st.sampled_from(["auto", 1, 64, 10**9]) | INTS),
    "data": field_values(st.sampled_from([LENET_DATA, {"train": "/etc"}, {"mnist": "x"}, {"nope": "x"}, {}])),
    "data_shapes": field_values(st.dictionaries(TEXT, st.lists(INTS, max_size=9), max_size=3)),
    "classes": field_values(INTS),
    "max_iter": field_values(INTS),
    "memory_cap": field_values(st.sampled_from(["2GiB", "1KiB", "lots", 1 << 20, 0]) | INTS),
    "fallback": field_values(st.fixed_dictionaries({}, optional={
        "max_attempts": INTS, "safety_margin": FLOATS, "growth": FLOATS, "start": TEXT,
    })),
}


def mutations(base: dict[str, Any], fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """A valid body with one or two fields changed or dropped: inputs that get past validation to the real work
    (an estimate, a job stored and placed) and test it with one odd value at a time."""
    changed = st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({key: fields[key] for key in keys})
    )
    dropped = st.sets(st.sampled_from(sorted(base)), max_size=1)
    return st.tuples(changed, dropped).map(
        lambda cd: {key: value for key, value in {**base, **cd[0]}.items() if key not in cd[1]}
    )


def bodies(fields: dict[str, st.SearchStrategy[Any]], valid: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A body that is the endpoint's fields with odd values, a valid body with a field or two changed, or
    anything at all."""
    known = st.fixed_dictionaries({}, optional=fields)
    with_junk = st.tuples(known, st.dictionaries(TEXT, JSON_VALUES, max_size=3)).map(lambda kv: {**kv[1], **kv[0]})
    near = mutations(valid, fields)
    return st.one_of(known, near, near, with_junk, JSON_VALUES, DEEP)


VALID_ESTIMATE: dict[str, Any] = {"net": LENET, "data_shapes": {"*": [1, 28, 28]}, "free_bytes": 1 << 30}
VALID_JOB: dict[str, Any] = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2}


def padded(body: Any, padding: int) -> bytes:
    """The body as JSON (NaN and Infinity included, as Python writes them), with whitespace to make it large."""
    return json.dumps(body, allow_nan=True).encode() + b" " * padding


PADDING = st.sampled_from([0, 0, 0, 100, REQUEST_LIMIT - 200, REQUEST_LIMIT + 1, 2 * REQUEST_LIMIT])
CONTENT_TYPES = st.sampled_from([
    "application/json", "application/json; charset=utf-8", "text/plain", "application/x-www-form-urlencoded",
    "multipart/form-data", "multipart/form-data; boundary=xyz", "application/octet-stream", "", "application/*",
    "application/json; charset=latin-1",
])
RAW = st.binary(max_size=2000) | st.text(max_size=500).map(str.encode)


# ============================================================================ the targets


def estimate_json(client: FlaskClient, value: tuple[Any, int]) -> None:
    body, padding = value
    response = client.post(f"{API}/estimate", data=padded(body, padding), content_type="application/json")
    check("POST /estimate (JSON)", response, {200, 400, 413})


def estimate_raw(client: FlaskClient, value: tuple[bytes, str]) -> None:
    raw, content_type = value
    check("POST /estimate (bytes)", client.post(f"{API}/estimate", data=raw, content_type=content_type),
          {200, 400, 413})


def jobs_json(client: FlaskClient, value: tuple[Any, int]) -> None:
    body, padding = value
    response = client.post(f"{API}/jobs", data=padded(body, padding), content_type="application/json")
    check("POST /jobs (JSON)", response, {201, 400, 413})


def jobs_raw(client: FlaskClient, value: tuple[bytes, str]) -> None:
    raw, content_type = value
    check("POST /jobs (bytes)", client.post(f"{API}/jobs", data=raw, content_type=content_type), {201, 400, 413})


FORM_KEYS = st.sampled_from([*JOB_FIELDS, "junk", "", "net[]"]) | TEXT
FORM_VALUES = TEXT | NETS | JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True))
FILE_PARTS = st.tuples(st.sampled_from(["net", "solver", "data", "x"]) | TEXT, RAW, st.text(max_size=20))


VALID_FORM = {"data": json.dumps(LENET_DATA), "device": "cpu", "max_iter": "2"}
VALID_FILES = [("net", LENET.encode(), "net.prototxt"), ("solver", SHORT_SOLVER.encode(), "solver.prototxt")]
MULTIPART = st.one_of(
    st.tuples(st.dictionaries(FORM_KEYS, FORM_VALUES, max_size=8), st.lists(FILE_PARTS, max_size=3)),
    st.tuples(  # the valid form with a field or a file changed, added or dropped
        mutations(VALID_FORM, dict.fromkeys((*JOB_FIELDS, "junk"), FORM_VALUES)),
        st.tuples(st.lists(FILE_PARTS, max_size=1), st.integers(0, 2)).map(
            lambda fd: [part for i, part in enumerate(VALID_FILES) if i != fd[1]] + fd[0]
        ),
    ),
)


INT_FIELDS = ("batch", "classes", "max_iter", "memory_cap")


def jobs_multipart(client: FlaskClient, value: tuple[dict[str, str], list[tuple[str, bytes, str]]]) -> None:
    form, files = value
    data: dict[str, Any] = dict(form)
    for name, content, filename in files:
        data[name] = (io.BytesIO(content), filename or "f")
    check("POST /jobs (multipart)", client.post(f"{API}/jobs", data=data, content_type="multipart/form-data"),
          {201, 400, 413})


ID_TEXT = TEXT | st.sampled_from(["..", ".", "%2e%2e", "nope", "a" * 300])
REAL_OR_ANY_ID = st.integers(0, 2) | st.integers(0, 2) | st.integers(0, 2) | ID_TEXT
"""Mostly one of the real jobs (an index into job_ids), else any text."""
QUERY = st.dictionaries(st.sampled_from(["attempt", "tail", "x"]), TEXT | INTS.map(str), max_size=2)
ACTIONS = st.sampled_from([("GET", ""), ("DELETE", ""), ("POST", "/cancel"), ("POST", "/resume"), ("GET", "/log"),
                           ("GET", "/progress"), ("PUT", ""), ("PATCH", "/cancel"), ("POST", "")])


def job_endpoints(
    client: FlaskClient, value: tuple[Any, tuple[str, str], dict[str, str]], ids: list[str]
) -> None:
    choice, (method, action), query = value
    job_id = ids[choice % len(ids)] if isinstance(choice, int) else quote(choice, safe="")
    path = f"{API}/jobs/{job_id}{action}"
    response = client.open(path, method=method, query_string=query)
    check(f"{method} /jobs/<id>{action}", response, {200, 204, 400, 404, 405, 409})
    if response.status_code == 204 and isinstance(choice, int):  # a real job was deleted: another takes its place
        created = client.post(f"{API}/jobs", data=padded(VALID_JOB, 0), content_type="application/json")
        ids[choice % len(ids)] = created.get_json()["id"]


def other_paths(client: FlaskClient, value: tuple[str, str, dict[str, str]]) -> None:
    method, rest, query = value
    path = f"{API}/{quote(rest, safe='/')}"
    if path.rstrip("/") == API or "\n" in rest:
        return  # not routed to the API: test_the_api_root_with_a_slash_is_json, test_paths_with_a_newline_are_json
    response = client.open(path, method=method, query_string=query)
    if response.status_code == 308 and "//" in path:
        # Werkzeug's URL map (the host app's) redirects a path with doubled slashes to the merged one; that is
        # routing, not the API answering: the merged path is what gets checked.
        TRIED["any method, any /api path"] += 1
        merged = re.sub("/{2,}", "/", path)
        assert response.headers["Location"].endswith(merged.split("?")[0]) or "%" in path, response.headers
        response = client.open(merged, method=method, query_string=query)
    check("any method, any /api path", response, {200, 204, 400, 404, 405, 409, 413})


HEADER_NAMES = st.text("abcdefghijklmnopqrstuvwxyz-ABCXYZ0123456789", min_size=1, max_size=12).filter(
    lambda name: name.lower() not in FRAMING
) | st.sampled_from(["Accept", "Content-Type", "Cookie", "Range", "If-None-Match", "X-Forwarded-For", "Origin"])
FRAMING = {"host", "content-length", "transfer-encoding"}
"""Headers the HTTP server and Werkzeug answer before the request reaches any app (a bad Host is the host app's
400): not the API's to answer."""
HEADER_VALUES = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
"""What HTTP can carry: a client cannot send a newline in a header (the test client refuses to build one)."""


def devices(client: FlaskClient, value: tuple[dict[str, str], dict[str, str]]) -> None:
    query, headers = value
    safe_headers = {key: value for key, value in headers.items() if key.isascii() and value.isascii()}
    check("GET /devices", client.get(f"{API}/devices", query_string=query, headers=safe_headers), {200})


TARGETS: dict[str, tuple[st.SearchStrategy[Any], Callable[..., None]]] = {
    "estimate_json": (st.tuples(bodies(ESTIMATE_FIELDS, VALID_ESTIMATE), PADDING), estimate_json),
    "estimate_raw": (st.tuples(RAW, CONTENT_TYPES), estimate_raw),
    "jobs_json": (st.tuples(bodies(JOB_FIELDS, VALID_JOB), PADDING), jobs_json),
    "jobs_raw": (st.tuples(RAW, CONTENT_TYPES), jobs_raw),
    "jobs_multipart": (MULTIPART, jobs_multipart),
    "job_endpoints": (st.tuples(REAL_OR_ANY_ID, ACTIONS, QUERY), job_endpoints),
    "other_paths": (
        st.tuples(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
                  TEXT | st.sampled_from(["jobs", "jobs/", "estimate/x", "devices/0", "health", ""]), QUERY),
        other_paths,
    ),
    "devices": (st.tuples(QUERY, st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=3)), devices),
}


# ============================================================================ the tests


@FUZZ
@given(TARGETS["estimate_json"][0])
def test_estimate_with_arbitrary_json(client: FlaskClient, value: Any) -> None:
    estimate_json(client, value)


@FUZZ
@given(TARGETS["estimate_raw"][0])
def test_estimate_with_arbitrary_bytes_and_content_types(client: FlaskClient, value: Any) -> None:
    estimate_raw(client, value)


@FUZZ
@given(TARGETS["jobs_json"][0])
def test_job_submission_with_arbitrary_json(client: FlaskClient, value: Any) -> None:
    jobs_json(client, value)


@FUZZ
@given(TARGETS["jobs_raw"][0])
def test_job_submission_with_arbitrary_bytes_and_content_types(client: FlaskClient, value: Any) -> None:
    jobs_raw(client, value)


@FUZZ
@given(TARGETS["jobs_multipart"][0])
def test_job_submission_with_arbitrary_multipart_forms(client: FlaskClient, value: Any) -> None:
    jobs_multipart(client, value)


@FUZZ
@given(TARGETS["job_endpoints"][0])
def test_job_endpoints_with_arbitrary_ids_methods_and_queries(
    client: FlaskClient, job_ids: list[str], value: Any
) -> None:
    job_endpoints(client, value, job_ids)


@FUZZ
@given(TARGETS["other_paths"][0])
def test_any_method_on_any_api_path(client: FlaskClient, value: Any) -> None:
    other_paths(client, value)


@FUZZ
@given(TARGETS["devices"][0])
def test_devices_with_arbitrary_queries_and_headers(client: FlaskClient, value: Any) -> None:
    devices(client, value)


def test_the_fuzzers_reach_success_and_every_kind_of_refusal(client: FlaskClient, job_ids: list[str]) -> None:
    """A fuzzer whose inputs all fail the same way tests one line: the targets must reach the endpoints' work."""
    for body in ({"net": LENET, "data_shapes": {"*": [1, 28, 28]}},
                 {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2}):
        path = "/estimate" if "data_shapes" in body else "/jobs"
        response = client.post(f"{API}{path}", data=padded(body, 0), content_type="application/json")
        assert response.status_code in (200, 201), response.get_json()
    assert STATUSES, "run with the fuzz tests"
    seen = collections.Counter(status for counts in STATUSES.values() for status in counts.elements())
    if sum(TRIED.values()) >= 1000:  # the whole module ran: its inputs got through to every kind of answer
        assert {200, 201, 400, 404, 405, 413} <= set(seen), seen


def test_the_api_root_with_a_slash_is_json(client: FlaskClient) -> None:
    response = client.get(f"{API}/")
    assert response.status_code == 404 and response.is_json


@pytest.mark.parametrize("field", ["batch", "max_iter", "classes", "memory_cap"])
def test_a_form_number_int_cannot_read_is_a_400(client: FlaskClient, field: str) -> None:
    form = {**VALID_FORM, field: "\u00b9"}
    data: dict[str, Any] = {**form, **{name: (io.BytesIO(content), filename) for name, content, filename in VALID_FILES}}
    response = client.post(f"{API}/jobs", data=data, content_type="multipart/form-data")
    assert response.status_code == 400 and response.is_json


@pytest.mark.parametrize(("method", "path"), [("GET", "/x%0A"), ("PUT", "/jobs/%0A"), ("POST", "/jobs/a%0Ab")])
def test_paths_with_a_newline_are_json(client: FlaskClient, method: str, path: str) -> None:
    response = client.open(f"{API}{path}", method=method)
    assert response.status_code in (404, 405) and response.is_json


@pytest.mark.parametrize("path", ["/estimate", "/jobs"])
def test_api_json_deeper_than_the_parser_is_a_400(client: FlaskClient, path: str) -> None:
    deep = b"[" * 5_000 + b"]" * 5_000  # past Python's recursion limit (1000), under the app's 32 KiB request limit
    response = client.post(f"{API}{path}", data=deep, content_type="application/json")
    assert response.status_code == 400 and response.is_json, response.status_code


def test_nan_and_infinity_in_json_are_refused_or_used_never_crash(client: FlaskClient) -> None:
    """Python's JSON reader takes NaN and Infinity, so they reach the fields; each is a clear 400 or harmless."""
    for field, value in (("safety_margin", math.nan), ("safety_margin", math.inf), ("free_bytes", math.inf),
                         ("batch", math.nan)):
        body = {"net": LENET, "data_shapes": {"*": [1, 28, 28]}, field: value, "free_bytes": 1 << 30} | (
            {field: value} if field == "free_bytes" else {})
        response = client.post(f"{API}/estimate", data=padded(body, 0), content_type="application/json")
        check("NaN and Infinity", response, {200, 400})
