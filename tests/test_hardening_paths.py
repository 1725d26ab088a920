"""Hostile paths: nothing a user sends makes the server, or the training child it starts, read or write outside the
dataset roots and the job's folder. Each request goes through the REST API of a real app; what the kernel saw is
the evidence: an inotify watch on a folder outside, full of real data that Caffe and the server would happily read
(an LMDB, HDF5 files, a mean file, a net), must report no open, read, write or new file there. Each refusal is a
400 that names the request's field, the layer and the layer's field.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import io
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, ManagerFactory, lenet_request, wait_for, write_lmdb

from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.networks import standard_network

pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api/jobs"

# ============================================================================ what the kernel saw

IN_ACCESS, IN_MODIFY, IN_ATTRIB, IN_OPEN, IN_MOVED_TO, IN_CREATE, IN_DELETE = (
    0x1, 0x2, 0x4, 0x20, 0x80, 0x100, 0x200,
)
WATCHED = IN_ACCESS | IN_MODIFY | IN_ATTRIB | IN_OPEN | IN_MOVED_TO | IN_CREATE | IN_DELETE
NAMES = {IN_ACCESS: "read", IN_MODIFY: "write", IN_ATTRIB: "attrib", IN_OPEN: "open", IN_MOVED_TO: "moved in",
         IN_CREATE: "create", IN_DELETE: "delete"}


class Watch:
    """inotify on a folder tree: every open, read, write or new entry any process makes there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries = set(root.rglob("*"))
        """What the tree held when the watch began (listed before: listing opens the folders)."""
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.folders: dict[int, Path] = {}
        for folder in [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(folder), WATCHED)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder}")
            self.folders[wd] = folder

    def events(self) -> list[str]:
        """What happened since the last call, as "open secret.h5" lines."""
        seen: list[str] = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return seen
            offset = 0
            while offset < len(data):
                wd, mask, _, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16 : offset + 16 + length].rstrip(b"\0").decode()
                offset += 16 + length
                what = [label for bit, label in NAMES.items() if mask & bit]
                where = self.folders.get(wd, Path("?"))
                seen += [f"{label} {where.name}/{name}" for label in what]

    def close(self) -> None:
        os.close(self.fd)


# ============================================================================ the folders


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Real data outside every root: what a hostile request would like the server to read."""
    folder = tmp_path / "outside"
    folder.mkdir()
    write_lmdb(folder / "secret_lmdb")
    with h5py.File(folder / "secret.h5", "w") as h5:
        h5["data"] = np.zeros((4, 1, 28, 28), dtype=np.float32)
        h5["label"] = np.zeros((4,), dtype=np.float32)
    mean = caffe_pb2.BlobProto(num=1, channels=1, height=28, width=28)
    mean.data.extend([0.5] * 28 * 28)
    (folder / "secret.binaryproto").write_bytes(mean.SerializeToString())
    (folder / "secret_list.txt").write_text(f"{folder / 'secret.h5'}\n")
    (folder / "images.txt").write_text("a.png 0\n")
    (folder / "net.prototxt").write_text(LENET)
    return folder


@pytest.fixture
def roots(datasets: Path, outside: Path) -> Path:
    """The dataset root, with links and list files pointing outside it."""
    (datasets / "link_lmdb").symlink_to(outside / "secret_lmdb")
    (datasets / "linked_dir").symlink_to(outside)
    (datasets / "link.h5").symlink_to(outside / "secret.h5")
    (datasets / "mean_link.binaryproto").symlink_to(outside / "secret.binaryproto")
    (datasets / "list_link.txt").symlink_to(outside / "secret_list.txt")
    (datasets / "absolute_list.txt").write_text(f"{outside / 'secret.h5'}\n")
    (datasets / "relative_list.txt").write_text("../outside/secret.h5\n")
    (datasets / "linked_entry_list.txt").write_text("link.h5\n")
    (datasets / "images_out.txt").write_text(f"{outside / 'a.png'} 0\n")
    (datasets / "images_up.txt").write_text("../outside/a.png 0\n")
    (datasets / "images_nul.txt").write_text("a\0/../../outside/a.png 0\n")
    return datasets


@pytest.fixture
def app_config(roots: Path) -> dict[str, Any]:
    """conftest's `app`, reading the dataset root under test."""
    return {"MEMPLUGIN_DATASET_ROOTS": [str(roots)]}


@pytest.fixture
def api(app: Flask) -> FlaskClient:
    client = app.test_client()
    assert client.get(API).status_code == 200  # the manager is started before anything is watched
    return client


@pytest.fixture
def watch(outside: Path) -> Iterator[Watch]:
    watcher = Watch(outside)
    yield watcher
    watcher.close()


# ============================================================================ hostile nets


def replace_layer(net: str, name: str, block: str) -> str:
    """LeNet with its layer `name` (the TRAIN "mnist" Data layer) replaced by `block`."""
    start = net.index(f'name: "{name}"')
    start = net.rindex("layer {", 0, start)
    end = net.index("\n}\n", start) + 3
    return net[:start] + block + net[end:]


def train_data(body: str, kind: str = "Data") -> str:
    return (
        f'layer {{ name: "mnist" type: "{kind}" top: "data" top: "label" include {{ phase: TRAIN }}\n'
        f"  {body} }}\n"
    )


def with_mean(mean_file: str) -> str:
    return train_data(
        f'transform_param {{ scale: 0.00390625 mean_file: "{mean_file}" }} '
        'data_param { source: "mnist_train_lmdb" batch_size: 64 backend: LMDB }'
    )


def hdf5(source: str) -> str:
    return train_data(f'hdf5_data_param {{ source: "{source}" batch_size: 64 }}', "HDF5Data")


def output(file_name: str) -> str:
    return (
        'layer { name: "out" type: "HDF5Output" bottom: "data" bottom: "label" include { phase: TRAIN }\n'
        f'  hdf5_output_param {{ file_name: "{file_name}" }} }}\n'
    )


OUT = "OUTSIDE"  # replaced by the outside folder's absolute path


def lenet_with(layer: str | None = None, extra: str = "") -> str:
    net = LENET if layer is None else replace_layer(LENET, "mnist", layer)
    return net + extra


TEST_ONLY = {"test": "mnist_test_lmdb"}
"""Data for the TEST phase only: the TRAIN data layer is the hostile one."""
HOSTILE_NETS: dict[str, tuple[dict[str, Any], str, str, str]] = {
    # case: (request fields, request field in errors, the layer's field, what the message says)
    "data-absolute": ({"data": {"train": f"{OUT}/secret_lmdb", "test": "mnist_test_lmdb"}}, "data",
                      "data_param.source", "outside the dataset folders"),
    "data-dotdot": ({"data": {"train": "../outside/secret_lmdb", "test": "mnist_test_lmdb"}}, "data",
                    "data_param.source", "outside the dataset folders"),
    "data-symlink-in-root": ({"data": {"train": "link_lmdb", "test": "mnist_test_lmdb"}}, "data",
                             "data_param.source", "outside the dataset folders"),
    "data-through-a-linked-folder": ({"data": {"train": "linked_dir/secret_lmdb", "test": "mnist_test_lmdb"}},
                                     "data", "data_param.source", "outside the dataset folders"),
    "net-source-absolute": ({"data": TEST_ONLY, "net": lenet_with(train_data(
        f'data_param {{ source: "{OUT}/secret_lmdb" batch_size: 64 backend: LMDB }}'))},
        "net", "data_param.source", "outside the dataset folders"),
    "leveldb-source": ({"data": TEST_ONLY, "net": lenet_with(train_data(
        f'data_param {{ source: "{OUT}/secret_lmdb" batch_size: 64 backend: LEVELDB }}'))},
        "net", "data_param.source", "outside the dataset folders"),
    "mean-file-absolute": ({"net": lenet_with(with_mean(f"{OUT}/secret.binaryproto"))}, "net",
                           "transform_param.mean_file", "outside the dataset folders"),
    "mean-file-symlink": ({"net": lenet_with(with_mean("mean_link.binaryproto"))}, "net",
                          "transform_param.mean_file", "outside the dataset folders"),
    "hdf5-file-absolute": ({"data": TEST_ONLY, "net": lenet_with(hdf5(f"{OUT}/secret.h5"))}, "net", "hdf5_data_param.source",
                           "outside the dataset folders"),
    "hdf5-list-outside": ({"data": TEST_ONLY, "net": lenet_with(hdf5(f"{OUT}/secret_list.txt"))}, "net", "hdf5_data_param.source",
                          "outside the dataset folders"),
    "hdf5-list-symlink": ({"data": TEST_ONLY, "net": lenet_with(hdf5("list_link.txt"))}, "net", "hdf5_data_param.source",
                          "outside the dataset folders"),
    "hdf5-list-names-absolute": ({"data": TEST_ONLY, "net": lenet_with(hdf5("absolute_list.txt"))}, "net", "hdf5_data_param.source",
                                 "outside the dataset folders"),
    "hdf5-list-names-dotdot": ({"data": TEST_ONLY, "net": lenet_with(hdf5("relative_list.txt"))}, "net", "hdf5_data_param.source",
                               "outside the dataset folders"),
    "hdf5-list-names-a-symlink": ({"data": TEST_ONLY, "net": lenet_with(hdf5("linked_entry_list.txt"))}, "net",
                                  "hdf5_data_param.source", "outside the dataset folders"),
    "image-list-outside": ({"data": TEST_ONLY, "net": lenet_with(train_data(
        'image_data_param { source: "images_out.txt" batch_size: 64 }', "ImageData"))}, "net",
        "image_data_param.source", "outside the dataset folders"),
    "image-list-dotdot": ({"data": TEST_ONLY, "net": lenet_with(train_data(
        'image_data_param { source: "images_up.txt" batch_size: 64 }', "ImageData"))}, "net",
        "image_data_param.source", "outside the dataset folders"),
    "image-root-folder-outside": ({"data": TEST_ONLY, "net": lenet_with(train_data(
        f'image_data_param {{ source: "images_up.txt" root_folder: "{OUT}" batch_size: 64 }}', "ImageData"))},
        "net", "image_data_param.root_folder", "outside the dataset folders"),
    "image-list-line-with-a-nul": ({"data": TEST_ONLY, "net": lenet_with(train_data(
        'image_data_param { source: "images_nul.txt" batch_size: 64 }', "ImageData"))}, "net",
        "image_data_param.source", "contains a NUL character"),
    # Each folder of an output path is made and checked in the server's thread: a path deep, or long, enough to
    # hold it for seconds (2,000 names: 9 s for 12 such layers) or past what the file system takes is refused.
    "output-too-deep": ({"net": lenet_with(extra=output("d/" * 2000 + "x.h5"))}, "net", "hdf5_output_param.file_name",
                        "2001 names deep in outputs/, more than the 8"),
    "output-name-too-long": ({"net": lenet_with(extra=output("a" * 300 + ".h5"))}, "net",
                             "hdf5_output_param.file_name", "name of 303 bytes"),
    "output-too-long": ({"net": lenet_with(extra=output(("b" * 200 + "/") * 7 + "x.h5"))}, "net",
                        "hdf5_output_param.file_name", "1411 bytes long below outputs/, more than the 1024"),
    "output-absolute": ({"net": lenet_with(extra=output(f"{OUT}/stolen.h5"))}, "net", "hdf5_output_param.file_name",
                        "outside the job's outputs folder"),
    "output-dotdot": ({"net": lenet_with(extra=output("../../../../outside/stolen.h5"))}, "net",
                      "hdf5_output_param.file_name", "outside the job's outputs folder"),
    # Inside the job's folder but not its outputs: where each attempt links a dataset's data file, and snapshots.
    "output-into-the-jobs-lmdb-links": ({"net": lenet_with(extra=output("../data/lmdb/1-mnist_test_lmdb/data.mdb"))},
                                        "net", "hdf5_output_param.file_name", "outside the job's outputs folder"),
    "output-into-snapshots": ({"net": lenet_with(extra=output("sub/../../snapshots/lenet_iter_2.caffemodel"))}, "net",
                              "hdf5_output_param.file_name", "outside the job's outputs folder"),
    "python-layer": ({"net": lenet_with(extra=(
        'layer { name: "py" type: "Python" bottom: "data" top: "py" '
        f'python_param {{ module: "{OUT}/evil" layer: "Evil" }} }}\n'))}, "net", "type", "Python layers"),
    "window-data": ({"data": TEST_ONLY, "net": lenet_with(train_data(
        f'window_data_param {{ source: "{OUT}/windows.txt" batch_size: 64 }}', "WindowData"))}, "net", "type",
        "WindowData"),
    "solver-test-net-file": ({"solver": SHORT_SOLVER + f'test_net: "{OUT}/net.prototxt"\n'}, "solver", "test_net",
                             "give its text instead"),
    "solver-test-net-dotdot": ({"solver": SHORT_SOLVER + 'test_net: "../../../outside/net.prototxt"\n'}, "solver",
                               "test_net", "give its text instead"),
}


def resolve(value: Any, outside: Path) -> Any:
    if isinstance(value, str):
        return value.replace(OUT, str(outside))
    if isinstance(value, dict):
        return {key: resolve(item, outside) for key, item in value.items()}
    return value


def body(**fields: Any) -> dict[str, Any]:
    return {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2, **fields}


def untouched(watch: Watch) -> None:
    """No process opened, read or changed anything in the watched tree, and it holds the same entries."""
    assert watch.events() == []
    assert set(watch.root.rglob("*")) == watch.entries


@pytest.mark.parametrize("case", sorted(HOSTILE_NETS))
def test_a_hostile_path_is_400_naming_the_field_and_nothing_outside_is_touched(
    api: FlaskClient, watch: Watch, outside: Path, data_dir: Path, case: str
) -> None:
    fields, key, field, message = HOSTILE_NETS[case]
    response = api.post(API, json=resolve(body(**fields), outside))
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["errors"].get(key, response.get_json()["errors"])
    assert isinstance(error, dict) and "field" in error, error
    assert error["field"] == field and message in error["message"], error
    if key == "net" and field not in ("type",):
        assert error["layer"] in ("mnist", "out")
    untouched(watch)
    assert not any((data_dir / "jobs").iterdir())  # no job folder left behind
    assert api.get(API).get_json()["jobs"] == []


@pytest.mark.parametrize("as_file", [False, True], ids=["json", "multipart"])
def test_multipart_uploads_are_confined_the_same_way(
    api: FlaskClient, watch: Watch, outside: Path, as_file: bool
) -> None:
    net = lenet_with(with_mean(f"{outside}/secret.binaryproto"))
    fields: dict[str, Any] = {
        "net": (io.BytesIO(net.encode()), "net.prototxt") if as_file else net,
        "solver": (io.BytesIO(SHORT_SOLVER.encode()), "solver.prototxt") if as_file else SHORT_SOLVER,
        "data": '{"train": "mnist_train_lmdb", "test": "mnist_test_lmdb"}',
        "device": "cpu",
    }
    response = api.post(API, data=fields, content_type="multipart/form-data")
    assert response.status_code == 400 and response.get_json()["errors"]["net"]["field"] == "transform_param.mean_file"
    untouched(watch)


# ============================================================================ paths the server replaces


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["/tmp/memplugin-hostile-{token}", "../../memplugin-hostile-{token}"])
def test_snapshot_prefix_and_solver_nets_are_replaced_and_training_stays_inside(
    api: FlaskClient, watch: Watch, outside: Path, data_dir: Path, prefix: str
) -> None:
    """A solver's own paths are not the job's: `net:` and `train_net:` are the submitted net's generated files and
    `snapshot_prefix` keeps only its last name, under snapshots/ in the job's folder (what DIGITS did), so stock
    solvers (`snapshot_prefix: "examples/mnist/lenet"`) are taken as they are and nothing lands elsewhere."""
    token = os.urandom(4).hex()
    name = f"memplugin-hostile-{token}"
    solver = SHORT_SOLVER.replace(
        'snapshot_prefix: "examples/mnist/lenet"', f'snapshot_prefix: "{prefix.format(token=token)}"'
    ).replace('net: "examples/mnist/lenet_train_test.prototxt"', f'net: "{outside}/net.prototxt"')
    assert name in solver and str(outside) in solver
    response = api.post(API, json=body(solver=solver))
    assert response.status_code == 201, response.get_json()
    job_id = response.get_json()["id"]
    done = wait_for(lambda: (d := api.get(f"{API}/{job_id}").get_json())["status"] in ("done", "failed") and d,
                    timeout=120)
    assert done["status"] == "done", done
    folder = data_dir / "jobs" / job_id
    assert done["snapshot"]["model"] == f"snapshots/{name}_iter_2.caffemodel"
    assert (folder / done["snapshot"]["model"]).is_file() and (folder / done["snapshot"]["state"]).is_file()
    generated = (folder / "attempts" / "1" / "solver.prototxt").read_text()
    assert str(outside) not in generated and f'snapshot_prefix: "snapshots/{name}"' in generated
    untouched(watch)
    for place in (Path("/tmp"), data_dir, data_dir.parent, folder.parent, folder.parent.parent):
        assert not list(place.glob(f"{name}*")), place


# ============================================================================ issue 23, finding 1


DIGITS_SOLVER = SHORT_SOLVER + 'train_state { stage: "train" }\ntest_state { stage: "val" }\n'
ISSUE_DUMP = ('layer{name:"dump" type:"HDF5Output" bottom:"data" bottom:"label" include{stage:"train"} '
              'hdf5_output_param{file_name:"../data/lmdb/1-victim_lmdb/data.mdb"}}\n')


def test_the_issues_hdf5output_onto_a_datasets_data_mdb_is_refused_and_the_dataset_keeps_its_bytes(
    api: FlaskClient, roots: Path, data_dir: Path
) -> None:
    """The issue's request: DIGITS' LeNet with an HDF5Output whose file_name leads, from outputs/, to where each
    attempt links the test dataset's data file (data/lmdb/1-victim_lmdb/data.mdb). That folder did not exist when
    the path was checked after resolving links, and the child wrote the dataset through the link (MDB_INVALID, a
    96-byte HDF5 file). Output paths are now taken by their letters, inside outputs/: a 400 naming the layer and
    the field. Had a job been made, it would be waited for: the dataset's checksum is the evidence."""
    write_lmdb(roots / "digits_train_lmdb")
    write_lmdb(roots / "victim_lmdb", records=8)
    victim = roots / "victim_lmdb" / "data.mdb"
    before = (hashlib.sha256(victim.read_bytes()).hexdigest(), victim.stat().st_mtime_ns)
    watch = Watch(roots)
    try:
        response = api.post(API, json={
            "net": standard_network("lenet").text + ISSUE_DUMP, "solver": DIGITS_SOLVER, "device": "cpu",
            "classes": 10, "max_iter": 2, "data": {"train": "digits_train_lmdb", "test": "victim_lmdb"},
        })
        if response.status_code == 201:  # as before the fix: the job trains, and its child writes the dataset
            job_id = response.get_json()["id"]
            wait_for(lambda: api.get(f"{API}/{job_id}").get_json()["status"] in ("done", "failed"), timeout=120)
        written = [event for event in watch.events() if event.split()[0] in ("write", "create", "moved", "delete")]
    finally:
        watch.close()
    assert (hashlib.sha256(victim.read_bytes()).hexdigest(), victim.stat().st_mtime_ns) == before
    assert written == []
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["errors"]["net"]
    assert (error["layer"], error["field"]) == ("dump", "hdf5_output_param.file_name"), error
    assert "outside the job's outputs folder" in error["message"]
    assert not any((data_dir / "jobs").iterdir())


def test_a_net_naming_more_output_paths_than_a_job_may_write_is_refused_and_nothing_is_made(
    api: FlaskClient, watch: Watch, data_dir: Path
) -> None:
    """64 output paths at most: each is made and checked in the server's thread, at submission and each attempt."""
    outputs = "".join(output(f"o{index}/x.h5").replace('name: "out"', f'name: "out{index}"') for index in range(65))
    response = api.post(API, json=body(net=lenet_with(extra=outputs)))
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["errors"]["net"]
    assert (error["layer"], error["field"]) == ("out64", "hdf5_output_param.file_name"), error
    assert "more than 64 output paths" in error["message"]
    untouched(watch)
    assert not any((data_dir / "jobs").iterdir())


# ============================================================================ links in the job's own folder


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["snapshots", "attempts", "job folder"])
def test_a_link_planted_in_a_waiting_jobs_folder_is_not_written_through(
    make_manager: ManagerFactory, outside: Path, planted: str
) -> None:
    """Nothing a user sends creates a link in a job's folder; someone with access to the data folder could. The
    attempt refuses to start rather than have the child write its log and snapshots through it."""
    manager = make_manager()
    first = manager.submit(lenet_request(max_iter=100_000))  # holds the one CPU slot
    wait_for(lambda: manager.get(first.id).status == "running", what="the first job to run")
    waiting = manager.submit(lenet_request())
    assert manager.get(waiting.id).status == "queued"
    folder = manager.folder(waiting.id)
    target = outside / "planted"
    target.mkdir()
    if planted == "job folder":
        shutil.move(str(folder), str(target / folder.name))
        folder.symlink_to(target / folder.name)
    else:
        (folder / planted).symlink_to(target)
    watch = Watch(outside)
    try:
        manager.cancel(first.id)
        ended = manager.wait(waiting.id, timeout=120)
        assert ended.status == "failed" and "link" in (ended.message or ""), ended
        assert manager.attempts(waiting.id) == []  # no attempt was started
        events = watch.events()
        assert not [e for e in events if e.split()[0] in ("create", "write", "moved")], events
    finally:
        watch.close()
    entries = sorted(p.name for p in target.rglob("*"))
    assert entries in ([], [folder.name, "net.prototxt", "solver.prototxt"]), entries


# ============================================================================ the estimate endpoint


@pytest.mark.parametrize("source", ["OUTSIDE/secret_lmdb", "link_lmdb", "../outside/secret_lmdb"])
def test_estimate_reading_datasets_stays_in_the_roots(
    app: Flask, watch: Watch, outside: Path, source: str
) -> None:
    net = lenet_with(train_data(f'data_param {{ source: "{source}" batch_size: 64 backend: LMDB }}'))
    response = app.test_client().post(
        "/memplugin/api/estimate", json={"net": resolve(net, outside), "read_datasets": True}
    )
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["errors"]["read_datasets"]
    assert error["field"] == "data_param.source" and "outside the dataset folders" in error["message"]
    untouched(watch)


def test_the_watch_sees_a_read(outside: Path, watch: Watch) -> None:
    """The evidence above is only worth something if the watch sees what the server would do."""
    (outside / "secret.binaryproto").read_bytes()
    try:
        (outside / "new").write_text("x")
    except OSError as error:  # pragma: no cover - the folder is ours
        assert error.errno != errno.EACCES
    events = watch.events()
    assert "open outside/secret.binaryproto" in events and "read outside/secret.binaryproto" in events
    assert "create outside/new" in events
