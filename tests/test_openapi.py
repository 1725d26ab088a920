"""`<prefix>/api/openapi.json`: a valid OpenAPI 3.1 document of the whole REST API, whose routes are the app's and
whose schemas hold the answers the app really gives (checked with openapi-core, status codes included)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from conftest import two_gpus
from flask import Flask
from flask.testing import FlaskClient
from openapi_core import OpenAPI
from openapi_core.contrib.werkzeug import WerkzeugOpenAPIRequest, WerkzeugOpenAPIResponse
from openapi_spec_validator import validate
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, wait_for
from werkzeug.test import EnvironBuilder, TestResponse
from werkzeug.wrappers import Request

from digits_memplugin import create_app
from digits_memplugin.core import oom
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.layers.base import CATEGORIES, ENGINES
from digits_memplugin.core.test_net_modes import TEST_NET_APART, TEST_NET_MODES, TEST_NET_SHARED
from digits_memplugin.devices import reader as devices
from digits_memplugin.devices.fake_nvml import FakeNvml
from digits_memplugin.host.resources import package_data_dir
from digits_memplugin.jobs.definition import request as job_request
from digits_memplugin.jobs.scheduling import apart_run
from digits_memplugin.jobs.store.records import JOB_STATES, Attempt
from digits_memplugin.web.api import envelope as api
from digits_memplugin.web.api import estimate as api_estimate
from digits_memplugin.web.api.openapi import load_document

pytest_plugins = ["test_jobs_fixtures"]

BUNDLED_LENET = (package_data_dir("networks") / "lenet.prototxt").read_text()
"""The LeNet the New model page offers (DIGITS stages, num_output from `classes`)."""
GPU0 = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


def api_root(app: Flask) -> str:
    return app.config["MEMPLUGIN_URL_PREFIX"].rstrip("/") + api.API_PATH


def served(client: FlaskClient, app: Flask) -> dict[str, Any]:
    response = client.get(f"{api_root(app)}/openapi.json")
    assert response.status_code == 200 and response.mimetype == "application/json", response.status_code
    return response.get_json()  # type: ignore[no-any-return]


class Checker:
    """Validates real exchanges against the served document: the path and method must be an operation, the
    status one it lists by number (not only its `default`), the body its schema for that status and type."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.openapi = OpenAPI.from_dict(document)

    def __call__(
        self, client: FlaskClient, method: str, url: str, *, request_too: bool = False, **options: Any
    ) -> TestResponse:
        """Send the request, and validate the answer (and with `request_too` the request) against the document.
        The client reads the request's body, so openapi-core is given a twin built from the same arguments."""
        response = client.open(url, method=method, **options)
        request = WerkzeugOpenAPIRequest(Request(EnvironBuilder(url, method=method, **options).get_environ()))
        if request_too:
            self.openapi.validate_request(request)
        self.openapi.validate_response(request, WerkzeugOpenAPIResponse(response))
        path, operation = self.operation(response)
        listed = self.document["paths"][path][operation]["responses"]
        assert str(response.status_code) in listed, f"{method} {path}: {response.status_code} is not listed"
        return response

    def operation(self, response: TestResponse) -> tuple[str, str]:
        root = self.document["servers"][0]["url"]
        assert response.request.path.startswith(root + "/")
        rest = response.request.path[len(root):]
        for path in self.document["paths"]:
            if re.fullmatch(re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(path)), rest):
                return path, response.request.method.lower()
        raise AssertionError(f"{rest} is in no documented path")


@pytest.fixture
def check(app: Flask, client: FlaskClient) -> Checker:
    return Checker(served(client, app))


def test_the_served_document_is_valid_openapi_3_1(app: Flask, client: FlaskClient) -> None:
    document = served(client, app)
    validate(document)  # raises with the first problem
    assert document["openapi"].startswith("3.1.")


def test_the_served_document_names_this_servers_api_root(data_dir: Path) -> None:
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "MEMPLUGIN_URL_PREFIX": "/gpu"})
    try:
        client = app.test_client()
        assert served(client, app)["servers"][0]["url"] == "/gpu/api"
        assert served(client, app)["paths"] == load_document()["paths"]
    finally:
        app.extensions["memplugin"].close()


def routes_in_the_app(app: Flask) -> set[tuple[str, str]]:
    """(path relative to the API root, method) of every API route, OpenAPI-style ({job_id}); not the catch-alls
    that answer unknown paths with a JSON 404/405, nor the HEAD and OPTIONS every GET route has."""
    root = api_root(app)
    routes = set()
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith(root + "/") or app.view_functions[rule.endpoint] is api.unknown_api_path:
            continue
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule[len(root):])
        routes |= {(path, method.lower()) for method in rule.methods or () if method not in ("HEAD", "OPTIONS")}
    return routes


def test_every_api_route_is_documented_and_every_documented_route_exists(app: Flask, client: FlaskClient) -> None:
    document = served(client, app)
    verbs = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
    documented = {(path, method) for path, item in document["paths"].items() for method in item if method in verbs}
    in_app = routes_in_the_app(app)
    assert len(in_app) >= 12  # health, openapi, devices, estimate, jobs x2, a job x2, cancel, resume, log, progress
    assert documented == in_app


def test_health_devices_and_estimates_match_the_document(
    install_nvml: Callable[[FakeNvml], FakeNvml], fixed_host: devices.HostPaths, app: Flask, client: FlaskClient,
    check: Checker,
) -> None:
    install_nvml(FakeNvml(two_gpus()))
    root = api_root(app)
    assert check(client, "GET", f"{root}/health").get_json()["gpu_count"] == 2
    assert check(client, "GET", f"{root}/openapi.json").status_code == 200
    listed = check(client, "GET", f"{root}/devices").get_json()
    assert [row["kind"] for row in listed["devices"]] == ["gpu", "gpu", "cpu"]

    lenet = {"net": BUNDLED_LENET, "data_shapes": {"*": [1, 28, 28]}, "classes": 10}
    for body in (
        lenet,
        {**lenet, "batch": 256, "engine": "gpu-cudnn", "free_bytes": "8GiB", "curve_batches": [1, 64, 1024]},
        {**lenet, "device": GPU0, "devices": "all", "safety_margin": 0.2, "max_batch": 100},
        {**lenet, "free_bytes": 1, "test_batch": 10},  # not even batch 1 fits
        {**lenet, "batch": 200000, "free_bytes": "1TiB"},  # past Caffe's blob limit: a blob_limit section
        {**lenet, "batch": 512, "free_bytes": "60MiB", "test_net": "apart"},  # the tester's bytes in the plan
        {**lenet, "batch": 512, "devices": "all", "test_net": "auto"},  # each device's placement and note
    ):
        answer = check(client, "POST", f"{root}/estimate", json=body, request_too=True)
        assert answer.status_code == 200 and answer.get_json()["total_bytes"] > 0, answer.get_json()
    placed = answer.get_json()["plans"]
    assert {plan["test_net"] for plan in placed.values()} <= {"shared", "apart"} and len(placed) == 3
    assert check(client, "GET", f"{root}/datasets").status_code == 200

    refused = [
        check(client, "POST", f"{root}/estimate", json={"net": BUNDLED_LENET, "free_bytes": "8 gigs", "bach": 1}),
        check(client, "POST", f"{root}/estimate", json={"net": "layer { name: 'x' type: 'Foo' top: 'x' }"}),
        check(client, "POST", f"{root}/estimate", data=b"{", content_type="application/json"),
        check(client, "POST", f"{root}/estimate", data=b"{}", content_type="text/plain"),
        check(client, "POST", f"{root}/estimate", json={**lenet, "test_net": "beside"}),
    ]
    assert [response.status_code for response in refused] == [400] * 5
    assert refused[1].get_json()["errors"]["net"]["line"] == 1


def test_answers_to_bad_requests_match_the_document(data_dir: Path) -> None:
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_MAX_REQUEST_BYTES": 4096, "MEMPLUGIN_API_TOKEN": "a-token-of-24-characters"})
    try:
        client = app.test_client()
        root = api_root(app)
        check = Checker(served(client, app))  # reading the document needs no token: reads are open here
        token = {"Authorization": "Bearer a-token-of-24-characters"}
        assert check(client, "POST", f"{root}/estimate", json={"net": "x" * 5000}, headers=token).status_code == 413
        assert check(client, "POST", f"{root}/jobs", json={"net": LENET}).status_code == 401
        assert check(client, "GET", f"{root}/jobs?limit=0", headers=token).status_code == 400
        assert check(client, "GET", f"{root}/jobs/nope", headers=token).status_code == 404
        assert check(client, "POST", f"{root}/jobs/nope/cancel", headers=token).status_code == 404
        cross_site = {**token, "Origin": "http://elsewhere.example"}
        assert check(client, "DELETE", f"{root}/jobs/nope", headers=cross_site).status_code == 403
    finally:
        app.extensions["memplugin"].close()


@pytest.fixture
def jobs_app(data_dir: Path, datasets: Path) -> Iterator[Flask]:
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "TESTING": True})
    yield app
    app.extensions["memplugin"].close()


@pytest.mark.slow
def test_a_job_from_submission_to_deletion_matches_the_document(jobs_app: Flask) -> None:
    client = jobs_app.test_client()
    check = Checker(served(client, jobs_app))
    root = api_root(jobs_app)
    assert check(client, "GET", f"{root}/jobs").get_json()["jobs"] == []
    body = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4,
            "memory_cap": "2GiB", "fallback": {"max_attempts": 2, "start": "plan"}}
    created = check(client, "POST", f"{root}/jobs", json=body, request_too=True)
    assert created.status_code == 201, created.get_json()
    job = f"{root}/jobs/{created.get_json()['id']}"
    wait_for(lambda: client.get(job).get_json()["status"] in ("done", "failed"), timeout=120, what="the job to end")
    shown = check(client, "GET", job).get_json()
    assert shown["status"] == "done" and shown["attempts"][0]["status"] == "success", shown
    assert check(client, "GET", f"{root}/jobs?limit=1").get_json()["total"] == 1
    assert check(client, "GET", f"{job}/progress").get_json()["records"]
    assert check(client, "GET", f"{job}/log?tail=2").mimetype == "text/plain"
    assert check(client, "GET", f"{job}/log?attempt=9").status_code == 404
    assert check(client, "POST", f"{job}/cancel").status_code == 409
    assert check(client, "POST", f"{job}/resume").status_code == 409
    assert check(client, "POST", f"{root}/jobs", json={**body, "batch": 0, "fallback": {"growth": 2}}).status_code == 400
    form = {**{key: str(value) for key, value in body.items() if key not in ("data", "fallback")}, "data": "{"}
    assert check(client, "POST", f"{root}/jobs", data=form, content_type="multipart/form-data").status_code == 400
    assert check(client, "DELETE", job).status_code == 204
    assert check(client, "GET", job).status_code == 404


@pytest.mark.slow
def test_a_diverged_job_matches_the_document_with_its_nan_records(jobs_app: Flask) -> None:
    """LeNet at base_lr 50 goes NaN: the job, its attempt ("diverged") and its records ("NaN" for the loss, a
    ReportedNumber) as the document describes them, in strict JSON."""
    client = jobs_app.test_client()
    check = Checker(served(client, jobs_app))
    root = api_root(jobs_app)
    body = {"net": LENET, "solver": SHORT_SOLVER.replace("base_lr: 0.01", "base_lr: 50"), "data": LENET_DATA,
            "device": "cpu", "max_iter": 50, "divergence": "stop"}
    created = check(client, "POST", f"{root}/jobs", json=body, request_too=True)
    assert created.status_code == 201, created.get_json()
    job = f"{root}/jobs/{created.get_json()['id']}"
    wait_for(lambda: client.get(job).get_json()["status"] in ("done", "failed"), timeout=120, what="the job to end")
    shown = check(client, "GET", job)
    document = json.loads(shown.get_data(as_text=True), parse_constant=_refuse)
    assert document["status"] == "failed" and document["attempts"][0]["status"] == "diverged", document["message"]
    assert document["progress"]["train"]["loss"] == "NaN"
    records = check(client, "GET", f"{job}/progress").get_json()["records"]
    assert records[-1]["loss"] == "NaN" and records[-1]["outputs"] == {"loss": "NaN"}
    check(client, "GET", f"{root}/jobs")
    statuses = load_document()["components"]["schemas"]["Attempt"]["properties"]["status"]["enum"]
    assert set(statuses) == {"running", *get_args(oom.OutcomeStatus)}


def _refuse(token: str) -> None:
    raise ValueError(f"not strict JSON: {token}")


def test_the_request_schemas_name_every_field_the_api_takes() -> None:
    """The document is maintained by hand: a field added to a request (or a state, an engine) must be added there."""
    schemas = load_document()["components"]["schemas"]
    assert set(schemas["EstimateRequest"]["properties"]) == set(api_estimate.FIELDS)
    assert set(schemas["JobRequest"]["properties"]) == set(job_request.FIELDS)
    assert set(schemas["JobForm"]["properties"]) == set(job_request.FIELDS)
    assert set(schemas["JobRequest"]["properties"]["fallback"]["properties"]) == set(job_request.FALLBACK_FIELDS)
    assert tuple(schemas["EstimateRequest"]["properties"]["engine"]["enum"]) == ENGINES
    assert set(schemas["Estimate"]["properties"]["categories"]["required"]) == set(CATEGORIES)
    assert tuple(schemas["Job"]["properties"]["status"]["enum"]) == JOB_STATES
    assert set(schemas["EstimateRequest"]["properties"]["test_net"]["enum"]) == set(TEST_NET_MODES)
    assert set(schemas["JobRequest"]["properties"]["test_net"]["enum"]) == {*TEST_NET_MODES, None}
    assert set(schemas["JobForm"]["properties"]["test_net"]["enum"]) == set(TEST_NET_MODES)
    # What an attempt's tester did: every field of the report the attempt row keeps.
    report = apart_run.TesterReport("cpu", True, 1).to_json()
    assert set(schemas["AttemptTester"]["properties"]) == set(report)
    assert set(schemas["Attempt"]["properties"]["test_net"]["enum"]) == {TEST_NET_SHARED, TEST_NET_APART, None}
    assert set(schemas["Attempt"]["properties"]) >= set(Attempt.__dataclass_fields__) - {"handle"}


def test_the_estimate_schema_names_every_field_an_estimate_has() -> None:
    """Every key of real estimate documents (a plan, device plans, a curve, a blob limit, an NVcaffe net) is in the
    Estimate schema, and every device plan's key in DevicePlan: a field added to the document must be added there."""
    schemas = load_document()["components"]["schemas"]
    documents = [
        estimate(EstimateRequest(net=BUNDLED_LENET, data_shapes={"*": (1, 28, 28)}, classes=10, batch=200000,
                                 free_bytes=1 << 40, budgets={"cpu": 1 << 30}, curve_batches=(1, 64))),
        estimate(EstimateRequest(net=BUNDLED_LENET, data_shapes={"*": (1, 28, 28)}, classes=10)),
    ]
    for document in documents:
        assert set(document) <= set(schemas["Estimate"]["properties"]), set(document) - set(
            schemas["Estimate"]["properties"]
        )
    plan = documents[0]["plans"]["cpu"]
    assert set(plan) <= set(schemas["DevicePlan"]["properties"]), set(plan) - set(schemas["DevicePlan"]["properties"])
    assert {"test_net", "test_net_note", "tester_bytes"} <= set(plan) & set(documents[0])


LENET_WITH_OUTPUTS = LENET + """
layer { name: "row_sums" type: "Reduction" bottom: "ip2" top: "row_sums" reduction_param { axis: 1 } }
layer { name: "scores" type: "Power" bottom: "ip2" top: "scores" }
"""
"""LeNet with two more output blobs: at batch 8, `row_sums` holds 8 values (listed one by one in a record) and
`scores` 80 (reported as their mean and count), as a net whose outputs are not all scalars is reported."""


@pytest.mark.slow
def test_real_job_answers_whose_outputs_are_lists_and_means_match_the_document(jobs_app: Flask) -> None:
    """Issue 23 item 8 (schemathesis ST108): a record's outputs may be a list of values or {"mean", "count"}
    (docs/jobs.md), while the document allowed numbers only, so GET /jobs answers with progress did not match it.
    Real answers of a job trained to its end: the list, the job, its progress."""
    client = jobs_app.test_client()
    check = Checker(served(client, jobs_app))
    root = api_root(jobs_app)
    body = {"net": LENET_WITH_OUTPUTS, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2,
            "batch": 8, "memory_cap": "2GiB"}
    created = client.post(f"{root}/jobs", json=body)
    assert created.status_code == 201, created.get_json()
    job = f"{root}/jobs/{created.get_json()['id']}"
    wait_for(lambda: client.get(job).get_json()["status"] in ("done", "failed"), timeout=120, what="the job to end")
    listed = check(client, "GET", f"{root}/jobs").get_json()["jobs"]
    [progress] = [entry["progress"] for entry in listed]
    outputs = progress["train"]["outputs"]  # what the check above held to the document: a list, a mean, a number
    assert len(outputs["row_sums"]) == 8 and outputs["scores"]["count"] == 80, outputs
    assert isinstance(outputs["loss"], float), outputs
    assert progress["test"][0]["outputs"]["scores"]["count"] == 100 * 10, progress["test"]
    assert check(client, "GET", f"{root}/jobs?limit=1").get_json()["jobs"][0]["progress"] == progress
    assert check(client, "GET", job).get_json()["status"] == "done"
    records = check(client, "GET", f"{job}/progress").get_json()["records"]
    assert any(isinstance(record.get("outputs", {}).get("row_sums"), list) for record in records)


@pytest.mark.slow
def test_a_jobs_downloads_clone_request_and_device_attempts_match_the_document(jobs_app: Flask) -> None:
    """Issue 26, point 10: the snapshots list, each snapshot's files, the trained model, the job's request (to clone
    it) and the devices' running attempts, answers and refusals, as the document describes them."""
    client = jobs_app.test_client()
    check = Checker(served(client, jobs_app))
    root = api_root(jobs_app)
    body = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 100_000}
    created = check(client, "POST", f"{root}/jobs", json=body, request_too=True)
    assert created.status_code == 201, created.get_json()
    job = f"{root}/jobs/{created.get_json()['id']}"
    wait_for(lambda: client.get(job).get_json()["iteration"] > 2, timeout=120, what="the job to train")
    attempts = check(client, "GET", f"{root}/devices/attempts").get_json()["attempts"]
    assert [attempt["device"] for attempt in attempts] == ["cpu"]
    check(client, "POST", f"{job}/cancel")
    wait_for(lambda: client.get(job).get_json()["status"] == "cancelled", timeout=120, what="the job to stop")
    assert check(client, "GET", f"{root}/devices/attempts").get_json() == {"attempts": []}
    snapshots = check(client, "GET", f"{job}/snapshots").get_json()["snapshots"]
    assert snapshots, "the job wrote no snapshot"
    first = snapshots[0]
    assert check(client, "GET", first["files"]["caffemodel"]["url"]).status_code == 200
    assert check(client, "GET", first["files"]["solverstate"]["url"]).status_code == 200
    assert check(client, "GET", f"{job}/snapshots/999999/caffemodel").status_code == 404
    assert check(client, "GET", f"{job}/model.tar.gz?iteration={first['iteration']}").mimetype == "application/gzip"
    assert check(client, "GET", f"{job}/model.tar.gz?iteration=999999").status_code == 404
    assert check(client, "GET", f"{job}/model.tar.gz?iteration=x").status_code == 400
    request = check(client, "GET", f"{job}/request").get_json()
    assert check(client, "POST", f"{root}/jobs", json={**request, "max_iter": 2}, request_too=True).status_code == 201
    folder = Path(jobs_app.config["MEMPLUGIN_DATA_DIR"]) / "jobs" / created.get_json()["id"] / "snapshots"
    weights = folder / first["files"]["caffemodel"]["name"]
    weights.unlink()
    weights.symlink_to(folder.parent / "net.prototxt")
    assert check(client, "GET", first["files"]["caffemodel"]["url"]).status_code == 409
    assert check(client, "GET", f"{root}/jobs/no-such-job/request").status_code == 404


BIG_TEST_NET = LENET.replace("batch_size: 100", "batch_size: 1000")
"""LeNet whose test net takes 1000 items a batch: under a 128 MiB cap, beside the train net, it holds the train batch
of 512 back, so that `auto` keeps the test nets apart until the cost of stopping for the tester is measured."""


@pytest.mark.slow
def test_a_job_with_its_test_nets_apart_then_replanned_matches_the_document(jobs_app: Flask) -> None:
    """Issue 28: a real job whose first attempt keeps its test nets apart (a tester on the CPU beside the trainer,
    which stops for it), ends "replanned" once stopping is measured to cost too much, and whose second attempt trains
    them shared: the job, its attempts (their test_net and tester), its progress with the tester's test records and
    its request to clone, as the document describes them."""
    client = jobs_app.test_client()
    check = Checker(served(client, jobs_app))
    root = api_root(jobs_app)
    solver = ("random_seed: 7\n" + SHORT_SOLVER.replace("test_iter: 2", "test_iter: 1")
              .replace("test_interval: 500", "test_interval: 4").replace("snapshot: 2", "snapshot: 4"))
    body = {"net": BIG_TEST_NET, "solver": solver, "data": LENET_DATA, "device": "cpu", "max_iter": 8, "batch": 512,
            "memory_cap": "128MiB", "test_net": "auto", "tester_device": "same"}
    created = check(client, "POST", f"{root}/jobs", json=body, request_too=True)
    assert created.status_code == 201, created.get_json()
    job = f"{root}/jobs/{created.get_json()['id']}"
    wait_for(lambda: client.get(job).get_json()["status"] in ("done", "failed"), timeout=300, what="the job to end")
    shown = check(client, "GET", job).get_json()
    assert shown["status"] == "done", shown["message"]
    measured, chosen = shown["attempts"]
    assert (measured["status"], measured["test_net"], chosen["test_net"]) == ("replanned", "apart", "shared")
    assert measured["tester"]["tested"][:2] == [0, 4] and measured["tester"]["stop_cost"] >= 0.05
    assert chosen["tester"] is None
    records = check(client, "GET", f"{job}/progress").get_json()["records"]
    tests = [(r["attempt"], r["iteration"]) for r in records if r["event"] == "test"]
    assert tests[:2] == [(1, 0), (1, 4)] and tests[-1] == (2, 8), tests
    check(client, "GET", f"{root}/jobs")
    request = check(client, "GET", f"{job}/request").get_json()
    assert (request.get("test_net", "auto"), request["tester_device"]) == ("auto", "same")  # auto: the default
    assert check(client, "POST", f"{root}/jobs", json={**request, "max_iter": 1, "test_net": "apart",
                                                      "tester_device": "cpu"}, request_too=True).status_code == 201
    refused = check(client, "POST", f"{root}/jobs", json={**request, "test_net": "shared", "tester_device": "cpu"},
                    request_too=True)
    assert refused.status_code == 400 and set(refused.get_json()["errors"]) == {"tester_device"}
