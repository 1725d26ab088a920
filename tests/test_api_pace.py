"""Issue 26, 2 on the real sample dataset (`digits-memplugin sample-dataset`: 1438 training and 359 validation
digits) and real LeNet training children: the defaults a new user's first job gets (Auto's batch within a twentieth
of the training set, 30 epochs as DIGITS counts them, one validation pass over the validation set once an epoch),
and every running job's speed and time left in its REST document and its events from its first records on,
computed from the records the server already follows (no progress file read per request)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from test_jobs_fixtures import wait_for

from digits_memplugin.host.extension import get_plugin
from digits_memplugin.jobs.events.pace import Window

pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "digits-memplugin"
NS = "/memplugin"
FIRST_JOB = {"model_name": "my first LeNet", "train_source": "digits_train_lmdb", "val_source": "digits_val_lmdb",
             "batch_size": "auto", "device": "cpu"}
"""What a new user fills in on the New model page, the rest left as the form has it (LeNet, the solver settings)."""


@pytest.fixture(scope="module")
def sample_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sample") / "datasets"
    subprocess.run([SCRIPT, "sample-dataset", str(root)], check=True, timeout=120, capture_output=True)
    return root


@pytest.fixture
def app_config(sample_root: Path) -> dict[str, Any]:
    """conftest's `app`, reading the sample dataset."""
    return {"MEMPLUGIN_DATASET_ROOTS": [str(sample_root)]}


def test_the_first_jobs_defaults_follow_the_sample_dataset(app: Flask) -> None:
    """Auto filled batch 1438 (the whole training set) and the form 10,000 iterations validated on 32 x 100 images
    (the 359-image set read nine times): about 100 minutes at 1.7 it/s on this CPU."""
    client = app.test_client()
    page = client.get("/memplugin/models/new").text
    assert 'id="epochs"' in page and 'value="30"' in page.split('id="epochs"')[1].split(">")[0]
    preview = client.post("/memplugin/models/preview.json", json=FIRST_JOB)
    assert preview.status_code == 200, preview.get_json()
    planned = preview.get_json()
    assert (planned["plan"]["batch_size"], planned["plan"]["iter_size"]) == (71, 1)
    assert planned["max_batch_limited_by"] == "max_batch"
    assert planned["auto_cap"] == (
        "capped at 71 so that an epoch of the 1438 training items has 21 iterations (at most 1/20 of the training set)"
    )
    assert planned["length"] == {"epochs": 30, "max_iter": 630, "per_epoch": 21, "test_interval": 21, "test_iter": 12}

    created = client.post("/memplugin/models.json", json=FIRST_JOB)
    assert created.status_code == 201, created.get_json()
    job = created.get_json()
    assert (job["epochs"], job["max_iter"]) == (30, None)  # by epochs at batch "auto": known once planned
    manager = get_plugin(app).started_jobs()
    spec = wait_for(lambda: (path := manager.folder(job["id"]) / "attempts" / "1" / "attempt.json").is_file()
                    and path.read_text(), timeout=60, what="the first attempt")
    running = client.get(f"/memplugin/api/jobs/{job['id']}").get_json()
    assert (running["max_iter"], running["epochs"], running["iterations_per_epoch"]) == (630, 30, 21)
    assert (running["batch"]["test_batch_size"], running["batch"]["test_iter"]) == (32, 12)
    assert '"max_iter": 630' in spec and '"test_interval": 21' in spec
    solver = (manager.folder(job["id"]) / "solver.prototxt").read_text()
    assert solver.startswith("# max_iter: 30 epochs, computed by the job")  # as submitted, saying what it leaves
    manager.cancel(job["id"])
    assert manager.wait(job["id"], timeout=60).status == "cancelled"


def test_a_running_job_tells_its_speed_and_time_left_from_its_first_records(app: Flask) -> None:
    plugin = get_plugin(app)
    client = app.test_client()
    socket = plugin.socketio.test_client(app, namespace=NS)
    socket.emit("subscribe_jobs", namespace=NS)
    created = client.post("/memplugin/models.json", json={**FIRST_JOB, "model_name": "paced", "epochs": 2})
    assert created.status_code == 201, created.get_json()
    job_id = created.get_json()["id"]
    socket.emit("subscribe_job", {"id": job_id}, namespace=NS)
    url = f"/memplugin/api/jobs/{job_id}"

    opened: list[str] = []
    counting = threading.Event()

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if counting.is_set() and event == "open" and "progress.jsonl" in str(args[0]):
            opened.append(str(args[0]))

    sys.addaudithook(audit)
    received: list[dict[str, Any]] = []
    measured: list[dict[str, Any]] = []

    def ended() -> bool:
        received.extend(socket.get_received(NS))
        counting.set()
        document = client.get(url).get_json()  # while it runs: its speed, from the records already followed
        counting.clear()
        if document["status"] == "running" and document["iterations_per_second"] is not None:
            measured.append(document)
        return document["status"] in ("done", "failed", "cancelled")

    wait_for(ended, timeout=240, what="the job to end")
    received.extend(socket.get_received(NS))
    done = client.get(url).get_json()
    assert done["status"] == "done", done["message"]
    assert (done["max_iter"], done["iterations_per_epoch"]) == (42, 21)
    assert (done["iterations_per_second"], done["seconds_left"]) == (None, None)  # not running any more
    assert not opened, opened  # no progress file read for the documents

    progress = [e["args"][0] for e in received if e["name"] == "job_progress" and e["args"][0]["event"] == "iteration"]
    assert len(progress) >= 3 and progress[0]["iteration"] == 1
    assert progress[0]["iterations_per_second"] is None  # one record says no speed yet
    for event in progress[1:]:  # every later one does: from the second record on
        rate, left = event["iterations_per_second"], event["seconds_left"]
        assert rate is not None and rate > 0, event
        assert left == pytest.approx((42 - event["iteration"]) / rate)
    listed = [e["args"][0] for e in received if e["name"] == "job_iteration" and e["args"][0]["id"] == job_id]
    assert [(e["iteration"], e["iterations_per_second"], e["seconds_left"]) for e in listed] == [
        (e["iteration"], e["iterations_per_second"], e["seconds_left"]) for e in progress
    ]
    assert measured, "no REST document of the running job had a speed"
    last = measured[-1]
    assert last["seconds_left"] == pytest.approx((42 - last["progress"]["pace"]["iteration"]) / last["iterations_per_second"])
    # The speed is the records' own: the attempt's records replayed through pace.Window give each event's figure.
    # (A spread around the run's average speed failed on a loaded machine, where the pace itself moves.)
    records = (plugin.jobs.folder(job_id) / "attempts" / "1" / "progress.jsonl").read_text().splitlines()
    window, replayed = Window(), {}
    for record in map(json.loads, records):
        if record.get("event") == "iteration":
            window.add(record["iteration"], float(record["seconds"]))
            measured = window.pace(42)
            replayed[record["iteration"]] = None if measured is None else measured.iterations_per_second
    for event in progress[1:]:
        assert event["iterations_per_second"] == pytest.approx(replayed[event["iteration"]]), event
    socket.disconnect(namespace=NS)
