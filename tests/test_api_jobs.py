"""REST under /memplugin/api/jobs and the job events on the socketio namespace, on the app in threading mode with
real training children (LeNet on synthetic MNIST LMDBs, a few iterations)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, wait_for

from digits_memplugin import create_app
from digits_memplugin.host.extension import get_plugin

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api/jobs"
NS = "/memplugin"


@pytest.fixture
def jobs_app(data_dir: Path, datasets: Path) -> Iterator[Flask]:
    app = create_app(
        {
            "MEMPLUGIN_DATA_DIR": data_dir,
            "MEMPLUGIN_ASYNC_MODE": "threading",
            "MEMPLUGIN_DATASET_ROOTS": [str(datasets)],
            "MEMPLUGIN_JOB_EVENTS_PER_SECOND": 2,
            "TESTING": True,
        }
    )
    yield app
    get_plugin(app).close()


@pytest.fixture
def api(jobs_app: Flask) -> FlaskClient:
    return jobs_app.test_client()


def body(**fields: Any) -> dict[str, Any]:
    return {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4, **fields}


def finished(api: FlaskClient, job_id: str, timeout: float = 120) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (doc := api.get(f"{API}/{job_id}").get_json())["status"] in ("done", "failed", "cancelled") and doc,
        timeout=timeout,
        what=f"job {job_id} to finish",
    )


def test_submit_list_show_and_train_to_the_end(api: FlaskClient) -> None:
    response = api.post(API, json=body(name="lenet quick"))
    assert response.status_code == 201, response.get_json()
    job = response.get_json()
    assert response.headers["Location"] == f"{API}/{job['id']}"
    assert (job["name"], job["status"], job["device"]) == ("lenet quick", "queued", {"requested": "cpu", "assigned": None})
    assert job["batch"]["requested"] is None and job["max_iter"] == 4
    assert [j["id"] for j in api.get(API).get_json()["jobs"]] == [job["id"]]

    doc = finished(api, job["id"])
    assert doc["status"] == "done", doc
    assert doc["iteration"] == 4 and doc["device"]["assigned"] == "cpu"
    assert doc["batch"]["batch_size"] == 64 and doc["batch"]["effective"] == 64
    assert doc["progress"]["train"]["iteration"] == 4 and doc["progress"]["test"][0]["event"] == "test"
    (attempt,) = doc["attempts"]
    assert set(attempt) >= {
        "number", "status", "device", "batch_size", "iter_size", "effective_batch", "test_batch_size", "test_iter",
        "resumed_from", "start_iteration", "end_iteration", "limit_bytes", "estimated_bytes", "peak_bytes",
        "started_at", "finished_at", "duration", "exit_code", "signal", "message", "out_of_memory", "log",
    }
    assert attempt["status"] == "success" and attempt["exit_code"] == 0


def test_validation_errors_are_400_with_every_field(api: FlaskClient) -> None:
    response = api.post(API, json={"solver": SHORT_SOLVER, "batch": 0, "frobnicate": True})
    assert response.status_code == 400
    errors = response.get_json()["errors"]
    assert set(errors) == {"net", "batch", "frobnicate"}


@pytest.mark.parametrize(
    ("fields", "key", "expected"),
    [
        ({"data": {"train": "/etc", "test": "mnist_test_lmdb"}}, "data", "outside the dataset folders"),
        ({"data": {"train": "missing_lmdb", "test": "mnist_test_lmdb"}}, "data", "does not exist"),
        ({"net": LENET + 'layer { name: "p" type: "Python" bottom: "ip2" top: "p" python_param { module: "os" } }'},
         "net", "Python layers"),
        ({"solver": SHORT_SOLVER.replace('"inv"', '"cosine"')}, "solver", "unknown learning rate policy"),
        # DIGITS' Caffe (NVcaffe) nets are estimated, not trained, on this BVLC server (core/flavour.py).
        ({"net": "default_forward_type: FLOAT16\n" + LENET}, "net",
         "this server trains with BVLC Caffe 1.0.0 (the bundled pycaffe); this net needs NVcaffe"),
        ({"solver": SHORT_SOLVER + "\nsolver_data_type: FLOAT16\n"}, "solver", "this net needs NVcaffe"),
        ({"device": "GPU-0000"}, "device", "no GPU has UUID"),
        ({"memory_cap": "1GiB", "device": "GPU-0000"}, "device", "no GPU"),
    ],
)
def test_definitions_that_cannot_run_are_400_with_the_reason(
    api: FlaskClient, fields: dict[str, Any], key: str, expected: str
) -> None:
    response = api.post(API, json=body(**fields))
    assert response.status_code == 400
    error = response.get_json()["errors"][key]
    assert expected in (error["message"] if isinstance(error, dict) else error)
    assert api.get(API).get_json()["jobs"] == []


def test_multipart_with_prototxt_files(api: FlaskClient) -> None:
    response = api.post(
        API,
        data={
            "net": (io.BytesIO(LENET.encode()), "lenet_train_test.prototxt"),
            "solver": (io.BytesIO(SHORT_SOLVER.encode()), "lenet_solver.prototxt"),
            "data": '{"train": "mnist_train_lmdb", "test": "mnist_test_lmdb"}',
            "device": "cpu",
            "batch": "32",
            "max_iter": "2",
        },
        content_type="multipart/form-data",
    )
    assert response.status_code == 201, response.get_json()
    doc = finished(api, response.get_json()["id"])
    assert doc["status"] == "done" and doc["batch"]["batch_size"] == 32


def test_bad_bodies_are_json_errors_never_tracebacks(api: FlaskClient) -> None:
    for response in (
        api.post(API, data="{not json", content_type="application/json"),
        api.post(API, data="plain", content_type="text/plain"),
        api.post(API, data={"data": "{broken"}, content_type="multipart/form-data"),
    ):
        assert response.status_code == 400
        document = response.get_json()
        assert document is not None and "Traceback" not in response.text
        assert "error" in document or "errors" in document


def test_unknown_jobs_are_404_json(api: FlaskClient) -> None:
    for response in (
        api.get(f"{API}/nope"),
        api.post(f"{API}/nope/cancel"),
        api.post(f"{API}/nope/resume"),
        api.delete(f"{API}/nope"),
        api.get(f"{API}/nope/log"),
    ):
        assert response.status_code == 404
        assert response.get_json()["error"] == "no job 'nope'"


def test_cancel_delete_resume_and_the_log(api: FlaskClient) -> None:
    job = api.post(API, json=body(max_iter=100_000)).get_json()
    wait_for(lambda: api.get(f"{API}/{job['id']}").get_json()["iteration"] > 0, what="training")
    refused = api.delete(f"{API}/{job['id']}")
    assert refused.status_code == 409 and "running" in refused.get_json()["error"]

    log = api.get(f"{API}/{job['id']}/log")
    assert log.status_code == 200 and log.mimetype == "text/plain"
    assert "Solver scaffolding done" in log.text
    assert len(api.get(f"{API}/{job['id']}/log?tail=2").text.splitlines()) == 2
    assert api.get(f"{API}/{job['id']}/log?attempt=9").status_code == 404
    assert api.get(f"{API}/{job['id']}/log?tail=x").status_code == 400

    assert api.post(f"{API}/{job['id']}/cancel").status_code == 200
    doc = finished(api, job["id"])
    assert doc["status"] == "cancelled" and doc["attempts"][0]["status"] == "cancelled"
    again = api.post(f"{API}/{job['id']}/cancel")
    assert again.status_code == 409 and again.get_json()["status"] == 409

    resumed = api.post(f"{API}/{job['id']}/resume")
    assert resumed.status_code == 200 and resumed.get_json()["status"] == "queued"
    wait_for(lambda: len(api.get(f"{API}/{job['id']}").get_json()["attempts"]) == 2, what="a second attempt")
    api.post(f"{API}/{job['id']}/cancel")
    finished(api, job["id"])
    assert api.delete(f"{API}/{job['id']}").status_code == 204
    assert api.get(f"{API}/{job['id']}").status_code == 404


def test_a_done_job_cannot_resume(api: FlaskClient) -> None:
    job = api.post(API, json=body(max_iter=1)).get_json()
    finished(api, job["id"])
    response = api.post(f"{API}/{job['id']}/resume")
    assert response.status_code == 409


def events_of(client: Any, name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in client.get_received(NS) if name is None or e["name"] == name]


def test_socketio_rooms_carry_the_api_documents_throttled(jobs_app: Flask, api: FlaskClient) -> None:
    socketio = get_plugin(jobs_app).socketio
    watcher, bystander = socketio.test_client(jobs_app, namespace=NS), socketio.test_client(jobs_app, namespace=NS)
    for client in (watcher, bystander):
        client.get_received(NS)
    watcher.emit("subscribe_jobs", namespace=NS)
    (listing,) = events_of(watcher, "jobs")
    assert listing["args"][0]["jobs"] == [] and listing["args"][0]["total"] == 0

    job = api.post(API, json=body(max_iter=30)).get_json()
    watcher.emit("subscribe_job", {"id": job["id"]}, namespace=NS)
    received: list[dict[str, Any]] = []
    started = time.monotonic()

    def done() -> bool:
        received.extend(events_of(watcher))
        return any(e["name"] == "job" and e["args"][0]["status"] == "done" for e in received)

    wait_for(done, timeout=120, what="the done event")
    elapsed = time.monotonic() - started
    names = {e["name"] for e in received}
    assert {"job", "job_attempt", "job_progress", "job_log"} <= names
    last_job = [e["args"][0] for e in received if e["name"] == "job"][-1]
    document = api.get(f"{API}/{job['id']}").get_json()
    assert last_job == {key: value for key, value in document.items() if key != "attempts"}  # what GET returns
    attempts = [e["args"][0] for e in received if e["name"] == "job_attempt"]
    assert attempts[-1] == {"job_id": job["id"], **document["attempts"][-1]}
    iterations = [e["args"][0]["iteration"] for e in received if e["name"] == "job_progress"
                  and e["args"][0]["event"] == "iteration"]
    assert iterations[-1] == 30  # the latest is never dropped
    assert len(iterations) <= 2 * elapsed + 2  # MEMPLUGIN_JOB_EVENTS_PER_SECOND = 2
    lines = [line for e in received if e["name"] == "job_log" for line in e["args"][0]["lines"]]
    assert any("Solver scaffolding done" in line for line in lines)
    assert not [e for e in events_of(bystander) if e["name"].startswith("job")]  # not subscribed: nothing


def test_subscribing_to_an_unknown_job_says_so(jobs_app: Flask) -> None:
    client = get_plugin(jobs_app).socketio.test_client(jobs_app, namespace=NS)
    client.emit("subscribe_job", {"id": "nope"}, namespace=NS)
    (error,) = events_of(client, "job_error")
    assert error["args"][0] == {"id": "nope", "error": "no job 'nope'"}


def test_with_simulated_gpus_a_gpu_job_is_refused_and_a_cpu_job_taken(data_dir: Path, datasets: Path) -> None:
    """The demo mode's GPUs have no CUDA device behind them: a job for one (or for "next available", which would
    pick one) is a 400 saying so before anything is written, as on the form; the CPU still trains."""
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "MEMPLUGIN_SIMULATE_GPUS": "2x24GiB",
                      "TESTING": True})
    try:
        api = app.test_client()
        for device in ("gpu:0", "1", "auto"):
            refused = api.post(API, json=body(device=device))
            assert refused.status_code == 400, (device, refused.get_json())
            assert "simulated" in refused.get_json()["errors"]["device"]
        assert api.get(API).get_json()["jobs"] == [] and not any((data_dir / "jobs").iterdir())
        taken = api.post(API, json=body())
        assert taken.status_code == 201, taken.get_json()
        assert finished(api, taken.get_json()["id"])["status"] == "done"
    finally:
        get_plugin(app).close()


# --- the test nets apart (issue 28) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "key", "expected"),
    [
        ({"test_net": "beside"}, "test_net", 'must be "auto" (apart only where it pays), "shared"'),
        ({"test_net": 1}, "test_net", 'must be "auto"'),
        ({"test_net": "Apart"}, "test_net", 'must be "auto"'),
        ({"tester_device": -1}, "tester_device", 'must be "auto", "same", "cpu", a GPU UUID or a GPU index'),
        ({"tester_device": True}, "tester_device", 'must be "auto", "same"'),
        ({"tester_device": 1.5}, "tester_device", 'must be "auto", "same"'),
        ({"test_net": "apart", "tester_device": "GPU-nope"}, "tester_device", "no GPU has UUID 'GPU-nope'"),
        ({"tester_device": 3}, "tester_device", "no GPU has index 3"),
        ({"test_net": "shared", "tester_device": "cpu"}, "tester_device",
         "names where a tester runs: give test_net 'apart' or 'auto' with it (the test nets are 'shared')"),
        ({"test_net": "shared", "tester_device": "same"}, "tester_device", "names where a tester runs"),
    ],
)
def test_a_test_net_or_tester_device_refused_is_a_400_naming_it_and_creates_nothing(
    api: FlaskClient, jobs_app: Flask, fields: dict[str, Any], key: str, expected: str
) -> None:
    response = api.post(API, json=body(**fields))
    assert response.status_code == 400 and response.mimetype == "application/json"
    errors = response.get_json()["errors"]
    assert set(errors) == {key} and expected in errors[key], errors
    assert api.get(API).get_json()["jobs"] == []
    jobs = Path(jobs_app.config["MEMPLUGIN_DATA_DIR"]) / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())


def test_a_form_refuses_a_test_net_by_its_name_too(api: FlaskClient) -> None:
    form = {"net": LENET, "solver": SHORT_SOLVER, "data": '{"train": "mnist_train_lmdb", "test": "mnist_test_lmdb"}',
            "device": "cpu", "max_iter": "2"}
    refused = api.post(API, data={**form, "test_net": "sideways"}, content_type="multipart/form-data")
    assert refused.status_code == 400 and set(refused.get_json()["errors"]) == {"test_net"}
    paired = api.post(API, data={**form, "test_net": "shared", "tester_device": "0"}, content_type="multipart/form-data")
    assert paired.status_code == 400 and set(paired.get_json()["errors"]) == {"tester_device"}
    assert api.get(API).get_json()["jobs"] == []


def test_an_apart_job_shows_its_tester_and_its_progress_has_the_testers_tests(
    jobs_app: Flask, api: FlaskClient
) -> None:
    """A real job with its test nets apart on the CPU: its attempt says where its tester ran and what it tested; GET
    progress has the tester's test records (as the attempt's, once each, equal to the tester's own file) beside the
    trainer's iterations; the socketio room carries them as the runner's; the request clones with its placement."""
    watcher = get_plugin(jobs_app).socketio.test_client(jobs_app, namespace=NS)
    created = api.post(API, json=body(test_net="apart", test_interval=2, max_iter=4))
    assert created.status_code == 201, created.get_json()
    job_id = created.get_json()["id"]
    watcher.emit("subscribe_job", {"id": job_id}, namespace=NS)
    received: list[dict[str, Any]] = []

    def done() -> bool:
        received.extend(events_of(watcher))
        return any(e["name"] == "job" and e["args"][0]["status"] in ("done", "failed") for e in received)

    wait_for(done, timeout=180, what="the apart job to end")
    doc = api.get(f"{API}/{job_id}").get_json()
    assert doc["status"] == "done", doc["message"]
    (attempt,) = doc["attempts"]
    assert attempt["status"] == "success" and attempt["test_net"] == "apart"
    tester = attempt["tester"]
    assert set(tester) == {"device", "same_device", "estimated_bytes", "peak_bytes", "tested", "pauses",
                           "setup_seconds", "interval_seconds", "shared_interval_seconds", "stop_cost", "failed"}
    assert (tester["device"], tester["same_device"], tester["tested"], tester["pauses"], tester["failed"]) == (
        "cpu", True, [0, 2, 4], 2, None)
    assert tester["estimated_bytes"] > 0 and tester["peak_bytes"] > 0

    records = api.get(f"{API}/{job_id}/progress").get_json()["records"]
    tests = [r for r in records if r["event"] == "test"]
    assert [(r["attempt"], r["iteration"], r["net"], r["superseded"]) for r in tests] == [
        (1, 0, 0, False), (1, 2, 0, False), (1, 4, 0, False)]
    folder = Path(jobs_app.config["MEMPLUGIN_DATA_DIR"]) / "jobs" / job_id / "attempts" / "1"
    own = [json.loads(line) for line in (folder / "tester" / "progress.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k not in ("attempt", "superseded")} for r in tests] == [
        r for r in own if r["event"] == "test"]
    assert [r["iteration"] for r in records if r["event"] == "iteration"] == [1, 2, 3, 4]
    assert doc["progress"]["test"][0]["iteration"] == 4  # the job's latest test is the tester's last

    told = [e["args"][0] for e in received if e["name"] == "job_progress" and e["args"][0]["event"] == "test"]
    assert [(p["attempt"], p["iteration"]) for p in told] == [(1, 0), (1, 2), (1, 4)]
    events = {e["args"][0]["event"] for e in received if e["name"] == "job_progress"}
    assert {"test_due", "paused"} <= events  # the trainer's records at each interval, as the socketio room gets them
    request = api.get(f"{API}/{job_id}/request").get_json()
    assert (request["test_net"], request.get("tester_device", "auto")) == ("apart", "auto")  # auto: the default


def test_with_simulated_gpus_a_tester_on_one_is_refused_naming_tester_device(data_dir: Path, datasets: Path) -> None:
    """A simulated GPU has no CUDA device behind it for a tester either: 400 on `tester_device`, nothing written."""
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "MEMPLUGIN_SIMULATE_GPUS": "2x24GiB",
                      "TESTING": True})
    try:
        api = app.test_client()
        for tester in ("0", 1, "gpu:1"):
            refused = api.post(API, json=body(test_net="apart", tester_device=tester))
            assert refused.status_code == 400, (tester, refused.get_json())
            errors = refused.get_json()["errors"]
            assert set(errors) == {"tester_device"} and "simulated" in errors["tester_device"], errors
        assert api.get(API).get_json()["jobs"] == [] and not any((data_dir / "jobs").iterdir())
        # Left to the plugin ("auto"), the tester never goes to a simulated GPU: it shares the CPU with training.
        taken = api.post(API, json=body(test_net="apart"))
        assert taken.status_code == 201, taken.get_json()
        done = finished(api, taken.get_json()["id"])
        assert done["status"] == "done", done["message"]
        (attempt,) = done["attempts"]
        assert attempt["test_net"] == "apart" and attempt["tester"]["device"] == "cpu" and attempt["tester"]["same_device"]
    finally:
        get_plugin(app).close()
