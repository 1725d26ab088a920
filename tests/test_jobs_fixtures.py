"""Shared by the job tests: synthetic MNIST-shaped LMDBs (written like measure/runner.py writes them), LeNet with a
short solver, and a job manager on a temporary data folder that is always stopped. Its own tests check the data.

Other test modules import from here (tests/ is on sys.path, as for conftest).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ZOO

from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.devices.reader import DeviceReader
from digits_memplugin.estimate.datasets import lmdb_item
from digits_memplugin.jobs.definition.request import JobRequest, parse_job_request
from digits_memplugin.jobs.manager import JobManager, ManagerConfig
from digits_memplugin.jobs.store.records import Job

MIB = 1 << 20
LENET = (ZOO / "caffe_lenet" / "lenet_train_test.prototxt").read_text()
LENET_SOLVER = (ZOO / "caffe_lenet" / "lenet_solver.prototxt").read_text()
# The zoo's LeNet solver with a quick test pass (2 x 100 items) and frequent snapshots; max_iter comes per job.
SHORT_SOLVER = LENET_SOLVER.replace("test_iter: 100", "test_iter: 2").replace("snapshot: 5000", "snapshot: 2")
LENET_DATA = {"train": "mnist_train_lmdb", "test": "mnist_test_lmdb"}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            return set(next((line for line in cpuinfo if line.startswith("flags")), "").split())
    except OSError:
        return set()


_NEEDS = {"Haswell": {"avx2", "fma"}, "Zen": {"avx2", "fma"}, "SkylakeX": {"avx512f", "avx512bw", "avx512dq", "avx512vl"}}
BLAS_CORES = [
    pytest.param(
        core, id=core or "own-core",
        marks=pytest.mark.skipif(not _NEEDS.get(core, set()) <= _cpu_flags(), reason=f"this CPU cannot run {core} kernels"),
    )
    for core in ("", "Haswell", "SkylakeX", "Zen")
]
"""OpenBLAS kernels to run capped attempts under (OPENBLAS_CORETYPE; "" lets OpenBLAS pick for this CPU): which
call first maps OpenBLAS's buffer differs between them, and a buffer mapped after the cap hangs the attempt."""


@pytest.fixture
def blas_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Training children started in this test run OpenBLAS with the kernel of `request.param`."""
    core = str(request.param)
    if core:
        monkeypatch.setenv("OPENBLAS_CORETYPE", core)
    else:
        monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    return core


def write_lmdb(path: Path, records: int = 16, shape: tuple[int, int, int] = (1, 28, 28), smaller_after: int | None = None) -> Path:
    """An LMDB of uint8 Datums with labels 0..9; from record `smaller_after` on, items are 8 pixels smaller (a
    corrupt dataset: Caffe's transformer aborts on it, a failure that is not out-of-memory)."""
    import lmdb

    rng = np.random.default_rng(0)
    env = lmdb.open(str(path), map_size=1 << 30)
    with env.begin(write=True) as txn:
        for index in range(records):
            channels, height, width = shape
            if smaller_after is not None and index >= smaller_after:
                height, width = height - 8, width - 8
            datum = caffe_pb2.Datum(label=index % 10, channels=channels, height=height, width=width)
            datum.data = rng.integers(0, 255, size=channels * height * width, dtype=np.uint8).tobytes()
            txn.put(f"{index:08d}".encode(), datum.SerializeToString())
    env.close()
    return path


@pytest.fixture
def datasets(tmp_path: Path) -> Path:
    """A dataset root with MNIST-shaped train and test LMDBs."""
    root = tmp_path / "datasets"
    root.mkdir()
    write_lmdb(root / "mnist_train_lmdb")
    write_lmdb(root / "mnist_test_lmdb", records=8)
    return root


ManagerFactory = Callable[..., JobManager]


@pytest.fixture
def make_manager(tmp_path: Path, datasets: Path) -> Iterator[ManagerFactory]:
    """Job managers on tmp_path/data reading `datasets`; every one is stopped after the test."""
    managers: list[JobManager] = []

    def make(
        events: list[tuple[str, dict[str, Any]]] | None = None, *, backend: Any = None, **config: Any
    ) -> JobManager:
        settings: dict[str, Any] = {"data_dir": tmp_path / "data", "dataset_roots": (datasets,), "poll_seconds": 0.2}
        settings.update(config)
        manager = JobManager(
            ManagerConfig(**settings),
            DeviceReader(),
            on_event=(lambda name, payload: events.append((name, payload))) if events is not None else None,
            backend=backend,
        )
        managers.append(manager)
        manager.start()
        return manager

    yield make
    for manager in managers:
        manager.stop()


def lenet_request(**fields: Any) -> JobRequest:
    body = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4, **fields}
    request, errors = parse_job_request(body, default_attempts=5)
    assert request is not None, errors
    return request


RUN_SPECIFIC = {"time", "seconds", "pid", "runner_pid", "memory_bytes", "allocated_bytes", "baseline_bytes", "blas",
                "caffe"}
"""Record fields that differ between two runs of the same training (times, processes, memory figures) and between a
Python process and `caffe`."""


def comparable_record(record: dict[str, Any]) -> dict[str, Any]:
    """A record without what differs between two runs of the same training, the pycaffe runner's and the binary's:
    the binary's confinement also grants its Caffe root and libraries, so only its number of rules differs."""
    kept = {key: value for key, value in record.items() if key not in RUN_SPECIFIC}
    if "confinement" in kept:
        kept["confinement"] = {key: value for key, value in kept["confinement"].items() if key != "rules"}
    return kept


WAIT_POLL_SECONDS = 0.05
"""How often `wait_for` looks again: the only sleep of a condition wait, never a wait by itself."""


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "the condition") -> Any:
    """Poll `predicate` until it returns something true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(WAIT_POLL_SECONDS)  # between two looks at the condition
    pytest.fail(f"timed out waiting for {what}")


class Calls:
    """Counts the calls of `owner.name` (a method of one object, or a module's function), which still runs as
    before: the proof a test waits for that a loop of the code under test has gone round, where a fixed sleep would
    only hope so."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        self.begun = 0
        self._lock = threading.Lock()
        original = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.begun += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    def wait_rounds(self, rounds: int, timeout: float = 60.0, what: str = "the calls") -> None:
        """Wait until `rounds` calls have begun after this point and each has been followed by the next one: what the
        loop making them does after a call (with what it read) has run `rounds` times since. Fails the test after
        `timeout` seconds."""
        with self._lock:
            target = self.begun + rounds + 1
        wait_for(lambda: self.begun >= target, timeout, f"{rounds} rounds of {what}")


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def runner_pid(manager: JobManager, job: Job, attempt: int = 1) -> int:
    """The training child's pid, as the runner itself reported it."""
    import json

    progress = manager.folder(job.id) / "attempts" / str(attempt) / "progress.jsonl"
    first = wait_for(lambda: progress.is_file() and progress.read_text().splitlines(), what="the runner to start")
    return int(json.loads(first[0])["pid"])


def test_synthetic_lmdbs_have_mnist_items(datasets: Path) -> None:
    spec = lmdb_item(datasets / "mnist_train_lmdb", "mnist")
    assert spec.shape == (1, 28, 28) and spec.stored_itemsize == 1


def test_the_short_solver_only_changes_the_test_pass_and_snapshots() -> None:
    assert "test_iter: 2" in SHORT_SOLVER and "snapshot: 2" in SHORT_SOLVER
    assert SHORT_SOLVER.replace("test_iter: 2", "test_iter: 100").replace("snapshot: 2", "snapshot: 5000") == LENET_SOLVER
