"""jobs.child.runner, the training child: what it reports is what Caffe itself computes (test outputs averaged like
Solver::Test, the loss of each iteration, the learning rate), and under a memory cap Caffe really fails to
allocate and aborts with the CHECK the classifier knows."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import BLAS_CORES, MIB, SHORT_SOLVER, ManagerFactory, lenet_request

from digits_memplugin.core import oom
from digits_memplugin.core.prototxt import parse_solver
from digits_memplugin.jobs.manager import JobManager

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]

SEEDED = "random_seed: 7\n"


def records(manager: JobManager, job_id: str, attempt: int) -> list[dict[str, Any]]:
    path = manager.folder(job_id) / "attempts" / str(attempt) / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def caffe_own_run(folder: Path, solver_file: str, iterations: int) -> str:
    """The attempt's generated solver run by pycaffe alone, with Caffe's own testing and display on."""
    solver = parse_solver((folder / solver_file).read_text())
    solver.test_interval = 1000
    solver.test_initialization = True
    solver.display = 1
    (folder / "caffe_own_solver.prototxt").write_text(str(solver))
    script = f"import caffe; caffe.set_mode_cpu(); caffe.get_solver('caffe_own_solver.prototxt').step({iterations})"
    env = {**os.environ, "GLOG_logtostderr": "1", "GLOG_minloglevel": "0", "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return result.stderr


def test_reports_match_caffes_own_test_loss_and_learning_rate(make_manager: ManagerFactory) -> None:
    manager = make_manager()
    request = dataclasses.replace(lenet_request(max_iter=3), solver=SEEDED + SHORT_SOLVER)  # the same weights twice
    job = manager.wait(manager.submit(request).id, timeout=120)
    assert job.status == "done"
    got = records(manager, job.id, 1)
    assert [r["event"] for r in got][:3] == ["started", "constructed", "test"]
    assert got[-1]["event"] == "finished"

    log = caffe_own_run(manager.folder(job.id), "attempts/1/solver.prototxt", 3)
    # Solver::Test at iteration 0: "Test net output #0: accuracy = 0.5" then "#1: loss = 2.3 (* 1 = 2.3 loss)".
    caffe_test = dict(re.findall(r"Test net output #\d+: (\w+) = ([-\d.e]+)", log)[:2])
    first_test = next(r for r in got if r["event"] == "test")
    assert first_test["iteration"] == 0
    for name, value in caffe_test.items():
        assert first_test["outputs"][name] == pytest.approx(float(value), rel=1e-4, abs=1e-6)
    # Solver::Step with display 1: "Iteration 0, loss = X" (iter_size 1: the loss of that iteration).
    caffe_losses = [float(x) for x in re.findall(r"Iteration \d+(?: \(.*?\))?, loss = ([-\d.e]+)", log)]
    ours = [r for r in got if r["event"] == "iteration"]
    assert [r["iteration"] for r in ours] == [1, 2, 3]
    assert [r["loss"] for r in ours] == pytest.approx(caffe_losses[:3], rel=1e-4)
    caffe_rates = [float(x) for x in re.findall(r"Iteration \d+, lr = ([-\d.e]+)", log)]
    assert [r["lr"] for r in ours] == pytest.approx(caffe_rates[:3], rel=2e-5)
    memory = [r["memory_bytes"] for r in got if "memory_bytes" in r]
    assert 0 < memory[0] < max(memory)  # the first iteration allocates activations, diffs and history
    assert manager.attempts(job.id)[0].peak_bytes == max(memory)
    allocated = [r["allocated_bytes"] for r in got if "allocated_bytes" in r]
    assert len(allocated) == len(memory) and 0 < allocated[0] < max(allocated)
    assert manager.attempts(job.id)[0].allocated_bytes == max(allocated)
    snapshot = next(r for r in got if r["event"] == "snapshot")
    assert (manager.folder(job.id) / snapshot["state"]).is_file()
    assert snapshot["state"].startswith("snapshots/")  # inside the job's folder


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("blas_core", BLAS_CORES, indirect=True)
def test_under_a_cap_caffe_really_fails_to_allocate(
    make_manager: ManagerFactory, blas_core: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under every OpenBLAS kernel and thread count: the BLAS buffers are mapped before the cap (a buffer mapped
    after it would make OpenBLAS retry for ever), so what fails under the cap is Caffe's own allocation."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", str(threads))
    manager = make_manager(cpu_memory_cap=40 * MIB)
    job = manager.wait(
        manager.submit(lenet_request(batch=400, fallback={"start": "wanted", "max_attempts": 1})).id, timeout=120
    )
    (attempt,) = manager.attempts(job.id)
    log = (manager.folder(job.id) / attempt.log).read_text()
    assert attempt.status == "out_of_memory" and attempt.out_of_memory is not None
    if attempt.out_of_memory["signature"] == "host_allocation_failed":  # Caffe's malloc failed first
        fatal = oom.fatal_line(log)
        assert fatal is not None and "host allocation of size" in fatal
        outcome = oom.classify(-signal.SIGABRT, log)
        assert outcome.status == oom.OUTCOME_OUT_OF_MEMORY and outcome.out_of_memory is not None
        assert attempt.signal == "SIGABRT"
    else:  # with BLAS threads, OpenBLAS's own job table (malloc'd at each threaded gemm) may fail first
        assert threads > 1 and attempt.out_of_memory["signature"] == "openblas_malloc_failed", attempt
        assert "OpenBLAS: malloc failed in" in log and attempt.exit_code == 1
    started = records(manager, job.id, 1)[0]
    assert started["memory_cap"] == 40 * MIB and started["baseline_bytes"] > 0
    blas = started["blas"]
    assert blas["settled"] and blas["mapped_bytes"] > 0 and "openblas" in blas["library"]
    assert blas["threads"] == threads
    if blas_core:
        assert blas["core"] == blas_core


def test_training_never_waits_for_a_server_that_does_not_read(tmp_path: Path) -> None:
    """A saturated server stops reading the runner's stdout: iteration records that would block are held back (the
    newest replaces the older), so training goes on; every other record waits, and comes after the latest
    iteration held back. The progress file has every record."""
    import threading

    from digits_memplugin.jobs.child.runner import Reporter

    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as stream:
        report = Reporter(stream, tmp_path / "progress.jsonl")
        training = threading.Thread(target=lambda: [report("iteration", iteration=i, loss=0.5) for i in range(1, 20001)])
        training.start()
        training.join(timeout=60)
        waited = training.is_alive()  # 20 000 lines are more than a pipe's 64 KiB
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: received.extend(iter(lambda: os.read(read_end, 1 << 16), b"")))
        reader.start()  # the server reads again (and a training that waited is let go, so the test ends)
        training.join()
        assert not waited, "training waited for the server to read"
        report("test", net=0, iteration=20000)
        report("finished", iteration=20000)
    reader.join(timeout=60)
    os.close(read_end)
    records = [json.loads(line) for line in b"".join(received).decode().splitlines()]
    iterations = [r["iteration"] for r in records if r["event"] == "iteration"]
    assert iterations == sorted(iterations) and iterations[-1] == 20000  # in order, and the latest got through
    assert [r["event"] for r in records[-3:]] == ["iteration", "test", "finished"]
    assert report.held_back > 0 and len(iterations) == 20000 - report.held_back
    written = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in written if r["event"] == "iteration"] == list(range(1, 20001))
