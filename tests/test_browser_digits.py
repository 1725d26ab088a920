"""What a DIGITS user looks for (issue 26, point 10), in a real browser (Debian's Chromium through Playwright) at
1280 px and on a 375 px phone: the trained model and its snapshots downloaded from the job page (and the section
growing live as the job writes snapshots), Clone opening the New model form filled in (with JavaScript and without),
the Devices page listing the job that trains on the CPU (live), Cancel and Delete from the jobs list asked first (a
dialog; a page of its own without JavaScript), the jobs list readable on a phone, and words explained where they
appear.

The server is browser_fixtures.py's `digits-memplugin serve --simulate-gpus 2x24GiB`: jobs train LeNet on the CPU
with real pycaffe children, one at a time, so every test leaves no job running.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from browser_fixtures import TRAIN_DB, VAL_DB, Server, watch
from playwright.sync_api import Browser, Page, ViewportSize, expect
from test_jobs_fixtures import wait_for

from digits_memplugin.jobs.store.records import FINAL_STATES

pytestmark = pytest.mark.slow
pytest_plugins = ["browser_fixtures"]

DESKTOP: ViewportSize = {"width": 1280, "height": 900}
PHONE: ViewportSize = {"width": 375, "height": 667}
WIDTHS = [pytest.param(DESKTOP, id="1280px"), pytest.param(PHONE, id="375px")]
TRAINING = 60_000


def twin(server: Server, **fields: Any) -> dict[str, Any]:
    """A job made by the New model form's JSON twin: LeNet on the CPU, validating every 20 iterations."""
    body = {
        "model_name": "lenet", "train_source": TRAIN_DB, "val_source": VAL_DB, "device": "cpu", "lr_policy": "fixed",
        "max_iter": 100_000, "test_interval": 20, "test_iter": 2, "snapshot": 0, "batch_size": 16, **fields,
    }
    response = requests.post(server.base_url + "memplugin/models.json", json=body, timeout=60)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def stop(server: Server, job_id: str) -> None:
    """Leave the CPU free for the next test: cancel the job if it still trains, and wait for its end."""
    response = server.request("GET", f"jobs/{job_id}")
    if response.status_code != 200:
        return
    if response.json()["status"] not in FINAL_STATES:
        server.request("POST", f"jobs/{job_id}/cancel")
    server.ended(job_id)


@pytest.fixture
def at(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page at the width the test is parametrized with (a phone's with touch), failing on any script error."""
    viewport: ViewportSize = getattr(request, "param", DESKTOP)
    phone = viewport["width"] < 576
    context = browser.new_context(viewport=viewport, is_mobile=phone, has_touch=phone, accept_downloads=True)
    page = context.new_page()
    errors = watch(page)
    yield page
    context.close()
    assert not errors, errors


def live(page: Page, url: str) -> None:
    page.goto(url)
    expect(page.locator("#mp-connection")).to_have_text("live", timeout=20_000)


def on_screen(page: Page, selector: str) -> dict[str, float]:
    """The element's box, asserted to lie within the viewport's width."""
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    width = page.viewport_size["width"] if page.viewport_size else 0
    assert box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, (selector, box, width)
    return box


# --- downloads ---------------------------------------------------------------------------------------------------


def test_the_trained_model_is_downloaded_from_the_job_page_and_snapshots_appear_live(at: Page, server: Server) -> None:
    job = twin(server, model_name="downloads", snapshot=40)
    try:
        live(at, server.job_url(job["id"]))
        rows = at.locator("#snapshots tbody tr")
        # Snapshots arrive while the page is open: the section grows without a reload.
        expect(rows).not_to_have_count(0, timeout=TRAINING)
        expect(at.locator("#download-model")).to_be_visible()
        first = int(rows.first.get_attribute("data-iteration") or "0")
        assert first == 40
        expect(rows.nth(1)).to_be_attached(timeout=TRAINING)  # a second one at least: a fast machine writes several
        server.request("POST", f"jobs/{job['id']}/cancel")
        server.ended(job["id"])
        snapshots = server.data_dir / "jobs" / job["id"] / "snapshots"
        with at.expect_download() as caught:
            rows.first.locator('[data-role="caffemodel"] a').click()
        download = caught.value
        assert download.suggested_filename == "snapshot_iter_40.caffemodel"
        assert Path(download.path()).read_bytes() == (snapshots / "snapshot_iter_40.caffemodel").read_bytes()
        at.reload()
        expect(at.locator("#download-model")).to_be_visible()
        with at.expect_download() as caught:
            at.click("#download-model")
        latest = max(int(r.get_attribute("data-iteration") or 0) for r in rows.all())
        assert caught.value.suggested_filename == f"downloads_iter_{latest}.tar.gz"
        on_screen(at, "#download-model")
    finally:
        stop(server, job["id"])


# --- clone ---------------------------------------------------------------------------------------------------------


CLONED = {"lr_policy": "step", "stepsize": "30", "gamma": "0.5", "base_lr": "0.02", "max_iter": "40",
          "test_interval": "20", "test_iter": "2", "snapshot": "20", "batch_size": "16", "model_name": "to clone"}


@pytest.mark.parametrize("scripts", [True, False], ids=["javascript", "no-javascript"])
def test_clone_opens_the_form_filled_in_and_create_makes_the_same_job(
    browser: Browser, server: Server, scripts: bool
) -> None:
    job = twin(server, **CLONED)
    server.ended(job["id"])
    context = browser.new_context(viewport=DESKTOP, java_script_enabled=scripts)
    page = context.new_page()
    errors = watch(page)
    created = None
    try:
        page.goto(server.job_url(job["id"]))
        page.click("#clone-job")
        expect(page).to_have_url(re.compile(rf"/memplugin/models/new\?clone={job['id']}$"))
        expect(page.locator("#clone-note")).to_contain_text("to clone")
        if scripts:
            expect(page.locator("#mp-connection")).to_have_text("live", timeout=20_000)
        for field, value in CLONED.items():
            expect(page.locator(f"#{field}")).to_have_value(value)
        expect(page.locator("#train_source")).to_have_value(TRAIN_DB)
        expect(page.locator("#val_source")).to_have_value(VAL_DB)
        expect(page.locator("#device")).to_have_value("cpu")
        expect(page.locator('input[name="standard_network"][value="lenet"]')).to_be_checked()
        page.fill("#model_name", "the clone")
        page.click("#create-model")
        expect(page).to_have_url(re.compile(r"/memplugin/jobs/\d{8}-\d{6}-[0-9a-f]{6}$"), timeout=30_000)
        created = page.url.rsplit("/", 1)[1]
        assert created != job["id"]
        first = server.api(f"jobs/{job['id']}/request")
        second = server.api(f"jobs/{created}/request")
        assert second == {**first, "name": "the clone"}
        assert not errors, errors
    finally:
        context.close()
        if created:
            stop(server, created)


# --- the Devices page ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("at", WIDTHS, indirect=True)
def test_the_devices_page_lists_the_job_training_on_the_cpu_live(at: Page, server: Server) -> None:
    live(at, server.base_url + "memplugin/devices")
    jobs = at.locator('#device-rows tr[data-key="cpu"] [data-role="jobs"]')
    expect(jobs).to_have_text("none")
    job = twin(server, model_name="on the cpu")
    try:
        link = jobs.locator(".mp-device-job > a")
        expect(link).to_have_text("on the cpu", timeout=TRAINING)  # no reload: the jobs room said it started
        expect(jobs).to_contain_text("attempt 1 · batch 16 × iter_size 1 · pid ")
        # Still there after the devices' next reading redraws the rows.
        reads = int(at.evaluate("Number(document.body.dataset.devicesRead || 0)"))
        at.wait_for_function(f"Number(document.body.dataset.devicesRead || 0) > {reads}")
        expect(link).to_have_text("on the cpu")
        expect(at.locator('#device-rows tr[data-key="cpu"] [data-role="processes"] span')).to_have_attribute(
            "title", re.compile("NVML lists the processes of GPUs only"))
        if at.viewport_size and at.viewport_size["width"] < 576:
            jobs.scroll_into_view_if_needed()
        link.click()
        expect(at).to_have_url(server.job_url(job["id"]))
        at.go_back()
        expect(at.locator("#mp-connection")).to_have_text("live", timeout=20_000)
        server.request("POST", f"jobs/{job['id']}/cancel")
        expect(at.locator('#device-rows tr[data-key="cpu"] [data-role="jobs"]')).to_have_text("none", timeout=TRAINING)
    finally:
        stop(server, job["id"])


# --- cancel and delete from the jobs list --------------------------------------------------------------------------


@pytest.mark.parametrize("at", WIDTHS, indirect=True)
def test_cancel_and_delete_from_the_jobs_list_ask_first(at: Page, server: Server) -> None:
    job = twin(server, model_name="from the list")
    try:
        wait_for(lambda: server.job(job["id"])["status"] == "running", what="the job to run")
        live(at, server.jobs_url)
        row = at.locator(f'#jobs-body tr[data-job-id="{job["id"]}"]')
        dialog = at.locator("#mp-confirm")
        row.locator('[data-role="actions"] button').click()
        expect(dialog).to_be_visible()
        expect(at.locator("#mp-confirm-question")).to_have_text("Cancel the job “from the list”?")
        on_screen(at, "#mp-confirm")
        at.click("#mp-confirm-keep")
        expect(dialog).to_be_hidden()
        assert server.job(job["id"])["status"] == "running"  # asked, not done
        row.locator('[data-role="actions"] button').click()
        at.click("#mp-confirm-action")
        expect(dialog).to_be_hidden()
        expect(row).to_have_attribute("data-status", "cancelled", timeout=TRAINING)
        assert server.ended(job["id"])["status"] == "cancelled"
        # The row's action is Delete now; it asks too.
        button = row.locator('[data-role="actions"] button')
        expect(button).to_have_text("Delete")
        on_screen(at, f'#jobs-body tr[data-job-id="{job["id"]}"] [data-role="actions"] button')
        button.click()
        expect(at.locator("#mp-confirm-question")).to_have_text("Delete the job “from the list”?")
        expect(at.locator("#mp-confirm-detail")).to_contain_text("removed for good")
        at.click("#mp-confirm-action")
        expect(row).to_have_count(0)
        assert server.request("GET", f"jobs/{job['id']}").status_code == 404
    finally:
        stop(server, job["id"])


def test_without_javascript_the_list_asks_on_a_page_of_its_own(browser: Browser, server: Server) -> None:
    job = twin(server, model_name="no script list", max_iter=2)
    server.ended(job["id"])
    context = browser.new_context(viewport=PHONE, java_script_enabled=False)
    page = context.new_page()
    try:
        page.goto(server.jobs_url)
        page.locator(f'#jobs-body tr[data-job-id="{job["id"]}"] [data-role="actions"] button').click()
        expect(page.locator("#confirm-question")).to_have_text("Delete the job “no script list”?")
        assert server.request("GET", f"jobs/{job['id']}").status_code == 200
        page.click("#confirm-keep")
        expect(page).to_have_url(server.jobs_url)
        page.locator(f'#jobs-body tr[data-job-id="{job["id"]}"] [data-role="actions"] button').click()
        page.click("#confirm-action")
        expect(page).to_have_url(server.jobs_url)
        expect(page.locator(f'#jobs-body tr[data-job-id="{job["id"]}"]')).to_have_count(0)
        assert server.request("GET", f"jobs/{job['id']}").status_code == 404
    finally:
        context.close()


@pytest.mark.parametrize("at", WIDTHS, indirect=True)
def test_every_cell_of_the_jobs_list_is_in_sight(at: Page, server: Server) -> None:
    """On a phone each job is a card of labelled lines (the Message column was off screen with no hint); at 1280 px
    it is a table row. Either way every cell, the message and the action included, lies within the screen."""
    job = twin(server, model_name="a job with a rather long name to wrap", max_iter=2)
    server.ended(job["id"])
    live(at, server.jobs_url)
    row = f'#jobs-body tr[data-job-id="{job["id"]}"]'
    expect(at.locator(f'{row} [data-role="message"]')).not_to_be_empty()
    phone = at.viewport_size is not None and at.viewport_size["width"] < 576
    # Without scrolling sideways (the table's box is not scrolled): each cell's box lies within the screen's width.
    assert at.evaluate("document.querySelector('#jobs-table').parentElement.scrollLeft") == 0
    for role in ("name", "status", "device", "batch", "iteration", "created", "message", "actions"):
        on_screen(at, f'{row} [data-role="{role}"]')
    label = at.evaluate(
        f"""() => getComputedStyle(document.querySelector('{row} [data-role="message"]'), '::before').content"""
    )
    assert label == ('"Message"' if phone else "none")
    assert at.evaluate("document.documentElement.scrollWidth") <= (at.viewport_size or DESKTOP)["width"]
    if not phone:
        expect(at.locator("#jobs-table thead")).to_be_visible()


# --- words explained ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("at", WIDTHS, indirect=True)
def test_words_are_explained_where_they_appear_and_lead_to_the_glossary(at: Page, server: Server) -> None:
    live(at, server.base_url + "memplugin/devices")
    source = at.locator('#device-rows tr[data-key="cpu"] a.mp-term[data-term="meminfo"]')
    # Drawn by the page's script after a devices event, as the server drew it.
    reads = int(at.evaluate("Number(document.body.dataset.devicesRead || 0)"))
    at.wait_for_function(f"Number(document.body.dataset.devicesRead || 0) > {reads}")
    expect(source).to_have_attribute("title", re.compile("/proc/meminfo"))
    expect(at.locator('#device-rows tr[data-key="cpu"] a.mp-term[data-term="cpu"]')).to_have_attribute(
        "title", re.compile("processor"))
    # click scrolls the link into view itself and, unlike scroll_into_view_if_needed, tries again when a devices event
    # redraws the rows under it (at 375 px a redraw between the two detached the link).
    source.click()
    expect(at).to_have_url(re.compile(r"/memplugin/glossary#term-meminfo$"))
    entry = at.locator("#term-meminfo")
    expect(entry).to_be_in_viewport()
    for key in ("nvml_v2", "gpu-cudnn", "iter_size", "host_allocation_failed", "SIGTERM"):
        expect(at.locator(f"#term-{key}")).to_have_count(1)
    on_screen(at, "#term-host_allocation_failed + dd")
    # The job page's attempt rows drawn by its script explain a signature and a signal as the server's do.
    job = twin(server, model_name="terms", max_iter=2)
    server.ended(job["id"])
    live(at, server.job_url(job["id"]))
    drawn = at.evaluate("""() => {
        const row = MemPlugin.JobFormat.attemptRow({number: 1, status: "out_of_memory", batch_size: 64, iter_size: 1,
            start_iteration: 0, end_iteration: 0, duration: 1, message: "host memory ran out", signal: "SIGABRT",
            out_of_memory: {signature: "host_allocation_failed", ambiguous: false}});
        return [...row.querySelectorAll("a.mp-term")].map((a) => [a.textContent, a.title.slice(0, 20), a.getAttribute("href")]);
    }""")
    assert drawn == [
        ["Out of memory", "Caffe asked for more", "/memplugin/glossary#term-host_allocation_failed"],
        ["the training process aborted", "The process stopped ", "/memplugin/glossary#term-SIGABRT"],
    ]
    expect(at.locator('#attempts thead a.mp-term[data-term="iter_size"]')).to_have_attribute(
        "title", re.compile("weights once"))
