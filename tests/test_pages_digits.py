"""What a DIGITS user looks for (issue 26, point 10), through Flask's test client with real short LeNet jobs on the
CPU (real pycaffe children): clone a job (its request as a submittable document; the New model form filled in with
its settings, without JavaScript), the Devices page listing each device's training jobs (GET
api/devices/attempts), cancel and delete from the jobs list with a confirmation step (a plain form post), words
explained where the pages show them (the glossary), and the job page's downloads."""

from __future__ import annotations

import html.parser
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, pid_alive, wait_for, write_lmdb

from digits_memplugin import create_app
from digits_memplugin.core import oom, oom_signatures
from digits_memplugin.devices.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.jobs.store.records import FINAL_STATES
from digits_memplugin.web.pages import glossary

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api/jobs"
PAGES = "/memplugin/jobs"
FORM_JOB = {
    "model_name": "lenet-clone-me", "standard_network": "lenet", "train_source": "mnist_train_lmdb",
    "val_source": "mnist_test_lmdb", "device": "cpu", "lr_policy": "step", "stepsize": 7, "gamma": 0.5,
    "base_lr": 0.02, "max_iter": 6, "test_interval": 3, "test_iter": 1, "snapshot": 3, "batch_size": 8,
    "divergence": "continue",
}
"""A job as the New model form's JSON twin makes it: the standard LeNet, solver settings, a step policy."""


@pytest.fixture(scope="module")
def jobs_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    data_dir = tmp_path_factory.mktemp("pages-digits") / "data"
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


def ended(client: FlaskClient, job_id: str) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (doc := client.get(f"{API}/{job_id}").get_json())["status"] in FINAL_STATES and doc,
        timeout=180, what=f"job {job_id} to end",
    )


def form_job(client: FlaskClient, **fields: Any) -> dict[str, Any]:
    response = client.post("/memplugin/models.json", json={**FORM_JOB, **fields})
    assert response.status_code == 201, response.get_json()
    return response.get_json()  # type: ignore[no-any-return]


def api_job(client: FlaskClient, **fields: Any) -> dict[str, Any]:
    body = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4, **fields}
    response = client.post(API, json=body)
    assert response.status_code == 201, response.get_json()
    return response.get_json()  # type: ignore[no-any-return]


class FormValues(html.parser.HTMLParser):
    """The values a browser would submit from the page's New model form (no JavaScript): inputs, checked radios,
    selected options, textareas."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self._select: str | None = None
        self._textarea: str | None = None
        self._first_option: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {key: value or "" for key, value in attrs}
        name = found.get("name")
        if tag == "input" and name and found.get("type") not in ("submit", "file", "button"):
            if found.get("type") in ("radio", "checkbox"):
                if "checked" in found:
                    self.values[name] = found.get("value", "on")
            else:
                self.values[name] = found.get("value", "")
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select:
            self._first_option.setdefault(self._select, found.get("value", ""))
            if "selected" in found:
                self.values[self._select] = found.get("value", "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select" and self._select:
            self.values.setdefault(self._select, self._first_option.get(self._select, ""))
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.values[self._textarea] += data


def form_values(page: str) -> dict[str, str]:
    parser = FormValues()
    form = re.search(r'<form[^>]*id="new-model-form".*?</form>', page, re.S)
    assert form, "no New model form on the page"
    parser.feed(form.group(0))
    # A browser drops the newline right after <textarea>; the parser keeps it.
    return {key: value.removeprefix("\r\n") if value.startswith("\r\n") else value.removeprefix("\n")
            for key, value in parser.values.items()}


# --- clone ---------------------------------------------------------------------------------------------------------


def test_a_jobs_request_is_a_document_post_api_jobs_takes_as_it_is(client: FlaskClient) -> None:
    job = api_job(client, name="zoo lenet", batch=16, max_iter=3, memory_cap="1GiB",
                  fallback={"max_attempts": 3, "growth": 0.2}, divergence="continue")
    job = ended(client, job["id"])
    document = client.get(f"{API}/{job['id']}/request")
    assert document.status_code == 200, document.get_json()
    request = document.get_json()
    assert request == {
        "net": LENET, "solver": SHORT_SOLVER, "name": "zoo lenet", "device": "cpu", "batch": 16,
        "data": LENET_DATA, "max_iter": 3, "memory_cap": 1 << 30, "divergence": "continue",
        "fallback": {"max_attempts": 3, "growth": 0.2, "start": "plan"},
    }
    again = client.post(API, json=request)
    assert again.status_code == 201, again.get_json()
    clone = ended(client, again.get_json()["id"])
    assert clone["status"] == "done", clone
    assert client.get(f"{API}/{clone['id']}/request").get_json() == request
    for key in ("batch", "max_iter", "memory_cap", "fallback", "divergence", "device", "iteration"):
        assert clone[key] == job[key], key
    assert client.get(f"{API}/no-such-job/request").status_code == 404


def test_clone_opens_the_new_model_form_filled_in_and_creating_it_makes_the_same_job(client: FlaskClient) -> None:
    job = form_job(client)
    ended(client, job["id"])
    page = client.get(f"{PAGES}/{job['id']}")
    assert f'href="/memplugin/models/new?clone={job["id"]}" id="clone-job"' in page.get_data(as_text=True)
    form_page = client.get(f"/memplugin/models/new?clone={job['id']}")
    assert form_page.status_code == 200
    text = form_page.get_data(as_text=True)
    assert 'id="clone-note"' in text and "lenet-clone-me</a>" in text
    values = form_values(text)
    assert values["network"] == "standard" and values["standard_network"] == "lenet"
    assert values["solver"] == "settings"
    expected = {
        "model_name": "lenet-clone-me", "train_source": "mnist_train_lmdb", "val_source": "mnist_test_lmdb",
        "data_backend": "lmdb", "device": "cpu", "lr_policy": "step", "stepsize": "7", "gamma": "0.5",
        "base_lr": "0.02", "max_iter": "6", "test_interval": "3", "test_iter": "1", "snapshot": "3", "batch_size": "8",
        "divergence": "continue", "solver_type": "SGD", "momentum": "0.9", "weight_decay": "0.0005",
        "classes": "10", "item_shape": "1,28,28",
    }
    assert {key: values.get(key) for key in expected} == expected
    # The form posted as it stands (no JavaScript) makes a job with the same request, but for its name.
    posted = client.post("/memplugin/models", data=values)
    assert posted.status_code == 303, posted.get_data(as_text=True)[:2000]
    new_id = posted.headers["Location"].rsplit("/", 1)[1]
    assert new_id != job["id"]
    first = client.get(f"{API}/{job['id']}/request").get_json()
    second = client.get(f"{API}/{new_id}/request").get_json()
    assert second == first
    ended(client, new_id)


def test_a_clone_of_an_api_job_pastes_its_net_and_solver_and_names_what_the_form_cannot_hold(
    client: FlaskClient,
) -> None:
    job = api_job(client, name="api lenet", memory_cap="1GiB", fallback={"max_attempts": 2})
    ended(client, job["id"])
    text = client.get(f"/memplugin/models/new?clone={job['id']}").get_data(as_text=True)
    values = form_values(text)
    assert values["network"] == "custom" and values["custom_network"] == LENET
    assert values["solver"] == "file"
    assert "max_iter: 4" in values["solver_text"]  # the request's max_iter written into the pasted solver
    assert values["train_source"] == "mnist_train_lmdb" and values["val_source"] == "mnist_test_lmdb"
    notes = re.findall(r'data-role="clone-note">(.*?)</div>', text)
    # The form has a memory-cap field: the cap goes back into it, as a size that reads back exactly.
    assert values["memory_cap"] == "1GiB" and not any("memory cap" in note for note in notes), notes
    assert any("max_attempts 2" in note for note in notes), notes
    assert client.get("/memplugin/models/new?clone=no-such-job").status_code == 404


# --- the Devices page: each device's jobs -------------------------------------------------------------------------


def test_the_devices_page_lists_the_job_training_on_the_cpu(client: FlaskClient) -> None:
    job = api_job(client, name="long <b>lenet</b>", max_iter=100_000)
    try:
        wait_for(lambda: client.get(f"{API}/{job['id']}").get_json()["iteration"] > 0, timeout=60,
                 what="the job to train")
        (attempt,) = client.get("/memplugin/api/devices/attempts").get_json()["attempts"]
        assert (attempt["device"], attempt["job_id"], attempt["attempt"]) == ("cpu", job["id"], 1)
        assert attempt["url"] == f"{PAGES}/{job['id']}" and pid_alive(attempt["pid"])
        assert attempt["batch_size"] == 64 and attempt["iter_size"] == 1
        page = client.get("/memplugin/devices").get_data(as_text=True)
        cpu_row = re.search(r'<tr data-key="cpu">.*?</tr>', page, re.S)
        assert cpu_row, page
        jobs_cell = re.search(r'<td data-role="jobs">(.*?)</td>', cpu_row.group(0), re.S)
        assert jobs_cell and f'<a href="{PAGES}/{job["id"]}">long &lt;b&gt;lenet&lt;/b&gt;</a>' in jobs_cell.group(1)
        assert f"pid {attempt['pid']}" in jobs_cell.group(1)
        # The CPU's processes are n/a (NVML lists GPUs' only), and the cell says where our jobs are instead.
        assert "the next column" in cpu_row.group(0)
    finally:
        client.post(f"{API}/{job['id']}/cancel")
        ended(client, job["id"])
    assert client.get("/memplugin/api/devices/attempts").get_json() == {"attempts": []}
    page = client.get("/memplugin/devices").get_data(as_text=True)
    assert re.search(r'<tr data-key="cpu">.*?<td data-role="jobs">none</td>', page, re.S)


# --- cancel and delete from the list, confirmed ----------------------------------------------------------------------


def token_of(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match
    return match.group(1)


def test_delete_from_the_list_asks_first_then_deletes(client: FlaskClient, jobs_app: Flask) -> None:
    job = api_job(client, name="to delete", max_iter=2)
    ended(client, job["id"])
    listing = client.get(PAGES).get_data(as_text=True)
    row = re.search(rf'<tr data-job-id="{job["id"]}".*?</tr>', listing, re.S)
    assert row, listing
    action = f'action="{PAGES}/{job["id"]}/confirm/delete"'
    assert action in row.group(0) and ">Delete</button>" in row.group(0)
    token = token_of(row.group(0))
    asked = client.post(f"{PAGES}/{job['id']}/confirm/delete", data={"csrf_token": token})
    assert asked.status_code == 200
    question = asked.get_data(as_text=True)
    assert "Delete the job “to delete”?" in question and 'name="confirmed" value="yes"' in question
    assert client.get(f"{API}/{job['id']}").status_code == 200  # nothing deleted by the first post
    folder = Path(jobs_app.config["MEMPLUGIN_DATA_DIR"]) / "jobs" / job["id"]
    refused = client.post(f"{PAGES}/{job['id']}/confirm/delete", data={"confirmed": "yes"})
    assert refused.status_code == 400 and "The job was not deleted" in refused.get_data(as_text=True)
    assert folder.is_dir()
    done = client.post(f"{PAGES}/{job['id']}/confirm/delete", data={"csrf_token": token_of(question), "confirmed": "yes"})
    assert done.status_code == 303 and done.headers["Location"] == PAGES
    assert client.get(f"{API}/{job['id']}").status_code == 404 and not folder.exists()


def test_cancel_from_the_list_asks_first_and_a_running_job_is_not_deleted(client: FlaskClient) -> None:
    job = api_job(client, name="to cancel", max_iter=100_000)
    try:
        wait_for(lambda: client.get(f"{API}/{job['id']}").get_json()["status"] == "running", timeout=60,
                 what="the job to run")
        listing = client.get(PAGES).get_data(as_text=True)
        row = re.search(rf'<tr data-job-id="{job["id"]}".*?</tr>', listing, re.S)
        assert row and ">Cancel</button>" in row.group(0) and "/confirm/cancel" in row.group(0)
        token = token_of(listing)
        busy = client.post(f"{PAGES}/{job['id']}/confirm/delete", data={"csrf_token": token, "confirmed": "yes"})
        assert busy.status_code == 409 and "it is running; cancel it first" in busy.get_data(as_text=True)
        asked = client.post(f"{PAGES}/{job['id']}/confirm/cancel", data={"csrf_token": token})
        assert asked.status_code == 200 and "Cancel the job “to cancel”?" in asked.get_data(as_text=True)
        assert client.get(f"{API}/{job['id']}").get_json()["status"] == "running"
        done = client.post(f"{PAGES}/{job['id']}/confirm/cancel", data={"csrf_token": token, "confirmed": "yes"})
        assert done.status_code == 303 and done.headers["Location"] == PAGES
        assert ended(client, job["id"])["status"] == "cancelled"
    finally:
        client.post(f"{API}/{job['id']}/cancel")
        ended(client, job["id"])
    assert client.post(f"{PAGES}/{job['id']}/confirm/rename", data={"csrf_token": token}).status_code == 404


# --- words explained ---------------------------------------------------------------------------------------------------


def test_the_words_the_issue_names_are_explained_where_they_appear(client: FlaskClient) -> None:
    job = api_job(client, name="terms", max_iter=2)
    ended(client, job["id"])
    devices = client.get("/memplugin/devices").get_data(as_text=True)
    assert re.search(r'memory from <a class="mp-term" href="/memplugin/glossary#term-meminfo" title="[^"]+" '
                     r'data-term="meminfo">meminfo</a>', devices)
    assert 'data-term="cpu">cpu</a>' in devices  # the CPU's engine
    assert 'data-term="reserved">Reserved</a>' in devices
    job_page = client.get(f"{PAGES}/{job['id']}").get_data(as_text=True)
    assert 'data-term="iter_size">iter_size</a>' in job_page
    assert 'data-term="validation_batch">Validation batch</a>' in job_page
    assert 'id="mp-glossary"' in job_page
    listing = client.get(PAGES).get_data(as_text=True)
    assert 'data-term="iter_size">iter_size</a>' in listing
    page = client.get("/memplugin/glossary").get_data(as_text=True)
    for key in ("nvml_v2", "meminfo", "cpu", "gpu", "gpu-cudnn", "iter_size", "host_allocation_failed", "SIGTERM",
                "validation_batch"):
        term = glossary.TERMS[key]
        assert f'id="{term.anchor}"' in page and term.short.replace("'", "&#39;").replace('"', "&#34;") in page
    assert 'href="/memplugin/glossary" id="mp-glossary-link"' in page


def test_an_out_of_memory_attempt_explains_its_signature_and_signal(client: FlaskClient) -> None:
    job = api_job(client, name="capped", max_iter=2, batch=512, memory_cap="64MiB",
                  fallback={"max_attempts": 1, "start": "wanted"})
    ended(client, job["id"])
    document = client.get(f"{API}/{job['id']}").get_json()
    (attempt,) = document["attempts"]
    assert attempt["out_of_memory"], attempt
    signature = attempt["out_of_memory"]["signature"]
    page = client.get(f"{PAGES}/{job['id']}").get_data(as_text=True)
    why = re.search(r'<td data-role="why".*?</td>', page, re.S)
    # The plain words link to the glossary entry of the signature and of the signal (the names stay as titles).
    assert why and f'<a class="mp-term" href="/memplugin/glossary#term-{signature}"' in why.group(0)
    assert f'data-term="{signature}">Out of memory</a>' in why.group(0)
    if attempt["signal"]:
        assert f'data-term="{attempt["signal"]}">{oom.signal_words(attempt["signal"])}</a>' in why.group(0)


def test_the_job_page_offers_the_trained_model_and_each_snapshot(client: FlaskClient) -> None:
    job = api_job(client, name="downloads", max_iter=4)
    ended(client, job["id"])
    page = client.get(f"{PAGES}/{job['id']}").get_data(as_text=True)
    section = re.search(r'<section class="mt-4" id="job-files".*?</section>', page, re.S)
    assert section, page
    assert f'href="{API}/{job["id"]}/model.tar.gz" id="download-model" download' in section.group(0)
    assert "the weights at iteration 4" in section.group(0)
    for iteration in (2, 4):
        assert f'href="{API}/{job["id"]}/snapshots/{iteration}/caffemodel" download>.caffemodel</a>' in section.group(0)
        assert f'href="{API}/{job["id"]}/snapshots/{iteration}/solverstate" download>.solverstate</a>' in section.group(0)


def test_the_job_page_lists_the_latest_twenty_snapshots(client: FlaskClient) -> None:
    job = api_job(client, name="many snapshots", max_iter=24, solver=SHORT_SOLVER.replace("snapshot: 2", "snapshot: 1"))
    ended(client, job["id"])
    assert len(client.get(f"{API}/{job['id']}/snapshots").get_json()["snapshots"]) == 24
    page = client.get(f"{PAGES}/{job['id']}").get_data(as_text=True)
    rows = re.findall(r'<tr data-iteration="(\d+)">', page)
    assert rows == [str(iteration) for iteration in range(5, 25)]
    older = re.search(r'<p class="small text-body-secondary mb-1" id="snapshots-older">(.*?)</p>', page, re.S)
    assert older and "The latest 20 of 24 snapshots" in older.group(1)


def test_a_gpu_process_that_is_one_of_our_attempts_is_marked_with_its_job(
    data_dir: Path, datasets: Path, fake_gpus: FakeNvml, gpus: list[FakeGpu]
) -> None:
    """NVML lists a GPU's processes by pid: the one that is our attempt's child gets its job's name and link (the
    job trains on the CPU here, the pid is what matters; no GPU job can run on this machine)."""
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "TESTING": True})
    try:
        client = app.test_client()
        job = api_job(client, name="on a gpu", max_iter=100_000)
        # Listed from its start, an attempt has its pid once its child runs (None before: seen under load).
        (attempt,) = wait_for(lambda: [a for a in client.get("/memplugin/api/devices/attempts").get_json()["attempts"]
                                       if a["pid"] is not None], timeout=60, what="the attempt's child to start")
        gpus[0].processes.append(FakeProcess(pid=attempt["pid"], name="python", used_memory=1 << 30))
        page = client.get("/memplugin/devices").get_data(as_text=True)
        gpu_row = re.search(rf'<tr data-key="{gpus[0].uuid}">.*?</tr>', page, re.S)
        assert gpu_row, page
        processes = re.search(r'<td data-role="processes">(.*?)</td>', gpu_row.group(0), re.S)
        assert processes
        assert f'{attempt["pid"]} python (1.0 GiB) · <a href="{PAGES}/{job["id"]}">on a gpu</a>' in processes.group(1)
        assert "4242 /usr/bin/python3 (6.0 GiB)</div>" in processes.group(1)  # another's process, unmarked
        client.post(f"{API}/{job['id']}/cancel")
        ended(client, job["id"])
    finally:
        get_plugin(app).close()


def test_every_signal_and_out_of_memory_signature_the_pages_can_show_has_a_glossary_entry() -> None:
    """The Why cells link the attempt's signal and out-of-memory signature to the glossary: each one core/oom.py can
    report (its SIGNAL_WORDS, and the name of each out-of-memory predicate of core/oom_signatures.py it combines)
    has an entry."""
    import inspect

    signatures = {name for name, function in inspect.getmembers(oom_signatures, inspect.isfunction)
                  if function.__module__ == oom_signatures.__name__
                  and re.search(rf'OutOfMemory\(\s*"{name}"', inspect.getsource(function))}
    assert {"cuda_out_of_memory", "host_allocation_failed"} <= signatures
    missing = {name for name in set(oom.SIGNAL_WORDS) | signatures if glossary.find(name) is None}
    assert missing == set()
