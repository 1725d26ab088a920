"""The screenshots of docs/ui.md, made from the served app in Debian's Chromium (Playwright, headless).

Starts `digits-memplugin serve --simulate-gpus 2x24GiB` on 127.0.0.1 with a temporary data folder holding small
MNIST-shaped LMDBs (the browser tests' datasets), trains one short LeNet job on the CPU so the jobs list has a row,
then writes into the output folder (docs/ by default):

- screenshot-new-model.png: the New model page at 1280 px, LeNet, Auto pressed;
- screenshot-new-model-375.png: the same page on a phone (375 x 667), at the batch field after Auto, its verdict
  beside it;
- screenshot-jobs-375.png: the jobs list on a phone;
- screenshot-job-375.png: that job's page on a phone, at its attempts (each a card of labelled lines).

    .venv/bin/python scripts/screenshots.py [--out docs] [--timeout 300]

Every wait has a timeout, and the whole run is bounded by --timeout (the server is stopped either way).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import requests
from browser_fixtures import CHROMIUM, CHROMIUM_ARGS, SCRIPT, TRAIN_DB, VAL_DB, write_digits
from playwright.sync_api import Browser, Page, ViewportSize, expect, sync_playwright

DESKTOP: ViewportSize = {"width": 1280, "height": 1000}
PHONE: ViewportSize = {"width": 375, "height": 667}
WAIT_MS = 30_000
"""The longest a page may take for any one step (a page load, an estimate, the connection going live)."""
JOB_SECONDS = 120
"""The longest the short LeNet job may take to train (it takes a few seconds on a CPU)."""


class OutOfTime(Exception):
    pass


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raise OutOfTime in the main thread once `seconds` have passed."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise OutOfTime(f"screenshots took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def log(message: str) -> None:
    print(message, flush=True)


def wait_for(predicate: Callable[[], Any], seconds: float, what: str) -> Any:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise OutOfTime(f"timed out after {seconds} s waiting for {what}")


@contextmanager
def serving(data: Path, output: Path) -> Iterator[str]:
    """`digits-memplugin serve --port 0 --simulate-gpus 2x24GiB` in its own process group, its output in a file;
    its address. The group is killed on the way out, however the run ends (the deadline included)."""
    with output.open("ab") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--host", "127.0.0.1", "--port", "0", "--simulate-gpus", "2x24GiB",
             "--data-dir", str(data)],
            stdout=sink, stderr=subprocess.STDOUT, cwd=data.parent, start_new_session=True,
        )
    try:
        yield wait_for(
            lambda: (found := re.findall(r"serving on (http://127\.0\.0\.1:\d+/)", output.read_text())) and found[-1],
            60, "the server's address",
        )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def train_a_short_job(base_url: str) -> str:
    """A LeNet job on the CPU through the form's JSON twin, trained to its end: a row for the jobs list, an
    attempt for its page; its id."""
    body: dict[str, Any] = {
        "model_name": "lenet-mnist", "train_source": TRAIN_DB, "val_source": VAL_DB, "device": "cpu",
        "lr_policy": "fixed", "max_iter": 40, "test_interval": 20, "test_iter": 2, "snapshot": 0, "batch_size": 64,
    }
    created = requests.post(base_url + "memplugin/models.json", json=body, timeout=60)
    created.raise_for_status()
    url = base_url + "memplugin/api/jobs/" + created.json()["id"]
    status = wait_for(
        lambda: (doc := requests.get(url, timeout=30).json())["status"] in ("done", "failed", "cancelled") and doc,
        JOB_SECONDS, "the LeNet job to end",
    )["status"]
    log(f"job ended: {status}")
    return str(created.json()["id"])


def fill(page: Page, selector: str, value: str) -> None:
    """Type into a text field, or choose in a select (the dataset fields may be either)."""
    node = page.locator(selector)
    if node.evaluate("(node) => node.tagName") == "SELECT":
        node.select_option(value)
    else:
        node.fill(value)


def open_form_with_auto(page: Page, base_url: str) -> None:
    """The New model page with the datasets filled in, LeNet (the standard network chosen first) and Auto pressed,
    once the panel shows the estimate of the batch Auto filled in."""
    page.goto(base_url + "memplugin/models/new")
    expect(page.locator("#mp-connection")).to_have_text("live")
    expect(page.locator("#device-list > li[data-verdict]").first).to_be_attached()
    fill(page, "#train_source", TRAIN_DB)
    fill(page, "#val_source", VAL_DB)
    page.locator("#model_name").fill("lenet-mnist")
    page.click("#auto-batch")
    expect(page.locator("#batch_size")).to_have_value(re.compile(r"\S"))
    page.wait_for_function(
        """() => { const batch = document.getElementById("batch_size").value;
                   return [...document.querySelectorAll("#device-list > li [data-role=verdict]")]
                       .some((node) => node.textContent.includes("batch " + batch + " "))
                       || document.getElementById("estimate-status").textContent.startsWith("No estimate"); }"""
    )
    page.wait_for_timeout(500)  # the chart's points follow the verdicts


def new_page(browser: Browser, phone: bool) -> Page:
    """A page at desktop width, or in a phone; without animations (Bootstrap scrolls smoothly otherwise, and a
    screenshot would catch the page mid-scroll)."""
    if phone:
        context = browser.new_context(
            viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=2, reduced_motion="reduce"
        )
    else:
        context = browser.new_context(viewport=DESKTOP, reduced_motion="reduce")
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.on("pageerror", lambda error: log(f"script error on {page.url}: {error}"))
    return page


def shoot(browser: Browser, base_url: str, job_id: str, out: Path) -> list[Path]:
    written = []

    page = new_page(browser, phone=False)
    open_form_with_auto(page, base_url)
    page.evaluate("window.scrollTo(0, 0)")
    written.append(out / "screenshot-new-model.png")
    page.screenshot(path=written[-1])
    page.context.close()

    page = new_page(browser, phone=True)
    open_form_with_auto(page, base_url)
    # As on a phone where the batch field was tapped: the field in the middle of the screen, the verdict under it.
    page.locator("#batch_size").evaluate("(node) => node.scrollIntoView({block: 'center', behavior: 'instant'})")
    page.wait_for_timeout(300)
    written.append(out / "screenshot-new-model-375.png")
    page.screenshot(path=written[-1])
    page.context.close()

    page = new_page(browser, phone=True)
    page.goto(base_url + "memplugin/jobs")
    expect(page.locator("#mp-connection")).to_have_text("live")
    expect(page.locator("#jobs-body tr").first).to_be_attached()
    written.append(out / "screenshot-jobs-375.png")
    page.screenshot(path=written[-1])
    page.context.close()

    page = new_page(browser, phone=True)
    page.goto(base_url + "memplugin/jobs/" + job_id)
    expect(page.locator("#mp-connection")).to_have_text("live")
    attempt = page.locator('#attempts tbody tr[data-attempt="1"]')
    attempt.evaluate("(node) => node.scrollIntoView({block: 'start', behavior: 'instant'})")
    page.wait_for_timeout(300)
    written.append(out / "screenshot-job-375.png")
    page.screenshot(path=written[-1])
    page.context.close()
    return written


def main(argv: list[str] | None = None) -> int:
    expect.set_options(timeout=WAIT_MS)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="folder to write the PNGs into (docs/)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds the whole run may take (300)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="memplugin-screenshots-") as folder:
        data = Path(folder) / "data"
        (data / "datasets").mkdir(parents=True)
        write_digits(data / "datasets" / TRAIN_DB, records=512, seed=1)
        write_digits(data / "datasets" / VAL_DB, records=64, seed=2)
        with deadline(args.timeout), serving(data, Path(folder) / "serve.log") as base_url:
            log(f"serving on {base_url}")
            job_id = train_a_short_job(base_url)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, timeout=WAIT_MS
                )
                try:
                    for path in shoot(browser, base_url, job_id, args.out):
                        log(f"wrote {path}")
                finally:
                    browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
