"""Job submissions that held the server's one thread (issue 23's gaps; docs/security.md, "Floods and storage" and
"Time" under "Paths").

- A job's HDF5 list was checked in the server's thread, a line at a time: 40,000 lines held it 3.5 s at POST
  /api/jobs and again at the New model form's preview and Create. It is checked in a dataset reader now
  (datasets.hdf5_list_files), within the read's deadline: /devices keeps answering, and a list naming a file
  outside the roots is refused without that file being opened.

Every attack runs against a real server while /devices is asked every 50 ms, each within 1 s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from test_hardening_floods import start
from test_hardening_paths import Watch, hdf5, lenet_with
from test_hardening_readers import h5_file, under_attack
from test_jobs_fixtures import SHORT_SOLVER, write_lmdb

pytest_plugins = ["test_jobs_fixtures"]

LINES = 40_000


# ============================================================================ a job's long HDF5 list


@pytest.fixture(scope="module")
def lists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose data folder's dataset root holds one HDF5 file under 40,000 names (links in a hidden folder)
    and lists of them: long.txt names each once (40,000 lookups, about 3 s of the server's thread before);
    long_out.txt the same, then a file outside the roots. outside/ holds that file."""
    folder = tmp_path_factory.mktemp("lists")
    root = folder / "data" / "datasets"
    links = root / ".l"
    links.mkdir(parents=True)

    def items(h5: Any) -> None:
        h5["data"] = np.zeros((4, 1, 28, 28), dtype=np.float32)
        h5["label"] = np.zeros((4,), dtype=np.float32)

    h5_file(root / "one.h5", items)
    for index in range(LINES):
        os.symlink("../one.h5", links / f"{index}.h5")
    names = "".join(f".l/{index}.h5\n" for index in range(LINES))
    (root / "long.txt").write_text(names)
    (root / "long_out.txt").write_text(names + "../../outside/secret.h5\n")
    (root / "good.txt").write_text("one.h5\n")
    write_lmdb(root / "mnist_test_lmdb", records=8)
    (folder / "outside").mkdir()
    h5_file(folder / "outside" / "secret.h5", items)
    return folder


def hdf5_job(source: str) -> dict[str, Any]:
    return {"net": lenet_with(hdf5(source)), "solver": SHORT_SOLVER, "data": {"test": "mnist_test_lmdb"},
            "device": "cpu", "max_iter": 2}


def hdf5_form(train: str) -> dict[str, Any]:
    """The New model form's JSON twin: the standard LeNet on HDF5 lists."""
    return {"model_name": "long", "data_backend": "hdf5", "train_source": train, "val_source": "good.txt",
            "device": "cpu", "batch_size": "4", "max_iter": 2}


@pytest.mark.slow
def test_a_long_hdf5_list_is_checked_off_the_server_thread_and_a_file_outside_is_never_opened(lists: Path) -> None:
    """POST /api/jobs, the form's preview and its Create with the 40,000-line list, and with the list whose last
    line is outside the roots: /devices answers within 1 s throughout (3.5 s without an answer before); the long
    list makes its job (or, on a machine too slow to check it within the read's deadline, a 400 saying so), the
    other is a 400 naming the line, with nothing outside opened (inotify) and no job or folder made."""
    server = start(lists)
    watch = Watch(lists / "outside")
    try:
        jobs = lists / "data" / "jobs"
        requests.get(server.api("/devices"), timeout=60)
        made = under_attack(server, lambda: requests.post(server.api("/jobs"), json=hdf5_job("long.txt"), timeout=60),
                            at_least=0)
        if made.status_code == 400:  # checked too slowly here: the deadline's words, naming the list
            assert "long.txt names 40000 files, more than could be checked in the" in made.text, made.text
        else:
            assert made.status_code == 201, made.text
            requests.post(server.api(f"/jobs/{made.json()['id']}/cancel"), timeout=30)
        folders = set(os.listdir(jobs))

        refused = under_attack(
            server, lambda: requests.post(server.api("/jobs"), json=hdf5_job("long_out.txt"), timeout=60), at_least=0
        )
        assert refused.status_code == 400, refused.text
        said = refused.json()["errors"]["net"]
        assert "../../outside/secret.h5 is outside the dataset folders" in said["message"], said
        assert (said["layer"], said["field"]) == ("mnist", "hdf5_data_param.source"), said

        url = f"{server.url}memplugin/models"
        for path in ("/preview.json", ".json"):  # the form's preview, and its Create
            form = under_attack(
                server, lambda path=path: requests.post(url + path, json=hdf5_form("long_out.txt"), timeout=60),
                at_least=0,
            )
            assert form.status_code == 400, form.text
            assert "outside the dataset folders" in str(form.json()["errors"]), form.text
        assert set(os.listdir(jobs)) == folders  # no job folder made, none left behind
        assert watch.events() == []  # nothing outside the roots opened or read, by the server or its readers
    finally:
        watch.close()
        server.stop()
