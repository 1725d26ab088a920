"""Shared by the browser tests: `digits-memplugin serve` with two simulated 24 GiB GPUs and a dataset root holding
small MNIST-shaped LMDBs, Debian's Chromium driven by Playwright (never `playwright install`), pages that fail the
test on any script error or dialog, and screenshots.

Browser test modules load it with ``pytest_plugins = ["browser_fixtures"]`` (tests/ is on sys.path, as for
conftest). Screenshots go under the test's tmp_path; with MEMPLUGIN_SCREENSHOT_DIR set (docs/ui.md gives the
command), the documentation's screenshots are written there too.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from playwright.sync_api import Browser, Page, sync_playwright

from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.jobs.store.records import FINAL_STATES

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
]
SCRIPT = Path(sys.executable).parent / "digits-memplugin"
VIEWPORT = {"width": 1400, "height": 1250}
SCREENSHOT_DIR = os.environ.get("MEMPLUGIN_SCREENSHOT_DIR")
TYPE_BATCH_UNTIL_ESTIMATE = """([key, bytes, batch]) => new Promise((resolve) => {
    const row = document.querySelector(`#device-list > li[data-device-key="${key}"]`);
    const input = document.getElementById("batch_size");
    const start = performance.now();
    const observer = new MutationObserver(() => {
        if (row.dataset.estimateBytes === bytes) { observer.disconnect(); resolve(performance.now() - start); }
    });
    observer.observe(row, {attributes: true});
    input.value = String(batch);
    input.dispatchEvent(new Event("input", {bubbles: true}));
})"""
"""For page.evaluate with [device key, estimate bytes, batch]: types the batch into the New model form and resolves
to the milliseconds until that device's row shows the estimate (the browser test and bench/page_latency.py)."""
TRAIN_DB = "mnist_train_lmdb"
VAL_DB = "mnist_val_lmdb"
"""Datasets in the served app's dataset root (<data dir>/datasets), named relative to it as a user would."""


def write_digits(path: Path, records: int, seed: int) -> Path:
    """An MNIST-shaped LMDB (1 x 28 x 28 uint8 Datums, labels 0..9) that LeNet learns in a few hundred iterations,
    as it would real digits (random pixels would only be memorised): each label is a faint 4 x 4 square at its
    own place, give or take two pixels, over noise. Train and validation sets differ by `seed`."""
    import lmdb
    import numpy as np

    rng = np.random.default_rng(seed)
    env = lmdb.open(str(path), map_size=1 << 28)
    with env.begin(write=True) as txn:
        for index in range(records):
            label = int(rng.integers(0, 10))
            pixels = rng.integers(0, 170, size=(28, 28), dtype=np.uint8)
            row, col = divmod(label, 4)
            top, left = 2 + 8 * row + int(rng.integers(0, 3)), 6 * col + int(rng.integers(0, 3))
            square = pixels[top:top + 4, left:left + 4]
            square[:] = np.maximum(square, rng.integers(100, 170, size=(4, 4), dtype=np.uint8))
            datum = caffe_pb2.Datum(label=label, channels=1, height=28, width=28, data=pixels.tobytes())
            txn.put(f"{index:08d}".encode(), datum.SerializeToString())
    env.close()
    return path


class Server:
    """The served app: its address, its data folder, and JSON calls to its API."""

    def __init__(self, base_url: str, data_dir: Path) -> None:
        self.base_url = base_url
        self.data_dir = data_dir
        self.output: collections.deque[str] = collections.deque(maxlen=5000)
        """The server's latest lines of output (stdout and stderr), read as they come so that a full pipe never
        blocks it."""
        self.form_url = base_url + "memplugin/models/new"
        self.jobs_url = base_url + "memplugin/jobs"

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> requests.Response:
        return requests.request(method, self.base_url + "memplugin/api/" + path, json=body, timeout=30)

    def api(self, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self.request("POST" if body is not None else "GET", path, body)
        assert response.status_code == 200, response.text
        return response.json()

    def job(self, job_id: str) -> dict[str, Any]:
        return self.api(f"jobs/{job_id}")  # type: ignore[no-any-return]

    def tracebacks(self) -> str:
        """The server's logged exceptions so far, each from its log line to the exception's own line."""
        lines, found, inside = list(self.output), [], False
        for number, line in enumerate(lines):
            if line.startswith("Traceback"):
                found.extend(lines[max(number - 1, 0):number])
                inside = True
            if inside:
                found.append(line)
                inside = line.startswith((" ", "Traceback"))
        return "".join(found)

    def job_url(self, job_id: str) -> str:
        return f"{self.jobs_url}/{job_id}"

    def ended(self, job_id: str, timeout: float = 180) -> dict[str, Any]:
        """The job's document once it has ended (done, failed or cancelled)."""
        from test_jobs_fixtures import wait_for

        return wait_for(  # type: ignore[no-any-return]
            lambda: (job := self.job(job_id))["status"] in FINAL_STATES and job, timeout=timeout, what=f"job {job_id} to end"
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`digits-memplugin serve --port 0 --simulate-gpus 2x24GiB` in its own process group, with a dataset root."""
    folder = tmp_path_factory.mktemp("serve")
    data_dir = folder / "data"
    datasets = data_dir / "datasets"
    datasets.mkdir(parents=True)
    write_digits(datasets / TRAIN_DB, records=512, seed=1)
    write_digits(datasets / VAL_DB, records=64, seed=2)
    process = subprocess.Popen(
        [SCRIPT, "serve", "--host", "127.0.0.1", "--port", "0", "--simulate-gpus", "2x24GiB",
         "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=folder, start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    base_url = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and base_url is None:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        match = re.search(r"serving on (http://127\.0\.0\.1:\d+/)", line)
        base_url = match.group(1) if match else None
    if base_url is None:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("serve did not report its address:\n" + "".join(lines))
    served = Server(base_url, data_dir)
    served.output.extend(lines)
    reader = threading.Thread(target=served.output.extend, args=(process.stdout,), name="serve-output", daemon=True)
    reader.start()
    try:
        yield served
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        reader.join(timeout=10)
        process.stdout.close()
        if tracebacks := served.tracebacks():
            print(f"The served app logged exceptions:\n{tracebacks}")  # shown with the module's last test's report


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `scripts/system-deps.sh --browser` installs Debian's chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def watch(page: Page) -> list[str]:
    """Collect the page's script errors and dialogs (an alert would mean injected script)."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
    return errors


@contextlib.contextmanager
def watched_page(browser: Browser) -> Iterator[Page]:
    """A fresh page in its own context that fails the test on any script error or dialog."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    errors = watch(page)
    yield page
    context.close()
    assert not errors, errors


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page that fails the test on any script error or dialog."""
    with watched_page(browser) as fresh:
        yield fresh


def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    """The top of the page, as a user first sees it."""
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=tmp_path / name, full_page=False)
    if SCREENSHOT_DIR:
        page.screenshot(path=Path(SCREENSHOT_DIR) / name, full_page=False)
