"""The jobs list and a job's page through Flask's test client (first paint, no JavaScript: refresh, cancel and delete
by form posts with CSRF), GET api/jobs/<id>/progress that the page's chart is drawn from, and how the New model
form's fields become a job request (web/pages/model_job.py). Jobs train LeNet on the CPU for real, briefly."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, pid_alive, wait_for, write_lmdb

from digits_memplugin import create_app
from digits_memplugin.core.errors import FieldErrors
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.jobs.store.records import FINAL_STATES
from digits_memplugin.networks import standard_network
from digits_memplugin.web.api import jobs as api_jobs
from digits_memplugin.web.pages.forms import ModelSpec
from digits_memplugin.web.pages.model_job import form_errors, job_body, manager_device

pytestmark = pytest.mark.slow

API = "/memplugin/api/jobs"
PAGES = "/memplugin/jobs"


@pytest.fixture(scope="module")
def jobs_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    """One app for the module, with MNIST-shaped LMDBs in its dataset root; its jobs are stopped at the end."""
    data_dir = tmp_path_factory.mktemp("pages-jobs") / "data"
    root = data_dir / "datasets"
    root.mkdir(parents=True)
    for name, records in (("mnist_train_lmdb", 16), ("mnist_test_lmdb", 8)):
        write_lmdb(root / name, records=records)
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True})
    yield app
    get_plugin(app).close()


@pytest.fixture
def client(jobs_app: Flask) -> FlaskClient:
    return jobs_app.test_client()


def submit(client: FlaskClient, **fields: Any) -> dict[str, Any]:
    body = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4, **fields}
    response = client.post(API, json=body)
    assert response.status_code == 201, response.get_json()
    return response.get_json()  # type: ignore[no-any-return]


def ended(client: FlaskClient, job_id: str) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (doc := client.get(f"{API}/{job_id}").get_json())["status"] in FINAL_STATES and doc,
        timeout=120, what=f"job {job_id} to end",
    )


def running(client: FlaskClient, job_id: str) -> dict[str, Any]:
    """The job once its child reports iterations (so a cancel has a process to stop)."""
    return wait_for(  # type: ignore[no-any-return]
        lambda: (doc := client.get(f"{API}/{job_id}").get_json())["iteration"] > 0 and doc,
        timeout=60, what=f"job {job_id} to train",
    )


def page_token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no form with a CSRF token"
    return match.group(1)


def stop(client: FlaskClient, job_id: str) -> None:
    client.post(f"{API}/{job_id}/cancel")
    ended(client, job_id)


# --- the pages --------------------------------------------------------------------------------------------------


def test_a_finished_job_page_shows_plan_attempts_progress_and_log(client: FlaskClient) -> None:
    job = submit(client, name="lenet quick", batch=32)
    ended(client, job["id"])
    page = client.get(f"{PAGES}/{job['id']}")
    assert page.status_code == 200
    html = page.text
    assert 'id="job-name">lenet quick<' in html
    assert 'id="job-status">done<' in html
    assert "training finished at iteration 4" in html
    summary = html.split('id="job-summary"')[1].split("</dl>")[0]
    assert re.search(r'data-role="wanted">32<', summary)
    assert "32 × iter_size 1 = 32" in summary
    assert re.search(r'data-role="iteration">4 of 4<', summary)
    assert re.search(r'data-role="test">accuracy [\d.]+, loss [\d.]+ \(iteration 0\)<', summary), summary
    attempts = re.findall(r'<tr data-attempt="(\d+)" data-status="(\w+)">', html)
    assert attempts == [("1", "success")]
    assert "0 → 4" in html
    # Each memory figure says what it counts: the estimate, Caffe's own allocation beside it, the process's growth.
    memory = html.split('data-role="memory"')[1].split("</td>")[0]
    labels = re.findall(r'data-role="(\w+)" title="[^"]+">(\w+) [\d.]+ [KMG]?i?B<', memory)
    assert labels == [("estimated", "estimated"), ("allocated", "Caffe"), ("peak", "process"), ("limit", "limit")], memory
    assert "Creating Layer" in html.split('id="job-log"')[1]  # Caffe's log, its last lines
    assert 'name: &#34;LeNet&#34;' in html  # the network as submitted
    # Finished: Delete, no Cancel, nothing to refresh.
    assert re.search(r'id="cancel-form" hidden>', html) and not re.search(r'id="delete-form" hidden>', html)
    assert 'http-equiv="refresh"' not in html


def test_an_active_job_page_refreshes_itself_without_javascript(client: FlaskClient) -> None:
    job = submit(client, max_iter=100_000)
    try:
        html = client.get(f"{PAGES}/{job['id']}").text
        assert '<noscript><meta http-equiv="refresh" content="5"></noscript>' in html
        assert f'<a href="{PAGES}/{job["id"]}">Refresh now</a>' in html
        listing = client.get(PAGES).text
        assert '<noscript><meta http-equiv="refresh" content="5"></noscript>' in listing
    finally:
        stop(client, job["id"])


def test_unknown_job_page_is_a_404_page(client: FlaskClient) -> None:
    """Issue 14, 8: the site's layout (menu, footer) with a link back to the jobs list, not Werkzeug's bare page;
    the API keeps answering JSON."""
    for path, says in ((f"{PAGES}/no-such-job", "no job &#39;no-such-job&#39;"), ("/memplugin/nowhere", "Not Found")):
        response = client.get(path)
        assert response.status_code == 404
        assert response.mimetype == "text/html"
        html = response.text
        assert '<nav class="navbar' in html and "mp-footer" in html, html
        assert "<h1" in html and "404 Not Found" in html and says in html
        assert f'<a href="{PAGES}">Back to the jobs list</a>' in html
    for path in (f"{API}/no-such-job", "/memplugin/api/nowhere"):
        api = client.get(path)
        assert api.status_code == 404 and api.mimetype == "application/json" and api.get_json()["status"] == 404
    wrong = client.post(f"{PAGES}/no-such-job")  # a page's error other than 404 has the layout too
    assert wrong.status_code == 405 and "mp-footer" in wrong.text and "GET" in wrong.headers["Allow"]


def test_cancel_by_form_needs_the_token_then_stops_the_child(jobs_app: Flask, client: FlaskClient) -> None:
    job = submit(client, max_iter=100_000)
    try:
        running(client, job["id"])
        html = client.get(f"{PAGES}/{job['id']}").text
        refused = client.post(f"{PAGES}/{job['id']}/cancel", data={})
        assert refused.status_code == 400
        assert "The job was not cancelled: The CSRF token is missing." in refused.text
        forged = client.post(f"{PAGES}/{job['id']}/cancel", data={"csrf_token": "forged"})
        assert forged.status_code == 400 and "The CSRF token is invalid." in forged.text
        assert client.get(f"{API}/{job['id']}").get_json()["status"] == "running"

        progress = get_plugin(jobs_app).jobs.folder(job["id"]) / "attempts" / "1" / "progress.jsonl"
        pid = json.loads(progress.read_text().splitlines()[0])["pid"]
        response = client.post(f"{PAGES}/{job['id']}/cancel", data={"csrf_token": page_token(html)})
        assert response.status_code == 303
        assert response.headers["Location"] == f"{PAGES}/{job['id']}"
        document = ended(client, job["id"])
        assert document["status"] == "cancelled"
        assert document["attempts"][0]["status"] == "cancelled"
        assert not pid_alive(pid)
        again = client.post(f"{PAGES}/{job['id']}/cancel", data={"csrf_token": page_token(html)})
        assert again.status_code == 409
        assert "The job was not cancelled: the job is cancelled" in again.text
    finally:
        stop(client, job["id"])


def test_resume_by_form_queues_a_cancelled_job_again(client: FlaskClient) -> None:
    """Issue 14, 8: a cancelled job offered only Delete; its page offers Resume (a form post without JavaScript)."""
    job = submit(client, max_iter=100_000)
    try:
        running(client, job["id"])
        assert re.search(r'id="resume-form" hidden', client.get(f"{PAGES}/{job['id']}").text)  # running: no Resume
        client.post(f"{API}/{job['id']}/cancel")
        assert ended(client, job["id"])["status"] == "cancelled"
        html = client.get(f"{PAGES}/{job['id']}").text
        assert re.search(r'id="resume-form">', html) and ">Resume</button>" in html
        refused = client.post(f"{PAGES}/{job['id']}/resume", data={})
        assert refused.status_code == 400 and "The job was not resumed: The CSRF token is missing." in refused.text
        response = client.post(f"{PAGES}/{job['id']}/resume", data={"csrf_token": page_token(html)})
        assert response.status_code == 303 and response.headers["Location"] == f"{PAGES}/{job['id']}"
        assert client.get(f"{API}/{job['id']}").get_json()["status"] in ("queued", "running")
        again = client.post(f"{PAGES}/{job['id']}/resume", data={"csrf_token": page_token(html)})
        assert again.status_code == 409 and "The job was not resumed: the job is " in again.text
    finally:
        stop(client, job["id"])


def test_delete_by_form_refuses_a_running_job_and_removes_a_finished_one_once_confirmed(
    client: FlaskClient, jobs_app: Flask
) -> None:
    """Issue 26 point 4: Delete removed the job and its snapshots at the first click. Without JavaScript the first
    post now brings the page back asking, naming the snapshots that would go; only the second post deletes."""
    job = submit(client, max_iter=100_000)
    try:
        wait_for(lambda: client.get(f"{API}/{job['id']}").get_json()["iteration"] >= 5, what="5 iterations")
        token = page_token(client.get(f"{PAGES}/{job['id']}").text)
        busy = client.post(f"{PAGES}/{job['id']}/delete", data={"csrf_token": token, "confirm": "yes"})
        assert busy.status_code == 409 and "it is running; cancel it first" in busy.text
        assert client.post(f"{PAGES}/{job['id']}/delete", data={}).status_code == 400
    finally:
        stop(client, job["id"])
    snapshots = sorted((get_plugin(jobs_app).jobs.folder(job["id"]) / "snapshots").glob("*.caffemodel"))
    assert len(snapshots) >= 2  # every 2 iterations, and the cancel's own

    asked = client.post(f"{PAGES}/{job['id']}/delete", data={"csrf_token": token})
    assert asked.status_code == 200
    question = asked.text.split('id="delete-confirm"', 1)[1].split("</div>", 1)[0]
    assert not question.startswith(" hidden") and "for good?" in question
    latest = max(int(re.search(r"_iter_(\d+)", path.name).group(1)) for path in snapshots)  # type: ignore[union-attr]
    assert f"Its {len(snapshots)} snapshots (the latest at iteration {latest})" in question
    assert 'name="confirm" value="yes"' in question and "Delete for good" in question
    assert f'href="{PAGES}/{job["id"]}" id="delete-keep">Keep the job<' in question
    # Nothing is gone yet: the job, its folder and its snapshots.
    assert client.get(f"{API}/{job['id']}").status_code == 200
    assert all(path.is_file() for path in snapshots)

    response = client.post(f"{PAGES}/{job['id']}/delete", data={"csrf_token": page_token(asked.text), "confirm": "yes"})
    assert response.status_code == 303 and response.headers["Location"] == PAGES
    assert client.get(f"{API}/{job['id']}").status_code == 404
    assert not any(path.exists() for path in snapshots)


def test_jobs_list_shows_each_job_newest_first_as_text(client: FlaskClient) -> None:
    first = submit(client, name="<i>first</i>")
    second = submit(client, name="second")
    ended(client, first["id"])
    ended(client, second["id"])
    html = client.get(PAGES).text
    rows = re.findall(r'<tr data-job-id="([\w-]+)" data-status="(\w+)">', html)
    ids = [job_id for job_id, _ in rows]
    assert ids.index(second["id"]) < ids.index(first["id"])
    assert dict(rows)[first["id"]] == "done"
    assert "&lt;i&gt;first&lt;/i&gt;" in html and "<i>first</i>" not in html
    assert f'<a href="{PAGES}/{first["id"]}">' in html
    assert "4 / 4" in html and "CPU" in html


def test_jobs_list_without_jobs_says_so(tmp_path: Path) -> None:
    app = create_app({"MEMPLUGIN_DATA_DIR": tmp_path / "data", "MEMPLUGIN_ASYNC_MODE": "threading"})
    try:
        html = app.test_client().get(PAGES).text
        assert '<p id="no-jobs">No jobs yet' in html
        assert 'http-equiv="refresh"' not in html
    finally:
        get_plugin(app).close()


def test_menu_links_to_the_jobs_list(client: FlaskClient) -> None:
    assert f'href="{PAGES}"' in client.get("/").text
    assert f'class="nav-link active" aria-current="page" href="{PAGES}"' in client.get(PAGES).text


# --- GET api/jobs/<id>/progress ------------------------------------------------------------------------------------


def test_progress_has_every_iteration_and_test_of_each_attempt(client: FlaskClient) -> None:
    job = submit(client)
    ended(client, job["id"])
    records = client.get(f"{API}/{job['id']}/progress").get_json()["records"]
    iterations = [r["iteration"] for r in records if r["event"] == "iteration"]
    tests = [r["iteration"] for r in records if r["event"] == "test"]
    assert iterations == [1, 2, 3, 4]
    assert tests == [0]  # test_initialization; the next test would be at test_interval 500
    assert {r["attempt"] for r in records} == {1}
    assert all(isinstance(r["lr"], float) for r in records if r["event"] == "iteration")
    assert client.get(f"{API}/no-such-job/progress").status_code == 404


def test_after_a_resume_without_a_snapshot_the_job_and_its_progress_show_the_new_run(
    client: FlaskClient, jobs_app: Flask
) -> None:
    """Issue 26 point 3: after Resume without a snapshot, attempt 2 restarted at 0 while the job still showed attempt
    1's iteration and loss, and GET .../progress gave both attempts' records alike. Now the job is where attempt 2
    is, its progress says which attempt it is of, and attempt 1's records that attempt 2 trains again are marked
    `superseded`."""
    job = submit(client, max_iter=100_000)
    try:
        wait_for(lambda: client.get(f"{API}/{job['id']}").get_json()["iteration"] >= 20, what="20 iterations")
        client.post(f"{API}/{job['id']}/cancel")
        first = ended(client, job["id"])
        reached = first["iteration"]
        folder = get_plugin(jobs_app).jobs.folder(job["id"])
        for snapshot in (folder / "snapshots").iterdir():  # no snapshot left: Resume starts again from 0
            snapshot.unlink()
        resumed = client.post(f"{API}/{job['id']}/resume").get_json()
        assert resumed["message"] == f"waiting to resume from the start (the snapshot of iteration {reached} is gone)"

        def restarted() -> dict[str, Any] | None:
            doc = client.get(f"{API}/{job['id']}").get_json()
            return doc if doc["attempt_count"] == 2 and doc["status"] == "running" else None

        doc = wait_for(restarted, what="attempt 2 to start")
        assert doc["attempts"][1]["start_iteration"] == 0 and doc["attempts"][1]["resumed_from"] is None
        train = (doc["progress"] or {}).get("train")
        assert train is None or train["attempt"] == 2, train  # never attempt 1's last record
        assert doc["iteration"] == (train["iteration"] if train else 0)
        assert doc["snapshot"] is None or doc["snapshot"]["iteration"] <= doc["iteration"]

        doc = wait_for(lambda: (d := client.get(f"{API}/{job['id']}").get_json())["iteration"] >= 5 and d,
                       what="attempt 2 to train")
        assert doc["progress"]["train"]["attempt"] == 2 and doc["iteration"] < reached + 10
        records = client.get(f"{API}/{job['id']}/progress").get_json()["records"]
        old = [r for r in records if r["attempt"] == 1]
        assert {r["superseded"] for r in old if r["iteration"] > 0} == {True}
        assert [r["superseded"] for r in old if r["iteration"] == 0] == [False]  # the test before any update
        assert {r["superseded"] for r in records if r["attempt"] == 2} == {False}
    finally:
        stop(client, job["id"])


def test_progress_is_thinned_and_skips_a_half_written_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_jobs, "MAX_PROGRESS_POINTS", 10)
    path = tmp_path / "progress.jsonl"
    lines = [json.dumps({"event": "started", "pid": 1, "time": 0})]
    lines += [json.dumps({"event": "iteration", "iteration": i, "time": i}) for i in range(1, 96)]
    lines += [json.dumps({"event": "test", "iteration": 50, "time": 50.5}), '{"event": "iteration", "iter']
    path.write_text("\n".join(lines))
    records = api_jobs._chart_records([path], 2)
    iterations = [r["iteration"] for r in records if r["event"] == "iteration"]
    assert len(iterations) <= 11 and iterations[0] == 1 and iterations[-1] == 95  # the last is always kept
    assert iterations == sorted(iterations)
    assert [r["iteration"] for r in records if r["event"] == "test"] == [50]
    assert {r["attempt"] for r in records} == {2}


# --- the form's fields as a job request ----------------------------------------------------------------------------


def spec(**fields: Any) -> ModelSpec:
    lenet = standard_network("lenet")
    values: dict[str, Any] = {
        "name": "m", "network_key": "lenet", "net_text": lenet.text, "net_source": lenet.filename,
        "solver_text": 'type: "SGD"', "solver_source": "solver settings", "solver_settings": {"type": "SGD"},
        "data_backend": "lmdb", "train_source": "train_db", "val_source": "val_db", "item_shape": (1, 28, 28),
        "classes": 10, "batch": None, "device": "cpu",
    }
    values.update(fields)
    return ModelSpec(**values)


def layers(*rows: tuple[str, str, str]) -> dict[str, Any]:
    """An estimate document's layers: (name, type, phase)."""
    return {"layers": [{"name": name, "type": kind, "phase": phase} for name, kind, phase in rows]}


LENET_LAYERS = layers(("train-data", "Data", "TRAIN"), ("loss", "SoftmaxWithLoss", "TRAIN"),
                      ("val-data", "Data", "TEST"), ("accuracy", "Accuracy", "TEST"))


def test_sources_go_to_the_data_layers_of_each_net() -> None:
    mapped = job_body(spec(), LENET_LAYERS, "cpu")
    assert mapped.body["data"] == {"train-data": "train_db", "val-data": "val_db"}
    assert mapped.sources == {"train-data": "train_source", "val-data": "val_source"}
    assert mapped.body["data_shapes"] == {"data": [1, 28, 28]} and mapped.body["classes"] == 10
    assert "batch" not in mapped.body
    without_val = job_body(spec(val_source=None, batch="auto"), LENET_LAYERS, "auto")
    assert without_val.body["data"] == {"train-data": "train_db"}
    assert without_val.body["batch"] == "auto" and without_val.body["device"] == "auto"


def test_an_lmdb_dataset_sets_the_data_layers_backend() -> None:
    net = parse_net(job_body(spec(), LENET_LAYERS, "cpu").body["net"])
    data = {layer.name: layer for layer in net.layer if layer.type == "Data"}
    assert {name: layer.data_param.backend for name, layer in data.items()} == {"train-data": 1, "val-data": 1}
    assert data["train-data"].data_param.batch_size == 64


def test_an_hdf5_dataset_turns_the_data_layers_into_hdf5data() -> None:
    net = parse_net(job_body(spec(data_backend="hdf5"), LENET_LAYERS, "cpu").body["net"])
    data = {layer.name: layer for layer in net.layer if layer.name.endswith("-data")}
    assert {layer.type for layer in data.values()} == {"HDF5Data"}
    assert data["train-data"].hdf5_data_param.batch_size == 64 and data["val-data"].hdf5_data_param.batch_size == 32
    assert not data["train-data"].HasField("data_param")
    with_transform = standard_network("lenet").text.replace(
        "data_param { batch_size: 64 }", "data_param { batch_size: 64 }\n  transform_param { scale: 0.1 }"
    )
    with pytest.raises(FieldErrors) as refused:
        job_body(spec(data_backend="hdf5", net_text=with_transform), LENET_LAYERS, "cpu")
    assert refused.value.field == "data_backend" and "transform_param" in refused.value.message


def test_a_data_layer_in_both_nets_cannot_read_two_datasets() -> None:
    shared = layers(("data", "Data", "TRAIN"), ("data", "Data", "TEST"))
    with pytest.raises(FieldErrors) as refused:
        job_body(spec(), shared, "cpu")
    assert refused.value.field == "val_source" and "include rules" in refused.value.message
    assert job_body(spec(val_source=None), shared, "cpu").body["data"] == {"data": "train_db"}


def test_a_network_without_training_data_is_refused_on_the_training_field() -> None:
    with pytest.raises(FieldErrors) as refused:
        job_body(spec(), layers(("input", "Input", "TRAIN")), "cpu")
    assert refused.value.field == "train_source"


def test_devices_are_named_as_the_manager_names_them() -> None:
    assert manager_device("next", None) == "auto"
    assert manager_device("cpu", None) == "cpu"
    assert manager_device("GPU-abc", 1) == "GPU-abc"
    assert manager_device("gpu-index-3", 3) == 3


def test_submission_errors_land_beside_the_form_fields() -> None:
    sources = {"train-data": "train_source", "val-data": "val_source"}
    source_error = {"message": "x does not exist", "layer": "val-data", "field": "data_param.source"}
    errors = {
        "net": source_error, "solver": "bad", "name": "too long", "batch": "no", "data": "unknown layers",
        "data_shapes.data": "bad shape", "device": "gone", "queue": "full",
    }
    assert form_errors(errors, spec(), sources) == {
        "val_source": source_error, "solver_type": "bad", "model_name": "too long", "batch_size": "no",
        "train_source": "unknown layers", "item_shape": "bad shape", "device": "gone", "queue": "full",
    }
    custom = spec(network_key=None, solver_settings=None)
    net_error = {"message": "bad", "layer": "conv", "field": "kernel_size"}
    assert form_errors({"net": net_error, "solver": "bad"}, custom, sources) == {
        "custom_network": net_error, "solver_text": "bad",
    }
