"""The "New model" page in Chromium, issue 14 points 3 and 4: a batch past Caffe's INT_MAX blob limit is a plan
with iter_size (not an error), and an error is shown at the field that caused it, with a line number only beside
text the user typed. Fixtures: browser_fixtures.py (the real app with two simulated 24 GiB GPUs)."""

from __future__ import annotations

import re

import pytest
from browser_fixtures import TRAIN_DB, VIEWPORT, Server
from playwright.sync_api import Browser, Locator, Page, expect
from test_browser_new_model import LENET, open_form, use_custom_network
from zoo_cases import ZOO

pytestmark = pytest.mark.slow
pytest_plugins = ["browser_fixtures"]

GOOGLENET = (ZOO / "caffe_googlenet" / "train_val.prototxt").read_text()
SOLVER = 'type: "SGD"\ntrain_state { stage: "train" }\n'


def gpu_row(page: Page, server: Server, index: int = 0) -> tuple[str, Locator]:
    key = server.api("devices")["devices"][index]["key"]
    return key, page.locator(f'#device-list > li[data-device-key="{key}"]')


def test_a_batch_past_the_blob_limit_is_planned_with_iter_size(page: Page, server: Server) -> None:
    """GoogLeNet at batch 4096 used to show "would create a blob of 3288334336 elements" under the network and
    empty the chart: now the wanted batch is reached in passes Caffe can build, and the page says why."""
    open_form(page, server)
    use_custom_network(page, GOOGLENET, shape="3,256,256", classes="1000")
    page.fill("#batch_size", "4096")
    key, row = gpu_row(page, server)
    document = server.api("estimate", {"net": GOOGLENET, "solver": SOLVER, "data_shapes": {"data": [3, 256, 256]},
                                       "classes": 1000, "batch": 4096, "engine": "gpu-cudnn", "device": key})
    plan = document["plan"]
    assert plan["fits"] and plan["iter_size"] > 1 and plan["effective_batch"] >= 4096
    expect(row).to_have_attribute("data-verdict", f"fits with iter_size {plan['iter_size']}", timeout=60_000)
    note = page.locator("#batch-note")
    expect(note).to_contain_text("Caffe cannot build batch 4096 in one pass")
    expect(note).to_contain_text("INT_MAX")
    expect(note).to_contain_text("2048 x iter_size 2")
    expect(page.locator("#custom_network-error")).to_be_empty()
    expect(page.locator("#batch_size")).not_to_have_class(re.compile("is-invalid"))
    # A batch within the limit: the note goes.
    page.fill("#batch_size", "64")
    expect(note).to_be_empty(timeout=60_000)


def test_a_huge_batch_on_a_standard_network_is_a_plan_not_an_error_about_its_text(page: Page, server: Server) -> None:
    """A batch of 1e9 on the standard LeNet used to show "Line 10: layer train-data ..." under the standard network
    table, 800 px from the batch field, about text the user never saw."""
    open_form(page, server)
    page.fill("#batch_size", "1000000000")
    _, row = gpu_row(page, server)
    expect(row).to_have_attribute("data-verdict", re.compile(r"^fits with iter_size \d+$"), timeout=60_000)
    expect(page.locator("#batch-note")).to_contain_text("Caffe cannot build batch 1000000000 in one pass")
    expect(page.locator("#standard_network-error")).to_be_empty()
    expect(page.get_by_text(re.compile(r"Line \d+"))).to_have_count(0)


def test_a_shape_error_in_a_standard_network_shows_at_the_item_shape(page: Page, server: Server) -> None:
    """Items of 1x4x4 are too small for LeNet's 5x5 kernels: the error is about the item shape the user typed, so it
    is shown there (marked invalid), naming the network, without a line of a text the page never shows."""
    open_form(page, server)
    page.fill("#item_shape", "1,4,4")
    error = page.locator("#item_shape-error")
    expect(error).to_contain_text("LeNet, layer")
    expect(error).to_contain_text("exceeds the padded input")
    expect(error).not_to_contain_text("Line")
    expect(page.locator("#item_shape")).to_have_class(re.compile("is-invalid"))
    expect(page.locator("#item_shape")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#standard_network-error")).to_be_empty()
    page.fill("#item_shape", "1,28,28")  # fixed: the error goes
    expect(error).to_be_empty()
    _, row = gpu_row(page, server)
    expect(row).to_have_attribute("data-verdict", "fits")


def test_a_shape_error_in_a_typed_network_keeps_its_line(page: Page, server: Server) -> None:
    """In text the user typed, the line number points at something they can see: it stays."""
    open_form(page, server)
    use_custom_network(page, LENET.text, shape="1,4,4")
    error = page.locator("#custom_network-error")
    expect(error).to_contain_text(re.compile(r"Line \d+"))
    expect(error).to_contain_text("exceeds the padded input")
    expect(error).not_to_contain_text("LeNet,")


def test_without_javascript_the_error_is_at_the_field_that_caused_it(browser: Browser, server: Server) -> None:
    context = browser.new_context(java_script_enabled=False, viewport=VIEWPORT)
    page = context.new_page()
    try:
        page.goto(server.form_url)
        page.fill("#train_source", TRAIN_DB)
        page.fill("#item_shape", "1,4,4")
        page.select_option("#device", "cpu")
        page.fill("#model_name", "too small")
        page.click("#create-model")
        error = page.locator("#item_shape-error")
        expect(error).to_contain_text("LeNet, layer")
        expect(error).not_to_contain_text("Line")
        expect(page.locator("#item_shape")).to_have_class(re.compile("is-invalid"))
        expect(page.locator("#standard_network-error")).to_be_empty()
    finally:
        context.close()
