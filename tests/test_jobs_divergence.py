"""A diverging loss, end to end with real pycaffe: LeNet at base_lr 50 goes NaN within a few iterations. The job
ends with DIGITS' advice (not a traceback, not an out-of-memory retry), its records keep the NaN as "NaN" in the
progress file, the store, the events, REST and a socketio client of a served app; a job that asked to train on
regardless trains to the end.

Data: the tiny MNIST-shaped LMDBs of test_jobs_fixtures (in-process managers), and the real sample dataset
(`digits-memplugin sample-dataset`) for the served app.
"""

from __future__ import annotations

import json
import math
import queue
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests
from browser_fixtures import SCRIPT, Server
from flask import Flask
from test_jobs_fixtures import LENET, SHORT_SOLVER, ManagerFactory, lenet_request

from digits_memplugin.host.extension import get_plugin
from digits_memplugin.jobs.backends.attempt_process import AttemptProcess
from digits_memplugin.jobs.definition.request import parse_job_request
from digits_memplugin.jobs.store.records import FINAL_STATES

pytest_plugins = ["test_jobs_fixtures", "browser_fixtures"]

DIGITS_SENTENCE = 'Network outputted NaN for "loss" (Train phase). Try decreasing your learning rate.'
"""DIGITS' words (digits/model/tasks/caffe_train.py)."""
DIVERGING = SHORT_SOLVER.replace("base_lr: 0.01", "base_lr: 50")
"""The zoo's LeNet solver with a learning rate no net survives: loss 76.4 at iteration 2, NaN from about 4."""
TESTING_OFTEN = DIVERGING.replace("test_interval: 500", "test_interval: 10")


def strict(text: str) -> Any:
    """JSON as a browser's JSON.parse reads it: the bare NaN / Infinity tokens are an error."""
    def refuse(token: str) -> None:
        raise ValueError(f"not strict JSON: {token} in {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def records(folder: Path, attempt: int = 1) -> list[dict[str, Any]]:
    return [strict(line) for line in (folder / "attempts" / str(attempt) / "progress.jsonl").read_text().splitlines()]


def first_nan(found: list[dict[str, Any]]) -> int:
    return next(r["iteration"] for r in found if r["event"] == "iteration" and r["loss"] == "NaN")


def test_a_diverging_job_ends_with_digits_advice_and_its_nan_records_intact(make_manager: ManagerFactory) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    manager = make_manager(events)
    job = manager.submit(lenet_request(solver=DIVERGING, max_iter=50))
    job = manager.wait(job.id, timeout=120)
    folder = manager.folder(job.id)

    assert job.status == "failed"
    assert job.message is not None and job.message.startswith(DIGITS_SENTENCE), job.message
    attempts = manager.attempts(job.id)
    assert len(attempts) == 1, "a diverged attempt is not retried"
    attempt = attempts[0]
    assert attempt.status == "diverged" and attempt.out_of_memory is None
    assert attempt.exit_code == 0 and attempt.signal is None, "the runner stopped by itself, without a crash"

    found = records(folder)  # every line strict JSON
    nan_at = first_nan(found)
    assert 2 < nan_at < 50
    assert f"iteration {nan_at}" in job.message
    assert found[-1]["event"] == "diverged" and found[-1]["value"] == "NaN" and found[-1]["iteration"] == nan_at
    assert found[-2]["event"] == "iteration" and found[-2]["iteration"] == nan_at, "stopped at the first NaN"
    assert found[-2]["outputs"] == {"loss": "NaN"}
    finite = [r["loss"] for r in found if r["event"] == "iteration" and r["iteration"] < nan_at]
    assert finite and all(isinstance(loss, float) for loss in finite)
    # No snapshot of NaN weights, no traceback, no heap corruption report in Caffe's log.
    assert all(r["iteration"] < nan_at for r in found if r["event"] == "snapshot")
    assert job.snapshot is not None and job.snapshot["iteration"] < nan_at
    log = (folder / attempt.log).read_text()
    assert "Traceback" not in log and "double free" not in log and "JSON compliant" not in log

    # The store keeps the NaN record as the job's latest progress, as strict JSON text.
    stored = manager.get(job.id)
    assert stored.progress is not None and stored.progress["train"]["loss"] == "NaN"
    assert stored.progress["train"]["iteration"] == nan_at
    with sqlite3.connect(manager.store.path) as database:  # what another reader of the database finds
        row = database.execute("SELECT progress FROM jobs WHERE id = ?", (job.id,)).fetchone()[0]
    assert strict(row)["train"]["loss"] == "NaN"
    # The events carried it, and every event payload is strict JSON.
    progress = [p for name, p in events if name == "job_progress" and p.get("event") == "iteration"]
    assert progress[-1]["loss"] == "NaN"
    for _, payload in events:
        strict(json.dumps(payload, allow_nan=False))
    assert any(name == "job_attempt" and p.get("status") == "diverged" for name, p in events)


def test_with_divergence_continue_the_job_trains_to_the_end(make_manager: ManagerFactory) -> None:
    manager = make_manager()
    job = manager.submit(lenet_request(solver=TESTING_OFTEN, max_iter=30, divergence="continue"))
    job = manager.wait(job.id, timeout=120)
    folder = manager.folder(job.id)

    assert job.status == "done" and job.iteration == 30, job.message
    found = records(folder)
    nan_at = first_nan(found)
    assert job.message == (
        f'training finished at iteration 30; the network outputted NaN for "loss" (Train phase) from iteration {nan_at} on'
    )
    attempt = manager.attempts(job.id)[0]
    assert attempt.status == "success" and attempt.exit_code == 0 and attempt.signal is None
    assert [r["iteration"] for r in found if r["event"] == "iteration"] == list(range(1, 31))
    assert all(r["loss"] == "NaN" for r in found if r["event"] == "iteration" and r["iteration"] > nan_at)
    tests = [r for r in found if r["event"] == "test"]
    assert [t["iteration"] for t in tests] == [0, 10, 20, 30]
    assert tests[-1]["outputs"]["loss"] == "NaN" and tests[-1]["loss"] == "NaN"
    assert found[-1]["event"] == "finished"
    assert job.to_json()["divergence"] == "continue"


KEEPS_GOING = """
import json, sys, time
for iteration in range(1, 1500):  # 30 s at most, whatever happens
    loss = float("nan") if iteration >= 3 else 2.3
    # json.dumps writes the bare NaN token, as a runner of another kind might (a parser of Caffe's log).
    print(json.dumps({"event": "iteration", "iteration": iteration, "loss": loss, "outputs": {"loss": loss}}), flush=True)
    time.sleep(0.02)  # a runner that trains slowly, as a real one does: what is tested
"""
"""A runner that does not stop by itself and writes Python's non-strict NaN: the supervisor must stop it."""


def test_the_supervisor_stops_a_runner_that_trains_on_after_the_nan(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    process = AttemptProcess(
        tmp_path, "attempt.json", "caffe.log", on_record=seen.append, grace_seconds=0.5,
        command=[sys.executable, "-c", KEEPS_GOING],
    )
    process.start()
    result = process.wait()
    assert result.outcome.status == "diverged" and result.outcome.signal == "SIGTERM"
    assert result.outcome.message.startswith(DIGITS_SENTENCE) and "iteration 3" in result.outcome.message
    assert seen[2] == {"event": "iteration", "iteration": 3, "loss": "NaN", "outputs": {"loss": "NaN"}}
    assert len(seen) < 200, "stopped within the grace period"
    assert not any(isinstance(record["loss"], float) and math.isnan(record["loss"]) for record in seen)


def test_the_divergence_option_is_checked_by_name() -> None:
    body = {"net": LENET, "solver": SHORT_SOLVER}
    request, errors = parse_job_request({**body, "divergence": "ignore"}, default_attempts=5)
    assert request is None and "divergence" in errors and '"continue"' in errors["divergence"]
    request, _ = parse_job_request(body, default_attempts=5)
    assert request is not None and request.spec("cpu")["divergence"] == "stop"
    request, _ = parse_job_request({**body, "divergence": "continue"}, default_attempts=5)
    assert request is not None and request.spec("cpu")["divergence"] == "continue"


def test_an_event_with_a_float_nan_goes_out_as_strict_json(app: Flask) -> None:
    """Whatever a producer hands the socketio layer (a runner of another kind, a float NaN of its own), the packet
    is strict JSON: the plugin's packet class encodes non-finite numbers as the REST API does."""
    socketio = get_plugin(app).socketio
    client = socketio.test_client(app, namespace="/memplugin")
    socketio.emit("job_progress", {"job_id": "x", "loss": math.nan, "outputs": {"up": math.inf}}, namespace="/memplugin")
    received = [event for event in client.get_received("/memplugin") if event["name"] == "job_progress"]
    assert received and received[0]["args"][0] == {"job_id": "x", "loss": "NaN", "outputs": {"up": "Infinity"}}


def test_the_served_app_reports_the_nan_through_rest_and_socketio(server: Server) -> None:
    """On `digits-memplugin serve` with the real sample dataset: GET jobs, GET job, its progress, and a
    socketio client's events, all strict JSON, all carrying "NaN"; the job ends with DIGITS' advice."""
    import socketio

    datasets = server.data_dir / "datasets"
    subprocess.run([SCRIPT, "sample-dataset", str(datasets)], check=True, timeout=120, capture_output=True)

    class StrictJson:
        """The client's JSON: every packet the server sends is read as JSON.parse would."""

        dumps = staticmethod(json.dumps)
        loads = staticmethod(strict)

    received: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    client = socketio.Client(json=StrictJson)
    for name in ("job", "job_attempt", "job_progress"):
        client.on(name, lambda payload, name=name: received.put((name, payload)), namespace="/memplugin")
    client.connect(server.base_url, namespaces=["/memplugin"], transports=["polling"], wait_timeout=10)
    try:
        response = server.request("POST", "jobs", {
            "net": LENET, "solver": DIVERGING, "device": "cpu", "max_iter": 200, "name": "too-fast",
            "data": {"train": "digits_train_lmdb", "test": "digits_val_lmdb"},
        })
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        client.emit("subscribe_job", {"id": job_id}, namespace="/memplugin")
        ended = server.ended(job_id, timeout=120)
        events: list[tuple[str, dict[str, Any]]] = []
        final = None
        while final is None:
            name, payload = received.get(timeout=30)
            events.append((name, payload))
            if name == "job" and payload.get("id") == job_id and payload["status"] in FINAL_STATES:
                final = payload
    finally:
        client.disconnect()

    assert ended["status"] == "failed" and ended["message"].startswith(DIGITS_SENTENCE), ended["message"]
    assert final["message"] == ended["message"]
    assert [a["status"] for a in ended["attempts"]] == ["diverged"]
    assert any(name == "job_progress" and p.get("loss") == "NaN" for name, p in events)
    assert any(name == "job_attempt" and p.get("status") == "diverged" for name, p in events)
    for path in (f"jobs/{job_id}", "jobs", f"jobs/{job_id}/progress"):
        answer = requests.get(server.base_url + "memplugin/api/" + path, timeout=30)
        assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("application/json")
        strict(answer.text)
    document = strict(requests.get(server.base_url + f"memplugin/api/jobs/{job_id}", timeout=30).text)
    assert document["progress"]["train"]["loss"] == "NaN" and document["divergence"] == "stop"
    listed = strict(requests.get(server.base_url + "memplugin/api/jobs", timeout=30).text)["jobs"]
    assert next(j for j in listed if j["id"] == job_id)["progress"]["train"]["loss"] == "NaN"
    chart = strict(requests.get(server.base_url + f"memplugin/api/jobs/{job_id}/progress", timeout=30).text)["records"]
    losses = [r["loss"] for r in chart if r["event"] == "iteration"]
    assert losses[-1] == "NaN" and all(isinstance(loss, float) for loss in losses[:-1])
