"""The test nets apart (issue 28) on the pages, through Flask's test client: the New model form's "Test nets" and
"Tester device" fields (offered, checked field by field, mapped into the job's request by the plain post and the
JSON twin, kept by Clone), the form's preview saying where the plan put the validation nets and why, and the job
page saying, attempt by attempt, where they were (shared; apart with the tester's device, the snapshots it tested,
its memory, what pausing for it cost; a tester that failed) and what "replanned" means. Jobs train LeNet on the CPU
for real, briefly; an attempt's every branch is also drawn from a made-up attempt row."""

from __future__ import annotations

import html
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, render_template_string
from flask.testing import FlaskClient
from test_jobs_fixtures import wait_for, write_lmdb
from test_pages_digits import ended, form_values

from digits_memplugin.core.oom import OutcomeStatus
from digits_memplugin.devices.fake_nvml import FakeNvml
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.jobs.scheduling import apart_run
from digits_memplugin.web.pages import glossary

FORM_URL = "/memplugin/models/new"
JSON_URL = "/memplugin/models.json"
PREVIEW_URL = "/memplugin/models/preview.json"
TRAIN_DB = "apart_train_lmdb"
VAL_DB = "apart_val_lmdb"
JOB = {
    "model_name": "lenet-apart", "train_source": TRAIN_DB, "val_source": VAL_DB, "device": "cpu", "batch_size": 24,
    "max_iter": 4, "test_interval": 2, "test_iter": 2, "snapshot": 0, "lr_policy": "fixed",
}
"""The standard LeNet from the JSON twin: 4 iterations on the CPU, validated every 2 (so tested at 0, 2 and 4)."""


@pytest.fixture
def datasets(app: Flask, data_dir: Path) -> Path:
    """LMDBs in the app's dataset root: 100 items to train on and 8 to validate on (a validation pass of 2 x 32
    items reads them a whole number of times)."""
    root = data_dir / "datasets"
    root.mkdir(parents=True, exist_ok=True)
    write_lmdb(root / TRAIN_DB, records=100)
    write_lmdb(root / VAL_DB, records=8)
    return root


def options(page: str, name: str) -> list[tuple[str, bool, bool]]:
    """A select's options: (value, selected, disabled)."""
    select = re.search(rf'<select[^>]*name="{name}"[^>]*>(.*?)</select>', page, re.S)
    assert select, f"no select {name}"
    found = []
    for attributes in re.findall(r"<option([^>]*)>", select.group(1)):
        value = re.search(r'value="([^"]*)"', attributes)
        assert value, attributes
        found.append((html.unescape(value.group(1)), bool(re.search(r"\bselected\b", attributes)),
                      bool(re.search(r"\bdisabled\b", attributes))))
    return found


def text_of(fragment: str) -> str:
    """What a reader sees of an HTML fragment: its text, spaces folded."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", fragment))).strip()


def cell(page: str, role: str, attempt: int | None = None) -> str:
    """The text of an attempt row's cell (or of the summary's, without `attempt`)."""
    if attempt is None:
        found = re.search(rf'<dd[^>]*data-role="{role}"[^>]*>(.*?)</dd>', page, re.S)
    else:
        row = re.search(rf'<tr data-attempt="{attempt}".*?</tr>', page, re.S)
        assert row, f"no row of attempt {attempt}"
        found = re.search(rf'<td data-role="{role}"[^>]*>(.*?)</td>', row.group(0), re.S)
    assert found, f"no {role} cell"
    return text_of(found.group(1))


# --- the form ------------------------------------------------------------------------------------------------------


def test_the_form_offers_where_the_test_nets_live_and_where_the_tester_runs(
    fake_gpus: FakeNvml, client: FlaskClient,
) -> None:
    page = client.get(FORM_URL).text
    assert options(page, "test_net") == [("auto", True, False), ("shared", False, False), ("apart", False, False)]
    uuids = [gpu.uuid for gpu in fake_gpus.gpus]
    assert [value for value, _, _ in options(page, "tester_device")] == ["auto", "same", "cpu", *uuids]
    assert options(page, "tester_device")[0][1], "auto is the tester device's default"
    assert "a tester process tests each validation interval&#39;s snapshot" in page
    for name in ("test_net", "tester_device"):  # drawn as the device field is, a select with its arrow
        tag = re.search(rf'<select[^>]*name="{name}"[^>]*>', page)
        assert tag and 'class="form-select' in tag.group(0), tag
    assert 'id="test-net-note"' in page
    # Read by a browser without JavaScript: the fields come after the device, before the name (the order errors
    # are focused in).
    assert page.index('name="device"') < page.index('name="test_net"') < page.index('name="tester_device"') < (
        page.index('name="model_name"'))


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"test_net": "elsewhere"}, "test_net", '\'elsewhere\' is not one of "auto", "shared", "apart"'),
        ({"tester_device": "GPU-nope"}, "tester_device", '\'GPU-nope\' is not one of "auto", "same", "cpu"'),
        ({"test_net": "shared", "tester_device": "cpu"}, "tester_device", "give test_net 'apart' or 'auto' with it"),
    ],
)
def test_the_two_fields_are_refused_by_name(
    client: FlaskClient, datasets: Path, fields: dict[str, str], field: str, message: str,
) -> None:
    for url in (JSON_URL, PREVIEW_URL):
        response = client.post(url, json={**JOB, **fields})
        assert response.status_code == 400, response.get_json()
        errors = response.get_json()["errors"]
        assert list(errors) == [field] and message in errors[field], errors


def test_a_tester_on_a_simulated_gpu_is_refused_beside_its_field(
    fake_gpus: FakeNvml, client: FlaskClient, datasets: Path,
) -> None:
    response = client.post(JSON_URL, json={**JOB, "test_net": "apart", "tester_device": fake_gpus.gpus[1].uuid})
    assert response.status_code == 400
    assert "simulated" in response.get_json()["errors"]["tester_device"]


def test_the_preview_says_where_the_plan_puts_the_test_nets_and_why(client: FlaskClient, datasets: Path) -> None:
    apart = client.post(PREVIEW_URL, json={**JOB, "test_net": "apart", "tester_device": "same"}).get_json()
    assert apart["test_net"] == "apart" and apart["tester_device"] is None  # None: the trainer's own device
    assert apart["tester_bytes"] > 0
    shared = client.post(PREVIEW_URL, json={**JOB, "test_net": "shared"}).get_json()
    assert (shared["test_net"], shared["tester_bytes"], shared["test_net_note"]) == ("shared", None, None)
    # Apart, the train net is planned alone: less memory at the same batch.
    assert apart["plan"]["batch_size"] == shared["plan"]["batch_size"] == 24
    assert apart["plan"]["bytes"] < shared["plan"]["bytes"]
    # Auto: the planner chose, and says why (LeNet at 24 fits either way: apart does not pay).
    auto = client.post(PREVIEW_URL, json=JOB).get_json()
    assert auto["test_net"] == "shared" and auto["test_net_note"].startswith("test nets shared: apart does not pay")


def test_auto_without_javascript_says_where_the_test_nets_are(
    client: FlaskClient, datasets: Path,
) -> None:
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', client.get(FORM_URL).text)
    assert token
    values = form_values(client.get(FORM_URL).text)
    values.update({key: str(value) for key, value in JOB.items()}, test_net="apart", tester_device="same",
                  action="suggest", csrf_token=token.group(1))
    page = client.post("/memplugin/models", data=values)
    assert page.status_code == 200, page.text[:2000]
    note = text_of(re.search(r'id="test-net-note"[^>]*>(.*?)</div>', page.text, re.S).group(1))  # type: ignore[union-attr]
    assert re.fullmatch(r"Test nets apart: the tester on CPU \(training pauses meanwhile\), about [\d.]+ [KM]iB\.",
                        note), note
    values["test_net"] = "auto"
    auto = client.post("/memplugin/models", data=values).text
    note = text_of(re.search(r'id="test-net-note"[^>]*>(.*?)</div>', auto, re.S).group(1))  # type: ignore[union-attr]
    assert note.startswith("Test nets shared. Apart does not pay (apart trains"), note


# --- the job, its page and its clone --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_job_apart_keeps_its_choice_shows_its_tester_and_clones(
    app: Flask, client: FlaskClient, datasets: Path,
) -> None:
    created = client.post(JSON_URL, json={**JOB, "test_net": "apart", "tester_device": "same"})
    assert created.status_code == 201, created.get_json()
    job = ended(client, created.get_json()["id"])
    assert job["status"] == "done", job["message"]
    stored = get_plugin(app).jobs.get(job["id"]).spec
    assert (stored["test_net"], stored["tester_device"]) == ("apart", "same")

    page = client.get(f"/memplugin/jobs/{job['id']}").text
    words = cell(page, "test-net", attempt=1)
    assert re.fullmatch(
        r"apart: tester on CPU \(the training device: training paused 2 times for it\) 3 snapshots tested "
        r"\(the latest at iteration 4\) tester estimated [\d.]+ [KM]iB tester peak [\d.]+ [KM]iB "
        r"stop cost [\d.]+% of an interval", words), words
    assert cell(page, "test-net") == (  # the summary: where the tester ran, and what the job asked
        "apart: tester on CPU (the training device: training paused 2 times for it) asked: apart, tester on the "
        "training device")
    assert 'href="/memplugin/glossary#term-apart"' in page

    # Clone: the request keeps both fields, the form is filled in with them, and posting it asks the same.
    request = client.get(f"/memplugin/api/jobs/{job['id']}/request").get_json()
    assert (request["test_net"], request["tester_device"]) == ("apart", "same")
    form = client.get(f"{FORM_URL}?clone={job['id']}").text
    assert ("apart", True, False) in options(form, "test_net")
    assert ("same", True, False) in options(form, "tester_device")
    values = form_values(form)
    posted = client.post("/memplugin/models", data=values)
    assert posted.status_code == 303, posted.text[:2000]
    clone_id = posted.headers["Location"].rsplit("/", 1)[1]
    assert client.get(f"/memplugin/api/jobs/{clone_id}/request").get_json() == request
    ended(client, clone_id)


@pytest.mark.slow
def test_a_job_shared_says_so_and_its_clone_asks_shared_again(client: FlaskClient, datasets: Path) -> None:
    job = ended(client, client.post(JSON_URL, json={**JOB, "test_net": "shared"}).get_json()["id"])
    page = client.get(f"/memplugin/jobs/{job['id']}").text
    assert cell(page, "test-net", attempt=1) == "shared"
    assert cell(page, "test-net") == "shared asked: shared"
    request = client.get(f"/memplugin/api/jobs/{job['id']}/request").get_json()
    assert request["test_net"] == "shared" and "tester_device" not in request  # auto: the server's default
    assert ("shared", True, False) in options(client.get(f"{FORM_URL}?clone={job['id']}").text, "test_net")
    # A job left to the planner keeps its request as it was: "auto" is the default, left out.
    auto = ended(client, client.post(JSON_URL, json=JOB).get_json()["id"])
    assert "test_net" not in client.get(f"/memplugin/api/jobs/{auto['id']}/request").get_json()
    assert ("auto", True, False) in options(client.get(f"{FORM_URL}?clone={auto['id']}").text, "test_net")


# --- an attempt's every branch, as the job page draws it --------------------------------------------------------------


ATTEMPT: dict[str, Any] = {
    "number": 2, "status": "replanned", "device": "cpu", "batch_size": 64, "iter_size": 1, "effective_batch": 64,
    "test_batch_size": 100, "test_iter": 2, "start_iteration": 0, "end_iteration": 20, "started_at": 0.0,
    "finished_at": 30.0, "duration": 30.0, "log": "attempts/2/caffe.log", "limit_bytes": 1 << 30,
    "estimated_bytes": 50 << 20, "peak_bytes": 60 << 20, "allocated_bytes": 55 << 20,
    "message": "replanned at iteration 20: stopping and resuming for the tester costs 1.4 s per test interval",
    "test_net": "apart", "signal": None, "out_of_memory": None, "exit_code": 0,
    "tester": {"device": "cpu", "same_device": True, "estimated_bytes": 6 << 20, "peak_bytes": 7 << 20,
               "tested": [0, 10, 20], "pauses": 2, "setup_seconds": 1.4, "interval_seconds": 20.0,
               "stop_cost": 0.07, "failed": None},
}
"""A made-up attempt row (as GET api/jobs/<id> lists it) with every figure of a tester."""


def attempt_row(app: Flask, attempt: dict[str, Any], labels: dict[str, str] | None = None) -> str:
    with app.test_request_context("/"):
        return render_template_string(
            '{% import "memplugin/macros.html" as m with context %}{{ m.attempt_row(attempt) }}',
            attempt=attempt, labels=labels or {"cpu": "CPU", "GPU-b": "GPU 1: TITAN"},
        )


def test_an_attempt_apart_says_where_its_tester_ran_what_it_did_and_cost(app: Flask) -> None:
    row = attempt_row(app, ATTEMPT)
    assert cell(row, "test-net", 2) == (
        "apart: tester on CPU (the training device: training paused 2 times for it) 3 snapshots tested (the latest at "
        "iteration 20) tester estimated 6.0 MiB tester peak 7.0 MiB stop cost 7.0% of an interval"
    )
    assert ('title="Pausing training for the tester and resuming it (1.4 s), against the training time of one '
            'validation interval (20.0 s)"') in row
    # On another device, with little known yet: only what the record says.
    other = {**ATTEMPT, "tester": {"device": "GPU-b", "same_device": False, "estimated_bytes": None,
                                   "peak_bytes": None, "tested": [], "pauses": 0, "setup_seconds": None,
                                   "interval_seconds": None, "stop_cost": None, "failed": None}}
    assert cell(attempt_row(app, other), "test-net", 2) == "apart: tester on GPU 1: TITAN 0 snapshots tested"


RUNNING_BEFORE = {**ATTEMPT, "status": "running", "finished_at": None, "duration": None, "end_iteration": None,
                  "tester": {"device": "cpu", "estimated_bytes": 6 << 20, "same_device": True}}
"""A running apart attempt's row as the version of 2026-12-07 stored it (only where the tester was to run): a job
page drawn while an attempt so stored runs, or after a server stopped during it, answered 500."""


def test_a_running_attempt_apart_is_drawn_from_what_its_row_has_so_far(app: Flask) -> None:
    # As attempt_loop stores it now:
    started = {**RUNNING_BEFORE, "tester": apart_run.TesterReport("cpu", True, 6 << 20).to_json()}
    for attempt in (started, RUNNING_BEFORE):
        assert cell(attempt_row(app, attempt), "test-net", 2) == (
            "apart: tester on CPU (the training device) 0 snapshots tested tester estimated 6.0 MiB")
        assert summary_words(app, attempt) == "apart: tester on CPU (the training device)"


def test_a_job_page_drawn_while_its_attempt_apart_runs_says_where_the_tester_is(
    client: FlaskClient, datasets: Path,
) -> None:
    job_id = client.post(JSON_URL, json={**JOB, "test_net": "apart", "tester_device": "same"}).get_json()["id"]
    running = wait_for(lambda: next((a for a in client.get(f"/memplugin/api/jobs/{job_id}").get_json()["attempts"]
                                     if a["status"] == "running"), None), timeout=60, what="a running attempt")
    assert running["tester"] == apart_run.TesterReport("cpu", True, running["tester"]["estimated_bytes"]).to_json()
    page = client.get(f"/memplugin/jobs/{job_id}")  # while it runs (or, if it has just ended, after)
    assert page.status_code == 200
    assert cell(page.text, "test-net", attempt=1).startswith("apart: tester on CPU (the training device")
    assert ended(client, job_id)["status"] == "done"


def summary_words(app: Flask, attempt: dict[str, Any], labels: dict[str, str] | None = None) -> str:
    """The job summary's words for its latest attempt's test nets, as the server draws them."""
    with app.test_request_context("/"):
        return text_of(render_template_string(
            '{% import "memplugin/macros.html" as m with context %}{{ m.test_nets(attempt, labels, brief=True) }}',
            attempt=attempt, labels=labels or {"cpu": "CPU", "GPU-b": "GPU 1: TITAN"},
        ))


def test_a_tester_that_failed_is_said_plainly(app: Flask) -> None:
    failed = {**ATTEMPT, "status": "failed", "message": "the tester of iteration 10 failed: ...",
              "tester": {**ATTEMPT["tester"], "tested": [0], "failed": "tester: Check failed: data (common.cpp:70)"}}
    row = attempt_row(app, failed)
    assert "The tester failed: Check failed: data (common.cpp:70)" in cell(row, "test-net", 2)
    assert re.search(r'<span data-role="tester-failed" class="text-danger">The tester failed: ', row)
    assert summary_words(app, failed) == ("apart: tester on CPU (the training device: training paused 2 times for "
                                          "it) The tester failed: Check failed: data (common.cpp:70)")


def test_shared_none_and_rows_stored_before_the_choice(app: Flask) -> None:
    shared = {**ATTEMPT, "status": "success", "test_net": "shared", "tester": None}
    assert cell(attempt_row(app, shared), "test-net", 2) == "shared"
    old = {**shared, "test_net": None}  # stored before the choice existed: Caffe's way, shared
    assert cell(attempt_row(app, old), "test-net", 2) == "shared"
    unvalidated = {**old, "test_batch_size": None, "test_iter": None}
    assert cell(attempt_row(app, unvalidated), "test-net", 2) == "none"


def test_replanned_reads_in_words_and_every_outcome_has_them(app: Flask) -> None:
    row = attempt_row(app, ATTEMPT)
    badge = re.search(r'<span class="badge mp-status mp-status-replanned"[^>]*title="([^"]+)"[^>]*>replanned</span>', row)
    assert badge and "stopped on purpose after a snapshot" in html.unescape(badge.group(1))
    for status in typing.get_args(OutcomeStatus):
        entry = glossary.outcome(status)
        assert entry is not None and entry.short, status
    page = app.test_client().get("/memplugin/glossary").text
    assert 'id="term-outcome_replanned"' in page and 'id="term-apart"' in page and 'id="term-tester"' in page
