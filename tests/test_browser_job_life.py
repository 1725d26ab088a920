"""A job's life on its page, in a real browser (issue 26 points 3-6): after Resume without a snapshot the page
shows the new run, with the old one's points drawn apart; Delete asks first, with and without JavaScript; Caffe's
log opens at its end and follows it while the user has not scrolled up; the out-of-memory story reads in plain
words and human sizes, with the job's memory cap, and fits the page at 1280 and 375 px.

The server is browser_fixtures.py's (`serve --simulate-gpus 2x24GiB`); jobs train LeNet on the CPU for real, the
out-of-memory job under a real 64 MiB memory cap. It runs one CPU job at a time: every test ends its jobs.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from browser_fixtures import TRAIN_DB, VAL_DB, Server, watch
from playwright.sync_api import Browser, Page, ViewportSize, expect
from test_browser_jobs import SERIES, TRAINING, cancel, twin, wait_points
from test_jobs_fixtures import LENET, SHORT_SOLVER, wait_for

pytestmark = pytest.mark.slow
pytest_plugins = ["browser_fixtures"]

WIDE: ViewportSize = {"width": 1280, "height": 900}
PHONE: ViewportSize = {"width": 375, "height": 667}
WIDTHS = [pytest.param(WIDE, id="1280px"), pytest.param(PHONE, id="375px")]


def open_page(browser: Browser, viewport: ViewportSize, *, script: bool = True) -> tuple[Any, Page, list[str]]:
    """A page in its own context at `viewport` (a phone's touch and mobile viewport at 375 px)."""
    phone = viewport["width"] < 500
    context = browser.new_context(
        viewport=viewport, java_script_enabled=script, is_mobile=phone, has_touch=phone,
    )
    page = context.new_page()
    return context, page, watch(page)


def points_of(page: Page, label: str) -> list[dict[str, Any]]:
    """A chart series' points with the attempt each came from."""
    return page.evaluate(  # type: ignore[no-any-return]
        f"(label) => {{ const found = ({SERIES})(label); return found ? found.data.map((p) => ({{x: p.x, y: p.y, "
        f"attempt: p.attempt}})) : []; }}",
        label,
    )


def summary_iteration(page: Page) -> int:
    return int(page.locator('#job-summary [data-role="iteration"]').inner_text().split()[0])


# --- point 3: resume without a snapshot --------------------------------------------------------------------------


def test_after_a_resume_without_a_snapshot_the_page_shows_the_new_run(browser: Browser, server: Server) -> None:
    """Attempt 1 trains to 150 or more, is cancelled (it snapshots), its snapshot goes away, and Resume starts
    attempt 2 from 0: the summary follows attempt 2, and attempt 1's points are a line of their own beneath."""
    job = twin(server, model_name="restarted")
    context, page, errors = open_page(browser, WIDE)
    try:
        page.goto(server.job_url(job["id"]))
        expect(page.locator("#mp-connection")).to_have_text("live")
        wait_for(lambda: server.job(job["id"])["iteration"] >= 150, timeout=TRAINING / 1000, what="150 iterations")
        page.click("#cancel-job")
        expect(page.locator("#job-status")).to_have_text("cancelled", timeout=TRAINING)
        reached = server.job(job["id"])["iteration"]
        # The cancel kept the work: a snapshot where it stopped, said on the page.
        expect(page.locator("#job-message")).to_have_text(
            f"cancelled at iteration {reached}; a snapshot of it was saved (Resume continues from it)")
        expect(page.locator('#job-summary [data-role="snapshot"]')).to_have_text(f"iteration {reached}")
        wait_points(page, "train loss", f"data.length === {reached}")
        shutil.rmtree(server.data_dir / "jobs" / job["id"] / "snapshots")  # gone: Resume starts from 0

        page.click("#resume-job")
        second = page.locator('#attempts tbody tr[data-attempt="2"]')
        expect(second).to_have_attribute("data-status", "running", timeout=TRAINING)
        expect(second.locator('[data-role="iterations"]')).to_have_text(re.compile(r"^0 → "))
        # Before attempt 2 has trained as far, the page already shows where it is, not where attempt 1 got.
        wait_points(page, "train loss", "data.length > 0 && data.every((p) => p.attempt === 2)")
        # The summary follows attempt 2 at the next event (the chart's points and the summary arrive apart): it
        # shows less than attempt 1 reached, unless attempt 2 has meanwhile trained as far.
        wait_for(lambda: summary_iteration(page) < reached
                 or max(p["x"] for p in points_of(page, "train loss")) >= reached,
                 timeout=30, what="the summary at attempt 2's iteration")
        assert page.evaluate("MemPlugin.jobPage.latest().attempt") == 2

        def drawn_apart(page: Page) -> None:
            current = points_of(page, "train loss")
            assert current and {p["attempt"] for p in current} == {2}, current[:3]
            assert [p["x"] for p in current] == sorted({p["x"] for p in current})
            earlier = points_of(page, "train loss, attempt 1 (trained again)")
            assert {p["attempt"] for p in earlier} == {1} and len(earlier) == reached
            style = page.evaluate("""() => {
                const sets = MemPlugin.jobPage.chart.data.datasets;
                const own = sets.find((d) => d.label === "train loss");
                const old = sets.find((d) => d.label === "train loss, attempt 1 (trained again)");
                return {own: own.order, old: old.order, dash: old.borderDash, color: old.borderColor,
                         base: own.borderColor};
            }""")
            assert style["old"] > style["own"]  # drawn beneath the current run
            assert style["dash"] and style["color"] == style["base"] + "80"  # dashed and paler, in its colour
            shown = summary_iteration(page)
            assert shown <= max(p["x"] for p in current) + 60  # attempt 2's iteration (events are throttled)
            assert shown < reached or max(p["x"] for p in current) >= reached

        drawn_apart(page)
        # A reload draws the same from the first paint and GET .../progress.
        page.reload()
        expect(page.locator("#mp-connection")).to_have_text("live")
        wait_points(page, "train loss, attempt 1 (trained again)", f"data.length === {reached}")
        drawn_apart(page)
        assert not errors, errors
    finally:
        context.close()
        cancel(server, job["id"])


# --- point 4: Delete asks first ------------------------------------------------------------------------------


@pytest.fixture
def finished_job(server: Server) -> Iterator[dict[str, Any]]:
    """A short job that has finished (its one snapshot after training), deleted at the end if a test left it."""
    job = twin(server, model_name="short one", max_iter=3)
    assert server.ended(job["id"], timeout=120)["status"] == "done"
    yield job
    server.request("DELETE", f"jobs/{job['id']}")


@pytest.mark.parametrize("viewport", WIDTHS)
@pytest.mark.parametrize("script", [True, False], ids=["javascript", "no-javascript"])
def test_delete_asks_first_and_names_the_snapshots(
    browser: Browser, server: Server, finished_job: dict[str, Any], viewport: ViewportSize, script: bool
) -> None:
    job_id = finished_job["id"]
    folder = server.data_dir / "jobs" / job_id
    context, page, errors = open_page(browser, viewport, script=script)
    try:
        page.goto(server.job_url(job_id))
        box = page.locator("#delete-confirm")
        expect(box).to_be_hidden()
        page.click("#delete-job")
        expect(box).to_be_visible()
        expect(box).to_contain_text("Delete “short one” for good?")
        expect(box).to_contain_text("Its 1 snapshot (the latest at iteration 3) and its attempts' logs go with it.")
        for button in ("#delete-confirmed", "#delete-keep"):  # in sight, within the screen's width
            expect(page.locator(button)).to_be_in_viewport()
            right = page.locator(button).bounding_box()
            assert right is not None and right["x"] + right["width"] <= viewport["width"]
        # Asking deleted nothing.
        assert server.request("GET", f"jobs/{job_id}").status_code == 200
        assert list((folder / "snapshots").glob("*.caffemodel"))

        page.click("#delete-keep")
        expect(page).to_have_url(server.job_url(job_id))
        expect(box).to_be_hidden()
        assert server.request("GET", f"jobs/{job_id}").status_code == 200

        page.click("#delete-job")
        page.click("#delete-confirmed")
        expect(page).to_have_url(server.jobs_url)
        assert server.request("GET", f"jobs/{job_id}").status_code == 404
        assert not folder.exists()
        assert not errors, errors
    finally:
        context.close()


# --- point 5: the log opens at its end and follows it -----------------------------------------------------------

END_VISIBLE = """() => {
    const box = document.getElementById("job-log");
    const text = box.textContent.replace(/\\s+$/, "");
    const walker = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
    let node = null, last = null;
    while ((node = walker.nextNode())) if (node.textContent.trim()) last = node;
    if (!last) return {visible: false, text};
    const end = last.textContent.replace(/\\s+$/, "").length;
    const range = document.createRange();
    range.setStart(last, end - 1);
    range.setEnd(last, end);
    const mark = range.getBoundingClientRect(), frame = box.getBoundingClientRect();
    return {visible: mark.bottom <= frame.bottom + 1 && mark.top >= frame.top - 1,
            overflows: box.scrollHeight > box.clientHeight + 8, last: text.slice(text.lastIndexOf("\\n") + 1)};
}"""
"""Whether the last character of Caffe's log is inside the log box's visible area (with or without scripts)."""


@pytest.mark.parametrize("viewport", WIDTHS)
@pytest.mark.parametrize("script", [True, False], ids=["javascript", "no-javascript"])
def test_the_log_of_a_finished_job_opens_at_its_end(
    browser: Browser, server: Server, finished_job: dict[str, Any], viewport: ViewportSize, script: bool
) -> None:
    context, page, errors = open_page(browser, viewport, script=script)
    try:
        page.goto(server.job_url(finished_job["id"]))
        if script:
            expect(page.locator("#mp-connection")).to_have_text("live")
            page.wait_for_function("document.getElementById('job-log').textContent.includes('Optimization Done.')")
        end = page.evaluate(END_VISIBLE)
        assert end["overflows"], "the log should be longer than its box for this test to mean anything"
        assert end["visible"], end
        assert end["last"].endswith("Optimization Done."), end  # how training ended, as caffe train says it
        assert not errors, errors
    finally:
        context.close()


def test_the_log_follows_its_end_until_the_user_scrolls_up(browser: Browser, server: Server) -> None:
    job = twin(server, model_name="chatty")
    context, page, errors = open_page(browser, WIDE)
    log = page.locator("#job-log")

    def grown(than: int) -> int:
        page.wait_for_function(f"document.getElementById('job-log').textContent.length > {than}", timeout=TRAINING)
        return int(page.evaluate("document.getElementById('job-log').textContent.length"))

    try:
        page.goto(server.job_url(job["id"]))
        expect(page.locator("#mp-connection")).to_have_text("live")
        expect(log).to_contain_text("Iteration 50", timeout=TRAINING)  # Caffe's display line, every 50
        # A reload while the job trains: the log is longer than its box by now, and must open at its end and follow
        # (it followed only when the page had been open from the log's first lines).
        page.reload()
        expect(page.locator("#mp-connection")).to_have_text("live")
        page.wait_for_function("(() => { const b = document.getElementById('job-log');"
                               " return b.scrollHeight > b.clientHeight + 8; })()")
        length = grown(0)
        assert page.evaluate(END_VISIBLE)["visible"]
        length = grown(length)
        assert page.evaluate(END_VISIBLE)["visible"], "the box follows the log's end as lines come"

        log.hover()
        page.mouse.wheel(0, -3000)  # the user scrolls up to read
        page.wait_for_function("(() => { const b = document.getElementById('job-log');"
                               " return b.scrollTop + b.clientHeight < b.scrollHeight - 100; })()")
        page.wait_for_timeout(300)  # the wheel's scrolling has settled
        top = page.evaluate("document.getElementById('job-log').scrollTop")
        length = grown(length)
        assert page.evaluate("document.getElementById('job-log').scrollTop") == top  # left where they read
        assert not page.evaluate(END_VISIBLE)["visible"]

        page.mouse.wheel(0, 100_000)  # back to the end: followed again
        page.wait_for_function("(() => { const b = document.getElementById('job-log');"
                               " return b.scrollTop + b.clientHeight >= b.scrollHeight - 8; })()")
        grown(length)
        assert page.evaluate(END_VISIBLE)["visible"]
        assert not errors, errors
    finally:
        context.close()
        cancel(server, job["id"])


# --- point 6: the out-of-memory story -------------------------------------------------------------------------------

CAP = "64MiB"
WANTED = 512


@pytest.fixture(scope="module")
def out_of_memory_job(server: Server) -> Iterator[dict[str, Any]]:
    """LeNet asked at batch 512 as given under a 64 MiB cap of its own: Caffe really runs out of memory (about
    107 MiB needed), and the fallback retries at a smaller batch with iter_size raised."""
    body = {
        "net": LENET, "solver": SHORT_SOLVER, "name": "capped lenet", "device": "cpu", "batch": WANTED,
        "data": {"train": TRAIN_DB, "test": VAL_DB}, "memory_cap": CAP, "max_iter": 4,
        "fallback": {"start": "wanted"},
    }
    response = requests.post(server.base_url + "memplugin/api/jobs", json=body, timeout=60)
    assert response.status_code == 201, response.text
    job = wait_for(lambda: (doc := server.job(response.json()["id"]))["status"] in ("done", "failed") and doc,
                   timeout=180, what="the capped job to end")
    assert job["status"] == "done", job["message"]
    assert job["attempts"][0]["status"] == "out_of_memory", job["attempts"]
    yield job
    server.request("DELETE", f"jobs/{job['id']}")


FITS = """() => {
    const wrapper = document.querySelector("#attempts").closest(".table-responsive");
    const cells = [...document.querySelectorAll('#attempts td[data-role="why"]')];
    return {
        table: [wrapper.scrollWidth, wrapper.clientWidth],
        page: [document.documentElement.scrollWidth, window.innerWidth],
        cells: cells.map((cell) => [cell.scrollWidth, cell.clientWidth]),
        edges: cells.map((cell) => { const box = cell.getBoundingClientRect(); return [box.left, box.right]; }),
    };
}"""


@pytest.mark.parametrize("viewport", WIDTHS)
def test_the_out_of_memory_story_reads_plainly_and_fits(
    browser: Browser, server: Server, out_of_memory_job: dict[str, Any], viewport: ViewportSize
) -> None:
    job = out_of_memory_job
    failed, last = job["attempts"][0], job["attempts"][-1]
    context, page, errors = open_page(browser, viewport)
    try:
        page.goto(server.job_url(job["id"]))
        expect(page.locator("#mp-connection")).to_have_text("live")
        # The end tells the retry's story, and the job's cap is on the page.
        expect(page.locator("#job-message")).to_have_text(
            f"training finished at iteration 4; it ran out of memory at batch {WANTED}, and was retried at batch "
            f"{last['batch_size']} x iter_size {last['iter_size']} (effective batch "
            f"{last['batch_size'] * last['iter_size']})")
        expect(page.locator('#job-summary [data-role="memory-cap"]')).to_have_text("64.0 MiB (this job's)")

        row = page.locator('#attempts tbody tr[data-attempt="1"]')
        why = row.locator('[data-role="why"]')
        signature = why.locator('abbr[data-role="signature"]')
        expect(signature).to_have_text("Out of memory")
        expect(signature).to_have_attribute("title", "out-of-memory signature: host_allocation_failed")
        signal = why.locator('abbr[data-role="signal"]')
        expect(signal).to_have_text("the training process aborted")
        expect(signal).to_have_attribute("title", "SIGABRT")
        text = why.inner_text()
        assert re.fullmatch(
            r"Out of memory: host memory ran out allocating [\d.]+ [KMG]iB \(malloc failed\); the training process "
            r"aborted", text), text
        assert not re.search(r"\d{4,} bytes", text) and "(SIGABRT)" not in text and "_" not in text
        limit = row.locator('[data-role="limit"]')  # the cap less the stacks of Caffe's threads
        expect(limit).to_have_text(re.compile(r"^limit 6\d\.\d MiB$"))
        expect(limit).to_have_attribute("title", re.compile("the memory cap less the stacks of Caffe's threads"))

        # Nothing clipped: at both widths the table fits its box (on a phone each attempt is a card of labelled
        # lines: the out-of-memory columns were 900 px off a 337 px box, with no sign they were there), the page does
        # not scroll sideways, and every Why cell holds its words, within the screen.
        fits = page.evaluate(FITS)
        assert fits["page"][0] <= fits["page"][1], fits
        assert all(scroll <= client + 1 for scroll, client in fits["cells"]), fits
        assert fits["table"][0] <= fits["table"][1] + 1, fits
        assert all(left >= 0 and right <= viewport["width"] for left, right in fits["edges"]), fits

        # A row the page's script draws from a `job_attempt` event reads the same as the server's.
        drawn = page.evaluate("""(attempt) => {
            const row = MemPlugin.JobFormat.attemptRow(attempt);
            const why = row.querySelector('[data-role="why"]');
            return {text: why.textContent, titles: [...why.querySelectorAll("abbr")].map((a) => a.title),
                    memory: row.querySelector('[data-role="memory"]').textContent.replace(/\\s+/g, " ").trim()};
        }""", failed)
        assert drawn["text"].replace("\n", "") == why.text_content().strip()
        assert drawn["titles"] == ["out-of-memory signature: host_allocation_failed", "SIGABRT"]
        server_memory = re.sub(r"\s+", " ", row.locator('[data-role="memory"]').text_content() or "").strip()
        assert drawn["memory"] == server_memory
        assert not errors, errors
    finally:
        context.close()


@pytest.mark.parametrize("viewport", WIDTHS)
def test_the_new_model_form_takes_a_memory_cap(browser: Browser, server: Server, viewport: ViewportSize) -> None:
    context, page, errors = open_page(browser, viewport)
    job_id = None
    try:
        page.goto(server.form_url)
        expect(page.locator("#mp-connection")).to_have_text("live")
        field = page.locator("#memory_cap")
        expect(field).to_be_visible()
        box = field.bounding_box()
        assert box is not None and box["x"] + box["width"] <= viewport["width"]
        page.fill("#train_source", TRAIN_DB)
        page.fill("#val_source", VAL_DB)
        page.select_option("#device", "cpu")
        page.fill("#model_name", "capped from the form")
        page.fill("#memory_cap", "2048")  # a bare number: refused beside the field, nothing created
        page.click("#create-model")
        expect(page.locator("#memory_cap-error")).to_contain_text("is not a memory size: write a number and a unit")
        page.fill("#memory_cap", "1GiB")
        page.click("#create-model")
        expect(page).to_have_url(re.compile(r"/memplugin/jobs/[\w-]+$"))
        job_id = page.url.rsplit("/", 1)[1]
        expect(page.locator('#job-summary [data-role="memory-cap"]')).to_have_text("1.0 GiB (this job's)")
        assert server.job(job_id)["memory_cap"] == 1 << 30
        assert not errors, errors
    finally:
        context.close()
        if job_id:
            cancel(server, job_id)
            server.request("DELETE", f"jobs/{job_id}")
