"""The "New model" page through Flask's test client: the form, its plain POST and its JSON twin creating jobs, CSRF
and escaping.

Planned numbers (Auto) are checked against `core.estimate` called directly with the same inputs, so the page is held
to the estimator rather than to numbers copied into the test; created jobs are checked in the job manager's store.
Jobs created here really train, on the CPU, for two iterations. The browser tests drive the same page live.
"""

from __future__ import annotations

import html
import io
import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_jobs_fixtures import write_lmdb

from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.core.sizes import GIB, MIB, format_size
from digits_memplugin.devices.fake_nvml import FakeGpu, FakeNvml
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.networks import standard_network
from digits_memplugin.web.pages.forms import solver_prototxt

LENET = standard_network("lenet")
FORM_URL = "/memplugin/models/new"
POST_URL = "/memplugin/models"
JSON_URL = "/memplugin/models.json"
TRAIN_DB = "mnist_train_lmdb"
VAL_DB = "mnist_val_lmdb"
JOB = {"train_source": TRAIN_DB, "val_source": VAL_DB, "device": "cpu", "max_iter": "2"}
"""What a form needs to become a job here: datasets in the dataset root, the CPU (the fake GPUs cannot train)."""


def csrf_token(client: FlaskClient) -> str:
    page = client.get(FORM_URL).text
    match = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page)
    assert match, "the form carries no CSRF token"
    return match.group(1)


def form_data(token: str | None, **fields: Any) -> dict[str, Any]:
    """What the page posts when the user changes `fields` and leaves the rest as the page fills it in."""
    data: dict[str, Any] = {
        "model_name": "lenet-mnist",
        "network": "standard",
        "standard_network": "lenet",
        "custom_network": "",
        "solver": "settings",
        "solver_type": "SGD",
        "base_lr": "0.01",
        "lr_policy": "step",
        "gamma": "0.1",
        "power": "0.75",
        "stepsize": "3000",
        "stepvalues": "",
        "momentum": "0.9",
        "weight_decay": "0.0005",
        "max_iter": "10000",
        "test_interval": "500",
        "test_iter": "100",
        "snapshot": "5000",
        "solver_text": "",
        "data_backend": "lmdb",
        "train_source": "/data/mnist/train_db",
        "val_source": "/data/mnist/val_db",
        "item_shape": "",
        "classes": "",
        "batch_size": "",
        "device": "next",
    }
    if token is not None:
        data["csrf_token"] = token
    data.update(fields)
    return data


def direct_estimate(net: str, device_free: int, *, engine: str = "gpu-cudnn", validation: bool = True,
                    solver_type: str = "SGD", batch: int | None = None, shape: tuple[int, ...] = LENET.item_shape,
                    classes: int | None = LENET.classes) -> dict[str, Any]:
    """What core.estimate says for the job the default form describes: the numbers the page must show."""
    settings = {"type": solver_type, "test_iter": 100, "test_interval": 500} if validation else {"type": solver_type}
    return estimate(
        EstimateRequest(
            net=net, solver=solver_prototxt(settings, validation=validation), batch=batch, engine=engine,
            free_bytes=device_free, data_shapes={"data": shape}, classes=classes,
        )
    )


@pytest.fixture
def gpus_app(fake_gpus: FakeNvml, app: Flask) -> FakeNvml:
    """The app with the two fake GPUs (GPU 0: 24 GiB with 8 GiB of processes; GPU 1: 12 GiB, idle) installed."""
    return fake_gpus


@pytest.fixture
def datasets(app: Flask, data_dir: Any) -> Any:
    """MNIST-shaped LMDBs in the app's dataset root (<data dir>/datasets), as a user names them: relative to it."""
    root = data_dir / "datasets"
    root.mkdir(parents=True, exist_ok=True)  # init_app made it
    write_lmdb(root / TRAIN_DB)
    write_lmdb(root / VAL_DB, records=8)
    return root


def stored_job(app: Flask, job_id: str) -> Any:
    return get_plugin(app).jobs.get(job_id)


def submitted_net(app: Flask, job_id: str) -> str:
    return str((get_plugin(app).jobs.folder(job_id) / "net.prototxt").read_text())


def error_box(html: str, name: str) -> str:
    """The text of the error box beside field `name` (empty when the field has none)."""
    match = re.search(rf'id="{name}-error"[^>]*>(.*?)</div>\s*</div>', html, re.DOTALL)
    assert match, f"no error box beside {name}"
    return match.group(1)


# --- the form ---------------------------------------------------------------------------------------------------


def test_form_lists_networks_devices_and_the_panel(gpus_app: FakeNvml, client: FlaskClient) -> None:
    page = client.get(FORM_URL)
    assert page.status_code == 200
    html = page.text
    assert 'name="csrf_token"' in html
    for key in ("lenet", "alexnet"):
        assert f'name="standard_network" type="radio" value="{key}"' in html
    options = re.findall(r'<option[^>]*value="([^"]+)"', html.split('id="device"')[1].split("</select>")[0])
    assert options == ["next", *[g.uuid for g in gpus_app.gpus], "cpu"]
    # The memory panel, rendered by the server so that it shows without JavaScript too.
    rows = re.findall(r'<li class="list-group-item mp-device" data-device-key="([^"]*)" data-kind="(\w*)"', html)
    assert rows[:3] == [(gpus_app.gpus[0].uuid, "gpu"), (gpus_app.gpus[1].uuid, "gpu"), ("cpu", "cpu")]
    assert "4242 /usr/bin/python3 (6.0 GiB)" in html
    assert 'aria-live="polite"' in html
    # Every field has a label tied to it.
    for name in ("model_name", "custom_network", "item_shape", "batch_size", "device", "train_source"):
        assert f'<label class="form-label" for="{name}">' in html


def test_form_loads_its_libraries_from_static_vendor_only(client: FlaskClient) -> None:
    html = client.get(FORM_URL).text
    sources = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', html)
    assert sources, "no scripts or stylesheets found"
    assert not [s for s in sources if "//" in s], "a library is loaded from another origin"
    for wanted in ("vendor/bootstrap/bootstrap.min.css", "vendor/socket.io-client/socket.io.min.js",
                   "vendor/chart.js/chart.umd.min.js", "js/memplugin.js", "js/memory-panel.js", "js/new-model.js"):
        url = next((s for s in sources if s.endswith(wanted)), None)
        assert url is not None, wanted
        response = client.get(url)
        assert response.status_code == 200, url
        response.close()


def test_home_page_menu_links_to_the_new_model_page(client: FlaskClient) -> None:
    assert f'href="{FORM_URL}"' in client.get("/").text


# --- plain POST -------------------------------------------------------------------------------------------------


def test_plain_post_without_the_csrf_token_is_refused(gpus_app: FakeNvml, client: FlaskClient) -> None:
    response = client.post(POST_URL, data=form_data(None))
    assert response.status_code == 400
    assert 'id="csrf-error"' in response.text
    assert "The CSRF token is missing." in response.text
    assert "Planned model" not in response.text


def test_plain_post_with_a_forged_token_is_refused(gpus_app: FakeNvml, client: FlaskClient) -> None:
    csrf_token(client)  # a session exists, but the token posted is not its own
    response = client.post(POST_URL, data=form_data("forged-token"))
    assert response.status_code == 400
    assert "The CSRF token is invalid." in response.text


def test_plain_post_creates_the_job_and_goes_to_its_page(
    gpus_app: FakeNvml, app: Flask, client: FlaskClient, datasets: Any
) -> None:
    response = client.post(POST_URL, data=form_data(csrf_token(client), **JOB))
    assert response.status_code == 303  # a reload of the job's page does not post the form again
    match = re.fullmatch(r"/memplugin/jobs/([\w-]+)", response.headers["Location"])
    assert match, response.headers["Location"]
    job = stored_job(app, match.group(1))
    assert job.name == "lenet-mnist"
    # The form's fields, as the job request: data sources by layer (DIGITS' stages), the CPU, LeNet's classes.
    assert job.spec["device"] == "cpu"
    assert job.spec["data"] == {"train-data": TRAIN_DB, "val-data": VAL_DB}
    assert job.spec["classes"] == 10 and job.spec["batch"] is None and job.spec["max_iter"] is None
    assert job.spec["data_shapes"] == {"data": [1, 28, 28]}
    assert job.max_iter == 2
    # Caffe's Data layer reads LevelDB unless told: the dataset's format went into the network.
    layers = {layer.name: layer for layer in parse_net(submitted_net(app, job.id)).layer}
    assert layers["train-data"].data_param.backend == layers["val-data"].data_param.backend == 1  # LMDB
    page = client.get(response.headers["Location"])
    assert page.status_code == 200
    assert 'id="job-name">lenet-mnist<' in page.text


def test_the_form_has_a_memory_cap_that_the_job_and_its_page_keep(
    gpus_app: FakeNvml, app: Flask, client: FlaskClient, datasets: Any
) -> None:
    """Issue 26 point 6: the API and the command line took a memory cap, the form had none, and the job's page
    showed it nowhere. The field is checked as the API checks `memory_cap`, beside it when wrong."""
    form = client.get(FORM_URL).text
    assert re.search(r'<label class="form-label" for="memory_cap">Memory cap \(CPU jobs\)</label>', form)
    response = client.post(POST_URL, data=form_data(csrf_token(client), **JOB, memory_cap="64MiB"))
    assert response.status_code == 303, error_box(response.text, "memory_cap")
    job = stored_job(app, response.headers["Location"].rsplit("/", 1)[1])
    assert job.spec["memory_cap"] == 64 * MIB
    page = client.get(response.headers["Location"]).text
    assert re.search(r'data-role="memory-cap">64.0 MiB \(this job&#39;s\)<', page), page.split("Memory cap")[1][:200]
    for typed, said in (("2048", "'2048' is not a memory size: write a number and a unit"),
                        ("12KiB", "must be a number of bytes from 1 MiB to 1 EiB"),
                        ("lots", "'lots' is not a memory size")):
        refused = client.post(POST_URL, data=form_data(csrf_token(client), **JOB, memory_cap=typed))
        assert refused.status_code == 400 and said in html.unescape(error_box(refused.text, "memory_cap")), typed


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (64 * MIB, None),  # a number is bytes, as in POST api/jobs
        ("64MiB", None),
        (1024, "must be a number of bytes from 1 MiB to 1 EiB"),
        ("64", "is not a memory size: write a number and a unit"),
        (1.5, "is not a memory size"),
        (True, "must be text or a number"),
    ],
)
def test_json_twin_takes_the_memory_cap_as_the_api_does(
    gpus_app: FakeNvml, app: Flask, client: FlaskClient, datasets: Any, value: Any, error: str | None
) -> None:
    response = client.post(JSON_URL, json={**JOB, "model_name": "capped", "memory_cap": value})
    if error is None:
        assert response.status_code == 201, response.get_json()
        assert response.get_json()["memory_cap"] == 64 * MIB
        assert stored_job(app, response.get_json()["id"]).spec["memory_cap"] == 64 * MIB
    else:
        assert response.status_code == 400
        assert error in response.get_json()["errors"]["memory_cap"], response.get_json()


def test_a_memory_cap_on_a_gpu_is_refused_beside_the_field(gpus_app: FakeNvml, client: FlaskClient, datasets: Any) -> None:
    response = client.post(JSON_URL, json={**JOB, "model_name": "g", "device": "next", "memory_cap": "2GiB"})
    assert response.status_code == 400
    assert response.get_json()["errors"] == {"memory_cap": 'a memory cap applies to CPU jobs only (device "cpu")'}


def test_plain_post_on_a_simulated_gpu_is_refused_beside_the_device(
    gpus_app: FakeNvml, app: Flask, client: FlaskClient, datasets: Any
) -> None:
    """The fake GPUs have made-up memory and no CUDA device behind them: a job there could only fail."""
    for device, label in (("next", "“Next available GPU” (GPU 0)"), (gpus_app.gpus[1].uuid, "GPU 1")):
        response = client.post(POST_URL, data=form_data(csrf_token(client), **{**JOB, "device": device}))
        assert response.status_code == 400
        box = error_box(response.text, "device")
        assert f"{label} is simulated (--simulate-gpus)" in box.replace("&#34;", '"')
        assert "choose the CPU to train" in box
    assert get_plugin(app).started_jobs().list_jobs() == []


def test_the_form_trains_on_the_cpu_by_default_when_the_gpus_are_simulated(
    gpus_app: FakeNvml, app: Flask, client: FlaskClient, datasets: Any
) -> None:
    """Issue 14, 5: "Next available GPU" was the default, and a job on a simulated GPU is refused: the first job of
    a demo failed at its first submit. The CPU is chosen, and a form that names no device trains there."""
    page = client.get(FORM_URL).text
    help_text = re.search(r'id="device-help">([^<]*)<', page)
    assert help_text and "The GPUs are simulated: plan against them, but jobs train on the CPU" in help_text.group(1)
    assert re.search(r'<option selected value="cpu">CPU \(', page), "the CPU is not the device chosen"
    fields = {key: value for key, value in form_data(csrf_token(client), **JOB).items() if key != "device"}
    response = client.post(POST_URL, data=fields)
    assert response.status_code == 303, error_box(response.text, "device")
    (job,) = get_plugin(app).started_jobs().list_jobs()
    assert job.spec["device"] == "cpu"


def test_without_simulated_gpus_the_default_is_the_next_available_gpu(fake_gpus: FakeNvml, client: FlaskClient,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from digits_memplugin.devices import reader as devices

    monkeypatch.setattr(devices._session, "simulated", False)
    assert re.search(r'<option selected value="next">Next available GPU', client.get(FORM_URL).text)


def test_the_form_says_where_to_put_data_and_how_to_get_some(client: FlaskClient, data_dir: Any) -> None:
    """Issue 14, 5: the datasets folder exists from the start, and the page names it and the sample command."""
    assert (data_dir / "datasets").is_dir()
    help_text = re.search(r'id="datasets-help">(.*?)</p>', client.get(FORM_URL).text, re.S)
    assert help_text, "the Dataset section does not say where to put data"
    text = " ".join(re.sub(r"<[^>]+>", "", help_text.group(1)).split())
    assert f"Put datasets in {data_dir / 'datasets'}: LMDB folders" in text
    assert f"digits-memplugin sample-dataset {data_dir / 'datasets'}" in text


def test_the_form_offers_the_datasets_found(gpus_app: FakeNvml, client: FlaskClient, datasets: Any) -> None:
    """Each dataset of the root is offered in the source fields (a datalist: it works without JavaScript), with its
    item shape, entries and size read from it; the same facts are listed in a table."""
    (datasets / "rgb").mkdir()
    write_lmdb(datasets / "rgb" / "cifar_lmdb", records=5, shape=(3, 32, 32))
    page = client.get(FORM_URL).text
    assert re.search(r'id="train_source" [^>]*list="mp-dataset-list"', page)
    assert re.search(r'id="val_source" [^>]*list="mp-dataset-list"', page)
    options = dict(re.findall(r'<option value="([^"]+)" label="([^"]+)">', page))
    train_bytes = (datasets / TRAIN_DB / "data.mdb").stat().st_blocks * 512
    assert options[TRAIN_DB] == f"LMDB · 1×28×28 · 16 items · {format_size(train_bytes)}"
    assert options[VAL_DB].startswith("LMDB · 1×28×28 · 8 items · ")
    assert options["rgb/cifar_lmdb"].startswith("LMDB · 3×32×32 · 5 items · ")
    row = re.search(r'<tr data-dataset="rgb/cifar_lmdb">(.*?)</tr>', page, re.S)
    assert row and re.sub(r"<[^>]+>|\s+", " ", row.group(1)).split() == ["rgb/cifar_lmdb", "LMDB", "3×32×32", "5",
                                                                        *format_size(32768).split()]


def test_without_javascript_an_empty_item_shape_is_the_datasets_own(
    gpus_app: FakeNvml, client: FlaskClient, datasets: Any
) -> None:
    """The standard LeNet expects 1x28x28, but the training dataset holds 3x32x32 items: the plan is for those."""
    (datasets / "rgb").mkdir()
    write_lmdb(datasets / "rgb" / "cifar_lmdb", records=800, shape=(3, 32, 32))  # Auto's cap: 800 / 20 = 40
    target = gpus_app.gpus[1]
    response = client.post(POST_URL, data=form_data(csrf_token(client), device=target.uuid, action="suggest",
                                                    train_source="rgb/cifar_lmdb"))
    assert response.status_code == 200
    plain = direct_estimate(LENET.text, target.free, shape=(3, 32, 32), batch=40)
    assert re.search(r'id="estimate-status"[^>]*>\s*Estimated for lenet-mnist on GPU 1: '
                     + re.escape(format_size(plain["total_bytes"])) + " at batch 40", response.text)


def test_plain_post_puts_a_missing_dataset_beside_its_field(
    gpus_app: FakeNvml, client: FlaskClient, datasets: Any
) -> None:
    response = client.post(POST_URL, data=form_data(csrf_token(client), **{**JOB, "val_source": "no_such_db"}))
    assert response.status_code == 400
    assert "no_such_db does not exist (as a folder) in the dataset folders" in error_box(response.text, "val_source")
    outside = client.post(POST_URL, data=form_data(csrf_token(client), **{**JOB, "train_source": "/etc"}))
    assert "/etc is outside the dataset folders this server may read" in error_box(outside.text, "train_source")


def test_plain_post_shows_a_prototxt_error_with_its_line(gpus_app: FakeNvml, client: FlaskClient) -> None:
    broken = LENET.text.replace("kernel_size: 5", "kernel_size: 5\n    stride_typo: 1", 1)
    line = broken.splitlines().index("    stride_typo: 1") + 1
    response = client.post(
        POST_URL, data=form_data(csrf_token(client), network="custom", custom_network=broken, item_shape="1,28,28",
                                 classes="10")
    )
    assert response.status_code == 400
    box = error_box(response.text, "custom_network")
    assert f"Line {line}, column 5:" in box
    assert "stride_typo" in box
    assert re.search(r'<textarea [^>]*aria-invalid="true" (autofocus )?class="[^"]*is-invalid"[^>]*id="custom_network"',
                     response.text)


def test_user_text_is_escaped_on_the_job_page(gpus_app: FakeNvml, client: FlaskClient, datasets: Any) -> None:
    evil = "<script>alert(1)</script>"
    net = LENET.text.replace('name: "features1"', f'name: "{evil}"')
    response = client.post(
        POST_URL, data=form_data(csrf_token(client), **JOB, network="custom", custom_network=net,
                                 model_name=f"<b>{evil}</b>", item_shape="1,28,28", classes="10"),
        follow_redirects=True,
    )
    assert response.status_code == 200
    assert evil not in response.text
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert f'id="job-name">&lt;b&gt;{escaped}&lt;/b&gt;<' in response.text
    assert f"<title>&lt;b&gt;{escaped}&lt;/b&gt; · digits-memplugin</title>" in response.text
    assert f"name: &#34;{escaped}&#34;" in response.text  # the layer, in the network as submitted
    # The embedded job document cannot close its script element either.
    assert "\\u003cscript\\u003e" in response.text.split('id="mp-job">')[1].split("</script>")[0]


def test_a_custom_network_keeps_its_text_when_nothing_needs_changing(
    gpus_app: FakeNvml, app: Flask, client: FlaskClient, datasets: Any
) -> None:
    net = "# my LeNet\n" + LENET.text.replace("data_param {", "data_param { backend: LMDB")
    response = client.post(JSON_URL, json={**JOB, "model_name": "m", "network": "custom", "custom_network": net,
                                           "item_shape": [1, 28, 28], "classes": 10})
    assert response.status_code == 201, response.get_json()
    assert submitted_net(app, response.get_json()["id"]) == net


def test_auto_button_without_javascript_fills_the_largest_batch_that_fits(
    gpus_app: FakeNvml, client: FlaskClient
) -> None:
    target = gpus_app.gpus[1]
    response = client.post(POST_URL, data=form_data(csrf_token(client), device=target.uuid, action="suggest"))
    assert response.status_code == 200
    largest = direct_estimate(LENET.text, target.free)["max_batch_size"]
    assert largest and largest > 256  # the training set cannot be read here: the ceiling of "auto" caps
    assert re.search(r'id="batch_size" [^>]*value="256"', response.text)
    assert "Planned model" not in response.text  # the form again, not a submission
    note = re.search(r'id="batch-note"[^>]*>([^<]*)<', response.text)
    assert note and note.group(1) == (
        "Batch 256: capped at 256, the largest batch of Caffe&#39;s reference models; GPU 1 has memory for more."
    )
    at_cap = direct_estimate(LENET.text, target.free, batch=256)
    assert at_cap["plan"] == {**at_cap["plan"], "fits": True, "iter_size": 1, "batch_size": 256}


def test_auto_without_javascript_is_capped_at_a_twentieth_of_the_training_set(
    gpus_app: FakeNvml, client: FlaskClient, datasets: Any
) -> None:
    """Issue 14, 6: Auto suggested batches past the dataset's size (124256 for LeNet, MNIST has 60000 images); issue
    26, 2: capped at the dataset's size it was the whole 1438-image sample set, one update an epoch. A training set
    of 1438 images here: Auto gives 71 (an epoch of 21 iterations), and says why."""
    write_lmdb(datasets / "sample_train_lmdb", records=1438)
    target = gpus_app.gpus[1]
    assert direct_estimate(LENET.text, target.free)["max_batch_size"] > 1438
    response = client.post(POST_URL, data=form_data(
        csrf_token(client), **{**JOB, "device": target.uuid, "train_source": "sample_train_lmdb"}, action="suggest"
    ))
    assert response.status_code == 200
    assert re.search(r'id="batch_size" [^>]*value="71"', response.text)
    note = re.search(r'id="batch-note"[^>]*>([^<]*)<', response.text)
    assert note and note.group(1) == (
        "Batch 71: capped at 71 so that an epoch of the 1438 training items has 21 iterations (at most 1/20 of the "
        "training set); GPU 1 has memory for more."
    )


def test_a_job_with_batch_auto_is_planned_within_the_training_datasets_size(
    app: Flask, client: FlaskClient, datasets: Any
) -> None:
    """The job manager caps "auto" the same way: the CPU could take thousands of LeNet items; a twentieth of the
    400-image training set is 20."""
    write_lmdb(datasets / "train_400_lmdb", records=400)
    response = client.post(JSON_URL, json={**JOB, "model_name": "auto", "batch_size": "auto", "val_source": None,
                                           "train_source": "train_400_lmdb"})
    assert response.status_code == 201, response.get_json()
    manager = get_plugin(app).started_jobs()
    job = manager.wait(response.get_json()["id"], timeout=180)
    assert job.status == "done", job.message
    (attempt,) = manager.store.attempts(job.id)
    assert (attempt.batch_size, attempt.iter_size) == (20, 1)


def test_form_errors_come_back_beside_their_fields(gpus_app: FakeNvml, client: FlaskClient) -> None:
    response = client.post(
        POST_URL,
        data=form_data(csrf_token(client), model_name="", batch_size="lots", item_shape="3,-1", stepsize="",
                       network="custom", custom_network=""),
    )
    assert response.status_code == 400
    html = response.text
    assert 'id="form-errors"' in html
    for name, message in (
        ("model_name", "This field is required."),
        ("batch_size", "&#39;lots&#39; is not a batch size"),
        ("item_shape", "is not a shape"),
        ("stepsize", "required with the &#39;step&#39; policy"),
        ("custom_network", "paste a network definition or upload a prototxt file"),
    ):
        assert message in error_box(html, name), name


def test_uploaded_network_replaces_the_pasted_text(gpus_app: FakeNvml, client: FlaskClient) -> None:
    broken = LENET.text.replace("num_output: 500", "num_output: -5")
    line = next(n for n, text in enumerate(broken.splitlines(), 1) if "num_output: -5" in text)
    data = form_data(csrf_token(client), network="custom", custom_network=LENET.text, item_shape="1,28,28",
                     classes="10")
    data["custom_network_file"] = (io.BytesIO(broken.encode()), "mine.prototxt")
    response = client.post(POST_URL, data=data, content_type="multipart/form-data")
    assert response.status_code == 400
    assert f"Line {line}, column" in error_box(response.text, "custom_network")


# --- JSON twin --------------------------------------------------------------------------------------------------


def test_json_twin_creates_the_job(gpus_app: FakeNvml, app: Flask, client: FlaskClient, datasets: Any) -> None:
    response = client.post(JSON_URL, json={"model_name": "j", "train_source": TRAIN_DB, "device": "cpu",
                                           "max_iter": 2, "batch_size": 32})
    assert response.status_code == 201
    document = response.get_json()
    assert response.headers["Location"] == f"/memplugin/api/jobs/{document['id']}"
    assert client.get(response.headers["Location"]).get_json()["id"] == document["id"]
    # The job document, as POST api/jobs answers it.
    assert (document["name"], document["status"], document["max_iter"]) == ("j", "queued", 2)
    assert document["device"] == {"requested": "cpu", "assigned": None}
    assert document["batch"]["requested"] == 32
    # Without validation data the solver has no test net, and only the training layer gets a source.
    assert stored_job(app, document["id"]).spec["data"] == {"train-data": TRAIN_DB}


def test_json_twin_passes_auto_batch_to_the_job(gpus_app: FakeNvml, client: FlaskClient, datasets: Any) -> None:
    document = client.post(
        JSON_URL, json={**JOB, "model_name": "a", "batch_size": "auto", "solver_type": "Adam"}
    ).get_json()
    assert document["batch"]["requested"] == "auto"


def test_json_twin_on_a_simulated_gpu_is_refused(gpus_app: FakeNvml, client: FlaskClient, datasets: Any) -> None:
    response = client.post(JSON_URL, json={**JOB, "model_name": "g", "device": gpus_app.gpus[0].uuid})
    assert response.status_code == 400
    assert "GPU 0 is simulated" in response.get_json()["errors"]["device"]


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"train_source": "/d"}, "model_name", "required"),
        ({"model_name": "m"}, "train_source", "required"),
        ({"model_name": "m", "train_source": "/d", "batch_size": 0}, "batch_size", "0 is not a batch size: give 1 or more"),
        ({"model_name": "m", "train_source": "/d", "item_shape": [3, 0, 2]}, "item_shape", "positive"),
        ({"model_name": "m", "train_source": "/d", "device": "GPU-nope"}, "device", "Not a valid choice"),
        ({"model_name": "m", "train_source": "/d", "standard_network": "vgg"}, "standard_network", "Not a valid choice"),
        ({"model_name": "m", "train_source": "/d", "network": "custom"}, "custom_network", "paste a network"),
        ({"model_name": "m", "train_source": "/d", "solver": "file"}, "solver_text", "paste a solver"),
        ({"model_name": "m", "train_source": "/d", "lr_policy": "multistep"}, "stepvalues", "multistep"),
        ({"model_name": "m", "train_source": "/d", "stepvalues": "5,2", "lr_policy": "multistep"}, "stepvalues",
         "increasing"),
        ({"model_name": "m", "train_source": "/d", "frobnicate": 1}, "frobnicate", "unknown field"),
        ({"model_name": "m", "train_source": "/d", "classes": True}, "classes", "text or a number"),
    ],
)
def test_json_twin_validation_errors(
    gpus_app: FakeNvml, client: FlaskClient, body: dict[str, Any], field: str, message: str
) -> None:
    response = client.post(JSON_URL, json=body)
    assert response.status_code == 400
    errors = response.get_json()["errors"]
    assert field in errors, errors
    assert message in errors[field], errors


def test_json_twin_prototxt_error_carries_its_line(gpus_app: FakeNvml, client: FlaskClient) -> None:
    net = "name: 'x'\nlayer {\n  name: 'data'\n  type: 'Input'\n  top: 'data'\n  input_param { shape { dim: 1 dim: 3 } }\n  oops: 2\n}\n"
    response = client.post(JSON_URL, json={"model_name": "m", "train_source": "/d", "network": "custom",
                                           "custom_network": net})
    assert response.status_code == 400
    error = response.get_json()["errors"]["custom_network"]
    assert error["line"] == 7
    assert "oops" in error["message"]


def test_json_twin_solver_error_goes_to_the_solver_field(gpus_app: FakeNvml, client: FlaskClient) -> None:
    response = client.post(JSON_URL, json={"model_name": "m", "train_source": "/d", "solver": "file",
                                           "solver_text": 'type: "SGD"\nbase_lr: [\n'})
    assert response.status_code == 400
    error = response.get_json()["errors"]["solver_text"]
    assert error["line"] == 2


def test_json_twin_asks_for_the_class_count_a_network_leaves_unset(gpus_app: FakeNvml, client: FlaskClient) -> None:
    response = client.post(JSON_URL, json={"model_name": "m", "train_source": "/d", "network": "custom",
                                           "custom_network": LENET.text, "item_shape": [1, 28, 28]})
    assert response.status_code == 400
    assert "num_output" in response.get_json()["errors"]["classes"]["message"]


def test_json_twin_asks_for_the_item_shape_of_a_custom_network(gpus_app: FakeNvml, client: FlaskClient) -> None:
    response = client.post(JSON_URL, json={"model_name": "m", "train_source": "/d", "network": "custom",
                                           "custom_network": LENET.text, "classes": 10})
    assert response.status_code == 400
    assert "item shape" in response.get_json()["errors"]["item_shape"]["message"]


def test_the_item_shape_error_speaks_of_the_form_not_of_a_command_line_flag(
    gpus_app: FakeNvml, client: FlaskClient
) -> None:
    """Issue 14, 8: the error asked web users for `--data-shape data=3,256,256`; the form and the API it estimates
    with (the page's script) name no flag: the error stands at the Item shape field. The CLI keeps its flag
    (test_cli_estimate.py)."""
    page = client.post(POST_URL, data=form_data(csrf_token(client), network="custom", custom_network=LENET.text,
                                                classes="10"))
    assert page.status_code == 400
    error = re.search(r'id="item_shape-error"[^>]*>(.*?)</div>\s*</div>', page.text, re.S)
    assert error and "item shape for &#39;data&#39;" in error.group(1), page.text
    assert "--data-shape" not in page.text
    api = client.post("/memplugin/api/estimate", json={"net": LENET.text, "classes": 10})
    assert api.status_code == 400 and "--data-shape" not in api.text and "item shape" in api.text


def test_json_twin_form_encoded_needs_the_csrf_token(
    gpus_app: FakeNvml, client: FlaskClient, datasets: Any
) -> None:
    refused = client.post(JSON_URL, data=form_data(None, **JOB))
    assert refused.status_code == 400
    assert "CSRF token is missing" in refused.get_json()["errors"]["csrf_token"]
    accepted = client.post(JSON_URL, data=form_data(csrf_token(client), **JOB))
    assert accepted.status_code == 201
    assert accepted.get_json()["status"] == "queued"


def test_json_twin_takes_no_json_sent_as_a_simple_cross_site_request(gpus_app: FakeNvml, client: FlaskClient) -> None:
    """A page elsewhere can post text/plain without a CORS preflight; such a body is a form post and needs the token."""
    body = '{"model_name": "m", "train_source": "/d"}'
    response = client.post(JSON_URL, data=body, content_type="text/plain")
    assert response.status_code == 400
    assert "csrf_token" in response.get_json()["errors"]


def test_a_job_that_does_not_fit_is_refused_on_the_device_field(
    install_nvml: Any, gpus: list[FakeGpu], app: Flask
) -> None:
    gpus[1].memory_total = 700 * MIB  # AlexNet's weights alone are bigger
    install_nvml(FakeNvml(gpus))
    response = app.test_client().post(
        JSON_URL, json={"model_name": "m", "train_source": "/d", "standard_network": "alexnet", "device": gpus[1].uuid}
    )
    assert response.status_code == 400
    assert "does not fit on GPU 1" in response.get_json()["errors"]["device"]


def test_a_lost_gpu_cannot_be_planned_on(gpus_app: FakeNvml, client: FlaskClient) -> None:
    token = csrf_token(client)
    gpus_app.lose_gpu(1)
    response = client.post(POST_URL, data=form_data(token, device=gpus_app.gpus[1].uuid))
    assert response.status_code == 400
    assert "GPU 1 cannot be planned on" in error_box(response.text, "device")


def test_requests_over_the_size_limit_are_refused(data_dir: Any) -> None:
    from digits_memplugin import create_app

    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_MAX_REQUEST_BYTES": 4096})
    response = app.test_client().post(JSON_URL, json={"model_name": "m", "custom_network": "#" * 8192})
    assert response.status_code == 413


def test_sizes_in_this_file_are_what_the_fixture_says(gpus_app: FakeNvml) -> None:
    """The tests above rely on GPU 0 having more free memory than GPU 1 ("next available" picks GPU 0)."""
    assert gpus_app.gpus[0].free > gpus_app.gpus[1].free > 11 * GIB
