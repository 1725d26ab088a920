"""The "New model" page's answers when something is wrong, through Flask's test client (issue 26, points 8-10):
the page's own estimate endpoint answers an estimate it cannot make with 200 and {"errors"} (the REST API keeps
its 400s), the address a failed Create leaves is a page again, the first error gets the focus, a batch past Caffe's
limit is said once, and the page shows the memory by kind and says that a job trains on one device.

The browser tests of the same: test_browser_new_model_state.py.
"""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_pages_new_model import FORM_URL, LENET, POST_URL, csrf_token, direct_estimate, error_box, form_data

from digits_memplugin.core.sizes import format_size
from digits_memplugin.devices.fake_nvml import FakeNvml
from digits_memplugin.web.pages.panel_words import CATEGORY_TERMS

PAGE_ESTIMATE_URL = "/memplugin/models/estimate.json"
API_ESTIMATE_URL = "/memplugin/api/estimate"
SOLVER = 'type: "SGD"\ntrain_state { stage: "train" }\n'
LENET_REQUEST = {"net": LENET.text, "solver": SOLVER, "data_shapes": {"data": [1, 28, 28]}, "classes": 10}


@pytest.mark.parametrize("body", [
    {**LENET_REQUEST, "data_shapes": {"data": [1, 4, 4]}},  # a shape error in the definition, with its layer
    {**LENET_REQUEST, "batch": 10**12},  # past Caffe's INT_MAX
    {**LENET_REQUEST, "batch": 0},
    {**LENET_REQUEST, "engine": "tpu"},
    {**LENET_REQUEST, "device": "GPU-nope"},
    {**LENET_REQUEST, "colour": "blue"},
    {"net": LENET.text.replace("pool: MAX", "pool: MAXIMUM", 1), "solver": SOLVER, "classes": 10},
])
def test_the_pages_estimate_answers_what_it_cannot_estimate_with_200(
    fake_gpus: FakeNvml, client: FlaskClient, body: dict[str, Any]
) -> None:
    """Point 9: the page estimates the form as it is typed, so "not valid yet" is an expected answer; as a 400 the
    browser logged it in the console, 9-10 times per edit. The same errors, as the API words them, with 200."""
    api = client.post(API_ESTIMATE_URL, json=body)
    page = client.post(PAGE_ESTIMATE_URL, json=body)
    assert api.status_code == 400, api.get_json()  # the REST API keeps DIGITS' 400 for scripts
    assert page.status_code == 200
    assert page.get_json() == api.get_json() and set(page.get_json()) == {"errors"}


def test_the_pages_estimate_is_the_apis_document(fake_gpus: FakeNvml, client: FlaskClient) -> None:
    body = {**LENET_REQUEST, "device": fake_gpus.gpus[0].uuid, "curve_batches": [1, 64, 512]}
    api = client.post(API_ESTIMATE_URL, json=body)
    page = client.post(PAGE_ESTIMATE_URL, json=body)
    assert api.status_code == page.status_code == 200
    assert page.get_json() == api.get_json()
    assert [point["batch"] for point in page.get_json()["curve"]] == [1, 64, 512]


def test_a_failure_of_the_request_itself_keeps_its_status(data_dir: Any) -> None:
    """Too large, not JSON: not an answer about the form, so not a 200 (and JSON, as the API's errors are)."""
    from digits_memplugin import create_app

    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_MAX_REQUEST_BYTES": 4096})
    client = app.test_client()
    large = client.post(PAGE_ESTIMATE_URL, json={"net": "#" * 8192})
    assert large.status_code == 413 and "limit is 4096" in large.get_json()["error"]
    wrong = client.post(PAGE_ESTIMATE_URL, data="net: 1", content_type="text/plain")
    assert wrong.status_code == 400 and "the body must be JSON" in wrong.get_json()["error"]
    assert client.get(PAGE_ESTIMATE_URL).status_code == 405


def test_the_address_a_failed_post_leaves_shows_the_form(client: FlaskClient) -> None:
    """Point 9: after a failed Create the browser shows <prefix>/models; opening it again was a 405."""
    response = client.get(POST_URL)
    assert response.status_code == 303
    assert response.headers["Location"].endswith(FORM_URL)
    assert client.get(POST_URL, follow_redirects=True).status_code == 200


def test_a_failed_post_gives_its_first_error_the_focus(fake_gpus: FakeNvml, client: FlaskClient) -> None:
    """Point 8: the form came back at its top, far from the error. The first error in the page's order (the batch
    comes before the model's name, though the form class declares the name first) is `autofocus`, so the browser
    opens the page there even without JavaScript; the alert at the top names it, with a link."""
    response = client.post(POST_URL, data=form_data(csrf_token(client), model_name="", batch_size="0"))
    assert response.status_code == 400
    focused = re.findall(r"<(?:input|select|textarea)[^>]*\bautofocus\b[^>]*>", response.text)
    assert len(focused) == 1 and 'id="batch_size"' in focused[0], focused
    assert re.search(r'\(the first: <a href="#batch_size" id="first-error-link">Batch size</a>\)', response.text)
    assert "0 is not a batch size: give 1 or more" in error_box(response.text, "batch_size")
    assert "This field is required." in error_box(response.text, "model_name")
    assert "autofocus" not in client.get(FORM_URL).text  # the form as first opened starts at its top


@pytest.mark.parametrize("batch", ["1000000000000", "3000000000"])
def test_a_batch_past_caffes_limit_is_said_once_plainly(fake_gpus: FakeNvml, client: FlaskClient, batch: str) -> None:
    """Point 9: 10^12 (more digits than a batch field reads) was "not a batch size: give a positive integer"."""
    response = client.post(POST_URL, data=form_data(csrf_token(client), batch_size=batch))
    assert response.status_code == 400
    box = html.unescape(re.sub(r"<[^>]+>", "", error_box(response.text, "batch_size"))).strip()
    assert box == f"{batch} is too large: a batch size is at most 2147483647 (Caffe keeps it in a 32-bit int)"


def test_auto_without_javascript_shows_the_memory_by_kind(fake_gpus: FakeNvml, client: FlaskClient) -> None:
    """Point 10: the CLI printed the categories, the page only the largest layers."""
    target = fake_gpus.gpus[1]
    response = client.post(POST_URL, data=form_data(csrf_token(client), device=target.uuid, action="suggest"))
    assert response.status_code == 200
    batch = int(re.search(r'id="batch_size" [^>]*value="(\d+)"', response.text).group(1))  # type: ignore[union-attr]
    document = direct_estimate(LENET.text, target.free, batch=batch)
    rows = re.findall(r'<tr data-category="(\w+)"><td><a [^>]*>([^<]+)</a></td><td class="text-end">([^<]+)</td>'
                      r'<td class="text-end">(\d+) %</td>', response.text)
    total = document["total_bytes"]
    expected = [(key, term.label, format_size(size), str(int(100 * size / total + 0.5)))
                for key, term in CATEGORY_TERMS.items() if (size := document["categories"][key])]
    assert rows == expected
    assert {"workspace", "context"} <= {row[0] for row in rows}  # a GPU's own kinds


def test_the_form_says_a_job_trains_on_one_device(client: FlaskClient, app: Flask) -> None:
    """Point 10: DIGITS trains a job on several GPUs; this plugin on one, and the page says so."""
    page = client.get(FORM_URL).text
    assert "A job trains on one device: one GPU or the CPU, never several GPUs at once" in page
    assert 'id="term-one-gpu"' in page


def test_the_pages_estimate_is_a_write_as_the_apis_is(data_dir: Any) -> None:
    """Another site's page cannot have a visitor's browser run estimates here, and with a token only a signed-in
    page or a bearer may: the same rules as POST api/estimate (access.py), and JSON answers, not a sign-in page."""
    from digits_memplugin import create_app

    token = "t" * 32
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_API_TOKEN": token})
    client = app.test_client()
    estimates = app.extensions["memplugin"].estimates
    calls: list[Any] = []
    original = estimates.estimate
    estimates.estimate = lambda *args, **kwargs: calls.append(args) or original(*args, **kwargs)
    for url in (PAGE_ESTIMATE_URL, API_ESTIMATE_URL):
        anonymous = client.post(url, json=LENET_REQUEST)
        assert anonymous.status_code == 401 and "API token" in anonymous.get_json()["error"], url
        cross = client.post(url, json=LENET_REQUEST, headers={"Origin": "http://evil.example",
                                                              "Authorization": f"Bearer {token}"})
        assert cross.status_code == 403 and "cross-site" in cross.get_json()["error"], url
        assert calls == []  # nothing was estimated
        allowed = client.post(url, json=LENET_REQUEST, headers={"Authorization": f"Bearer {token}"})
        assert allowed.status_code == 200 and allowed.get_json()["total_bytes"] > 0, url
        calls.clear()
