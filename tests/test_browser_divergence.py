"""A diverging loss in a real browser: LeNet created from the New model form with base learning rate 50, on the real
sample dataset (`digits-memplugin sample-dataset`), trained by real pycaffe children. The job page ends with DIGITS'
advice; on the chart a NaN is a gap in its line and a red ✕ (drawn: its pixels are read back), listed in words
under the chart; the summary says "NaN". Chosen on the form, "Keep training" trains to the end with the NaN
points marked. Any script error on the page fails the test (browser_fixtures.page).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from browser_fixtures import SCRIPT, Server, screenshot
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.slow
pytest_plugins = ["browser_fixtures"]

DIGITS_SENTENCE = 'Network outputted NaN for "loss" (Train phase). Try decreasing your learning rate.'
TRAINING = 120_000

MARKS = """(label) => {
    const chart = MemPlugin.jobPage.chart;
    const index = chart.data.datasets.findIndex((d) => d.label === label + " not finite");
    if (index < 0) return null;
    const ratio = chart.currentDevicePixelRatio || 1;
    const context = chart.canvas.getContext("2d");
    return chart.getDatasetMeta(index).data.map((element, i) => {
        const pixel = context.getImageData(Math.round(element.x * ratio), Math.round(element.y * ratio), 1, 1).data;
        return {x: chart.data.datasets[index].data[i].x, shown: chart.data.datasets[index].data[i].shown,
                rgb: [pixel[0], pixel[1], pixel[2]], top: element.y < chart.chartArea.top + 0.1 * chart.height};
    });
}"""
"""The red ✕ marks of a series: their iterations, the value each stands for, and the colour of the canvas at each."""
GAPS = """(label) => {
    const chart = MemPlugin.jobPage.chart;
    const index = chart.data.datasets.findIndex((d) => d.label === label);
    const data = chart.data.datasets[index].data;
    return chart.getDatasetMeta(index).data.map((element, i) => ({x: data[i].x, y: data[i].y, skip: element.skip}));
}"""
"""A series' points as Chart.js draws them: `skip` means the line is broken there."""


@pytest.fixture(scope="module")
def sample(server: Server) -> Server:
    """The server with the real sample dataset in its dataset folder."""
    subprocess.run([SCRIPT, "sample-dataset", str(server.data_dir / "datasets")], check=True, timeout=120,
                   capture_output=True)
    return server


def create(page: Page, server: Server, name: str, max_iter: int, divergence: str | None = None) -> str:
    """A LeNet job from the New model form, on the CPU, at base learning rate 50; its id once its page opened."""
    page.goto(server.form_url)
    expect(page.locator("#mp-connection")).to_have_text("live")
    page.fill("#train_source", "digits_train_lmdb")
    page.fill("#val_source", "digits_val_lmdb")
    page.fill("#base_lr", "50")
    page.select_option("#lr_policy", "fixed")
    page.fill("#max_iter", str(max_iter))
    page.fill("#test_interval", "10")
    page.fill("#test_iter", "2")
    page.fill("#snapshot", "0")
    expect(page.locator("#divergence")).to_have_value("stop")  # DIGITS' behaviour unless chosen otherwise
    if divergence is not None:
        page.select_option("#divergence", divergence)
    page.select_option("#device", "cpu")
    page.fill("#model_name", name)
    page.click("#create-model")
    page.wait_for_url("**/memplugin/jobs/*", timeout=60_000)
    return page.url.rsplit("/", 1)[1]


def first_nan(server: Server, job_id: str) -> int:
    records = server.api(f"jobs/{job_id}/progress")["records"]
    return next(r["iteration"] for r in records if r["event"] == "iteration" and r["loss"] == "NaN")


def assert_marked(page: Page, label: str, iterations: set[int]) -> None:
    """The series has a gap at each of `iterations` and a red ✕ near the top of the chart above it."""
    # Every mark there and drawn: the chart is redrawn at most every 50 ms, so its canvas may lag its data.
    page.wait_for_function(
        f"(label) => {{ const m = ({MARKS})(label); return m && m.length === {len(iterations)}"
        " && m.every((k) => k.rgb[0] > 150 && k.rgb[1] < 110 && k.rgb[2] < 130); }",
        arg=label, timeout=TRAINING,
    )
    marks = page.evaluate(MARKS, label)
    assert {mark["x"] for mark in marks} == iterations
    for mark in marks:
        red, green, blue = mark["rgb"]
        assert red > 150 and green < 110 and blue < 130, mark  # #dc3545 drawn there
        assert mark["top"] and mark["shown"] == "NaN", mark
    drawn = {point["x"]: point for point in page.evaluate(GAPS, label)}
    for iteration in iterations:
        assert drawn[iteration]["y"] is None and drawn[iteration]["skip"] is True, drawn[iteration]
    assert all(p["skip"] is False and p["y"] is not None for x, p in drawn.items() if x not in iterations)


def test_a_diverging_job_from_the_form_ends_with_digits_advice_and_marks_the_nan(
    page: Page, sample: Server, tmp_path: Path
) -> None:
    job_id = create(page, sample, "lenet lr 50", max_iter=300)
    job = sample.ended(job_id)
    assert job["status"] == "failed" and job["message"].startswith(DIGITS_SENTENCE), job["message"]
    nan_at = first_nan(sample, job_id)

    expect(page.locator("#job-status")).to_have_text("failed", timeout=TRAINING)
    expect(page.locator("#job-message")).to_contain_text(DIGITS_SENTENCE)
    row = page.locator("#attempts tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-status", "diverged")
    expect(row.locator('[data-role="status"]')).to_have_text("diverged")
    expect(row.locator('[data-role="why"]')).to_have_text(job["message"])  # no signal: the runner stopped itself
    assert_marked(page, "train loss", {nan_at})
    note = page.locator("#chart-non-finite")
    expect(note).to_be_visible()
    expect(note).to_have_text(f"Not finite (✕ above a gap in the line): train loss NaN at iteration {nan_at}.")
    expect(page.locator('#job-summary [data-role="loss"]')).to_have_text("NaN")
    screenshot(page, tmp_path, "job-diverged.png")

    # The first paint of the ended job (the server's template, then the history from REST) says the same.
    page.reload()
    expect(page.locator('#job-summary [data-role="loss"]')).to_have_text("NaN")
    assert_marked(page, "train loss", {nan_at})
    expect(note).to_be_visible()


def test_keep_training_chosen_on_the_form_trains_to_the_end_with_every_nan_marked(page: Page, sample: Server) -> None:
    job_id = create(page, sample, "lenet lr 50 trains on", max_iter=40, divergence="continue")
    job = sample.ended(job_id)
    nan_at = first_nan(sample, job_id)
    assert job["status"] == "done" and job["iteration"] == 40 and job["divergence"] == "continue", job["message"]
    expect(page.locator("#job-status")).to_have_text("done", timeout=TRAINING)
    expect(page.locator("#job-message")).to_contain_text(f'outputted NaN for "loss" (Train phase) from iteration {nan_at}')
    records = sample.api(f"jobs/{job_id}/progress")["records"]
    train_nan = {r["iteration"] for r in records if r["event"] == "iteration" and r["loss"] == "NaN"}
    test_nan = {r["iteration"] for r in records if r["event"] == "test" and r["outputs"]["loss"] == "NaN"}
    assert train_nan == set(range(nan_at, 41)) and test_nan
    assert_marked(page, "train loss", train_nan)
    assert_marked(page, "validation loss", test_nan)
    expect(page.locator("#chart-non-finite")).to_contain_text(f"train loss NaN at iteration {nan_at} and ")
    expect(page.locator("#chart-non-finite")).to_contain_text("validation loss NaN at iteration")
