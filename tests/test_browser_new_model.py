"""The "New model" page in a real browser: Debian's Chromium driven by Playwright against `digits-memplugin serve`
with two simulated 24 GiB GPUs, its estimates checked against the REST API of the same server (fixtures and
screenshots: browser_fixtures.py). Submitting jobs and the job pages: test_browser_jobs.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from browser_fixtures import TRAIN_DB, TYPE_BATCH_UNTIL_ESTIMATE, VIEWPORT, Server, screenshot, watch
from playwright.sync_api import Browser, Page, expect

from digits_memplugin.core.sizes import format_size
from digits_memplugin.networks import standard_network

LENET = standard_network("lenet")

pytestmark = pytest.mark.slow
pytest_plugins = ["browser_fixtures"]

CAPPED_AT_25 = (
    "Batch 25: capped at 25 so that an epoch of the 512 training items has 21 iterations (at most 1/20 of the training "
    "set); GPU 0 has memory for more."
)
"""Auto's note on the 512-image training set (core/planning/planner.py auto_cap)."""


def open_form(page: Page, server: Server) -> None:
    page.goto(server.form_url)
    expect(page.locator("#mp-connection")).to_have_text("live")
    rows = page.locator("#device-list > li")
    expect(rows).to_have_count(3)
    for index in range(3):  # the first estimate has drawn a verdict on every device
        expect(rows.nth(index)).to_have_attribute("data-verdict", re.compile(".+"))


def use_custom_network(page: Page, text: str, shape: str = "1,28,28", classes: str = "10") -> None:
    page.get_by_label("Custom network", exact=True).check()
    page.fill("#custom_network", text)
    page.fill("#item_shape", shape)
    page.fill("#classes", classes)


def lenet_request(**extra: Any) -> dict[str, Any]:
    """What the page sends for the custom LeNet without validation data (the solver settings' memory terms)."""
    solver = 'type: "SGD"\ntrain_state { stage: "train" }\n'
    return {"net": LENET.text, "solver": solver, "data_shapes": {"data": [1, 28, 28]}, "classes": 10, **extra}


def test_panel_shows_two_gpus_and_the_cpu_live(page: Page, server: Server) -> None:
    open_form(page, server)
    rows = page.locator("#device-list > li")
    devices = server.api("devices")["devices"]
    assert [row.get_attribute("data-kind") for row in rows.all()] == ["gpu", "gpu", "cpu"]
    for row, device in zip(rows.all(), devices):
        assert row.get_attribute("data-device-key") == device["key"]
    for index in (0, 1):
        expect(rows.nth(index).locator('[data-role="label"]')).to_have_text(f"GPU {index}")
        expect(rows.nth(index).locator('[data-role="name"]')).to_have_text("Simulated GPU 24.0 GiB")
        expect(rows.nth(index).locator('[data-role="memory"]')).to_contain_text("free 23.7 GiB of 24.0 GiB")
        expect(rows.nth(index).locator('[data-role="utilization"]')).to_have_text("0 % busy")
    # The bars are drawn to scale: reserved is 307 MiB of 24 GiB.
    width = rows.nth(0).locator('[data-role="reserved"]').evaluate("node => node.style.width")
    assert float(width.rstrip("%")) == pytest.approx(100 * 307 / (24 * 1024), abs=0.1)
    # Updates keep coming over the websocket: the panel's reading time moves on.
    first = page.locator("#panel-updated").text_content()
    expect(page.locator("#panel-updated")).not_to_have_text(first or "", timeout=10_000)


def test_pasted_lenet_and_auto_fill_a_batch_that_fits(page: Page, server: Server, tmp_path: Path) -> None:
    open_form(page, server)
    use_custom_network(page, LENET.text)
    gpu0 = server.api("devices")["devices"][0]
    page.select_option("#device", gpu0["key"])  # the demo trains on the CPU; plans against a GPU all the same
    page.click("#auto-batch")
    expect(page.locator("#batch_size")).to_have_value(re.compile(r"^\d+$"))
    batch = int(page.input_value("#batch_size"))
    # The same estimate through the API: the batch filled in is the largest that fits on GPU 0 within the cap of
    # "auto" (no training set chosen: its ceiling, 256), and it fits.
    document = server.api("estimate", lenet_request(engine="gpu-cudnn", device=gpu0["key"], batch=batch, auto=True))
    assert document["max_batch_size"] == batch == 256
    assert document["plan"] == {**document["plan"], "fits": True, "iter_size": 1, "batch_size": batch}
    row = page.locator(f'#device-list > li[data-device-key="{gpu0["key"]}"]')
    expect(row).to_have_attribute("data-estimate-bytes", str(document["total_bytes"]))
    expect(row).to_have_attribute("data-verdict", "fits")
    expect(row.locator('[data-role="verdict"]')).to_contain_text(f"batch {batch} × iter_size 1")
    expect(page.locator("#batch-note")).to_have_text(
        "Batch 256: capped at 256, the largest batch of Caffe's reference models; GPU 0 has memory for more."
    )
    # The chart: the network's curve and one free-memory line per GPU.
    labels = page.evaluate("MemPlugin.newModel.panel.chart.data.datasets.map(d => d.label)")
    assert labels[0] == "this network (gpu-cudnn)"
    assert {"GPU 0 free", "GPU 1 free"} <= set(labels)
    # The largest consumers, from the same estimate.
    top = max(document["layers"], key=lambda layer: layer["bytes"])
    expect(page.locator("#top-layers tbody tr").first.locator("td").first).to_have_text(top["name"])
    screenshot(page, tmp_path, "screenshot-new-model.png")


def test_editing_the_batch_re_estimates_without_a_reload(page: Page, server: Server) -> None:
    """The panel shows the estimate at the typed batch, on the same page. How fast is measured by
    bench/page_latency.py (a timed assertion here failed at 612 ms on a loaded CI run: timings live in benchmarks)."""
    open_form(page, server)
    use_custom_network(page, LENET.text)
    gpu0 = server.api("devices")["devices"][0]
    expected = server.api("estimate", lenet_request(engine="gpu-cudnn", device=gpu0["key"], batch=5000))
    page.evaluate("window.samePage = true")
    elapsed = page.evaluate(TYPE_BATCH_UNTIL_ESTIMATE, [gpu0["key"], str(expected["total_bytes"]), 5000])
    assert elapsed > 0
    assert page.evaluate("window.samePage") is True  # no reload
    row = page.locator(f'#device-list > li[data-device-key="{gpu0["key"]}"]')
    expect(row).to_have_attribute("data-verdict", "fits")


def test_a_batch_too_big_for_one_pass_fits_with_iter_size(page: Page, server: Server, tmp_path: Path) -> None:
    open_form(page, server)
    page.get_by_label("AlexNet-sized", exact=True).check()
    page.fill("#batch_size", "4096")
    gpu1 = server.api("devices")["devices"][1]
    request = {
        "net": standard_network("alexnet").text, "solver": 'type: "SGD"\ntrain_state { stage: "train" }\n',
        "data_shapes": {"data": [3, 256, 256]}, "classes": 1000, "batch": 4096, "engine": "gpu-cudnn",
        "device": gpu1["key"],
    }
    plan = server.api("estimate", request)["plan"]
    assert plan["fits"] and plan["iter_size"] > 1
    row = page.locator(f'#device-list > li[data-device-key="{gpu1["key"]}"]')
    expect(row).to_have_attribute("data-verdict", f"fits with iter_size {plan['iter_size']}")
    # The bar shows what would run: the planned batch, in the colour of "fits with iter_size".
    marker = row.locator('[data-role="estimate"]')
    expect(marker).to_have_class(re.compile("mp-estimate-iter"))
    width = float(marker.evaluate("node => node.style.width").rstrip("%"))
    assert width == pytest.approx(100 * plan["bytes"] / gpu1["memory_total"], abs=0.01)
    screenshot(page, tmp_path, "screenshot-iter-size.png")


def test_a_broken_prototxt_shows_its_line_number(page: Page, server: Server, tmp_path: Path) -> None:
    open_form(page, server)
    broken = LENET.text.replace("pool: MAX", "pool: MAXIMUM", 1)
    line = next(n for n, text in enumerate(broken.splitlines(), 1) if "MAXIMUM" in text)
    use_custom_network(page, broken)
    error = page.locator("#custom_network-error")
    expect(error).to_contain_text(f"Line {line}, column")
    expect(error).to_contain_text("MAXIMUM")
    expect(page.locator("#custom_network")).to_have_class(re.compile("is-invalid"))
    expect(page.locator("#device-list > li").first).not_to_have_attribute("data-verdict", re.compile(".+"))
    expect(page.locator("#top-layers tbody tr")).to_have_count(0)  # nothing stale is left on the panel
    screenshot(page, tmp_path, "screenshot-prototxt-error.png")
    page.fill("#custom_network", LENET.text)  # fixed: the error goes, the estimate comes back
    expect(error).to_be_empty()
    expect(page.locator("#device-list > li").first).to_have_attribute("data-verdict", "fits")


def test_an_error_stays_shown_while_devices_update(page: Page, server: Server) -> None:
    """Issue 14, 1: every `devices` event (every 2 s) used to clear the error and send the estimates again. The same
    definition on the same devices is not sent again: the error stays, and the server hears nothing more."""
    open_form(page, server)
    page.get_by_label("Custom network", exact=True).check()
    page.fill("#item_shape", "1,28,28")
    page.fill("#classes", "10")
    # An unknown type goes to the pycaffe fallback, a child process per device: seconds, longer than the 2 s
    # between `devices` events, which used to abort the estimate and send it again, for ever.
    page.fill("#custom_network", LENET.text.replace('type: "Pooling"', 'type: "Foo"', 1))
    error = page.locator("#custom_network-error")
    expect(error).to_contain_text("Foo", timeout=120_000)
    posted: list[str] = []
    page.on("request", lambda request: posted.append(request.url) if request.method == "POST" else None)

    def next_update() -> None:  # the panel's reading time moves at each `devices` event
        shown = page.locator("#panel-updated").text_content() or ""
        expect(page.locator("#panel-updated")).not_to_have_text(shown, timeout=10_000)

    next_update()  # the fields were filled one by one: the last of their estimates has gone out by now
    expect(error).to_contain_text("Foo")
    posted.clear()
    for _ in range(3):
        next_update()
        expect(error).to_contain_text("Foo")
        expect(page.locator("#custom_network")).to_have_class(re.compile("is-invalid"))
    assert posted == [], f"estimates sent again for an unchanged definition: {posted}"
    expect(page.locator("#estimate-status")).not_to_have_text(re.compile("Estimating"))
    page.fill("#custom_network", LENET.text)  # a change is estimated at once
    expect(error).to_be_empty()
    expect(page.locator("#device-list > li").first).to_have_attribute("data-verdict", "fits")
    assert posted, "the corrected definition was not estimated"


def test_enter_in_a_field_creates_the_model(page: Page, server: Server) -> None:
    """Issue 14, 2: Enter submits the form with Create, not with Auto (the first button on the page)."""
    open_form(page, server)
    page.fill("#train_source", TRAIN_DB)
    page.fill("#max_iter", "2")
    page.select_option("#device", "cpu")
    page.fill("#model_name", "enter-creates")
    page.press("#model_name", "Enter")
    expect(page).to_have_url(re.compile(r"/memplugin/jobs/[\w-]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    document = server.job(job_id)
    assert document["name"] == "enter-creates"
    assert document["batch"]["requested"] is None  # Auto filled nothing in: the network's own batch
    server.request("POST", f"jobs/{job_id}/cancel")


def test_layer_names_are_shown_as_text(page: Page, server: Server) -> None:
    open_form(page, server)
    evil = '<img src=x onerror="alert(1)">'
    use_custom_network(page, LENET.text.replace('name: "features1"', f"name: '{evil}'"))
    cell = page.locator("#top-layers tbody td", has_text="<img")
    expect(cell).to_have_text(evil)
    assert page.locator("#top-layers img").count() == 0


def test_without_javascript_the_form_posts_and_escapes_user_text(browser: Browser, server: Server) -> None:
    context = browser.new_context(java_script_enabled=False, viewport=VIEWPORT)
    page = context.new_page()
    errors = watch(page)
    try:
        page.goto(server.form_url)
        expect(page.locator("#device-list > li")).to_have_count(3)  # the panel, as the server read it
        evil = "<script>document.title='owned'</script>"
        page.get_by_label("Custom network", exact=True).check()
        page.fill("#custom_network", LENET.text.replace('name: "features1"', f'name: "{evil}"'))
        page.fill("#item_shape", "1,28,28")
        page.fill("#classes", "10")
        page.fill("#train_source", TRAIN_DB)
        page.fill("#max_iter", "3")
        page.select_option("#device", "cpu")
        page.fill("#model_name", f"lenet {evil}")
        page.click("#create-model")
        # The job's page, rendered by the server: the name as text, in the heading and in the title.
        expect(page).to_have_url(re.compile(r"/memplugin/jobs/[\w-]+$"))
        expect(page.locator("#job-name")).to_have_text(f"lenet {evil}")
        assert page.title() == f"lenet {evil} · digits-memplugin"
        # The layer name, in the definition as submitted (rewritten for LMDB: protobuf escapes the quotes).
        expect(page.locator("#job-network")).to_contain_text("name: \"<script>document.title=\\'owned\\'</script>\"")
        assert page.locator("script", has_text="owned").count() == 0  # no script element was made of it
        job_id = page.url.rsplit("/", 1)[1]
        job = server.job(job_id)
        assert (job["name"], job["device"]["requested"]) == (f"lenet {evil}", "cpu")
        expect(page.locator("#job-status")).to_have_text(re.compile("queued|running|done"))
    finally:
        context.close()
    assert not errors, errors


def test_without_javascript_auto_fills_the_suggested_batch(browser: Browser, server: Server) -> None:
    context = browser.new_context(java_script_enabled=False, viewport=VIEWPORT)
    page = context.new_page()
    try:
        page.goto(server.form_url)
        gpu0 = server.api("devices")["devices"][0]
        page.fill("#train_source", "/data/mnist/train_db")
        page.fill("#model_name", "lenet")
        page.select_option("#device", gpu0["key"])
        page.click("#auto-batch")
        expect(page.locator("#batch_size")).to_have_value(re.compile(r"^\d+$"))
        batch = int(page.input_value("#batch_size"))
        solver = 'type: "SGD"\ntrain_state { stage: "train" }\n'
        document = server.api("estimate", {"net": LENET.text, "solver": solver, "data_shapes": {"data": [1, 28, 28]},
                                           "classes": 10, "engine": "gpu-cudnn", "device": gpu0["key"], "auto": True})
        assert batch == document["max_batch_size"] == 256  # the training set cannot be read: the ceiling caps
    finally:
        context.close()


def test_a_post_without_the_csrf_token_is_refused(page: Page, server: Server) -> None:
    open_form(page, server)
    page.fill("#train_source", "/data/mnist/train_db")
    page.fill("#model_name", "lenet")
    page.evaluate("document.querySelector('input[name=csrf_token]').remove()")
    with page.expect_navigation():
        page.click("#create-model")
    expect(page.locator("#csrf-error")).to_contain_text("The CSRF token is missing.")
    assert page.url.endswith("/memplugin/models")  # the form again, not a job's page
    assert page.locator("#job-name").count() == 0


# --- issue 14, 5 and 6: the first job, datasets, Auto within the dataset ---------------------------------------------


def test_the_demo_trains_on_the_cpu_and_the_form_says_where_data_goes(page: Page, server: Server) -> None:
    """Issue 14, 5: the default device was "Next available GPU", which a demo refuses at the first submit."""
    open_form(page, server)
    assert page.input_value("#device") == "cpu"
    expect(page.locator("#datasets-help")).to_contain_text(f"Put datasets in {server.data_dir / 'datasets'}:")
    expect(page.locator("#datasets-help")).to_contain_text(f"digits-memplugin sample-dataset {server.data_dir / 'datasets'}")
    page.fill("#train_source", TRAIN_DB)
    page.fill("#max_iter", "2")
    page.fill("#model_name", "first-job")
    page.click("#create-model")
    expect(page).to_have_url(re.compile(r"/memplugin/jobs/[\w-]+$"))
    job = server.job(page.url.rsplit("/", 1)[1])
    assert job["device"]["requested"] == "cpu"
    server.request("POST", f"jobs/{job['id']}/cancel")


def test_datasets_found_are_offered_and_choosing_one_fills_the_item_shape(page: Page, server: Server) -> None:
    open_form(page, server)
    found = {d["name"]: d for d in server.api("datasets")["datasets"]}
    train = found[TRAIN_DB]
    assert (train["shape"], train["entries"]) == ([1, 28, 28], 512)
    option = page.locator(f'#mp-dataset-list option[value="{TRAIN_DB}"]')
    expect(option).to_have_attribute("label", f"LMDB · 1×28×28 · 512 items · {format_size(train['disk_bytes'])}")
    expect(page.locator(f'#datasets-found tr[data-dataset="{TRAIN_DB}"]')).to_contain_text("512")
    page.get_by_label("Custom network", exact=True).check()
    page.fill("#custom_network", LENET.text)
    page.select_option("#data_backend", "hdf5")
    assert page.input_value("#item_shape") == ""
    page.fill("#train_source", TRAIN_DB)  # what choosing the option does: the field's value, an input event
    expect(page.locator("#item_shape")).to_have_value("1,28,28")
    expect(page.locator("#data_backend")).to_have_value("lmdb")


def test_placeholders_do_not_look_like_values(page: Page, server: Server) -> None:
    open_form(page, server)
    for selector in ("#train_source", "#val_source", "#model_name"):
        assert (page.get_attribute(selector, "placeholder") or "").startswith("e.g. ")
    assert page.get_attribute("#item_shape", "placeholder") == "default: 1,28,28"
    placeholder = page.evaluate("getComputedStyle(document.getElementById('train_source'), '::placeholder').fontStyle")
    typed = page.evaluate("getComputedStyle(document.getElementById('train_source')).fontStyle")
    assert (placeholder, typed) == ("italic", "normal")


def test_auto_is_capped_at_a_twentieth_of_the_training_set(page: Page, server: Server) -> None:
    """Issue 14, 6: Auto gave LeNet batches of 100000+ on a 24 GiB GPU; issue 26, 2: capped at the training set's
    size it gave the whole set (one update an epoch). The training set here has 512 images: 25, an epoch of 21."""
    open_form(page, server)
    gpu0 = server.api("devices")["devices"][0]
    page.select_option("#device", gpu0["key"])
    uncapped = server.api("estimate", lenet_request(engine="gpu-cudnn", device=gpu0["key"]))["max_batch_size"]
    assert uncapped > 512
    use_custom_network(page, LENET.text)
    page.fill("#train_source", TRAIN_DB)
    page.click("#auto-batch")
    expect(page.locator("#batch_size")).to_have_value("25")
    expect(page.locator("#batch-note")).to_have_text(CAPPED_AT_25)
    row = page.locator(f'#device-list > li[data-device-key="{gpu0["key"]}"]')
    expect(row.locator('[data-role="verdict"]')).to_contain_text("batch 25 × iter_size 1")


def test_auto_typed_is_estimated_at_the_batch_auto_would_give(page: Page, server: Server) -> None:
    """Typing "auto" estimated the network's own 64; it is the largest batch that fits on each device within the
    cap of "auto" (256, or a twentieth of the training set when one is chosen), as Auto and a job with batch "auto"
    would run."""
    open_form(page, server)
    gpu0 = server.api("devices")["devices"][0]
    use_custom_network(page, LENET.text)
    largest = server.api("estimate", lenet_request(engine="gpu-cudnn", device=gpu0["key"], auto=True))["max_batch_size"]
    assert largest == 256
    at_largest = server.api("estimate", lenet_request(engine="gpu-cudnn", device=gpu0["key"], batch=largest))
    row = page.locator(f'#device-list > li[data-device-key="{gpu0["key"]}"]')
    page.fill("#batch_size", "auto")
    expect(row).to_have_attribute("data-estimate-bytes", str(at_largest["total_bytes"]))
    expect(row.locator('[data-role="verdict"]')).to_contain_text(f"batch {largest} × iter_size 1")
    page.fill("#train_source", TRAIN_DB)  # now within a twentieth of the dataset: 25
    at_25 = server.api("estimate", lenet_request(engine="gpu-cudnn", device=gpu0["key"], batch=25))
    expect(row).to_have_attribute("data-estimate-bytes", str(at_25["total_bytes"]))
    page.select_option("#device", gpu0["key"])
    expect(page.locator("#batch-note")).to_contain_text("capped at 25 so that an epoch of the 512 training items")


def test_without_javascript_auto_is_capped_at_the_training_datasets_size(browser: Browser, server: Server) -> None:
    context = browser.new_context(java_script_enabled=False, viewport=VIEWPORT)
    page = context.new_page()
    try:
        page.goto(server.form_url)
        page.fill("#train_source", TRAIN_DB)
        page.fill("#model_name", "lenet")
        page.select_option("#device", server.api("devices")["devices"][0]["key"])
        page.click("#auto-batch")
        expect(page.locator("#batch_size")).to_have_value("25")
        expect(page.locator("#batch-note")).to_have_text(CAPPED_AT_25)
    finally:
        context.close()
