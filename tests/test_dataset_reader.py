"""dataset_reader.py: datasets are read in reader processes that a crash or a stall costs, never the caller.

Each test drives real reader processes (a private pool where it must know which process reads) and checks what
the kernel says of them: their exit, their confinement in /proc, that they end with their parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from test_jobs_fixtures import wait_for, write_lmdb

from digits_memplugin.estimate import dataset_reader
from digits_memplugin.estimate.dataset_reader import ReaderCrashed, ReadTimedOut
from digits_memplugin.estimate.datasets import DatasetInfo, lmdb_info


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "datasets"
    folder.mkdir()
    write_lmdb(folder / "small_lmdb", records=3)
    return folder


@pytest.fixture(scope="module")
def long_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A list naming one file under 20,000 names: each is opened and checked, which takes seconds."""
    root = tmp_path_factory.mktemp("long")
    with h5py.File(root / "one.h5", "w") as h5:
        h5["data"] = np.zeros((2, 1, 4, 4), dtype=np.float32)
    links = root / "links"
    links.mkdir()
    for index in range(20_000):
        os.symlink("../one.h5", links / f"{index}.h5")
    (root / "long.txt").write_text("".join(f"links/{index}.h5\n" for index in range(20_000)))
    return root


@pytest.fixture
def pool() -> Iterator[Any]:
    """A pool of one reader of the test's own, so that the test knows which process reads."""
    own = dataset_reader._Pool(1)
    yield own
    own.close()


def lmdb_arguments(root: Path) -> dict[str, Any]:
    return {"path": str(root / "small_lmdb"), "layer": "data", "name": "small_lmdb", "roots": [str(root)]}


def list_arguments(root: Path) -> dict[str, Any]:
    """The long list of `long_root`."""
    return {"listing": str(root / "long.txt"), "shown": "long.txt", "tops": ["data"], "layer": "data",
            "roots": [str(root)]}


def reader_pids() -> set[int]:
    """This process's reader children."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"digits_memplugin.estimate.dataset_reader" in command:
            found.add(int(entry.name))
    return found


def in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        began = time.monotonic()
        try:
            outcome["value"] = call()
        except Exception as error:  # noqa: BLE001 - the test looks at it
            outcome["error"] = error
        outcome["seconds"] = time.monotonic() - began

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def read_bytes(pid: int) -> int:
    """What a process has read so far (/proc/PID/io's rchar: files and pipes alike)."""
    io = dict(line.split(": ", 1) for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(io["rchar"])


def reading_the_long_list(pid: int, long_root: Path, since: int) -> None:
    """Wait until reader `pid` has read more than the long list since `since`: it has its request and is in the
    read (checking 20,000 names takes seconds), not before it."""
    size = (long_root / "long.txt").stat().st_size
    wait_for(lambda: read_bytes(pid) > since + size, timeout=30, what="the reader to be reading the long list")


def started_reader(pool: Any, root: Path) -> int:
    """The pid of `pool`'s one reader, started by a first read."""
    assert DatasetInfo.from_json(pool.run("lmdb", lmdb_arguments(root), 30)).entries == 3
    (reader,) = pool._idle
    return int(reader.process.pid)


def test_a_reader_that_stops_answering_is_killed_at_its_deadline_and_replaced(pool: Any, root: Path, long_root: Path) -> None:
    pid = started_reader(pool, root)
    since = read_bytes(pid)
    thread, outcome = in_thread(lambda: pool.run("hdf5", list_arguments(long_root), 1.0))
    reading_the_long_list(pid, long_root, since)
    os.kill(pid, signal.SIGSTOP)  # as stuck as a library waiting on a file can be
    thread.join(timeout=10)
    assert not thread.is_alive()
    error = outcome["error"]
    assert isinstance(error, ReadTimedOut) and error.message == "reading it took longer than 1 s; stopped", error
    assert outcome["seconds"] < 1.0 + dataset_reader.KILL_GRACE + 1.0
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2],
             timeout=5, what="the stopped reader to be killed")
    assert pid not in reader_pids()
    assert started_reader(pool, root) != pid  # the next read has a new reader


def test_a_reader_killed_while_it_reads_is_a_crash_naming_how_it_ended(pool: Any, root: Path, long_root: Path) -> None:
    pid = started_reader(pool, root)
    since = read_bytes(pid)
    thread, outcome = in_thread(lambda: pool.run("hdf5", list_arguments(long_root), 30.0))
    reading_the_long_list(pid, long_root, since)
    os.kill(pid, signal.SIGBUS)
    thread.join(timeout=10)
    error = outcome["error"]
    assert isinstance(error, ReaderCrashed) and error.ended == "SIGBUS", error
    assert error.message == "reading it ended the reader process (SIGBUS)"
    assert started_reader(pool, root) != pid


def test_a_reader_cuts_a_long_list_short_at_its_own_deadline_and_stays(pool: Any, root: Path, long_root: Path) -> None:
    pid = started_reader(pool, root)
    with pytest.raises(ReadTimedOut) as caught:
        pool.run("hdf5", list_arguments(long_root), 0.5)
    assert caught.value.message.startswith("HDF5 list file long.txt names 20000 files, more than could be read")
    assert caught.value.field == "hdf5_data_param.source"
    assert started_reader(pool, root) == pid  # the reader stopped itself: it is kept


def test_a_read_waits_for_a_busy_reader_only_within_its_own_deadline(pool: Any, root: Path, long_root: Path) -> None:
    pid = started_reader(pool, root)
    since = read_bytes(pid)
    thread, _ = in_thread(lambda: pool.run("hdf5", list_arguments(long_root), 3.0))
    reading_the_long_list(pid, long_root, since)  # the pool's one reader is busy
    began = time.monotonic()
    with pytest.raises(ReadTimedOut, match=r"the 1 dataset readers stayed busy for 0\.3 s"):
        pool.run("lmdb", lmdb_arguments(root), 0.3)
    assert time.monotonic() - began < 2.0
    thread.join(timeout=10)


def test_readers_are_confined_and_bounded(pool: Any, root: Path) -> None:
    pid = started_reader(pool, root)
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"  # sandbox.confine's filter
    limits = Path(f"/proc/{pid}/limits").read_text()
    assert any(line.startswith("Max data size") and str(dataset_reader.DATA_LIMIT) in line for line in limits.splitlines())
    (cpu,) = [line.split()[3] for line in limits.splitlines() if line.startswith("Max cpu time")]
    assert cpu.isdigit()  # the CPU bound its last read set (a crafted file's endless loop ends the reader)
    assert Path(f"/proc/{pid}/cwd").resolve() == Path("/")
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"HDF5_PLUGIN_PRELOAD=::" in environ  # no HDF5 filter plugin is loaded


def test_concurrent_reads_use_at_most_max_readers(root: Path) -> None:
    threads = [in_thread(lambda: lmdb_info(root / "small_lmdb", "data", [root])) for _ in range(8)]
    most = 0
    while any(thread.is_alive() for thread, _ in threads):
        most = max(most, len(reader_pids()))
        time.sleep(0.01)  # a sample of the readers alive while the reads run: a maximum over time, no condition
    assert all(outcome["value"].entries == 3 for _, outcome in threads), threads
    assert 1 <= most <= dataset_reader.MAX_READERS


def test_a_reader_ends_when_its_parent_is_killed(root: Path, tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from digits_memplugin.estimate.datasets import lmdb_info\n"
        f"lmdb_info(Path({str(root / 'small_lmdb')!r}), 'data', [Path({str(root)!r})])\n"
        "print('read', flush=True)\n"
        "time.sleep(60)\n"  # a parent that stays until it is killed: what is tested
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"read\n"
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        (reader,) = [int(pid) for pid in children]
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        wait_for(lambda: not Path(f"/proc/{reader}").exists(), timeout=10, what="the orphaned reader to end")
    finally:
        parent.kill()
        parent.wait(timeout=10)
        if parent.stdout is not None:
            parent.stdout.close()


@pytest.mark.parametrize(
    "document",
    [
        None, [], {"specs": []}, {"specs": {"data": {"shape": [1, 2], "itemsize": 1}}, "entries": -1, "disk_bytes": 0},
        {"specs": {"data": {"shape": [True], "itemsize": 1}}, "entries": 1, "disk_bytes": 0},
        {"specs": {"data": {"shape": "1,2", "itemsize": 1}}, "entries": 1, "disk_bytes": 0},
        {"specs": {"data": {"shape": [1] * 33, "itemsize": 1}}, "entries": 1, "disk_bytes": 0},
        {"specs": {"data": {"shape": [1], "itemsize": 1.5}}, "entries": 1, "disk_bytes": 0},
    ],
)
def test_an_answer_that_is_not_a_datasets_facts_is_refused(document: Any) -> None:
    with pytest.raises(ValueError):
        DatasetInfo.from_json(document)


def test_facts_cross_the_pipe_unchanged(root: Path) -> None:
    info = lmdb_info(root / "small_lmdb", "data", [root])
    assert DatasetInfo.from_json(info.to_json()) == info
    assert (info.specs["data"].shape, info.entries) == ((1, 28, 28), 3)
