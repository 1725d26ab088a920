"""Issue 14, point 8 ("Smaller") in a real browser: the Devices page follows the GPUs' memory live and says they
are simulated, the jobs list's iteration follows training, a cancelled job resumes from its page, and each
Customize button has a name of its own. Fixtures and the served app: browser_fixtures.py; jobs train LeNet on the
CPU as in test_browser_jobs.py.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from browser_fixtures import Server
from flask import Flask
from playwright.sync_api import Page, expect
from test_browser_jobs import TRAINING, cancel, twin
from test_jobs_fixtures import wait_for
from werkzeug.serving import BaseWSGIServer, make_server

from digits_memplugin import create_app
from digits_memplugin.core.sizes import GIB
from digits_memplugin.devices.fake_nvml import FakeNvml
from digits_memplugin.networks import standard_network

pytestmark = pytest.mark.slow
pytest_plugins = ["browser_fixtures"]


@pytest.fixture
def gpus_in_process(
    install_nvml: Callable[[FakeNvml], FakeNvml], tmp_path: Path
) -> Iterator[tuple[FakeNvml, str]]:
    """The app served from this process (threads), so the test can change its simulated GPUs while a page watches:
    (the fake library, the base URL). `--simulate-gpus 2x24GiB`'s GPUs, read every half second."""
    library = install_nvml(FakeNvml.from_spec("2x24GiB"))
    app: Flask = create_app({
        "MEMPLUGIN_DATA_DIR": tmp_path / "data", "MEMPLUGIN_ASYNC_MODE": "threading",
        "MEMPLUGIN_DEVICES_POLL_SECONDS": 0.5,
    })
    server: BaseWSGIServer = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="served-app", daemon=True)
    thread.start()
    try:
        yield library, f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        app.extensions["memplugin"].close()


def test_the_devices_page_follows_memory_live_and_says_the_gpus_are_simulated(
    page: Page, gpus_in_process: tuple[FakeNvml, str]
) -> None:
    """It never updated, though the home page calls it live; and it showed the fake library's made-up driver."""
    library, base_url = gpus_in_process
    page.goto(base_url + "memplugin/devices")
    expect(page.locator("#mp-connection")).to_have_text("live")
    first = page.locator("#device-rows tr").first
    free = first.locator('[data-role="free"]')
    expect(free).to_have_text("23.7 GiB")
    expect(page.locator("#device-source")).to_contain_text("GPUs simulated by a fake NVML library")
    expect(page.get_by_text(re.compile(r"NVIDIA driver \d"))).to_have_count(0)  # no made-up version
    reloads = page.evaluate("performance.getEntriesByType('navigation').length")
    library.update(0, memory_used=5 * GIB)  # another process takes 5 GiB of GPU 0
    expect(free).to_have_text("18.7 GiB")
    expect(first.locator('[data-role="used"]')).to_have_text("5.0 GiB")
    expect(page.locator("#device-rows tr").nth(1).locator('[data-role="free"]')).to_have_text("23.7 GiB")
    assert page.evaluate("performance.getEntriesByType('navigation').length") == reloads
    expect(page.locator("#device-source")).to_contain_text("GPUs simulated")  # redrawn, still said


def test_the_jobs_list_follows_the_iteration_between_snapshots(page: Page, server: Server) -> None:
    """The list's iteration moved only at snapshots (the `job` events); it follows the progress records now."""
    page.goto(server.jobs_url)
    expect(page.locator("#mp-connection")).to_have_text("live")
    job = twin(server, model_name="list follows", snapshot=0)  # no snapshot: no `job` event while it trains
    try:
        cell = page.locator(f'#jobs-body tr[data-job-id="{job["id"]}"] [data-role="iteration"]')
        expect(cell).to_have_text(re.compile(r"^([1-9]\d{2,}) / 100000$"), timeout=TRAINING)  # 100 and more
        shown = int(cell.text_content().split(" / ")[0])  # type: ignore[union-attr]
        expect(cell).not_to_have_text(f"{shown} / 100000", timeout=TRAINING)  # and goes on moving
    finally:
        cancel(server, job["id"])


def test_a_cancelled_job_resumes_from_its_page(page: Page, server: Server) -> None:
    """A cancelled job offered only Delete (resume was API-only): Resume queues it again, from its snapshot."""
    job = twin(server, model_name="resume me", snapshot=20)
    try:
        page.goto(server.job_url(job["id"]))
        expect(page.locator("#mp-connection")).to_have_text("live")
        resume = page.get_by_role("button", name="Resume", exact=True)
        expect(resume).to_be_hidden()  # running: Cancel only
        snapshot = wait_for(lambda: server.job(job["id"])["snapshot"], timeout=TRAINING / 1000, what="a snapshot")
        page.get_by_role("button", name="Cancel", exact=True).click()
        expect(page.locator("#job-status")).to_have_text("cancelled", timeout=TRAINING)
        expect(resume).to_be_visible()
        expect(page.get_by_role("button", name="Delete", exact=True)).to_be_visible()
        resumed_from = server.job(job["id"])["snapshot"]["iteration"]
        assert resumed_from >= snapshot["iteration"]
        resume.click()
        expect(page.locator("#job-status")).to_have_text(re.compile("queued|running"))
        expect(resume).to_be_hidden()
        expect(page.get_by_role("button", name="Cancel", exact=True)).to_be_visible()
        expect(page.locator("#job-error")).to_be_hidden()
        # A second attempt trains on from the snapshot, and the page shows it.
        second = page.locator('#attempts tbody tr[data-attempt="2"]')
        expect(second).to_be_visible(timeout=TRAINING)
        expect(second.locator('[data-role="iterations"]')).to_contain_text(f"{resumed_from} →")
        expect(page.locator("#job-status")).to_have_text("running", timeout=TRAINING)
    finally:
        cancel(server, job["id"])


def test_each_customize_button_is_named_for_its_network(page: Page, server: Server) -> None:
    """The two Customize buttons shared one accessible name; each names its network now."""
    page.goto(server.form_url)
    lenet = page.get_by_role("button", name="Customize LeNet", exact=True)
    alexnet = page.get_by_role("button", name="Customize AlexNet-sized", exact=True)
    expect(lenet).to_have_count(1)
    expect(alexnet).to_have_count(1)
    expect(page.get_by_role("button", name="Customize", exact=True)).to_have_count(0)
    lenet.click()
    expect(page.locator("#custom_network")).to_have_value(standard_network("lenet").text)
