"""How often one submission of the New model form goes through the core (issue 27, "Planning runs backwards": up
to six times per click). Counted on the real functions, which still run: `core.estimate.estimate` (an estimate
document: the panel's report, and a plan when it is given free memory) and `core.planning.job_plan.plan_job` (a
plan: inside an estimate given free memory, and the job manager's preview of the typed request).

What one click costs now: the form's own estimate on the device chosen (its report, its definition errors with
their lines, which data layers the nets have, and whether even batch 1 fits there), the manager's preview (the plan
the job's first attempt gets) and, only when that plan's batch is another than the estimate's (Auto), the report
at the planned batch, which is not planned again. Before: that report was planned a third time (2 estimates and 3
plans for Auto). A test here fails when a path asks the core more often again.

The page's script asks models/estimate.json once per device on each change, and once more for the chart (one
request per device each round is what test_browser_new_model_state holds it to); each of those requests goes
through the core once."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from flask.testing import FlaskClient
from test_jobs_fixtures import write_lmdb
from test_pages_new_model import JOB, JSON_URL, POST_URL, TRAIN_DB, VAL_DB, csrf_token, form_data

import digits_memplugin
from digits_memplugin.core import estimate as core_estimate
from digits_memplugin.core.planning import job_plan
from digits_memplugin.devices.fake_nvml import FakeNvml
from digits_memplugin.estimate import dataset_scan
from digits_memplugin.networks import standard_network

PREVIEW_URL = "/memplugin/models/preview.json"


class Counted:
    """Counts the calls of `function` from every module of the package that holds it (each caller imported it by
    name, so patching its own module alone would count none); the function still runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, function: Callable[..., Any]) -> None:
        self.calls = 0
        lock = threading.Lock()

        def counted(*args: Any, **kwargs: Any) -> Any:
            with lock:
                self.calls += 1
            return function(*args, **kwargs)

        holders = [
            module for name, module in list(sys.modules.items())
            if name.startswith(digits_memplugin.__name__) and module is not None
        ]
        self.holders = 0
        for module in holders:
            for attribute, value in list(vars(module).items()):
                if value is function:
                    monkeypatch.setattr(module, attribute, counted)
                    self.holders += 1


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], Any]], tuple[Any, int, int]]:
    """Run a request and count what it asked of the core: (response, estimates, plans)."""

    def run(send: Callable[[], Any]) -> tuple[Any, int, int]:
        with monkeypatch.context() as patch:
            estimates = Counted(patch, core_estimate.estimate)
            plans = Counted(patch, job_plan.plan_job)
            assert estimates.holders and plans.holders, "the counted functions are no longer where callers find them"
            response = send()
            return response, estimates.calls, plans.calls

    return run


SAMPLE = "sample_train_lmdb"
"""A training set of 1438 items: Auto's cap (a twentieth of it) chooses batch 71, not the net's 64."""


@pytest.fixture
def datasets(app: Any, data_dir: Any) -> None:
    """The LMDBs the form's JOB names and SAMPLE, in the app's dataset root (<data dir>/datasets)."""
    for name, records in ((TRAIN_DB, 16), (VAL_DB, 8), (SAMPLE, 1438)):
        write_lmdb(data_dir / "datasets" / name, records=records)


def test_a_create_click_asks_for_one_estimate_and_the_managers_plan(
    fake_gpus: FakeNvml, client: FlaskClient, datasets: None, counts: Any
) -> None:
    token = csrf_token(client)
    response, estimates, plans = counts(lambda: client.post(POST_URL, data=form_data(token, **JOB)))
    assert response.status_code == 303
    assert (estimates, plans) == (1, 2)  # the form's estimate (with its plan on the device), the manager's preview


def test_the_auto_button_plans_its_batch_once_more_only_in_the_preview(
    fake_gpus: FakeNvml, client: FlaskClient, datasets: None, counts: Any
) -> None:
    token = csrf_token(client)
    target = fake_gpus.gpus[1]
    fields = {**JOB, "device": target.uuid, "train_source": SAMPLE}
    response, estimates, plans = counts(lambda: client.post(POST_URL, data=form_data(token, **fields, action="suggest")))
    assert response.status_code == 200 and 'value="71"' in response.text
    # The form's estimate at the net's batch and its plan, the preview's plan at 71, the report at 71 (no plan).
    assert (estimates, plans) == (2, 2)


@pytest.mark.parametrize("url", [PREVIEW_URL, JSON_URL])
def test_the_json_twins_with_auto_plan_as_the_form_does(
    fake_gpus: FakeNvml, client: FlaskClient, datasets: None, counts: Any, url: str
) -> None:
    body = {**JOB, "model_name": "auto", "batch_size": "auto", "train_source": SAMPLE}
    response, estimates, plans = counts(lambda: client.post(url, json=body))
    assert response.status_code in (200, 201), response.get_json()
    assert (estimates, plans) == (2, 2)


def test_auto_before_the_data_is_in_place_plans_on_the_forms_estimate(
    fake_gpus: FakeNvml, client: FlaskClient, counts: Any
) -> None:
    """The training set cannot be read (the manager's preview refuses it): the form's estimate plans, at the net's
    batch and then at the largest batch that fits (what the panel shows there)."""
    token = csrf_token(client)
    target = fake_gpus.gpus[1]
    response, estimates, plans = counts(
        lambda: client.post(POST_URL, data=form_data(token, device=target.uuid, action="suggest"))
    )
    assert response.status_code == 200 and 'value="256"' in response.text
    assert (estimates, plans) == (2, 2)


def test_a_click_reads_the_training_dataset_it_names_once(
    fake_gpus: FakeNvml, client: FlaskClient, datasets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The form reads it for the item shape (an empty one is the dataset's) and for the cap of "auto"; it read it
    twice, each time in a confined reader process. The job manager's preview reads it again as the job will."""
    token = csrf_token(client)
    fields = {**JOB, "device": fake_gpus.gpus[1].uuid, "train_source": SAMPLE}
    reads = Counted(monkeypatch, dataset_scan.source_dataset)
    assert reads.holders
    response = client.post(POST_URL, data=form_data(token, **fields, action="suggest"))
    assert response.status_code == 200 and 'value="71"' in response.text
    assert reads.calls == 1


def test_the_pages_estimate_goes_through_the_core_once_per_device(
    fake_gpus: FakeNvml, client: FlaskClient, counts: Any
) -> None:
    """What the page's script asks on each change, once per device (and once for the chart, which plans nothing):
    one estimate, planned on that device's free memory."""
    lenet = standard_network("lenet")
    body = {"net": lenet.text, "data_shapes": {"data": list(lenet.item_shape)}, "classes": lenet.classes,
            "device": fake_gpus.gpus[1].uuid}
    response, estimates, plans = counts(lambda: client.post("/memplugin/models/estimate.json", json=body))
    assert response.status_code == 200 and response.get_json()["plan"]["fits"], response.get_json()
    assert (estimates, plans) == (1, 1)
    chart = {**body, "curve_batches": [1, 2, 4, 8]}
    del chart["device"]
    response, estimates, plans = counts(lambda: client.post("/memplugin/models/estimate.json", json=chart))
    assert len(response.get_json()["curve"]) == 4
    assert (estimates, plans) == (1, 0)
