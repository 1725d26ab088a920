"""The test nets apart (issue 28) in a real browser: a LeNet job trained on the CPU with its test nets apart (a tester
child per validation interval's snapshot, the trainer paused for it) shows its validation results on its page exactly
as the same training with them shared does (the same values at the same iterations, on the chart and in the
summary), live as the testers report and again after a reload; the attempt says where its test nets were, in the
same words the server draws; the New model form's "Test nets" and "Tester device" reach the job.

The jobs train the same weights: a seeded solver, a training set of 100 items at batch 24 (the trainer resumed after
each pause skips its data to where it was) and a validation pass of 2 x 32 over 8 items (whole passes, so a tester
starting at the first item reads what the shared test net reads): tests/test_jobs_apart.py holds the training to
the bit. The tester runs on the trainer's device ("same"): the server's GPUs are simulated.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from browser_fixtures import Server, watched_page
from flask import Flask
from playwright.sync_api import Browser, Page, expect
from test_jobs_fixtures import write_lmdb
from test_pages_apart import ATTEMPT, RUNNING_BEFORE, attempt_row, cell, summary_words

from digits_memplugin import create_app
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.jobs.scheduling import apart_run

pytestmark = pytest.mark.slow
pytest_plugins = ["browser_fixtures"]

TRAIN_DB = "apart_train_lmdb"
VAL_DB = "apart_val_lmdb"
K = 4
"""The validation interval (and snapshot interval) of the jobs here: tested at 0, K, 2K and 3K."""
SOLVER = f"""random_seed: 7
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 1
max_iter: {3 * K}
snapshot: {K}
test_iter: 2
test_interval: {K}
train_state {{ stage: "train" }}
test_state {{ stage: "val" }}
"""
"""DIGITS' stages for the standard LeNet's train and val data layers; seeded, so both jobs start from one set of
weights."""
TRAINING = 120_000
SERIES = """() => [...MemPlugin.jobPage.chart.data.datasets, ...MemPlugin.jobPage.lrChart.data.datasets]
    .map((d) => ({label: d.label, points: d.data.map((p) => [p.x, p.y])}))"""
"""Every series of a job page's charts, by label, as Chart.js holds them."""


@pytest.fixture(scope="module")
def datasets(server: Server) -> None:
    """The jobs' datasets in the served app's dataset root, beside the fixture's own (it scans at each request)."""
    root = server.data_dir / "datasets"
    write_lmdb(root / TRAIN_DB, records=100)
    write_lmdb(root / VAL_DB, records=8)


def twin(server: Server, **fields: Any) -> dict[str, Any]:
    """A LeNet job through the New model form's JSON twin, on the CPU, at batch 24 with the seeded solver."""
    body = {
        "model_name": "lenet", "standard_network": "lenet", "train_source": TRAIN_DB, "val_source": VAL_DB,
        "device": "cpu", "batch_size": 24, "solver": "file", "solver_text": SOLVER, **fields,
    }
    response = requests.post(server.base_url + "memplugin/models.json", json=body, timeout=60)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def charts(page: Page) -> dict[str, list[list[float]]]:
    return {series["label"]: series["points"] for series in page.evaluate(SERIES)}


def validation(page: Page) -> dict[str, list[list[float]]]:
    return {label: points for label, points in charts(page).items() if label.startswith("validation")}


def wait_tested(page: Page, count: int) -> None:
    """Until the page's validation accuracy has `count` points."""
    page.wait_for_function(
        f"""() => {{ const found = ({SERIES})().find((s) => s.label === "validation accuracy");
                   return found !== undefined && found.points.length === {count}; }}""",
        timeout=TRAINING,
    )


@pytest.fixture
def second(browser: Browser) -> Iterator[Page]:
    """Another tab, failing the test on any script error."""
    with watched_page(browser) as page:
        yield page


def test_a_job_with_its_test_nets_apart_shows_the_results_the_shared_job_shows(
    page: Page, second: Page, server: Server, datasets: None,
) -> None:
    shared = twin(server, model_name="lenet shared", test_net="shared")
    assert server.ended(shared["id"])["status"] == "done"
    apart = twin(server, model_name="lenet apart", test_net="apart", tester_device="same")
    # The apart job's page, open while it trains: its validation results come live, from its testers.
    page.goto(server.job_url(apart["id"]))
    expect(page.locator("#mp-connection")).to_have_text("live", timeout=30_000)
    expect(page.locator("#job-status")).to_have_text("done", timeout=TRAINING)
    wait_tested(page, 4)
    document = server.job(apart["id"])
    (attempt,) = document["attempts"]
    assert attempt["test_net"] == "apart" and attempt["tester"]["tested"] == [0, K, 2 * K, 3 * K]
    assert attempt["tester"]["pauses"] == 3  # trained as the shared job did, with three pauses for its tester

    second.goto(server.job_url(shared["id"]))
    expect(second.locator("#job-status")).to_have_text("done")
    wait_tested(second, 4)
    expected = validation(second)
    assert [x for x, _ in expected["validation accuracy"]] == [0, K, 2 * K, 3 * K]
    assert set(expected) == {"validation accuracy", "validation loss"}
    live = validation(page)
    assert live == expected
    assert charts(page)["train loss"] == charts(second)["train loss"]
    summary = '#job-summary [data-role="test"]'
    expect(page.locator(summary)).to_have_text(second.locator(summary).inner_text())
    assert re.fullmatch(r"accuracy [\d.]+, loss [\d.]+ \(iteration 12\)", second.locator(summary).inner_text())

    # After a reload the chart is drawn from the history (GET .../progress, the testers' records with the
    # runner's), and the server's first paint of the summary says the same.
    page.reload()
    expect(page.locator(summary)).to_have_text(second.locator(summary).inner_text())
    wait_tested(page, 4)
    assert validation(page) == expected

    # Where the test nets were: said in the attempt's row and the summary.
    row = page.locator('#attempts tr[data-attempt="1"] [data-role="test-net"]')
    expect(row).to_have_text(re.compile(
        r"^apart: tester on CPU \(the training device: training paused 3 times for it\) 4 snapshots tested "
        r"\(the latest at iteration 12\) tester estimated [\d.]+ [KM]iB tester peak [\d.]+ [KM]iB "
        r"stop cost [\d.]+% of an interval$"))
    expect(page.locator('#job-summary [data-role="test-net"]')).to_contain_text("asked: apart, tester on the training device")
    expect(second.locator('#attempts tr[data-attempt="1"] [data-role="test-net"]')).to_have_text("shared")


@pytest.fixture(scope="module")
def pages_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    """An app in this process, to draw an attempt's row as the server draws it."""
    app = create_app({"MEMPLUGIN_DATA_DIR": tmp_path_factory.mktemp("rows") / "data",
                      "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True})
    yield app
    get_plugin(app).close()


ROWS = {
    "same device": ATTEMPT,
    "another device": {**ATTEMPT, "tester": {**ATTEMPT["tester"], "device": "GPU-b", "same_device": False,
                                             "pauses": 0, "setup_seconds": None, "interval_seconds": None,
                                             "stop_cost": None, "peak_bytes": None}},
    "failed": {**ATTEMPT, "status": "failed", "tester": {**ATTEMPT["tester"], "failed": "tester: it broke"}},
    "running": {**RUNNING_BEFORE, "tester": apart_run.TesterReport("cpu", True, 6 << 20).to_json()},
    "running, stored before 2026-12-07": RUNNING_BEFORE,
    "shared": {**ATTEMPT, "status": "success", "test_net": "shared", "tester": None},
    "before the choice": {**ATTEMPT, "status": "out_of_memory", "test_net": None, "tester": None},
    "no validation": {**ATTEMPT, "test_net": None, "tester": None, "test_batch_size": None, "test_iter": None},
}


def test_the_script_draws_an_attempts_test_nets_as_the_server_does(
    page: Page, server: Server, datasets: None, pages_app: Flask,
) -> None:
    page.goto(server.jobs_url)
    labels = {"cpu": "CPU", "GPU-b": "GPU 1: TITAN"}
    for name, attempt in ROWS.items():
        drawn = page.evaluate(
            """([attempt, labels]) => {
                 const row = MemPlugin.JobFormat.attemptRow(attempt, labels);
                 const cell = row.querySelector('[data-role="test-net"]');
                 const brief = MemPlugin.el("div", {}, ...MemPlugin.JobFormat.testNetParts(attempt, labels, true));
                 return {text: cell.textContent.replace(/\\s+/g, " ").trim(),
                         brief: brief.textContent.replace(/\\s+/g, " ").trim(),
                         title: row.querySelector('[data-role="status"] span').title};
               }""",
            [attempt, labels],
        )
        served = attempt_row(pages_app, attempt, labels)
        assert drawn["text"] == cell(served, "test-net", 2), name
        assert drawn["brief"] == summary_words(pages_app, attempt, labels), name  # the summary's
        title = re.search(r'<td data-role="status"><span[^>]*?(?: title="([^"]*)")?>', served)
        assert title is not None
        assert drawn["title"] == (title.group(1) or "").replace("&#39;", "'"), name
    assert "stopped on purpose" in page.evaluate("MemPlugin.JobFormat.outcomeWords('replanned')")


def test_the_form_asks_where_the_test_nets_live_and_the_job_gets_it(
    page: Page, server: Server, datasets: None, tmp_path: Path,
) -> None:
    page.goto(server.form_url)
    expect(page.locator("#mp-connection")).to_have_text("live", timeout=30_000)
    tester = page.locator("#tester_device")
    expect(page.locator("#test_net")).to_have_value("auto")
    expect(tester).to_be_enabled()
    page.select_option("#test_net", "shared")
    expect(tester).to_be_disabled()  # shared: no tester to place (a disabled field posts nothing: auto)
    page.select_option("#test_net", "apart")
    expect(tester).to_be_enabled()
    page.select_option("#tester_device", "same")
    page.fill("#train_source", TRAIN_DB)
    page.fill("#val_source", VAL_DB)
    page.fill("#batch_size", "24")
    page.fill("#max_iter", "4")
    page.fill("#test_interval", "2")
    page.fill("#test_iter", "2")
    page.select_option("#device", "cpu")
    # The plan on the CPU, estimated with the form's choice: apart, the tester there, paused for.
    expect(page.locator("#test-net-note")).to_have_text(
        re.compile(r"^Test nets apart: the tester on CPU \(training pauses meanwhile\), about [\d.]+ [KM]iB\."),
        timeout=30_000)
    page.fill("#model_name", "lenet from the form")
    page.click("#create-model")
    expect(page).to_have_url(re.compile(r"/memplugin/jobs/[\w-]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    request = server.api(f"jobs/{job_id}/request")
    assert (request["test_net"], request["tester_device"]) == ("apart", "same")
    expect(page.locator('#job-summary [data-role="test-net"]')).to_contain_text("asked: apart, tester on the training device")
    assert server.ended(job_id)["status"] == "done"
