"""Datasets that are not what they seem, or change after the check (issue 18, items 4-6).

- The files inside an LMDB folder are the server's and the child's to open, not only the folder: a `data.mdb` linked
  outside is refused, and a `lock.mdb` linked outside is never opened (the child's lock file lives in the job's
  folder), so the outside file keeps its bytes and its mtime.
- A FIFO among a dataset's files is refused without being opened: the server keeps answering.
- A dataset swapped for a link after the submission's 201 is caught when the attempt starts: the job fails naming
  the path, no child starts, nothing outside is opened.

The evidence is what the kernel saw (an inotify watch on the outside folder, md5 and mtime of the outside files),
not only the status code. Every wait is bounded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient
from test_hardening_paths import Watch, hdf5, lenet_with, train_data
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, ManagerFactory, lenet_request, wait_for, write_lmdb
from test_jobs_restart import Server, serve

from digits_memplugin.core.prototxt import parse_net

pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api"


def fingerprint(path: Path) -> tuple[str, int, int]:
    """md5, mtime (ns) and size of a file, without following a link."""
    info = os.stat(path)
    return hashlib.md5(path.read_bytes()).hexdigest(), info.st_mtime_ns, info.st_size


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Outside every root: a real LMDB (what a link would like the job to train on) and a file a lock table would
    overwrite."""
    folder = tmp_path / "outside"
    folder.mkdir()
    write_lmdb(folder / "secret_lmdb", records=12)
    (folder / "victim.bin").write_bytes(os.urandom(16384))
    return folder


@pytest.fixture
def linked(datasets: Path, outside: Path) -> Path:
    """LMDB folders inside the root whose files are links out of it."""
    data_link = datasets / "mdb_link_lmdb"
    data_link.mkdir()
    (data_link / "data.mdb").symlink_to(outside / "secret_lmdb" / "data.mdb")
    shutil.copy(datasets / "mnist_train_lmdb" / "lock.mdb", data_link / "lock.mdb")
    lock_link = datasets / "lock_link_lmdb"
    shutil.copytree(datasets / "mnist_train_lmdb", lock_link)
    (lock_link / "lock.mdb").unlink()
    (lock_link / "lock.mdb").symlink_to(outside / "victim.bin")
    return datasets


@pytest.fixture
def app_config(linked: Path) -> dict[str, Any]:
    """conftest's `app`, reading the dataset root with the links."""
    return {"MEMPLUGIN_DATASET_ROOTS": [str(linked)]}


@pytest.fixture
def api(app: Flask) -> FlaskClient:
    client = app.test_client()
    assert client.get(f"{API}/jobs").status_code == 200  # the manager is started before anything is watched
    return client


@pytest.fixture
def watch(outside: Path) -> Iterator[Watch]:
    watcher = Watch(outside)
    yield watcher
    watcher.close()


def job_body(**fields: Any) -> dict[str, Any]:
    return {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2, **fields}


# ============================================================================ item 4: files inside an LMDB folder


def test_a_data_mdb_linked_outside_is_refused_by_jobs_and_estimates_and_not_read(
    api: FlaskClient, watch: Watch, outside: Path, data_dir: Path
) -> None:
    response = api.post(f"{API}/jobs", json=job_body(data={"train": "mdb_link_lmdb", "test": "mnist_test_lmdb"}))
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["errors"]["data"]
    assert error["field"] == "data_param.source" and error["layer"] == "mnist", error
    assert "mdb_link_lmdb/data.mdb" in error["message"] and "outside the dataset folders" in error["message"]
    assert str(outside) not in response.get_data(as_text=True)  # the link's target is not named
    assert not any((data_dir / "jobs").iterdir())

    net = lenet_with(train_data('data_param { source: "mdb_link_lmdb" batch_size: 64 backend: LMDB }'))
    response = api.post(f"{API}/estimate", json={"net": net, "read_datasets": True})
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["errors"]["read_datasets"]
    assert "data.mdb" in error["message"] and "outside the dataset folders" in error["message"], error
    assert str(outside) not in response.get_data(as_text=True)
    assert watch.events() == []  # neither the server nor anyone else opened the outside LMDB


@pytest.mark.slow
def test_a_lock_mdb_linked_outside_is_never_opened_and_the_child_locks_in_the_job_folder(
    api: FlaskClient, watch: Watch, outside: Path, data_dir: Path, linked: Path
) -> None:
    """Caffe opens an LMDB with MDB_RDONLY, which still opens (creates, locks and writes) `lock.mdb` in the folder;
    a prototxt cannot ask for MDB_NOLOCK. The child is handed a folder of the job's own whose data.mdb links to the
    dataset's real data file, so its lock table is written there and the dataset's lock.mdb is never opened."""
    before = fingerprint(outside / "victim.bin")
    assert len(watch.events()) == 2  # the watch sees reads: this one (open, read), now drained
    response = api.post(f"{API}/jobs", json=job_body(data={"train": "lock_link_lmdb", "test": "mnist_test_lmdb"}))
    assert response.status_code == 201, response.get_json()
    job_id = response.get_json()["id"]
    done = wait_for(
        lambda: (doc := api.get(f"{API}/jobs/{job_id}").get_json())["status"] in ("done", "failed") and doc,
        timeout=120, what="the job to end",
    )
    assert done["status"] == "done", done
    assert watch.events() == []
    assert fingerprint(outside / "victim.bin") == before
    assert (linked / "lock_link_lmdb" / "lock.mdb").is_symlink()  # left as it was

    folder = data_dir / "jobs" / job_id
    train = parse_net((folder / "attempts" / "1" / "train.prototxt").read_text())
    sources = {layer.include[0].phase: Path(layer.data_param.source) for layer in train.layer if layer.type == "Data"}
    for phase, dataset in ((0, "lock_link_lmdb"), (1, "mnist_test_lmdb")):
        given = sources[phase]
        assert given.is_relative_to(folder.resolve()), given  # a folder of the job's own, not the dataset's
        assert (given / "data.mdb").resolve() == (linked / dataset / "data.mdb").resolve()
        assert (given / "lock.mdb").is_file() and not (given / "lock.mdb").is_symlink()  # the child's lock table


def test_an_hdf5_lists_relative_entries_are_read_from_the_lists_folder(api: FlaskClient, linked: Path) -> None:
    """As jobs read them (not from the server's working folder, where they were looked for before)."""
    (linked / "h5").mkdir()
    with h5py.File(linked / "h5" / "real.h5", "w") as h5:
        h5["data"] = np.zeros((4, 1, 28, 28), dtype=np.float32)
        h5["label"] = np.zeros((4,), dtype=np.float32)
    (linked / "h5_list.txt").write_text("h5/real.h5\n")
    net = lenet_with(hdf5("h5_list.txt")).replace("examples/mnist/mnist_test_lmdb", "mnist_test_lmdb")
    response = api.post(f"{API}/estimate", json={"net": net, "read_datasets": True})
    assert response.status_code == 200, response.get_json()


# ============================================================================ item 5: FIFOs never stall the server


@pytest.fixture
def fifo_server(tmp_path: Path) -> Iterator[Server]:
    """A real `serve` (gevent, one thread) whose dataset root holds FIFOs where an LMDB's data file and an HDF5 file
    should be. Killed after the test, whatever state it is in."""
    data = tmp_path / "data"
    root = data / "datasets"  # the default dataset root
    root.mkdir(parents=True)
    write_lmdb(root / "mnist_train_lmdb")
    write_lmdb(root / "mnist_test_lmdb", records=8)
    (root / "f_lmdb").mkdir()
    os.mkfifo(root / "f_lmdb" / "data.mdb")
    os.mkfifo(root / "fifo.h5")
    (root / "fifo_list.txt").write_text(f"{root / 'fifo.h5'}\n")
    with h5py.File(root / "real.h5", "w") as h5:  # a real file beside it, so only the FIFO is at fault
        h5["data"] = np.zeros((4, 1, 28, 28), dtype=np.float32)
        h5["label"] = np.zeros((4,), dtype=np.float32)
    server = serve(data, tmp_path / "serve.log")
    yield server
    server.process.kill()
    server.process.wait(timeout=30)


FIFO_REQUESTS = {
    "job-lmdb": ("/jobs", job_body(data={"train": "f_lmdb", "test": "mnist_test_lmdb"}), "data"),
    "estimate-lmdb": ("/estimate", {"net": lenet_with(train_data(
        'data_param { source: "f_lmdb" batch_size: 64 backend: LMDB }')), "read_datasets": True}, "read_datasets"),
    "estimate-hdf5": ("/estimate", {"net": lenet_with(hdf5("fifo_list.txt")), "read_datasets": True},
                      "read_datasets"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FIFO_REQUESTS))
def test_a_fifo_among_a_datasets_files_is_refused_and_the_server_keeps_answering(
    fifo_server: Server, case: str
) -> None:
    path, body, key = FIFO_REQUESTS[case]
    answer: dict[str, Any] = {}

    def post() -> None:
        try:
            response = requests.post(fifo_server.api(path), json=body, timeout=20)
            answer["status"], answer["body"] = response.status_code, response.json()
        except (requests.RequestException, ValueError) as error:
            answer["error"] = repr(error)

    poster = threading.Thread(target=post, daemon=True)
    poster.start()
    poster.join(timeout=0.5)
    # While the request is handled (or stuck), the one server thread must still answer others.
    devices = requests.get(fifo_server.api("/devices"), timeout=5)
    assert devices.status_code == 200 and "devices" in devices.json()
    poster.join(timeout=20)
    assert not poster.is_alive() and "error" not in answer, answer
    assert answer["status"] == 400, answer
    error = answer["body"]["errors"][key]
    assert "not a regular file" in error["message"] and "FIFO" in error["message"], error
    assert ("data.mdb" if "lmdb" in case else "fifo.h5") in error["message"], error
    assert requests.get(fifo_server.api("/devices"), timeout=5).status_code == 200


# ============================================================================ item 6: data swapped after the 201


@pytest.mark.slow
def test_a_dataset_swapped_for_a_link_after_submission_fails_the_job_naming_it_and_nothing_outside_is_read(
    make_manager: ManagerFactory, datasets: Path, outside: Path
) -> None:
    shutil.copytree(datasets / "mnist_train_lmdb", datasets / "swap_lmdb")
    manager = make_manager()
    first = manager.submit(lenet_request(max_iter=100_000))  # holds the one CPU slot
    wait_for(lambda: manager.get(first.id).status == "running", what="the first job to run")
    waiting = manager.submit(lenet_request(data={"train": "swap_lmdb", "test": "mnist_test_lmdb"}))
    assert manager.get(waiting.id).status == "queued"
    (datasets / "swap_lmdb").rename(datasets / "swap_old")
    (datasets / "swap_lmdb").symlink_to(outside / "secret_lmdb")
    watch = Watch(outside)
    try:
        manager.cancel(first.id)
        ended = manager.wait(waiting.id, timeout=120)
        assert ended.status == "failed", ended
        message = ended.message or ""
        assert "swap_lmdb" in message and "changed since the job was submitted" in message, message
        assert str(outside) not in message
        assert manager.attempts(waiting.id) == []  # no child was started
        assert watch.events() == []
    finally:
        watch.close()


# ============================================================================ issue 23, finding 6: files opened while training

SECRET = np.array([1234.5, 2718.25, 3141.5, 1618.0], dtype=np.float32)
"""What the outside file holds: values no training output would give by chance."""
LEAK_NET = """name: "leak"
layer { name: "data" type: "HDF5Data" top: "data" top: "label" top: "secret"
  hdf5_data_param { source: "leak/list.txt" batch_size: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
"""A net whose "secret" top is left unconsumed: a net output of 4 values, which the progress records list one by
one (GET /jobs/<id>/progress). HDF5Data opens each file of its list again when it moves on to it."""
LEAK_SOLVER = 'base_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1000000\nsnapshot: 0\n'


def leak_h5(path: Path, external: Path | None = None) -> None:
    """An HDF5 file of 4 rows; its "secret" dataset zeros, or stored in `external` (HDF5's external storage)."""
    with h5py.File(path, "w") as h5:
        h5["data"] = np.ones((4, 4), dtype=np.float32)
        h5["label"] = np.zeros((4,), dtype=np.float32)
        if external is None:
            h5["secret"] = np.zeros((4, 4), dtype=np.float32)
        else:
            h5.create_dataset("secret", (4, 4), np.float32, external=[(str(external), 0, SECRET.nbytes * 4)])


def rewrite_in_place(path: Path, content: bytes) -> None:
    """The file's bytes replaced in one write, keeping its inode (as a program rewriting its dataset would)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, content, 0)
        os.ftruncate(fd, len(content))
    finally:
        os.close(fd)


@pytest.mark.slow
@pytest.mark.parametrize("swap", ["external storage written in place", "a link out"])
def test_a_list_files_h5_changed_while_training_cannot_open_or_leak_a_file_outside(
    api: FlaskClient, linked: Path, outside: Path, swap: str
) -> None:
    """After iteration 1 the list's second file becomes (a) an HDF5 file whose "secret" dataset is stored in an
    outside file, rewritten in place (same inode: the path is still the checked regular file), or (b) a link to an
    outside HDF5 file holding the secret. The training child opens it when HDF5Data moves on to it: the kernel
    refuses the outside file (the child is confined to the job's folder and the files it was checked to read), so
    the attempt fails, the secret never reaches GET /jobs/<id>/progress, and inotify sees nothing opened outside."""
    (linked / "leak").mkdir()
    leak_h5(linked / "leak" / "a.h5")
    leak_h5(linked / "leak" / "b.h5")
    (linked / "leak" / "list.txt").write_text("a.h5\nb.h5\n")
    (outside / "secret.bin").write_bytes(np.tile(SECRET, 4).tobytes())
    leak_h5(outside / "secret.h5")
    with h5py.File(outside / "secret.h5", "a") as h5:
        h5["secret"][...] = np.tile(SECRET, (4, 1))
    leak_h5(linked / "staged.h5", external=outside / "secret.bin")
    staged = (linked / "staged.h5").read_bytes()

    response = api.post(f"{API}/jobs", json={"net": LEAK_NET, "solver": LEAK_SOLVER, "device": "cpu",
                                             "fallback": {"max_attempts": 1}})
    assert response.status_code == 201, response.get_json()
    job_id = response.get_json()["id"]

    def progress() -> list[dict[str, Any]]:
        return api.get(f"{API}/jobs/{job_id}/progress").get_json()["records"]

    wait_for(lambda: any(r["event"] == "iteration" for r in progress()), timeout=60, what="iteration 1")
    watch = Watch(outside)
    try:
        inode = os.stat(linked / "leak" / "b.h5").st_ino
        if swap == "a link out":
            (linked / "leak" / "b.h5").unlink()
            (linked / "leak" / "b.h5").symlink_to(outside / "secret.h5")
        else:
            rewrite_in_place(linked / "leak" / "b.h5", staged)
            assert os.stat(linked / "leak" / "b.h5").st_ino == inode
        def ended_or_leaked() -> bool:
            leaked = "1234.5" in api.get(f"{API}/jobs/{job_id}/progress").get_data(as_text=True)
            return leaked or api.get(f"{API}/jobs/{job_id}").get_json()["status"] not in ("queued", "running")

        wait_for(ended_or_leaked, timeout=30, what="the attempt to stop on the changed file")
        events = watch.events()
    finally:
        watch.close()
        if api.get(f"{API}/jobs/{job_id}").get_json()["status"] == "running":
            api.post(f"{API}/jobs/{job_id}/cancel")
    text = api.get(f"{API}/jobs/{job_id}/progress").get_data(as_text=True)
    assert "1234.5" not in text and "2718.25" not in text  # the outside file's values never came back
    assert events == [], events  # nothing outside was opened or read
    ended = api.get(f"{API}/jobs/{job_id}").get_json()
    assert ended["status"] == "failed", ended
    # Caffe's own words: "Failed opening HDF5 file: .../b.h5", "Failed to read float dataset secret".
    assert "Failed opening HDF5 file" in ended["message"] or "Failed to read float dataset secret" in ended["message"]
