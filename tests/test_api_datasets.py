"""`GET <prefix>/api/datasets` and the scan behind it (dataset_scan.py): what the New model page offers.

Each dataset is read from its files (a Datum's shape, the LMDB's record count, the HDF5 rows); roots that are not
what they seem (links out of them, loops, FIFOs, garbage files, a huge tree) give a listing that stays inside the
roots, names what it could not read, and comes back promptly.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_jobs_fixtures import write_lmdb

from digits_memplugin import create_app
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.estimate import dataset_scan

URL = "/memplugin/api/datasets"


@pytest.fixture
def root(app: Flask, data_dir: Path) -> Path:
    """The app's default dataset root, which init_app made."""
    return data_dir / "datasets"


def listing(client: FlaskClient) -> dict[str, Any]:
    response = client.get(URL)
    assert response.status_code == 200, response.text
    return response.get_json()  # type: ignore[no-any-return]


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {found["name"]: found for found in document["datasets"]}


def write_hdf5_list(folder: Path, rows: tuple[int, ...], shape: tuple[int, ...] = (3, 8, 8)) -> Path:
    """A DIGITS-style HDF5 dataset: .h5 files with "data" and "label", named by a list file, relative to it."""
    folder.mkdir(parents=True)
    for index, count in enumerate(rows):
        with h5py.File(folder / f"part{index}.h5", "w") as h5:
            h5["data"] = np.zeros((count, *shape), dtype=np.float32)
            h5["label"] = np.zeros((count,), dtype=np.float32)
    listing = folder / "train.txt"
    listing.write_text("".join(f"part{index}.h5\n" for index in range(len(rows))))
    return listing


def test_the_default_dataset_folder_is_made_at_start(app: Flask, root: Path) -> None:
    assert root.is_dir()


def test_configured_dataset_folders_are_left_as_given(tmp_path: Path) -> None:
    app = create_app({"MEMPLUGIN_DATA_DIR": tmp_path / "data", "MEMPLUGIN_DATASET_ROOTS": [tmp_path / "mine"],
                      "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True})
    try:
        assert not (tmp_path / "data" / "datasets").exists() and not (tmp_path / "mine").exists()
        assert app.test_client().get(URL).get_json() == {"roots": [str(tmp_path / "mine")], "datasets": [],
                                                         "truncated": None}
    finally:
        app.extensions["memplugin"].close()


def test_lmdbs_and_hdf5_lists_are_listed_with_what_they_hold(client: FlaskClient, root: Path) -> None:
    write_lmdb(root / "mnist_train_lmdb", records=12)
    (root / "cifar").mkdir()
    write_lmdb(root / "cifar" / "val_lmdb", records=3, shape=(3, 32, 32))
    write_hdf5_list(root / "h5", rows=(5, 7))
    (root / "notes.txt").write_text("not a list of HDF5 files\n")
    (root / "images.txt").write_text("a/0001.png 3\n")
    document = listing(client)
    assert document["roots"] == [str(root)] and document["truncated"] is None
    found = by_name(document)
    assert sorted(found) == ["cifar/val_lmdb", "h5/train.txt", "mnist_train_lmdb"]
    mnist = found["mnist_train_lmdb"]
    assert mnist == {
        "name": "mnist_train_lmdb", "path": str(root / "mnist_train_lmdb"), "root": str(root), "format": "lmdb",
        "shape": [1, 28, 28], "entries": 12, "error": None,
        "disk_bytes": (root / "mnist_train_lmdb" / "data.mdb").stat().st_blocks * 512,
    }
    assert (found["cifar/val_lmdb"]["shape"], found["cifar/val_lmdb"]["entries"]) == ([3, 32, 32], 3)
    h5 = found["h5/train.txt"]
    assert (h5["format"], h5["shape"], h5["entries"]) == ("hdf5", [3, 8, 8], 12)  # the rows of both files
    assert h5["disk_bytes"] >= 12 * 3 * 8 * 8 * 4


def test_links_out_of_the_roots_are_not_followed(client: FlaskClient, root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    write_lmdb(outside / "secret_lmdb", records=4)
    os.symlink(outside / "secret_lmdb", root / "escape_lmdb")
    os.symlink(outside, root / "escape_folder")
    inner = root / "inner_lmdb"
    write_lmdb(inner, records=2)
    os.symlink(inner, root / "alias_lmdb")  # a link that stays inside: listed
    os.symlink(root, root / "loop")  # a loop back to the root: walked once
    linked_data = root / "half_lmdb"
    linked_data.mkdir()
    os.symlink(outside / "secret_lmdb" / "data.mdb", linked_data / "data.mdb")
    found = by_name(listing(client))
    assert sorted(found) == ["alias_lmdb", "half_lmdb", "inner_lmdb"]
    assert found["alias_lmdb"]["entries"] == 2
    # A folder inside whose data file links out: listed, not read, and the message says why.
    assert found["half_lmdb"]["error"] == "half_lmdb/data.mdb is outside the dataset folders this server may read"
    assert found["half_lmdb"]["entries"] is None


def test_an_unreadable_dataset_is_listed_with_an_error_naming_the_file(client: FlaskClient, root: Path) -> None:
    garbage = root / "garbage_lmdb"
    garbage.mkdir()
    (garbage / "data.mdb").write_bytes(b"not an lmdb" * 512)
    not_datums = root / "text_lmdb"
    write_lmdb(not_datums, records=1)
    import lmdb

    env = lmdb.open(str(not_datums))
    with env.begin(write=True) as txn:
        txn.put(b"00000000", b"\xff\xff\xff not a Datum")
    env.close()
    write_lmdb(root / "empty_lmdb", records=0)
    broken = write_hdf5_list(root / "h5", rows=(2,))
    broken.write_text("part0.h5\nmissing.h5\n")
    found = by_name(listing(client))
    assert found["garbage_lmdb"]["error"] == "cannot open LMDB garbage_lmdb/data.mdb: MDB_INVALID: File is not an LMDB file"
    assert found["text_lmdb"]["error"].startswith("the first record of text_lmdb is not a Caffe Datum")
    assert found["empty_lmdb"]["error"] == "LMDB empty_lmdb is empty"
    assert "missing.h5" in found["h5/train.txt"]["error"]
    for name in ("garbage_lmdb", "text_lmdb", "empty_lmdb", "h5/train.txt"):
        assert (found[name]["shape"], found[name]["entries"], found[name]["disk_bytes"]) == (None, None, None)


def test_a_fifo_named_like_a_list_is_never_opened(client: FlaskClient, root: Path) -> None:
    os.mkfifo(root / "train.txt")
    fifo_lmdb = root / "fifo_lmdb"
    fifo_lmdb.mkdir()
    os.mkfifo(fifo_lmdb / "data.mdb")
    answers: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: answers.append(listing(client)), daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert answers, "the scan waited on a FIFO"
    found = by_name(answers[0])
    assert sorted(found) == ["fifo_lmdb"]
    assert found["fifo_lmdb"]["error"] == "fifo_lmdb/data.mdb is not a regular file (a FIFO); not read"


def test_a_huge_tree_is_scanned_within_bounds(root: Path) -> None:
    for index in range(30):
        (root / f"d{index:02d}" / "a" / "b" / "c" / "d" / "e").mkdir(parents=True)
    write_lmdb(root / "d00" / "a" / "b" / "c" / "deep_lmdb", records=1)  # depth 5: below MAX_DEPTH
    write_lmdb(root / "d00" / "a" / "near_lmdb", records=1)  # depth 3
    scan = dataset_scan.scan([root])
    assert [found.name for found in scan.datasets] == ["d00/a/near_lmdb"] and scan.truncated is None
    few = dataset_scan.scan([root], max_entries=10)
    assert few.truncated == "more than 10 files and folders in the dataset folders; only the first are listed"
    for index in range(3):
        write_lmdb(root / f"x{index}_lmdb", records=1)
    capped = dataset_scan.scan([root], max_datasets=2)
    assert len(capped.datasets) == 2 and capped.truncated == "more than 2 datasets; only the first are listed"
    assert dataset_scan.scan([root], seconds=0).truncated == (
        "the dataset folders took over 0 s to look through; only part is listed"
    )


def test_locate_takes_a_source_as_a_job_would(root: Path, tmp_path: Path) -> None:
    write_lmdb(root / "a_lmdb", records=1)
    (tmp_path / "outside_lmdb").mkdir()
    assert dataset_scan.locate("a_lmdb", "lmdb", [root]) == root / "a_lmdb"
    assert dataset_scan.locate(str(root / "a_lmdb"), "lmdb", [root]) == root / "a_lmdb"
    assert dataset_scan.locate("../../outside_lmdb", "lmdb", [root]) is None
    assert dataset_scan.locate(str(tmp_path / "outside_lmdb"), "lmdb", [root]) is None
    assert dataset_scan.locate("a_lmdb", "hdf5", [root]) is None  # a folder is not a list file
    found = dataset_scan.source_dataset("a_lmdb", "lmdb", [root])
    assert found is not None and (found.shape, found.entries) == ((1, 28, 28), 1)


def test_a_datum_of_floats_is_read_too(root: Path) -> None:
    import lmdb

    folder = root / "float_lmdb"
    env = lmdb.open(str(folder))
    with env.begin(write=True) as txn:
        for index in range(3):
            datum = caffe_pb2.Datum(channels=2, height=1, width=1, float_data=[0.5, 0.25])
            txn.put(f"{index}".encode(), datum.SerializeToString())
    env.close()
    (found,) = dataset_scan.scan([root]).datasets
    assert (found.shape, found.entries, found.error) == ((2, 1, 1), 3, None)
