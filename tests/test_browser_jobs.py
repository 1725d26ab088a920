"""Jobs in a real browser: a job created from the New model form trains LeNet on the CPU (real pycaffe children,
tiny MNIST-shaped LMDBs) while its page grows its chart from the websocket, catches up after a dropped connection,
cancels, and the jobs list follows along live; without JavaScript the pages refresh and cancel by form posts.

The server is `digits-memplugin serve --simulate-gpus 2x24GiB` (browser_fixtures.py): the GPUs are fake, so jobs
train on the CPU. It runs one CPU job at a time, so every test leaves no job running behind it.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from browser_fixtures import TRAIN_DB, VAL_DB, VIEWPORT, Server, screenshot, watch
from playwright.sync_api import Browser, Page, expect
from test_jobs_fixtures import pid_alive, wait_for

from digits_memplugin.jobs.store.records import FINAL_STATES
from digits_memplugin.networks import standard_network

pytestmark = pytest.mark.slow
pytest_plugins = ["browser_fixtures"]

LENET = standard_network("lenet")
TRAINING = 60_000
"""Milliseconds to wait for training to get somewhere: a child starts pycaffe in about a second, LeNet at batch
64 takes some 35 ms an iteration on this CPU, a browser shares it."""


def twin(server: Server, **fields: Any) -> dict[str, Any]:
    """A job created through the New model form's JSON twin (LeNet on the CPU, validating every 20 iterations)."""
    body = {
        "model_name": "lenet", "train_source": TRAIN_DB, "val_source": VAL_DB, "device": "cpu", "lr_policy": "fixed",
        "max_iter": 100_000, "test_interval": 20, "test_iter": 2, "snapshot": 0, **fields,
    }
    response = requests.post(server.base_url + "memplugin/models.json", json=body, timeout=60)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def cancel(server: Server, job_id: str) -> None:
    """Stop a job this test started, so the next test gets the CPU."""
    if server.job(job_id)["status"] not in FINAL_STATES:
        server.request("POST", f"jobs/{job_id}/cancel")
    server.ended(job_id, timeout=120)


def runner_pid(server: Server, job_id: str) -> int:
    """The training child's pid, from its first record (the runner reports it)."""
    progress = server.data_dir / "jobs" / job_id / "attempts" / "1" / "progress.jsonl"
    first = wait_for(lambda: progress.is_file() and progress.read_text().splitlines(), what="the runner to start")
    return int(json.loads(first[0])["pid"])


SERIES = """(label) => [...MemPlugin.jobPage.chart.data.datasets, ...MemPlugin.jobPage.lrChart.data.datasets]
    .find((d) => d.label === label)"""
"""A chart series by its label, as Chart.js holds it (undefined until its first point)."""


def points(page: Page, label: str) -> list[dict[str, float]]:
    """The chart's points of one series."""
    return page.evaluate(  # type: ignore[no-any-return]
        f"(label) => {{ const found = ({SERIES})(label); return found ? found.data.map((p) => ({{x: p.x, y: p.y}})) : []; }}",
        label,
    )


def wait_points(page: Page, label: str, condition: str) -> None:
    """Wait until the series' points (`data`, an array of {x, y}) meet `condition`, a JavaScript expression."""
    page.wait_for_function(
        f"(label) => {{ const found = ({SERIES})(label); const data = found ? found.data : []; return {condition}; }}",
        arg=label,
        timeout=TRAINING,
    )


@pytest.fixture
def jobs_list(browser: Browser, server: Server) -> Iterator[Page]:
    """The jobs list, open and live in its own tab."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    errors = watch(page)
    page.goto(server.jobs_url)
    expect(page.locator("#mp-connection")).to_have_text("live")
    yield page
    context.close()
    assert not errors, errors


def test_a_job_from_the_form_trains_live_on_its_page(
    page: Page, jobs_list: Page, server: Server, tmp_path: Path
) -> None:
    page.goto(server.form_url)
    expect(page.locator("#mp-connection")).to_have_text("live")
    page.fill("#train_source", TRAIN_DB)
    page.fill("#val_source", VAL_DB)
    page.select_option("#lr_policy", "step")
    page.fill("#stepsize", "100")
    page.fill("#gamma", "0.5")
    page.fill("#max_iter", "300")
    page.fill("#test_interval", "20")
    page.fill("#test_iter", "2")
    page.fill("#snapshot", "200")
    page.select_option("#device", "cpu")
    page.fill("#model_name", "lenet-mnist")
    page.click("#create-model")
    expect(page).to_have_url(re.compile(r"/memplugin/jobs/[\w-]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    try:
        expect(page.locator("#mp-connection")).to_have_text("live")
        expect(page.locator("#job-status")).to_have_text("running", timeout=TRAINING)
        # The chart grows from job_progress events: more points arrive while we watch.
        wait_points(page, "train loss", "data.length > 5")
        before = len(points(page, "train loss"))
        wait_points(page, "train loss", f"data.length > {before + 5}")
        wait_points(page, "validation accuracy", "data.length > 2")
        wait_points(page, "learning rate", "data.length > 5")
        summary = page.locator("#job-summary")
        expect(summary.locator('[data-role="plan"]')).to_have_text("64 × iter_size 1 = 64")
        expect(summary.locator('[data-role="device"]')).to_contain_text("CPU")
        expect(summary.locator('[data-role="test"]')).to_contain_text("accuracy")
        row = page.locator("#attempts tbody tr")
        expect(row).to_have_count(1)
        expect(row.locator('[data-role="status"]')).to_have_text("running")
        expect(row.locator('[data-role="batch"]')).to_have_text("64")
        expect(row.locator('[data-role="iter_size"]')).to_have_text("1")
        expect(page.locator("#job-log")).to_contain_text("Creating Layer")
        # The jobs list, opened before the job existed, shows it live.
        listed = jobs_list.locator(f'#jobs-body tr[data-job-id="{job_id}"]')
        expect(listed.locator('[data-role="name"]')).to_have_text("lenet-mnist")
        expect(listed).to_have_attribute("data-status", "running")
        wait_points(page, "validation accuracy", "data.length > 8")
        screenshot(page, tmp_path, "screenshot-job.png")

        expect(page.locator("#job-status")).to_have_text("done", timeout=TRAINING)
        expect(row).to_have_attribute("data-status", "success")
        expect(row.locator('[data-role="iterations"]')).to_have_text("0 → 300")
        expect(page.locator("#cancel-form")).to_be_hidden()
        expect(page.locator("#delete-form")).to_be_visible()
        expect(listed).to_have_attribute("data-status", "done")
        # Every iteration is on the chart once the job is over (the history fills what the throttle coalesced),
        # and the step policy halved the learning rate at 100 and 200.
        wait_points(page, "train loss", "data.length === 300")
        train = points(page, "train loss")
        assert [p["x"] for p in train] == list(range(1, 301))
        rates = {round(p["y"], 6) for p in points(page, "learning rate")}
        assert rates == {0.01, 0.005, 0.0025}
        document = server.job(job_id)
        assert document["attempts"][0]["status"] == "success"
        tested = [p["x"] for p in points(page, "validation accuracy")]
        assert tested == list(range(0, 301, 20))
    finally:
        cancel(server, job_id)


def test_the_page_catches_up_after_a_dropped_connection_and_cancel_stops_the_child(
    page: Page, jobs_list: Page, server: Server
) -> None:
    job = twin(server, model_name="long lenet")
    try:
        page.goto(server.job_url(job["id"]))
        expect(page.locator("#mp-connection")).to_have_text("live")
        listed = jobs_list.locator(f'#jobs-body tr[data-job-id="{job["id"]}"]')
        expect(listed).to_be_visible()
        wait_points(page, "train loss", "data.length > 10")

        page.evaluate("MemPlugin.socket().disconnect()")
        expect(page.locator("#mp-connection")).to_have_text("reconnecting…")
        seen = points(page, "train loss")
        # Training goes on while the page hears nothing.
        missed = wait_for(lambda: (it := server.job(job["id"])["iteration"]) > seen[-1]["x"] + 50 and it,
                          what="the job to train on")
        assert len(points(page, "train loss")) == len(seen)

        with page.expect_response(lambda answer: answer.url.split("?")[0].endswith("/progress")) as refetched:
            page.evaluate("MemPlugin.socket().connect()")
        expect(page.locator("#mp-connection")).to_have_text("live")
        # The page re-fetched the history: every iteration it missed that the history holds is on the chart, in
        # order (a history past MAX_PROGRESS_POINTS records comes thinned: a fast machine trains past it here).
        history = {record["iteration"] for record in refetched.value.json()["records"]
                   if record.get("event") == "iteration"}
        wait_points(page, "train loss", f"data.some((p) => p.x === {missed})")
        xs = [p["x"] for p in points(page, "train loss")]
        assert xs == sorted(set(xs))
        missed_points = {x for x in history if seen[-1]["x"] <= x <= missed}
        assert missed_points and missed_points <= set(xs)
        expect(page.locator('#job-summary [data-role="iteration"]')).not_to_have_text(str(seen[-1]["x"]))

        pid = runner_pid(server, job["id"])
        assert pid_alive(pid)
        page.click("#cancel-job")
        expect(page.locator("#job-status")).to_have_text("cancelled", timeout=TRAINING)
        row = page.locator("#attempts tbody tr")
        expect(row).to_have_attribute("data-status", "cancelled")
        # The cancel let the runner snapshot and stop (SIGINT, honoured between steps), not a kill.
        expect(row.locator('[data-role="why"]')).to_contain_text("a snapshot of it was saved")
        # The row drawn by the page's script labels its memory figures as the server's page does.
        expect(row.locator('[data-role="memory"] [data-role="allocated"]')).to_contain_text("Caffe ")
        expect(row.locator('[data-role="memory"] [data-role="peak"]')).to_contain_text("process ")
        expect(page.locator("#delete-form")).to_be_visible()
        expect(listed).to_have_attribute("data-status", "cancelled")
        # The job document says the child has ended, and it has.
        document = server.job(job["id"])
        assert document["status"] == "cancelled"
        assert document["attempts"][0]["status"] == "cancelled" and document["attempts"][0]["finished_at"]
        assert not pid_alive(pid)

        page.click("#delete-job")
        page.click("#delete-confirmed")  # Delete asks first (test_browser_job_life.py)
        expect(page).to_have_url(server.jobs_url)
        expect(page.locator(f'#jobs-body tr[data-job-id="{job["id"]}"]')).to_have_count(0)
        expect(listed).to_have_count(0)  # the other tab heard of the deletion too
    finally:
        if server.request("GET", f"jobs/{job['id']}").status_code == 200:
            cancel(server, job["id"])


def test_user_text_on_the_job_pages_stays_text(page: Page, jobs_list: Page, server: Server) -> None:
    evil = '<img src=x onerror="alert(1)">'
    net = LENET.text.replace('name: "features1"', f"name: '{evil}'")
    job = twin(server, model_name=f"lenet {evil}", network="custom", custom_network=net, item_shape="1,28,28",
               classes=10)
    try:
        page.goto(server.job_url(job["id"]))
        expect(page.locator("#job-name")).to_have_text(f"lenet {evil}")
        # Caffe names the layer in its log; the page's live log shows it as text.
        expect(page.locator("#job-log")).to_contain_text(f"Creating Layer {evil}", timeout=TRAINING)
        listed = jobs_list.locator(f'#jobs-body tr[data-job-id="{job["id"]}"]')
        expect(listed.locator('[data-role="name"]')).to_have_text(f"lenet {evil}")
        assert page.locator("#job-page img").count() == 0 and jobs_list.locator("#jobs-body img").count() == 0
    finally:
        cancel(server, job["id"])


def test_without_javascript_a_job_page_refreshes_itself_and_cancels_by_form(browser: Browser, server: Server) -> None:
    job = twin(server, model_name="no script")
    context = browser.new_context(java_script_enabled=False, viewport=VIEWPORT)
    page = context.new_page()
    try:
        page.goto(server.job_url(job["id"]))
        expect(page.locator("noscript meta[http-equiv=refresh]")).to_have_attribute("content", "5")
        expect(page.locator("#refresh-note a")).to_have_text("Refresh now")
        wait_for(lambda: server.job(job["id"])["status"] == "running", what="the job to start")
        page.reload()
        page.click("#cancel-job")  # a form post with the page's CSRF token, answered by a redirect to the page
        expect(page).to_have_url(server.job_url(job["id"]))
        expect(page.locator("#job-message")).to_have_text(re.compile("cancell"))
        assert server.ended(job["id"], timeout=120)["status"] == "cancelled"
        page.reload()
        expect(page.locator("#job-status")).to_have_text("cancelled")
        assert page.locator("noscript meta[http-equiv=refresh]").count() == 0  # nothing left to follow
        page.click("#delete-job")
        page.click("#delete-confirmed")  # the page asked first (test_browser_job_life.py)
        expect(page).to_have_url(server.jobs_url)
        assert server.request("GET", f"jobs/{job['id']}").status_code == 404
    finally:
        context.close()
        if server.request("GET", f"jobs/{job['id']}").status_code == 200:
            cancel(server, job["id"])


def test_a_page_of_the_jobs_list_moves_its_oldest_row_to_the_older_page_live(browser: Browser, server: Server) -> None:
    """With a page size of 1, a new job takes the page's only row live, and "Older jobs" then leads to the job it
    replaced: the rows past the page's size go to the older page, as the server would page them."""
    first = twin(server, model_name="paged first")
    cancel(server, first["id"])
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    errors = watch(page)
    second: dict[str, Any] = {}
    try:
        page.goto(server.jobs_url + "?limit=1")
        expect(page.locator("#mp-connection")).to_have_text("live")
        expect(page.locator("#jobs-body tr")).to_have_count(1)
        expect(page.locator(f'#jobs-body tr[data-job-id="{first["id"]}"]')).to_have_count(1)
        second = twin(server, model_name="paged second")
        expect(page.locator(f'#jobs-body tr[data-job-id="{second["id"]}"]')).to_have_count(1)
        expect(page.locator("#jobs-body tr")).to_have_count(1)  # the first moved to the older page
        older = page.locator("#older-jobs")
        expect(older).to_be_visible()
        older.click()
        expect(page).to_have_url(re.compile(rf"before={second['id']}"))
        expect(page.locator("#jobs-body tr").first).to_have_attribute("data-job-id", first["id"])
        expect(page.locator("#newest-jobs")).to_be_visible()
        assert not errors, errors
    finally:
        context.close()
        if second:
            cancel(server, second["id"])


FRAMING_PAGE = """<!doctype html><title>a page that frames the job page</title>
<iframe src="{src}" width="1200" height="900" onload="document.body.dataset.framed = 'loaded'"></iframe>"""


@contextlib.contextmanager
def page_server(html: str) -> Iterator[str]:
    """Another origin on this machine (127.0.0.1, another port): a plain HTTP server answering every GET with
    `html`. A real one, not a Playwright route: a routed page of another origin could not frame the loopback job
    page even before the plugin sent any header (Chromium's Private Network Access takes it for a public page), so
    it would prove nothing."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    served = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{served.server_address[1]}/framing"
    finally:
        served.shutdown()
        served.server_close()
        thread.join(timeout=10)


def test_a_job_page_framed_by_another_origin_is_not_shown(browser: Browser, server: Server) -> None:
    """Issue 23 item 8 (clickjacking): a page of another origin framed the job page, so its one-click Delete could
    sit under a button of that page. Now Chromium refuses to show it there (frame-ancestors 'self'); framed by a page
    of the server's own origin it is shown, Delete and all (the harness: the frame would show it)."""
    job = twin(server, model_name="framed", max_iter=3)
    assert server.ended(job["id"], timeout=120)["status"] == "done"
    framing = FRAMING_PAGE.format(src=server.job_url(job["id"]))
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        errors = watch(page)
        with page_server(framing) as elsewhere:
            page.goto(elsewhere)
            page.wait_for_function("document.body.dataset.framed === 'loaded'")
            [framed] = page.main_frame.child_frames
            assert framed.url == "chrome-error://chromewebdata/", framed.url  # Chromium's page for a refused frame
            assert framed.query_selector("#delete-job") is None and "framed" not in framed.content()

        # The same page at the server's own origin (a route: same origin, so no Private Network Access question).
        page.route(server.base_url + "framing", lambda route: route.fulfill(body=framing, content_type="text/html"))
        page.goto(server.base_url + "framing")
        page.wait_for_function("document.body.dataset.framed === 'loaded'")
        [framed] = page.main_frame.child_frames
        assert framed.url == server.job_url(job["id"])
        expect(framed.locator("#delete-job")).to_be_visible()
        expect(framed.locator("#job-status")).to_have_text("done")
        assert not errors, errors
    finally:
        context.close()
        server.request("DELETE", f"jobs/{job['id']}")
