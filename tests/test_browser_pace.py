"""Issue 26, 2 in a real browser: how long a job will train, on the New model page (by epochs, at the planned batch),
and a running job's speed and time left on its page and in the jobs list, at 1280 and at 375 px, measured by the server from the job's records (REST `iterations_per_second`, `seconds_left`; the
`job_progress` and `job_iteration` events) and kept live; once the job ends they go.

The server is browser_fixtures.py's (`serve --simulate-gpus 2x24GiB`): jobs train LeNet on the CPU, one at a time,
so every test cancels its job."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from browser_fixtures import TRAIN_DB, VAL_DB, Server, screenshot, watch
from playwright.sync_api import Browser, Page, ViewportSize, expect
from playwright.sync_api import Error as PlaywrightError
from test_browser_jobs import TRAINING, cancel, twin

pytestmark = pytest.mark.slow
pytest_plugins = ["browser_fixtures"]

WIDTHS: dict[str, ViewportSize] = {"1280": {"width": 1280, "height": 900}, "375": {"width": 375, "height": 667}}
PACE = re.compile(r"^\d+(\.\d+)? it/s · (\d+ s|\d+ min \d\d s|\d+ h \d\d min|\d+ d \d+ h) left$")
"""What a running job's speed and time left read as (pace.format_rate, pace.format_duration)."""


@pytest.fixture(params=list(WIDTHS))
def screen(request: pytest.FixtureRequest, browser: Browser) -> Iterator[tuple[Page, int]]:
    """A page at 1280 px (a laptop) or 375 px (a phone, touch), failing the test on any script error or dialog."""
    size = WIDTHS[str(request.param)]
    phone = size["width"] < 500
    context = browser.new_context(viewport=size, is_mobile=phone, has_touch=phone)
    page = context.new_page()
    errors = watch(page)
    yield page, size["width"]
    context.close()
    assert not errors, errors


ATTEMPTS = 5
"""Looks at an element the page may redraw meanwhile, before the test fails."""


def in_sight_across(page: Page, selector: str, width: int) -> None:
    """The element is shown, not cut off sideways: on the screen, or reachable in its table's own scroll box."""
    element = page.locator(selector)
    box = None
    for _ in range(ATTEMPTS):  # a progress event may redraw the row between finding the element and scrolling to it
        expect(element).to_be_visible()
        try:
            element.scroll_into_view_if_needed()
            box = element.bounding_box()
        except PlaywrightError as error:
            if "not attached" not in str(error):
                raise
            continue
        if box is not None:
            break
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, (selector, box)


def test_the_job_page_shows_the_speed_and_the_time_left(
    screen: tuple[Page, int], server: Server, tmp_path: Any
) -> None:
    page, width = screen
    job = twin(server, model_name=f"paced at {width} px", snapshot=0)
    try:
        page.goto(server.job_url(job["id"]))
        expect(page.locator("#mp-connection")).to_have_text("live")
        pace = page.locator('#job-summary [data-role="pace"]')
        expect(pace).to_have_text(PACE, timeout=TRAINING)
        first = pace.text_content()
        expect(pace).not_to_have_text(first or "", timeout=TRAINING)  # live: it follows the records
        in_sight_across(page, '#job-summary [data-role="pace"]', width)
        document = server.job(job["id"])
        assert document["status"] == "running" and document["iterations_per_second"] > 0
        assert document["seconds_left"] > 0
        if width == 1280:
            screenshot(page, tmp_path, "screenshot-job-pace.png")
        page.reload()  # the first paint says it too, from the job document
        expect(pace).to_have_text(PACE)
    finally:
        cancel(server, job["id"])
    expect(pace).to_have_text("n/a", timeout=TRAINING)


def test_the_jobs_list_shows_each_running_jobs_speed_and_time_left(screen: tuple[Page, int], server: Server) -> None:
    page, width = screen
    page.goto(server.jobs_url)
    expect(page.locator("#mp-connection")).to_have_text("live")
    job = twin(server, model_name=f"listed at {width} px", snapshot=0)
    row = page.locator(f'#jobs-body tr[data-job-id="{job["id"]}"]')
    try:
        pace = row.locator('[data-role="pace"]')
        expect(pace).to_have_text(PACE, timeout=TRAINING)  # from the `job_iteration` events
        first = pace.text_content()
        expect(pace).not_to_have_text(first or "", timeout=TRAINING)
        expect(row.locator('[data-role="iteration"]')).to_have_text(re.compile(r"^\d+ / 100000$"))
        in_sight_across(page, f'#jobs-body tr[data-job-id="{job["id"]}"] [data-role="pace"]', width)
        page.reload()  # the server's first paint
        expect(pace).to_have_text(PACE)
    finally:
        cancel(server, job["id"])
    expect(pace).to_have_text("", timeout=TRAINING)
    assert page.evaluate("Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)") <= width


def test_the_new_model_page_says_how_long_the_job_trains_by_epochs(page: Page, server: Server) -> None:
    """The form asks for epochs, as DIGITS does, and shows the iterations they make at the batch planned: the
    512-image training set at Auto's batch 25 (a twentieth of it) is 21 iterations an epoch, validated on one pass
    over the 64 validation images (2 batches of LeNet's 32)."""
    page.goto(server.form_url)
    expect(page.locator("#mp-connection")).to_have_text("live")
    expect(page.locator("#epochs")).to_have_value("30")
    page.fill("#train_source", TRAIN_DB)
    page.fill("#val_source", VAL_DB)
    page.fill("#batch_size", "auto")
    note = page.locator("#length-note")
    expect(note).to_have_text(
        "Trains 630 iterations (30 epochs of 21 at batch 25); validates every 21 iterations, 2 batches of 32."
    )
    page.fill("#epochs", "10")
    expect(note).to_have_text(
        "Trains 210 iterations (10 epochs of 21 at batch 25); validates every 21 iterations, 2 batches of 32."
    )
    page.fill("#max_iter", "100")
    page.fill("#test_iter", "1")
    expect(note).to_have_text("Trains 100 iterations (21 per epoch at batch 25); validates every 21 iterations, "
                              "1 batch of 32.")
