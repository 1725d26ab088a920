"""REST fuzzing: hypothesis throws arbitrary JSON (wrong types, huge numbers, NaN, deep and wide nesting), field-aware
bodies built from the real nets, random bytes under random content types, multipart forms with random parts, and
random ids, paths, methods and query strings at every endpoint of the API; the New model form (its JSON twin and its
plain POST), the HTML pages, and every socket.io event. Whatever comes in, the answer is never a 5xx and never a
stack trace: JSON with a message (`error` or `errors`), or the endpoint's own success document (a page: HTML, never
a 5xx); a socket event is answered as its handler promises, or not at all, and the connection stays.
The work per input is bounded by the request limit the app is given, so nothing can hang.

Every text strategy also draws the inputs of issue 18, item 10: lone surrogates ("\\ud800", sent as JSON escapes,
or as the bytes ED A0 80 in URLs and forms), integers of more digits than Python converts (5000: raw JSON, query
values, form fields) and numbers written with other digits than 0-9 ("²", "١٢٣", "𝟘", "1_000").

Each target is tried `FUZZ_API_EXAMPLES` times (200 by default; bench/fuzz_api.py runs the same targets for many
more); the inputs tried per target are printed (pytest -s) and written to fuzz_api_counts.json in pytest's temp
folder. Jobs that validate are real jobs, but the app's CPU memory cap (1 MiB) fits no batch, so each fails at
placement instead of starting a training child.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, write_lmdb
from werkzeug.test import TestResponse

from digits_memplugin import create_app
from digits_memplugin.host.extension import get_plugin

NS = "/memplugin"

EXAMPLES = int(os.environ.get("FUZZ_API_EXAMPLES", "200"))
REQUEST_LIMIT = 32 * 1024
"""MEMPLUGIN_MAX_REQUEST_BYTES of the fuzzed app: bodies go up to twice that, so the limit is crossed often."""
API = "/memplugin/api"
TRIED: collections.Counter[str] = collections.Counter()
STATUSES: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None,
    # function_scoped_fixture: the app (and its client) is one per test on purpose, shared by the test's examples
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture],
)


# ============================================================================ the app


def fuzz_settings(folder: Path) -> dict[str, Any]:
    """Small limits and datasets (written under `folder`): the fuzzed app's jobs validate but never train."""
    datasets = folder / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    for name, records in (("mnist_train_lmdb", 16), ("mnist_test_lmdb", 8)):
        if not (datasets / name).exists():
            write_lmdb(datasets / name, records=records)
    return {
        "MEMPLUGIN_DATASET_ROOTS": [str(datasets)],
        "MEMPLUGIN_MAX_REQUEST_BYTES": REQUEST_LIMIT,
        "MEMPLUGIN_CPU_MEMORY_CAP": 1 << 20,
        "MEMPLUGIN_MAX_QUEUED_JOBS": 1000,
        "MEMPLUGIN_MAX_STORED_JOBS": 100_000,  # the fuzzer stores many jobs (each a few kB)
        "MEMPLUGIN_CLIENT_EVENT_BURST": 10**9,  # the socket fuzzer sends one client's events as fast as it can
        "MEMPLUGIN_CLIENT_EVENTS_PER_SECOND": 1e9,
        "MEMPLUGIN_SOCKET_EVENTS_PER_SECOND": 1e9,
    }


def fuzz_app(folder: Path) -> Flask:
    """The fuzzed app on `folder`, for bench/fuzz_api.py (the tests get the same one from conftest's `app`)."""
    return create_app({"MEMPLUGIN_DATA_DIR": folder / "data", "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True,
                       **fuzz_settings(folder)})


@pytest.fixture
def app_config(tmp_path: Path) -> dict[str, Any]:
    """conftest's `app` (one per test, shared by that test's examples) with the fuzzed app's settings."""
    return fuzz_settings(tmp_path)


@pytest.fixture
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

class Huge:
    """An integer of more digits than Python converts (4300): no Python int can hold it for json.dumps, so `dumps`
    writes its digits into the JSON text; in a URL or a form it is its digits."""

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __str__(self) -> str:
        return self.digits

    def __repr__(self) -> str:
        return f"Huge({len(self.digits)} digits)"


def dumps(value: Any) -> str:
    """JSON as Python writes it (NaN and Infinity included, a lone surrogate as its escape), with each Huge written
    as its digits."""
    huge: list[str] = []

    def placeholder(item: Any) -> str:
        if isinstance(item, Huge):
            huge.append(item.digits)
            return f"\x00huge{len(huge) - 1}\x00"
        raise TypeError(f"not JSON: {item!r}")

    text = json.dumps(value, allow_nan=True, default=placeholder)
    return re.sub(r'"\\u0000huge(\d+)\\u0000"', lambda match: huge[int(match.group(1))], text) if huge else text


HUGE_DIGITS = st.sampled_from(["9" * 5000, "1" + "0" * 4300, "-" + "9" * 4301, "4" * 20_000])
HUGE = HUGE_DIGITS.map(Huge)
SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udbff", "x" * 30 + "\udc00", "\ud83d"]) | st.text(
    st.characters(categories=["Cs"]), min_size=1, max_size=4
)
"""Lone surrogates: characters no UTF-8 can carry (JSON may escape them; a client may send their bytes)."""
UNICODE_DIGITS = st.sampled_from(["\u00b2", "\u0661\u0662\u0663", "\u0663", "\u0d6c", "\U0001d7d8\U0001d7d9",
                                  "\uff11\uff12", "1_000", " 12 ", "+5", "-0", "0x10", "1e3", "\u2075", "\u216b",
                                  "\u06f9\u06f9", "\u07c0", "\u0663.\u0665", "12\u00b2", "\u0661GiB"])
"""Numbers Python's int() or float() reads although they are not written with 0-9, or reads differently."""
HOSTILE_TEXT = SURROGATES | UNICODE_DIGITS | HUGE_DIGITS
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e308, -1e-308, 0.5, 1.0])
INTS = (
    st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63), int("9" * 401)])
    | HUGE
)
TEXT = st.text(max_size=40) | HOSTILE_TEXT | st.sampled_from([
    "", " ", "auto", "cpu", "gpu", "all", "\x00", "../../etc/passwd", "GPU-", "0", "-1", "1e9", "NaN", "{}", "[]",
    "%s", "\u202e",
])
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
    LENET, SHORT_SOLVER, "", "layer {", 'name: "x"', "\x00\x01", "layer { type: 'Input' }", LENET + "\ud800",
    LENET.replace('name: "LeNet"', 'name: "Le\udfffNet"'), LENET.replace("num_output: 20", "num_output: " + "9" * 5000),
    LENET.replace("examples/mnist/mnist_train_lmdb", "a" * 300),
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
    "test_net": field_values(st.sampled_from(["auto", "shared", "apart", "Apart", "beside", ""])),
}
JOB_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "net": field_values(NETS),
    "solver": field_values(st.sampled_from([SHORT_SOLVER, SHORT_SOLVER + 'test_net: "/etc/passwd"\n', "max_iter: 0",
                                            "type: 'Nope'", "base_lr: 0.01\nlr_policy: 'poly'"])),
    "name": field_values(TEXT),
    "device": field_values(st.sampled_from(["auto", "cpu", 0, 7, "gpu:0", "GPU-", -1])),
    "batch": field_values(st.sampled_from(["auto", 1, 64, 10**9]) | INTS),
    "data": field_values(st.sampled_from([LENET_DATA, {"train": "/etc"}, {"mnist": "x"}, {"nope": "x"}, {},
                                          {"train": "a" * 300}, {"train": "d/" + "b" * 5000}])),
    "data_shapes": field_values(st.dictionaries(TEXT, st.lists(INTS, max_size=9), max_size=3)),
    "classes": field_values(INTS),
    "max_iter": field_values(INTS),
    "memory_cap": field_values(st.sampled_from(["2GiB", "1KiB", "lots", 1 << 20, 0]) | INTS),
    "fallback": field_values(st.fixed_dictionaries({}, optional={
        "max_attempts": INTS, "safety_margin": FLOATS, "growth": FLOATS, "start": TEXT,
    })),
    "test_net": field_values(st.sampled_from(["auto", "shared", "apart", "APART", "beside"])),
    "tester_device": field_values(st.sampled_from(["auto", "same", "cpu", "cpu@elsewhere", 0, 7, "gpu:0", "GPU-", -1])),
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
    return dumps(body).encode() + b" " * padding


def wire(text: str) -> bytes:
    """Text as a client puts it on the wire: UTF-8, a lone surrogate as the three bytes it would take (invalid
    UTF-8, which the server must read as such)."""
    return text.encode("utf-8", "surrogatepass")


def query_text(query: dict[str, Any]) -> str:
    """A query string any client could send (the test client would refuse a surrogate in a dict)."""
    return "&".join(f"{quote(wire(str(key)), safe='')}={quote(wire(str(value)), safe='')}" for key, value in query.items())


def multipart_body(form: dict[str, Any], files: list[tuple[str, bytes, str]]) -> tuple[bytes, str]:
    """A multipart/form-data body with `form`'s fields and `files`, names quoted as browsers do, values on the wire
    as `wire` puts them (the test client's encoder would refuse a lone surrogate)."""
    boundary = "fuzz-boundary-7b1c"

    def name(text: str) -> bytes:
        return wire(text).replace(b'"', b"%22").replace(b"\r", b"%0D").replace(b"\n", b"%0A")

    parts = [
        b"--" + boundary.encode() + b'\r\nContent-Disposition: form-data; name="' + name(str(key)) + b'"\r\n\r\n'
        + wire(str(value)) + b"\r\n"
        for key, value in form.items()
    ]
    parts += [
        b"--" + boundary.encode() + b'\r\nContent-Disposition: form-data; name="' + name(key) + b'"; filename="'
        + name(filename or "f") + b'"\r\nContent-Type: application/octet-stream\r\n\r\n' + content + b"\r\n"
        for key, content, filename in files
    ]
    return b"".join(parts) + b"--" + boundary.encode() + b"--\r\n", f"multipart/form-data; boundary={boundary}"


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
FORM_VALUES = TEXT | NETS | JSON_VALUES.map(dumps)
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
    body, content_type = multipart_body(form, files)
    check("POST /jobs (multipart)", client.post(f"{API}/jobs", data=body, content_type=content_type),
          {201, 400, 413})


ID_TEXT = TEXT | st.sampled_from(["..", ".", "%2e%2e", "nope", "a" * 300, "a" * 5000])
REAL_OR_ANY_ID = st.integers(0, 2) | st.integers(0, 2) | st.integers(0, 2) | ID_TEXT
"""Mostly one of the real jobs (an index into job_ids), else any text."""
QUERY = st.dictionaries(st.sampled_from(["attempt", "tail", "limit", "before", "x"]), TEXT | INTS.map(str),
                        max_size=2)
ACTIONS = st.sampled_from([("GET", ""), ("DELETE", ""), ("POST", "/cancel"), ("POST", "/resume"), ("GET", "/log"),
                           ("GET", "/progress"), ("PUT", ""), ("PATCH", "/cancel"), ("POST", "")])


def job_endpoints(
    client: FlaskClient, value: tuple[Any, tuple[str, str], dict[str, str]], ids: list[str]
) -> None:
    choice, (method, action), query = value
    job_id = ids[choice % len(ids)] if isinstance(choice, int) else quote(wire(choice), safe="")
    path = f"{API}/jobs/{job_id}{action}"
    response = client.open(path, method=method, query_string=query_text(query))
    check(f"{method} /jobs/<id>{action}", response, {200, 204, 400, 404, 405, 409})
    if response.status_code == 204 and isinstance(choice, int):  # a real job was deleted: another takes its place
        created = client.post(f"{API}/jobs", data=padded(VALID_JOB, 0), content_type="application/json")
        ids[choice % len(ids)] = created.get_json()["id"]


def other_paths(client: FlaskClient, value: tuple[str, str, dict[str, str]]) -> None:
    method, rest, query = value
    path = f"{API}/{quote(wire(rest), safe='/')}"
    if path.rstrip("/") == API or "\n" in rest:
        return  # not routed to the API: test_the_api_root_with_a_slash_is_json, test_paths_with_a_newline_are_json
    response = client.open(path, method=method, query_string=query_text(query))
    if response.status_code == 308 and "//" in path:
        # Werkzeug's URL map (the host app's) redirects a path with doubled slashes to the merged one; that is
        # routing, not the API answering: the merged path is what gets checked.
        TRIED["any method, any /api path"] += 1
        merged = re.sub("/{2,}", "/", path)
        assert response.headers["Location"].endswith(merged.split("?")[0]) or "%" in path, response.headers
        response = client.open(merged, method=method, query_string=query_text(query))
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
    check("GET /devices", client.get(f"{API}/devices", query_string=query_text(query), headers=safe_headers), {200})


# --- the New model form: its JSON twin and its plain POST

MODEL_URL = "/memplugin/models"
VALID_MODEL: dict[str, Any] = {"model_name": "m", "train_source": "mnist_train_lmdb", "val_source": "mnist_test_lmdb",
                               "device": "cpu", "max_iter": 2}
NUMBER_TEXT = INTS.map(str) | UNICODE_DIGITS | HUGE_DIGITS | st.sampled_from(["9" * 401, str(2**31), "64", "auto"])
MODEL_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model_name": field_values(TEXT),
    "network": field_values(st.sampled_from(["standard", "custom"])),
    "standard_network": field_values(st.sampled_from(["lenet", "alexnet"])),
    "custom_network": field_values(NETS),
    "solver": field_values(st.sampled_from(["settings", "file"])),
    "solver_type": field_values(st.sampled_from(["SGD", "Adam", "AdaGrad", "Nesterov"])),
    "base_lr": field_values(FLOATS | NUMBER_TEXT),
    "lr_policy": field_values(st.sampled_from(["step", "multistep", "inv", "poly", "fixed"])),
    "gamma": field_values(FLOATS | NUMBER_TEXT),
    "power": field_values(FLOATS | NUMBER_TEXT),
    "stepsize": field_values(NUMBER_TEXT),
    "stepvalues": field_values(st.sampled_from(["100,200", "200,100", "1," + "9" * 401, "\u0661,\u0662"]) | TEXT),
    "momentum": field_values(FLOATS | NUMBER_TEXT),
    "weight_decay": field_values(FLOATS | NUMBER_TEXT),
    "max_iter": field_values(NUMBER_TEXT),
    "test_interval": field_values(NUMBER_TEXT),
    "test_iter": field_values(NUMBER_TEXT),
    "snapshot": field_values(NUMBER_TEXT),
    "solver_text": field_values(st.sampled_from([SHORT_SOLVER, "base_lr: 0.01\nmax_iter: " + "9" * 5000]) | NETS),
    "data_backend": field_values(st.sampled_from(["lmdb", "hdf5"])),
    "train_source": field_values(st.sampled_from(["mnist_train_lmdb", "/etc", "../x", "mnist_test_lmdb", "a" * 300])),
    "val_source": field_values(st.sampled_from(["mnist_test_lmdb", ""])),
    "item_shape": field_values(st.sampled_from(["1,28,28", [1, 28, 28], "3,\u0662,2"]) | st.lists(INTS, max_size=5)),
    "classes": field_values(NUMBER_TEXT),
    "batch_size": field_values(NUMBER_TEXT),
    "device": field_values(st.sampled_from(["cpu", "next"])),
}
FORM_TEXT = {name: strategy.map(lambda v: v if isinstance(v, str) else dumps(v)) for name, strategy in MODEL_FIELDS.items()}
VALID_MODEL_FORM = {"model_name": "m", "network": "standard", "standard_network": "lenet", "solver": "settings",
                    "solver_type": "SGD", "base_lr": "0.01", "lr_policy": "step", "gamma": "0.1", "stepsize": "3000",
                    "momentum": "0.9", "weight_decay": "0.0005", "max_iter": "2", "snapshot": "0",
                    "data_backend": "lmdb", "train_source": "mnist_train_lmdb", "device": "cpu"}


def models_json(client: FlaskClient, value: tuple[Any, int]) -> None:
    body, padding = value
    response = client.post(f"{MODEL_URL}.json", data=padded(body, padding), content_type="application/json")
    check("POST /models.json", response, {201, 400, 413})


_TOKENS: weakref.WeakKeyDictionary[FlaskClient, str] = weakref.WeakKeyDictionary()


def csrf_token(client: FlaskClient) -> str:
    """The form's CSRF token in `client`'s session (read once per client from the New model page)."""
    if client not in _TOKENS:
        page = client.get(f"{MODEL_URL}/new").get_data(as_text=True)
        match = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page)
        assert match, "the form carries no CSRF token"
        _TOKENS[client] = match.group(1)
    return _TOKENS[client]


def check_page(target: str, response: TestResponse, allowed: set[int]) -> None:
    """A page (HTML) or a JSON answer: never a 5xx, never a traceback, only the route's statuses."""
    TRIED[target] += 1
    STATUSES[target][response.status_code] += 1
    text = response.get_data(as_text=True)
    if response.status_code >= 500 or "Traceback (most recent call last)" in text:
        raise Violation(f"{target}: {response.status_code} {text[:600]}")
    if response.status_code not in allowed:
        raise Violation(f"{target}: status {response.status_code} not in {sorted(allowed)}: {text[:300]}")


def model_form(client: FlaskClient, value: tuple[dict[str, str], bool, bool]) -> None:
    form, as_multipart, suggest = value
    fields = {"csrf_token": csrf_token(client), **form, **({"action": "suggest"} if suggest else {})}
    if as_multipart:
        body, content_type = multipart_body(fields, [])
    else:
        body, content_type = query_text(fields).encode(), "application/x-www-form-urlencoded"
    response = client.post(MODEL_URL, data=body, content_type=content_type)
    check_page("POST /models (the form)", response, {200, 303, 400, 413})


# --- the HTML pages

PAGES = st.sampled_from([("GET", "/jobs"), ("GET", "/jobs/{id}"), ("POST", "/jobs/{id}/cancel"),
                         ("POST", "/jobs/{id}/delete"), ("GET", "/models/new"), ("GET", "/devices"), ("GET", "/"),
                         ("HEAD", "/jobs/{id}"), ("PUT", "/jobs/{id}")])


def pages(client: FlaskClient, value: tuple[tuple[str, str], Any, dict[str, Any], bool], ids: list[str]) -> None:
    (method, route), choice, query, with_token = value
    job_id = ids[choice % len(ids)] if isinstance(choice, int) else quote(wire(choice), safe="")
    path = "/memplugin" + route.replace("{id}", job_id)
    data = query_text({"csrf_token": csrf_token(client)}) if with_token and method == "POST" else ""
    response = client.open(path, method=method, query_string=query_text(query), data=data,
                           content_type="application/x-www-form-urlencoded")
    if response.status_code == 308:
        # An id holding "/" (sent as %2F, decoded before routing) makes a path with doubled slashes, which Werkzeug's
        # URL map redirects to the merged one: routing, and only ever to this server's own merged path.
        location = urlsplit(response.headers["Location"])
        merged = re.sub("/{2,}", "/", unquote(path))
        assert location.netloc == "localhost" and unquote(location.path) == merged, (path, response.headers["Location"])
        TRIED[f"{method} {route} (page)"] += 1
        return
    check_page(f"{method} {route} (page)", response, {200, 303, 400, 404, 405, 409})
    if response.status_code == 303 and route.endswith("/delete") and isinstance(choice, int):
        created = client.post(f"{API}/jobs", data=padded(VALID_JOB, 0), content_type="application/json")
        ids[choice % len(ids)] = created.get_json()["id"]


# --- socket.io events

KNOWN_EVENTS = st.sampled_from(["subscribe_job", "unsubscribe_job", "subscribe_jobs", "unsubscribe_jobs",
                                 "subscribe_devices", "unsubscribe_devices", "message", "hello"])
SOCKET_EVENT_NAMES = st.tuples(st.integers(0, 3), KNOWN_EVENTS, TEXT).map(lambda c: c[2] if c[0] == 0 else c[1])
"""Three times in four one of the namespace's own events, else any name."""
SOCKET_PAYLOADS = st.one_of(
    st.none(),
    st.fixed_dictionaries({}, optional={"id": ID_TEXT | INTS | JSON_VALUES, "limit": INTS | TEXT | FLOATS,
                                        "before": ID_TEXT | INTS}),
    JSON_VALUES,
    DEEP,
)
ANSWERS = {"subscribe_job": {"job", "job_error"}, "subscribe_jobs": {"jobs", "job_error"}, "subscribe_devices": {"devices"}}
"""The event each request is answered with (at least one of them)."""
_SOCKETS: weakref.WeakKeyDictionary[Flask, Any] = weakref.WeakKeyDictionary()


def socket_for(client: FlaskClient) -> Any:
    """A socket.io test client on `client`'s app, connected to the plugin's namespace (one per app, reconnected if
    an event ever disconnected it, which the check below reports first)."""
    app = client.application
    connected = _SOCKETS.get(app)
    if connected is None or not connected.is_connected(NS):
        connected = get_plugin(app).socketio.test_client(app, namespace=NS)
        connected.get_received(NS)
        _SOCKETS[app] = connected
    return connected


def has_huge(value: Any) -> bool:
    if isinstance(value, Huge):
        return True
    if isinstance(value, dict):
        return any(has_huge(item) for item in value.values())
    return isinstance(value, list) and any(has_huge(item) for item in value)


def socket_events(client: FlaskClient, value: tuple[str, Any, Any], ids: list[str]) -> None:
    """One event as a browser could send it: through the test client, or as a raw packet when it holds a number
    Python cannot write (the server must still read it); answered as its handler promises, the connection kept."""
    event, payload, choice = value
    sock = socket_for(client)
    if event in ("subscribe_job", "unsubscribe_job") and payload is None:
        payload = {"id": ids[choice % len(ids)] if isinstance(choice, int) else choice}
    target = f"socket {event if event in ANSWERS or event.startswith('un') else 'other event'}"
    if has_huge(payload):
        get_plugin(client.application).socketio.server._handle_eio_message(
            sock.eio_sid, f"2{NS}," + dumps([event, payload])
        )
    elif payload is None:
        sock.emit(event, namespace=NS)
    else:
        sock.emit(event, payload, namespace=NS)
    names = [received["name"] for received in sock.get_received(NS)]
    TRIED[target] += 1
    STATUSES[target][(set(names) & ANSWERS.get(event, set())).pop() if event in ANSWERS and names else "no answer"] += 1
    if not sock.is_connected(NS):
        raise Violation(f"{target}: the event {event!r} with {payload!r:.200} disconnected the client")
    if event in ANSWERS and not set(names) & ANSWERS[event]:
        raise Violation(f"{target}: {event!r} with {payload!r:.200} got {names}, none of {sorted(ANSWERS[event])}")
    if event == "subscribe_devices":
        sock.emit("unsubscribe_devices", namespace=NS)
        sock.get_received(NS)


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
    "models_json": (st.tuples(bodies(MODEL_FIELDS, VALID_MODEL), PADDING), models_json),
    "model_form": (st.tuples(mutations(VALID_MODEL_FORM, FORM_TEXT), st.booleans(), st.booleans()), model_form),
    "pages": (st.tuples(PAGES, REAL_OR_ANY_ID, QUERY, st.booleans()), pages),
    "socket_events": (st.tuples(SOCKET_EVENT_NAMES, SOCKET_PAYLOADS, REAL_OR_ANY_ID), socket_events),
}
TAKE_IDS = frozenset({"job_endpoints", "pages", "socket_events"})
"""Targets that are handed the real jobs' ids too."""


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


@FUZZ
@given(TARGETS["models_json"][0])
def test_the_model_form_json_twin_with_arbitrary_json(client: FlaskClient, value: Any) -> None:
    models_json(client, value)


@FUZZ
@given(TARGETS["model_form"][0])
def test_the_model_form_post_with_arbitrary_fields(client: FlaskClient, value: Any) -> None:
    model_form(client, value)


@FUZZ
@given(TARGETS["pages"][0])
def test_pages_with_arbitrary_ids_methods_and_queries(client: FlaskClient, job_ids: list[str], value: Any) -> None:
    pages(client, value, job_ids)


@FUZZ
@given(TARGETS["socket_events"][0])
def test_socket_events_with_arbitrary_names_and_payloads(client: FlaskClient, job_ids: list[str], value: Any) -> None:
    socket_events(client, value, job_ids)


REACH_EXAMPLES = 40
"""Inputs drawn per target by the test below: enough for its fixed draws to reach every kind of answer."""
REACHED = {200, 201, 400, 404, 405, 413}


def drawn_from(name: str, client: FlaskClient, ids: list[str]) -> Callable[[], None]:
    """`name`'s target tried on REACH_EXAMPLES inputs of its strategy, the same ones at every run."""
    strategy, target = TARGETS[name]

    @settings(FUZZ, max_examples=REACH_EXAMPLES, derandomize=True)
    @given(strategy)
    def draw(value: Any) -> None:
        if name in TAKE_IDS:
            target(client, value, ids)
        else:
            target(client, value)

    return draw


def test_the_fuzzers_reach_success_and_every_kind_of_refusal(client: FlaskClient, job_ids: list[str]) -> None:
    """A fuzzer whose inputs all fail the same way tests one line: the targets must reach the endpoints' work.
    The inputs are drawn here from the targets' own strategies, the same ones at every run (derandomized), and only
    the answers to them are counted: what other tests ran, or did not, changes nothing."""
    for body in ({"net": LENET, "data_shapes": {"*": [1, 28, 28]}},
                 {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2}):
        path = "/estimate" if "data_shapes" in body else "/jobs"
        response = client.post(f"{API}{path}", data=padded(body, 0), content_type="application/json")
        assert response.status_code in (200, 201), response.get_json()
    before = {name: collections.Counter(counts) for name, counts in STATUSES.items()}
    for name in TARGETS:
        drawn_from(name, client, job_ids)()
    seen: collections.Counter[Any] = collections.Counter()
    for name, counts in STATUSES.items():
        seen.update(counts - before.get(name, collections.Counter()))
    assert set(seen) >= REACHED, seen


def test_the_api_root_with_a_slash_is_json(client: FlaskClient) -> None:
    response = client.get(f"{API}/")
    assert response.status_code == 404 and response.is_json


@pytest.mark.parametrize("field", ["batch", "max_iter", "classes", "memory_cap"])
def test_a_form_number_int_cannot_read_is_a_400(client: FlaskClient, field: str) -> None:
    for text in ("\u00b9", "\u0661\u0662", "9" * 5000, "\ud800"):
        body, content_type = multipart_body({**VALID_FORM, field: text}, VALID_FILES)
        response = client.post(f"{API}/jobs", data=body, content_type=content_type)
        assert response.status_code == 400 and response.is_json and field in response.get_json()["errors"], text[:9]


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
