"""Damaged and hostile datasets in a dataset root, against a real `serve` (issue 23, items 2, 5, 7 and the NUL of 8).

- A truncated LMDB (`truncate -s 16384` of its data.mdb, a half-finished copy) killed the server with SIGBUS on
  GET /api/datasets, an estimate with `read_datasets`, the New model page and a job submission. It is an error row
  (and a 400) naming the file now. An LMDB crafted to make LMDB read past its file's end anyway (what a file cut
  between the check and the read does) ends only the reader process.
- HDF5 files whose `data` leads to another file (an external link to a FIFO, to a file or to nothing outside, a
  soft link to such a link), keeps its values outside (external storage) or is a virtual dataset, or is a group:
  error rows naming the file; nothing outside is opened (inotify); the form still renders.
- A long HDF5 list keeps the scan within its time bound, and `truncated` says when it cut the scan short.
- A NUL in a data source is a 400 naming the field (pathlib's ValueError was a 500).

Each attack runs while /devices is asked every 50 ms with a 1 s timeout: the server must answer every time, and be
alive afterwards. Every wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import requests
from flask.testing import FlaskClient
from test_hardening_paths import Watch, hdf5, lenet_with, train_data
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, write_lmdb
from test_jobs_restart import Server, serve

from digits_memplugin.estimate import dataset_scan

pytest_plugins = ["test_jobs_fixtures"]

TIME_OUT_ROW = "the dataset folders took over {:g} s to look through; only part is listed"


# ============================================================================ the datasets


def truncated_lmdb(folder: Path) -> Path:
    """An LMDB whose data.mdb was cut at 16 KiB, as a copy still under way leaves it."""
    write_lmdb(folder, records=2000)
    os.truncate(folder / "data.mdb", 16384)
    return folder


def lmdb_reading_past_its_end(folder: Path) -> Path:
    """An LMDB whose size agrees with its meta pages (the check passes), but whose first value claims 96 MiB on
    overflow pages the file does not have: LMDB reads past the file's end, as it does in a file cut after the
    check. A real SIGBUS, in whatever process maps it."""
    import lmdb

    env = lmdb.open(str(folder), map_size=1 << 30)
    with env.begin(write=True) as txn:
        txn.put(b"00000000", b"x" * 10000)
    env.close()
    data = bytearray((folder / "data.mdb").read_bytes())
    page_size = 4096
    for page in range(2, len(data) // page_size):
        flags = struct.unpack_from("<QHHHH", data, page * page_size)[2]
        if flags & 0x02:  # P_LEAF: its first node's data size (lo, hi) becomes 0x06000000
            (node,) = struct.unpack_from("<H", data, page * page_size + 16)
            struct.pack_into("<HH", data, page * page_size + node, 0, 0x0600)
    (folder / "data.mdb").write_bytes(bytes(data))
    return folder


def h5_file(path: Path, build: Callable[[h5py.File], None]) -> None:
    with h5py.File(path, "w") as h5:
        build(h5)
        if "label" not in h5:
            h5["label"] = np.zeros((4,), dtype=np.float32)


def virtual(h5: h5py.File, source: Path) -> None:
    """An unlimited virtual dataset over `source`: asking its shape opens the source (HDF5 sizes it from there)."""
    from h5py import h5d, h5p, h5s, h5t

    virtual_space = h5s.create_simple((0, 4), (h5s.UNLIMITED, 4))
    virtual_space.select_hyperslab((0, 0), (h5s.UNLIMITED, 1), block=(1, 4))
    source_space = h5s.create_simple((0, 4), (h5s.UNLIMITED, 4))
    source_space.select_hyperslab((0, 0), (h5s.UNLIMITED, 1), block=(1, 4))
    plist = h5p.create(h5p.DATASET_CREATE)
    plist.set_virtual(virtual_space, str(source).encode(), b"data", source_space)
    h5d.create(h5.id, b"data", h5t.NATIVE_FLOAT, virtual_space, dcpl=plist)


HOSTILE_HDF5: dict[str, tuple[Callable[[h5py.File, Path], None], str]] = {
    # name: (what `data` is in <name>.h5, given the outside folder; what the row's error says)
    "elink_fifo": (lambda h5, out: h5.__setitem__("data", h5py.ExternalLink(str(out / "fifo.h5"), "data")),
                   "'data' is reached through an external link"),
    "elink_file": (lambda h5, out: h5.__setitem__("data", h5py.ExternalLink(str(out / "secret.h5"), "data")),
                   "'data' is reached through an external link"),
    "elink_missing": (lambda h5, out: h5.__setitem__("data", h5py.ExternalLink(str(out / "gone.h5"), "data")),
                      "'data' is reached through an external link"),
    "soft_to_elink": (lambda h5, out: (h5.__setitem__("x", h5py.ExternalLink(str(out / "secret.h5"), "data")),
                                       h5.__setitem__("data", h5py.SoftLink("/x"))),
                      "'data' is reached through an external link"),
    "group": (lambda h5, out: h5.create_group("data"), "'data' is a group, not a dataset"),
    "external_storage": (lambda h5, out: h5.create_dataset(
        "data", (4, 1, 2, 2), np.float32, external=[(str(out / "raw.bin"), 0, h5py.h5f.UNLIMITED)]),
        "'data' keeps its values in external files"),
    "external_fifo": (lambda h5, out: h5.create_dataset(
        "data", (4, 1, 2, 2), np.float32, external=[(str(out / "raw_fifo"), 0, h5py.h5f.UNLIMITED)]),
        "'data' keeps its values in external files"),
    "virtual_fifo": (lambda h5, out: virtual(h5, out / "fifo.h5"), "'data' is a virtual dataset"),
    "virtual_file": (lambda h5, out: virtual(h5, out / "secret.h5"), "'data' is a virtual dataset"),
}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Outside every root: what hostile files point at (a real HDF5 file, FIFOs, raw bytes)."""
    folder = tmp_path / "outside"
    folder.mkdir()
    h5_file(folder / "secret.h5", lambda h5: h5.__setitem__("data", np.ones((7, 4), dtype=np.float32)))
    os.mkfifo(folder / "fifo.h5")
    os.mkfifo(folder / "raw_fifo")
    (folder / "raw.bin").write_bytes(b"\0" * 64)
    return folder


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The default dataset root of a data folder, with the two LMDBs LeNet trains on and a good HDF5 list."""
    folder = tmp_path / "data" / "datasets"
    folder.mkdir(parents=True)
    write_lmdb(folder / "mnist_train_lmdb")
    write_lmdb(folder / "mnist_test_lmdb", records=8)
    h5_file(folder / "good.h5", lambda h5: h5.__setitem__("data", np.zeros((4, 1, 28, 28), dtype=np.float32)))
    (folder / "good.txt").write_text("good.h5\n")
    return folder


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[], Server]]:
    """Starts a real `serve` on the data folder of `root` once the test has put its datasets there."""
    started: list[Server] = []

    def starter() -> Server:
        server = serve(tmp_path / "data", tmp_path / "serve.log")
        started.append(server)
        return server

    yield starter
    for server in started:
        server.process.kill()
        server.process.wait(timeout=30)


# ============================================================================ the attack, timed


def under_attack(server: Server, attack: Callable[[], Any], *, at_least: float = 1.0, limit: float = 30.0) -> Any:
    """`attack()` (repeated for `at_least` seconds, the last answer kept) in a thread while /devices is asked every
    50 ms: each must be answered within 1 s. Then the server must still be running."""
    answers: list[Any] = []
    failures: list[str] = []

    def run() -> None:
        began = time.monotonic()
        try:
            while True:
                answers.append(attack())
                if time.monotonic() - began >= at_least:
                    return
        except (requests.RequestException, ValueError) as error:
            failures.append(repr(error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    asked = 0
    deadline = time.monotonic() + limit
    while thread.is_alive() and time.monotonic() < deadline:
        began = time.monotonic()
        try:
            devices = requests.get(server.api("/devices"), timeout=1)
        except requests.RequestException as error:
            pytest.fail(f"/devices was not answered within 1 s during the attack ({type(error).__name__}); server "
                        f"{'alive' if server.process.poll() is None else f'dead ({server.process.returncode})'}")
        assert devices.status_code == 200 and time.monotonic() - began < 1.0
        asked += 1
        time.sleep(0.05)  # the probe's pace: /devices asked all through the attack, a sample, not a wait
    thread.join(timeout=1)
    assert not thread.is_alive(), f"the attack did not end within {limit} s"
    assert not failures, failures
    assert asked >= 1 and server.process.poll() is None, server.process.returncode
    return answers[-1]


def datasets_of(server: Server) -> Callable[[], dict[str, Any]]:
    def listing() -> dict[str, Any]:
        response = requests.get(server.api("/datasets"), timeout=20)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    return listing


def post(server: Server, path: str, body: dict[str, Any]) -> Callable[[], requests.Response]:
    return lambda: requests.post(server.api(path), json=body, timeout=20)


def new_model_page(server: Server) -> Callable[[], requests.Response]:
    return lambda: requests.get(f"{server.url}memplugin/models/new", timeout=20)


def rows(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {found["name"]: found for found in listing["datasets"]}


def lmdb_net(source: str) -> str:
    return lenet_with(train_data(f'data_param {{ source: "{source}" batch_size: 64 backend: LMDB }}'))


def job(data: dict[str, str]) -> dict[str, Any]:
    return {"net": LENET, "solver": SHORT_SOLVER, "data": data, "device": "cpu", "max_iter": 2}


# ============================================================================ item 2: LMDBs that are cut short


@pytest.mark.slow
def test_a_truncated_lmdb_is_an_error_row_everywhere_and_the_server_keeps_answering(
    root: Path, start: Callable[[], Server]
) -> None:
    truncated_lmdb(root / "cut_lmdb")
    server = start()
    said = "cut_lmdb/data.mdb is truncated: it holds 16384 bytes but its pages run to"

    found = rows(under_attack(server, datasets_of(server)))
    assert said in found["cut_lmdb"]["error"], found["cut_lmdb"]
    assert found["cut_lmdb"]["entries"] is None and found["mnist_train_lmdb"]["entries"] == 16

    estimate = under_attack(server, post(server, "/estimate", {"net": lmdb_net("cut_lmdb"), "read_datasets": True}))
    assert estimate.status_code == 400, estimate.text
    assert said in estimate.json()["errors"]["read_datasets"]["message"]

    page = under_attack(server, new_model_page(server))
    assert page.status_code == 200 and "cut_lmdb" in page.text and "is truncated" in page.text

    submitted = under_attack(server, post(server, "/jobs", job({"train": "cut_lmdb", "test": "mnist_test_lmdb"})))
    assert submitted.status_code == 400, submitted.text
    error = submitted.json()["errors"]["data"]
    assert said in error["message"] and error["field"] == "data_param.source", error
    assert requests.get(server.api("/jobs"), timeout=10).json()["jobs"] == []


@pytest.mark.slow
def test_an_lmdb_that_makes_lmdb_read_past_its_end_ends_only_the_reader(root: Path, start: Callable[[], Server]) -> None:
    """What a file cut between the size check and LMDB's read does: a SIGBUS. The reader dies, the server does not;
    the rest of the listing comes from a new reader."""
    lmdb_reading_past_its_end(root / "crafted_lmdb")
    server = start()
    said = "crafted_lmdb/data.mdb ended the reader process (SIGBUS)"  # a job names the dataset by its real path

    found = rows(under_attack(server, datasets_of(server)))
    assert said in found["crafted_lmdb"]["error"], found["crafted_lmdb"]
    assert found["mnist_train_lmdb"]["entries"] == 16 and found["good.txt"]["entries"] == 4

    estimate = under_attack(server, post(server, "/estimate", {"net": lmdb_net("crafted_lmdb"), "read_datasets": True}))
    assert estimate.status_code == 400 and said in estimate.json()["errors"]["read_datasets"]["message"]
    submitted = under_attack(server, post(server, "/jobs", job({"train": "crafted_lmdb", "test": "mnist_test_lmdb"})))
    assert submitted.status_code == 400 and said in submitted.json()["errors"]["data"]["message"], submitted.text
    assert "SIGBUS" in (root.parent.parent / "serve.log").read_text()  # the server logged its reader's end


def test_an_lmdb_cut_inside_its_header_pages_is_refused_naming_it(root: Path) -> None:
    write_lmdb(root / "stub_lmdb", records=1)
    os.truncate(root / "stub_lmdb" / "data.mdb", 4096 + 64)  # its second meta page cut
    (found,) = [row for row in dataset_scan.scan([root]).datasets if row.name == "stub_lmdb"]
    assert found.error == (
        "stub_lmdb/data.mdb is truncated: it holds 4160 bytes but its pages run to 8192 bytes (a copy that has not "
        "finished?); not read"
    )


# ============================================================================ item 5: HDF5 files that lead elsewhere


@pytest.mark.slow
def test_hdf5_links_and_storage_outside_are_refused_unopened_and_the_form_still_renders(
    root: Path, outside: Path, start: Callable[[], Server]
) -> None:
    for name, (build, _) in HOSTILE_HDF5.items():
        h5_file(root / f"{name}.h5", lambda h5, build=build: build(h5, outside))  # type: ignore[misc]
        (root / f"{name}.txt").write_text(f"{name}.h5\n")
    watch = Watch(outside)
    try:
        server = start()
        found = rows(under_attack(server, datasets_of(server)))
        for name, (_, said) in HOSTILE_HDF5.items():
            row = found[f"{name}.txt"]
            assert row["error"] is not None and row["error"].startswith(f"{name}.h5: {said}"), row
            assert str(outside) not in row["error"] and row["entries"] is None
        assert found["good.txt"]["entries"] == 4 and found["mnist_train_lmdb"]["entries"] == 16

        page = under_attack(server, new_model_page(server))
        assert page.status_code == 200 and "elink_fifo.txt" in page.text and "a group, not a dataset" in page.text

        for name in ("elink_fifo", "virtual_fifo", "external_fifo", "elink_missing", "group"):
            net = lenet_with(hdf5(f"{name}.txt")).replace("examples/mnist/mnist_test_lmdb", "mnist_test_lmdb")
            estimate = under_attack(server, post(server, "/estimate", {"net": net, "read_datasets": True}), at_least=0)
            assert estimate.status_code == 400, estimate.text
            message = estimate.json()["errors"]["read_datasets"]["message"]
            assert f"{name}.h5: {HOSTILE_HDF5[name][1]}" in message, message
            submitted = under_attack(server, post(server, "/jobs", {"net": net, "solver": SHORT_SOLVER,
                                                                     "device": "cpu"}), at_least=0)
            assert submitted.status_code == 400, submitted.text
            assert f"{name}.h5: {HOSTILE_HDF5[name][1]}" in submitted.json()["errors"]["net"]["message"]
        assert watch.events() == []  # nothing outside was opened or read, by the server or its readers
    finally:
        watch.close()


# ============================================================================ item 7: long HDF5 lists


LONG = 40_000


@pytest.fixture(scope="module")
def long_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset root with two long lists. long.txt names one HDF5 file under 40,000 names (links in a hidden
    folder, which the walk skips): each must be opened and checked, about 3 s of work here, and the list stays under
    the scan's 1 MiB for list files. same.txt is the issue's 200 KB list: one file named 40,000 times."""
    root = tmp_path_factory.mktemp("long") / "datasets"
    links = root / ".l"
    links.mkdir(parents=True)
    h5_file(root / "one.h5", lambda h5: h5.__setitem__("data", np.zeros((4, 1, 28, 28), dtype=np.float32)))
    for index in range(LONG):
        os.symlink("../one.h5", links / f"{index}.h5")
    (root / "long.txt").write_text("".join(f".l/{index}.h5\n" for index in range(LONG)))
    (root / "same.txt").write_text("one.h5\n" * LONG)
    assert (root / "long.txt").stat().st_size <= dataset_scan.MAX_LIST_BYTES
    return root


def test_a_list_longer_than_the_scan_has_time_for_cuts_the_scan_short_within_its_bound(long_root: Path) -> None:
    dataset_scan.scan([long_root / "one.h5"])  # no dataset: a reader is not even needed yet
    dataset_scan.describe(long_root / "same.txt", dataset_scan.HDF5, [long_root])  # a reader is started
    began = time.monotonic()
    scan = dataset_scan.scan([long_root], seconds=0.5)
    took = time.monotonic() - began
    assert took < 0.5 + dataset_scan.MAX_SECONDS, took  # 12 s before (0.3 ms a line, in the caller's thread)
    assert scan.truncated == TIME_OUT_ROW.format(0.5)
    (row,) = [row for row in scan.datasets if row.name == "long.txt"]
    assert row.error is not None and row.error.startswith(
        f"HDF5 list file long.txt names {LONG} files, more than could be read in the"
    ), row.error


@pytest.mark.slow
def test_long_hdf5_lists_keep_the_listing_within_its_bound_and_the_server_answering(
    long_root: Path, tmp_path: Path
) -> None:
    server = serve(tmp_path / "data", tmp_path / "serve.log", "--dataset-root", str(long_root))
    try:
        datasets_of(server)()  # the first listing starts the reader
        began = time.monotonic()
        listing = under_attack(server, datasets_of(server), at_least=0)
        took = time.monotonic() - began
    finally:
        server.process.kill()
        server.process.wait(timeout=30)
    assert took < 2 * dataset_scan.MAX_SECONDS, took  # 10.6 s for the 200 KB list alone before, 51 s for 1 MiB
    found = rows(listing)
    same = found.get("same.txt")
    if same is not None and same["error"] is None:  # a file named again is read once, and counted each time
        assert same["entries"] == 4 * LONG
    cut = found.get("long.txt", {}).get("error")
    if cut is not None:
        assert cut.startswith(f"HDF5 list file long.txt names {LONG} files") and listing["truncated"] == (
            TIME_OUT_ROW.format(dataset_scan.MAX_SECONDS)
        ), listing
    elif listing["truncated"] is None:  # a machine fast enough to read it all in time
        assert found["long.txt"]["entries"] == 4 * LONG
    else:
        assert listing["truncated"] == TIME_OUT_ROW.format(dataset_scan.MAX_SECONDS), listing


# ============================================================================ item 8: a NUL in a data source


NUL_SOURCE = "digits_train_lmdb\u0000/../x"


@pytest.fixture
def nul_root(datasets: Path) -> Path:
    shutil.copytree(datasets / "mnist_train_lmdb", datasets / "digits_train_lmdb")
    return datasets


@pytest.fixture
def nul_client(data_dir: Path, nul_root: Path) -> Iterator[FlaskClient]:
    from digits_memplugin import create_app

    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_DATASET_ROOTS": [str(nul_root)], "TESTING": True})
    yield app.test_client()
    app.extensions["memplugin"].close()


FORM = {"standard_network": "lenet", "model_name": "nul", "device": "cpu", "train_source": "digits_train_lmdb",
        "val_source": "mnist_test_lmdb"}
NUL_REQUESTS: dict[str, tuple[str, dict[str, Any], str]] = {
    # case: (path, body, the field the 400 names)
    "job-data": ("/memplugin/api/jobs", job({**LENET_DATA, "train": NUL_SOURCE}), "data"),
    "job-net": ("/memplugin/api/jobs", {**job(LENET_DATA), "data": None,
                                         "net": lmdb_net("digits_train_lmdb\\000/../x")}, "net"),
    "preview-train": ("/memplugin/models/preview.json", {**FORM, "train_source": NUL_SOURCE}, "train_source"),
    "preview-val": ("/memplugin/models/preview.json", {**FORM, "val_source": NUL_SOURCE}, "val_source"),
    "create-train": ("/memplugin/models.json", {**FORM, "train_source": NUL_SOURCE}, "train_source"),
    "estimate": ("/memplugin/api/estimate", {"net": lmdb_net("digits_train_lmdb\\000/../x"), "read_datasets": True},
                 "read_datasets"),
    "estimate-hdf5": ("/memplugin/api/estimate", {"net": lenet_with(hdf5("list\\000.txt")), "read_datasets": True},
                      "read_datasets"),
}


@pytest.mark.parametrize("case", sorted(NUL_REQUESTS))
def test_a_nul_in_a_data_source_is_a_400_naming_the_field(nul_client: FlaskClient, data_dir: Path, case: str) -> None:
    path, body, field = NUL_REQUESTS[case]
    response = nul_client.post(path, json=body)
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()["errors"][field]
    assert "contains a NUL character, which no file name can hold" in error["message"], error
    assert error["field"] in ("data_param.source", "hdf5_data_param.source"), error
    assert "\\x00" in error["message"] and "\x00" not in error["message"]  # shown escaped, never raw
    jobs = data_dir / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())  # nothing was written
