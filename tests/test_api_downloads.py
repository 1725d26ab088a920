"""Downloading a job's trained model through the REST API (issue 26, point 10): each snapshot's .caffemodel and
.solverstate, and the tar.gz of deploy-ready files DIGITS offers (weights, train/val net, solver, deploy net, mean
file, info.json), from real short LeNet jobs (real pycaffe children). The archive's deploy net and weights are
loaded by pycaffe itself (in a child process) and classify an item.

The hostile half: a snapshot replaced by a link out of the job's folder, `snapshots/` itself a link, a hard link,
a FIFO, a record naming a path outside: nothing is sent, the answer is a JSON error, and an inotify watch on the
outside folder sees nothing opened (the bytes served are checked too).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_hardening_paths import Watch
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, wait_for

from digits_memplugin import create_app
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.networks import standard_network
from digits_memplugin.web.pages.forms import solver_prototxt

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api/jobs"
DIGITS_LENET = standard_network("lenet")
SOLVER = solver_prototxt(
    {"type": "SGD", "base_lr": 0.01, "lr_policy": "fixed", "weight_decay": 0.0005, "max_iter": 4, "snapshot": 2,
     "momentum": 0.9, "test_interval": 2, "test_iter": 1},
    validation=True,
)
"""The New model form's solver for LeNet: stages "train" and "val", snapshots at iterations 2 and 4."""
TOKEN = "downloads-test-token-0123456789"


def _app(data_dir: Path, datasets: Path, **config: Any) -> Flask:
    return create_app({
        "MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
        "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "TESTING": True, **config,
    })


@pytest.fixture
def jobs_app(data_dir: Path, datasets: Path) -> Iterator[Flask]:
    app = _app(data_dir, datasets)
    yield app
    get_plugin(app).close()


@pytest.fixture
def api(jobs_app: Flask) -> FlaskClient:
    return jobs_app.test_client()


def digits_lenet(**fields: Any) -> dict[str, Any]:
    """The bundled DIGITS-style LeNet as the form submits it (data by layer, 10 classes), batch 8."""
    return {"net": DIGITS_LENET.text, "solver": SOLVER, "name": "lenet", "device": "cpu", "batch": 8, "classes": 10,
            "data": {"train-data": "mnist_train_lmdb", "val-data": "mnist_test_lmdb"}, **fields}


def trained(api: FlaskClient, body: dict[str, Any]) -> dict[str, Any]:
    response = api.post(API, json=body)
    assert response.status_code == 201, response.get_json()
    job_id = response.get_json()["id"]
    job = wait_for(lambda: (doc := api.get(f"{API}/{job_id}").get_json())["status"] in ("done", "failed") and doc,
                   timeout=180, what=f"job {job_id} to finish")
    assert job["status"] == "done", job
    return job  # type: ignore[no-any-return]


@pytest.fixture
def lenet_job(api: FlaskClient) -> dict[str, Any]:
    return trained(api, digits_lenet())


def folder(data_dir: Path, job: dict[str, Any]) -> Path:
    return data_dir / "jobs" / job["id"]


def test_a_trained_job_lists_its_snapshots_and_sends_each_file_as_written(
    api: FlaskClient, lenet_job: dict[str, Any], data_dir: Path
) -> None:
    listed = api.get(f"{API}/{lenet_job['id']}/snapshots")
    assert listed.status_code == 200, listed.get_json()
    document = listed.get_json()
    assert [s["iteration"] for s in document["snapshots"]] == [2, 4]
    assert document["model_url"] == f"{API}/{lenet_job['id']}/model.tar.gz"
    snapshots = folder(data_dir, lenet_job) / "snapshots"
    for snapshot in document["snapshots"]:
        for kind in ("caffemodel", "solverstate"):
            entry = snapshot["files"][kind]
            on_disk = snapshots / entry["name"]
            assert entry["name"] == f"snapshot_iter_{snapshot['iteration']}.{kind}"
            assert entry["bytes"] == on_disk.stat().st_size > 0
            sent = api.get(entry["url"])
            assert sent.status_code == 200
            assert sent.data == on_disk.read_bytes()
            assert sent.headers["Content-Type"] == "application/octet-stream"
            assert sent.headers["Content-Length"] == str(entry["bytes"])
            assert sent.headers["Content-Disposition"] == f"attachment; filename={entry['name']}"
    unknown = api.get(f"{API}/{lenet_job['id']}/snapshots/3/caffemodel")
    assert unknown.status_code == 404 and "no snapshot at iteration 3 (it has: 2, 4)" in unknown.get_json()["error"]
    assert api.get(f"{API}/{lenet_job['id']}/snapshots/4/weights").status_code == 404
    assert api.get(f"{API}/no-such-job/snapshots").status_code == 404


def _archive(api: FlaskClient, url: str) -> tuple[Any, dict[str, bytes]]:
    response = api.get(url)
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    assert response.headers["Content-Type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(response.data), mode="r:gz") as archive:
        files = {member.name: archive.extractfile(member).read() for member in archive.getmembers()}  # type: ignore[union-attr]
    return response, files


def test_the_trained_model_is_a_tar_gz_that_pycaffe_deploys(
    api: FlaskClient, lenet_job: dict[str, Any], data_dir: Path, tmp_path: Path
) -> None:
    response, files = _archive(api, f"{API}/{lenet_job['id']}/model.tar.gz")
    assert response.headers["Content-Disposition"] == "attachment; filename=lenet_iter_4.tar.gz"
    assert sorted(files) == sorted(["deploy.prototxt", "train_val.prototxt", "solver.prototxt",
                                    "snapshot_iter_4.caffemodel", "info.json"])
    weights = folder(data_dir, lenet_job) / "snapshots" / "snapshot_iter_4.caffemodel"
    assert files["snapshot_iter_4.caffemodel"] == weights.read_bytes()
    info = json.loads(files["info.json"])
    assert info["snapshot"] == {"iteration": 4, "attempt": 1, "weights": "snapshot_iter_4.caffemodel"}
    assert info["deploy"] == "deploy.prototxt" and info["deploy_refused"] is None
    solver = files["solver.prototxt"].decode()
    assert 'net: "train_val.prototxt"' in solver and "max_iter: 4" in solver and "iter_size: 1" in solver
    train_val = files["train_val.prototxt"].decode()
    assert 'source: "mnist_train_lmdb"' in train_val and "batch_size: 8" in train_val  # as trained, as named
    assert "num_output: 10" in train_val  # the classes filled in, as DIGITS does
    # An older snapshot on request.
    _, older = _archive(api, f"{API}/{lenet_job['id']}/model.tar.gz?iteration=2")
    assert "snapshot_iter_2.caffemodel" in older
    assert api.get(f"{API}/{lenet_job['id']}/model.tar.gz?iteration=x").status_code == 400
    # pycaffe loads the deploy net with the weights and classifies one item (probabilities that sum to 1).
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    script = (
        "import caffe, numpy, sys; caffe.set_mode_cpu();"
        "net = caffe.Net('deploy.prototxt', 'snapshot_iter_4.caffemodel', caffe.TEST);"
        "net.blobs['data'].data[...] = 0.5;"
        "out = net.forward()['probabilities'];"
        "print(out.shape, round(float(out.sum()), 4))"
    )
    ran = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         check=False)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == "(1, 10) 1.0"


def test_a_net_without_a_deploy_stage_is_packed_and_says_why_it_has_no_deploy_net(api: FlaskClient) -> None:
    job = trained(api, {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2,
                        "name": "zoo lenet"})
    _, files = _archive(api, f"{API}/{job['id']}/model.tar.gz")
    assert "deploy.prototxt" not in files and "lenet_iter_2.caffemodel" in files
    info = json.loads(files["info.json"])
    assert "reads 'label' (the labels), which a deployed net does not have" in info["deploy_refused"]


def test_a_job_without_a_snapshot_says_so(api: FlaskClient) -> None:
    job = trained(api, digits_lenet(solver=SOLVER.replace("snapshot: 2", "snapshot: 0"), max_iter=1))
    # The runner snapshots after training too (snapshot_after_train): take that one away from the records.
    progress = next((Path(api.application.config["MEMPLUGIN_DATA_DIR"]) / "jobs" / job["id"]).rglob("progress.jsonl"))
    progress.write_text("".join(line for line in progress.read_text().splitlines(True) if '"snapshot"' not in line))
    assert api.get(f"{API}/{job['id']}/snapshots").get_json() == {"job_id": job["id"], "snapshots": [],
                                                                   "model_url": None, "total": 0, "older": None}
    refused = api.get(f"{API}/{job['id']}/model.tar.gz")
    assert refused.status_code == 404 and "has written no snapshot yet" in refused.get_json()["error"]


def test_a_name_in_any_script_gets_an_rfc_6266_filename(api: FlaskClient) -> None:
    job = trained(api, digits_lenet(name="Réseau 日本 \"x\"/y", max_iter=2))
    response = api.get(f"{API}/{job['id']}/model.tar.gz")
    assert response.status_code == 200
    disposition = response.headers["Content-Disposition"]
    assert disposition == (
        "attachment; filename=Reseau___x__y_iter_2.tar.gz; "
        "filename*=UTF-8''R%C3%A9seau_%E6%97%A5%E6%9C%AC__x__y_iter_2.tar.gz"
    )


# --- hostile: the job's folder changed by someone with access to the data folder ---------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the data folder holding a file a download must never send."""
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "snapshot_iter_4.caffemodel").write_bytes(b"SECRET-BYTES" * 1000)
    (secret / "snapshot_iter_4.solverstate").write_bytes(b"SECRET-STATE" * 1000)
    return secret


def _refused(api: FlaskClient, url: str) -> dict[str, Any]:
    response = api.get(url)
    assert response.status_code == 409, (response.status_code, response.data[:300])
    assert b"SECRET" not in response.data
    body = response.get_json()
    assert body["status"] == 409
    return body  # type: ignore[no-any-return]


def test_a_snapshot_swapped_for_a_link_out_is_not_sent_and_nothing_outside_is_opened(
    api: FlaskClient, lenet_job: dict[str, Any], data_dir: Path, outside: Path
) -> None:
    weights = folder(data_dir, lenet_job) / "snapshots" / "snapshot_iter_4.caffemodel"
    weights.unlink()
    weights.symlink_to(outside / "snapshot_iter_4.caffemodel")
    watch = Watch(outside)
    try:
        body = _refused(api, f"{API}/{lenet_job['id']}/snapshots/4/caffemodel")
        assert "is not a file the job wrote" in body["error"] and str(outside) not in body["error"]
        _refused(api, f"{API}/{lenet_job['id']}/model.tar.gz")
        listed = api.get(f"{API}/{lenet_job['id']}/snapshots").get_json()
        assert [s["iteration"] for s in listed["snapshots"]] == [2]  # the link is not offered
        assert watch.events() == []
    finally:
        watch.close()
    # The other snapshot is still sent.
    assert api.get(f"{API}/{lenet_job['id']}/snapshots/2/caffemodel").status_code == 200


def test_a_snapshots_folder_that_is_a_link_out_is_not_followed(
    api: FlaskClient, lenet_job: dict[str, Any], data_dir: Path, outside: Path
) -> None:
    snapshots = folder(data_dir, lenet_job) / "snapshots"
    shutil.rmtree(snapshots)
    snapshots.symlink_to(outside)
    watch = Watch(outside)
    try:
        _refused(api, f"{API}/{lenet_job['id']}/snapshots/4/caffemodel")
        _refused(api, f"{API}/{lenet_job['id']}/snapshots/4/solverstate")
        _refused(api, f"{API}/{lenet_job['id']}/model.tar.gz")
        assert api.get(f"{API}/{lenet_job['id']}/snapshots").get_json()["snapshots"] == []
        assert watch.events() == []
    finally:
        watch.close()


def test_a_hard_link_or_a_fifo_in_place_of_a_snapshot_is_not_sent(
    api: FlaskClient, lenet_job: dict[str, Any], data_dir: Path, tmp_path: Path
) -> None:
    snapshots = folder(data_dir, lenet_job) / "snapshots"
    secret = tmp_path / "secret.bin"  # on the same file system: a hard link to it is possible
    secret.write_bytes(b"SECRET-HARD" * 100)
    (snapshots / "snapshot_iter_4.caffemodel").unlink()
    os.link(secret, snapshots / "snapshot_iter_4.caffemodel")
    body = _refused(api, f"{API}/{lenet_job['id']}/snapshots/4/caffemodel")
    assert "hard link" in body["error"]
    (snapshots / "snapshot_iter_2.caffemodel").unlink()
    os.mkfifo(snapshots / "snapshot_iter_2.caffemodel")  # opening it for reading would block the server
    body = _refused(api, f"{API}/{lenet_job['id']}/snapshots/2/caffemodel")
    assert "not a regular file" in body["error"] or "is not a file the job wrote" in body["error"]


def test_a_record_naming_a_file_outside_the_snapshots_folder_is_ignored(
    api: FlaskClient, lenet_job: dict[str, Any], data_dir: Path, outside: Path
) -> None:
    job_folder = folder(data_dir, lenet_job)
    progress = job_folder / "attempts" / "1" / "progress.jsonl"
    relative = os.path.relpath(outside / "snapshot_iter_4.caffemodel", job_folder)
    with progress.open("a") as records:
        for model in (relative, str(outside / "snapshot_iter_4.caffemodel"), "net.prototxt",
                      "snapshots/../../outside/snapshot_iter_6.caffemodel"):
            records.write(json.dumps({"event": "snapshot", "iteration": 6, "model": model, "state": model}) + "\n")
    watch = Watch(outside)
    try:
        listed = api.get(f"{API}/{lenet_job['id']}/snapshots").get_json()
        assert [s["iteration"] for s in listed["snapshots"]] == [2, 4]
        refused = api.get(f"{API}/{lenet_job['id']}/snapshots/6/caffemodel")
        assert refused.status_code == 404 and b"SECRET" not in refused.data
        assert watch.events() == []
    finally:
        watch.close()


def test_downloads_need_the_token_when_reads_do(data_dir: Path, datasets: Path) -> None:
    app = _app(data_dir, datasets, MEMPLUGIN_API_TOKEN=TOKEN, MEMPLUGIN_AUTH_READS=True)
    try:
        client = app.test_client()
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        response = client.post(API, json=digits_lenet(max_iter=2), headers=bearer)
        assert response.status_code == 201, response.get_json()
        job_id = response.get_json()["id"]
        wait_for(lambda: client.get(f"{API}/{job_id}", headers=bearer).get_json()["status"] == "done", timeout=180,
                 what="the job to finish")
        for path in ("snapshots", "snapshots/2/caffemodel", "model.tar.gz"):
            denied = client.get(f"{API}/{job_id}/{path}")
            assert denied.status_code == 401 and denied.get_json()["status"] == 401
            assert client.get(f"{API}/{job_id}/{path}", headers=bearer).status_code == 200
    finally:
        get_plugin(app).close()


def test_a_caffemodel_sent_is_a_netparameter_pycaffe_wrote(api: FlaskClient, lenet_job: dict[str, Any]) -> None:
    sent = api.get(f"{API}/{lenet_job['id']}/snapshots/4/caffemodel")
    weights = caffe_pb2.NetParameter.FromString(sent.data)
    assert {layer.name for layer in weights.layer} >= {"features1", "features2", "hidden", "scores"}


def _mean(values: float) -> bytes:
    mean = caffe_pb2.BlobProto(num=1, channels=1, height=28, width=28)
    mean.data.extend([values] * 28 * 28)
    return mean.SerializeToString()


def test_the_train_nets_mean_file_is_packed_beside_the_net_and_a_link_out_is_not(
    api: FlaskClient, datasets: Path, outside: Path
) -> None:
    (datasets / "mnist_mean.binaryproto").write_bytes(_mean(12.5))
    net = DIGITS_LENET.text.replace(
        'include { stage: "train" }\n  data_param { batch_size: 64 }',
        'include { stage: "train" }\n  transform_param { mean_file: "mnist_mean.binaryproto" }\n  data_param { batch_size: 64 }',
    )
    assert "mnist_mean" in net
    job = trained(api, digits_lenet(net=net, max_iter=2))
    _, files = _archive(api, f"{API}/{job['id']}/model.tar.gz")
    assert files["mnist_mean.binaryproto"] == (datasets / "mnist_mean.binaryproto").read_bytes()
    assert 'mean_file: "mnist_mean.binaryproto"' in files["train_val.prototxt"].decode()
    assert json.loads(files["info.json"])["mean_file"] == "mnist_mean.binaryproto"
    # The dataset's mean file swapped for a link out of the dataset folders: the archive comes without it.
    (outside / "secret.binaryproto").write_bytes(b"SECRET-MEAN" * 100)
    (datasets / "mnist_mean.binaryproto").unlink()
    (datasets / "mnist_mean.binaryproto").symlink_to(outside / "secret.binaryproto")
    watch = Watch(outside)
    try:
        response, files = _archive(api, f"{API}/{job['id']}/model.tar.gz")
        assert b"SECRET" not in response.data and "mnist_mean.binaryproto" not in files
        info = json.loads(files["info.json"])
        assert "outside the dataset folders" in info["mean_file_note"]
        assert watch.events() == []
    finally:
        watch.close()
