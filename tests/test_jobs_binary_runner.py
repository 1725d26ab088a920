"""jobs.child.binary_runner with the real BVLC `caffe` binary of the bundled Caffe's binary build (a Caffe root without a
pycaffe, so its jobs train through the binary): the records it reads from caffe's log are the pycaffe runner's for the
same job, and under a memory cap caffe really fails to allocate, under every OpenBLAS kernel and thread count,
instead of hanging in OpenBLAS's retry loop: the capped-start library warmed its BLAS up before the cap. Every child
here has a time bound."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import BLAS_CORES, MIB, SHORT_SOLVER, ManagerFactory, comparable_record, lenet_request

from digits_memplugin.jobs.child.caffe_build import BINARY, BUNDLED_BINARY_ROOT, BVLC, CaffeBuild, find_caffe
from digits_memplugin.jobs.child.preload import ensure_library
from digits_memplugin.jobs.child.runner import THREAD_STACK_BYTES
from digits_memplugin.jobs.manager import JobManager

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]

SEEDED = "random_seed: 7\n"


@pytest.fixture(scope="module")
def binary_caffe() -> CaffeBuild:
    """The bundled Caffe's binary build (make install builds it), read as the server reads a Caffe root."""
    if not (BUNDLED_BINARY_ROOT / "build" / "tools" / "caffe").is_file():
        pytest.fail(f"the bundled Caffe's binary build is missing at {BUNDLED_BINARY_ROOT}: run `make install`")
    return find_caffe(BUNDLED_BINARY_ROOT)


def records(manager: JobManager, job_id: str, attempt: int) -> list[dict[str, Any]]:
    path = manager.folder(job_id) / "attempts" / str(attempt) / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_bundled_binary_build_is_read_as_a_cpu_only_bvlc_caffe_trained_through_its_binary(
    binary_caffe: CaffeBuild,
) -> None:
    assert (binary_caffe.flavour, binary_caffe.version, binary_caffe.runner) == (BVLC, "1.0.0", BINARY)
    assert not binary_caffe.cuda and not binary_caffe.cudnn  # its device_query says "CPU-only Caffe"
    assert binary_caffe.libraries == () and binary_caffe.pycaffe is None


def approx(record: dict[str, Any]) -> dict[str, Any]:
    """Caffe's log prints 6 significant digits; the pycaffe runner reads float32 values."""
    def close(value: Any) -> Any:
        if isinstance(value, float):
            return pytest.approx(value, rel=2e-5, abs=1e-6)
        if isinstance(value, dict):
            return {key: close(item) for key, item in value.items()}
        if isinstance(value, list):
            return [close(item) for item in value]
        return value

    return close(comparable_record(record))


def test_the_binary_runner_sends_the_records_the_pycaffe_runner_sends_for_the_same_job(
    make_manager: ManagerFactory, binary_caffe: CaffeBuild, tmp_path: Path,
) -> None:
    """One seeded LeNet job trained twice, by pycaffe and by the binary: the same events in the same order, the same
    iterations, losses, rates, test outputs and snapshots; the binary's records carry caffe's memory figures."""
    request = dataclasses.replace(lenet_request(max_iter=3), solver=SEEDED + SHORT_SOLVER)
    by_pycaffe = make_manager()
    first = by_pycaffe.wait(by_pycaffe.submit(request).id, timeout=120)
    by_binary = make_manager(data_dir=tmp_path / "binary-data", caffe=binary_caffe, preload=str(ensure_library()))
    second = by_binary.wait(by_binary.submit(request).id, timeout=120)
    assert first.status == second.status == "done", (first.message, second.message)
    ours, theirs = records(by_pycaffe, first.id, 1), records(by_binary, second.id, 1)
    assert [r["event"] for r in theirs] == [r["event"] for r in ours]
    assert [comparable_record(r) for r in theirs] == [approx(r) for r in ours]
    started = theirs[0]
    assert started["caffe"] == binary_caffe.binary and started["pid"] != started["runner_pid"]
    assert started["confinement"]["confined"] and started["confinement"]["rules"] > ours[0]["confinement"]["rules"]
    assert started["blas"]["settled"] and "openblas" in started["blas"]["library"]
    memory = [r["allocated_bytes"] for r in theirs if "allocated_bytes" in r]
    assert memory and 0 < memory[0] < max(memory)  # the first update allocates diffs and history, as in pycaffe
    (attempt,) = by_binary.attempts(second.id)
    assert attempt.allocated_bytes == max(memory) and attempt.peak_bytes is not None
    log = (by_binary.folder(second.id) / attempt.log).read_text()
    assert "Optimization Done." in log and "solver.cpp" in log  # caffe's own log, whole


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("blas_core", BLAS_CORES, indirect=True)
def test_under_a_cap_the_binary_really_fails_to_allocate(
    make_manager: ManagerFactory, binary_caffe: CaffeBuild, blas_core: str, threads: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As test_jobs_runner's capped attempt, through `caffe train`: what fails under the cap is Caffe's own
    allocation (or OpenBLAS's job table with threads), never a buffer OpenBLAS would retry mapping for ever."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", str(threads))
    manager = make_manager(cpu_memory_cap=40 * MIB, caffe=binary_caffe, preload=str(ensure_library()))
    job = manager.wait(
        manager.submit(lenet_request(batch=400, fallback={"start": "wanted", "max_attempts": 1})).id, timeout=120
    )
    (attempt,) = manager.attempts(job.id)
    assert attempt.status == "out_of_memory" and attempt.out_of_memory is not None, attempt
    if attempt.out_of_memory["signature"] == "host_allocation_failed":
        assert "host allocation of size" in attempt.out_of_memory["line"] and attempt.signal == "SIGABRT"
    else:
        assert threads > 1 and attempt.out_of_memory["signature"] == "openblas_malloc_failed", attempt
    started = records(manager, job.id, 1)[0]
    assert started["memory_cap"] == 40 * MIB and started["baseline_bytes"] > 0
    blas = started["blas"]
    assert blas["settled"] and blas["mapped_bytes"] >= 64 << 20 and blas["threads"] == threads
    if blas_core:
        assert blas["core"] == blas_core


@pytest.mark.parametrize(
    "blas_core", [param for param in BLAS_CORES if param.values[0] == "SkylakeX"], indirect=True,
)
def test_without_the_warm_up_a_capped_binary_hangs_where_the_capped_start_library_keeps_it_from_it(
    make_manager: ManagerFactory, binary_caffe: CaffeBuild, blas_core: str, tmp_path: Path,
) -> None:
    """The witness that the warm-up is what keeps a capped caffe from hanging: an attempt that trains to the end
    under its cap spins for ever in OpenBLAS's retry loop once the library leaves the BLAS cold
    (MEMPLUGIN_WARM_UP=0): its first large gemm maps OpenBLAS's 128 MiB buffer after the cap."""
    manager = make_manager(cpu_memory_cap=40 * MIB, caffe=binary_caffe, preload=str(ensure_library()))
    job = manager.wait(manager.submit(lenet_request(max_iter=2)).id, timeout=120)
    assert job.status == "done", job.message
    folder = manager.folder(job.id)
    spec = json.loads((folder / "attempts" / "1" / "attempt.json").read_text())
    assert spec["runner"] == "binary"

    def run(warm: bool, timeout: float) -> int:
        read, write = os.pipe()
        environment = {**os.environ, "LD_PRELOAD": spec["preload"], "MEMPLUGIN_REPORT_FD": str(write),
                       "MEMPLUGIN_DATA_CAP": str(40 * MIB), "MEMPLUGIN_WARM_UP": "1" if warm else "0",
                       "MEMPLUGIN_THREAD_STACK": str(THREAD_STACK_BYTES),
                       "GLOG_logtostderr": "1"}
        process = subprocess.Popen([spec["caffe"], "train", f"--solver={spec['solver']}"], cwd=folder,
                                   env=environment, pass_fds=(write,), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(write)
        try:
            return process.wait(timeout=timeout)
        finally:
            os.close(read)
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)

    assert run(warm=True, timeout=60) == 0  # warmed, as the runner runs it: trains to the end under the cap
    with pytest.raises(subprocess.TimeoutExpired):
        run(warm=False, timeout=20)


def test_the_fallback_goes_on_through_the_binary(make_manager: ManagerFactory, binary_caffe: CaffeBuild) -> None:
    """The wanted batch runs out of memory under the cap; the next attempt, planned from what failed, trains to the
    end, resumed from nothing (no snapshot yet) with the effective batch kept through iter_size."""
    manager = make_manager(cpu_memory_cap=64 * MIB, caffe=binary_caffe, preload=str(ensure_library()))
    job = manager.wait(
        manager.submit(lenet_request(batch=512, max_iter=2, fallback={"start": "wanted", "max_attempts": 4})).id,
        timeout=240,
    )
    attempts = manager.attempts(job.id)
    assert job.status == "done", job.message
    assert attempts[0].status == "out_of_memory" and attempts[-1].status == "success"
    assert attempts[-1].batch_size * attempts[-1].iter_size >= 512


@pytest.mark.parametrize(
    "blas_core", [param for param in BLAS_CORES if param.values[0] == "SkylakeX"], indirect=True,
)
def test_the_watchdog_looks_at_caffe_itself(
    make_manager: ManagerFactory, binary_caffe: CaffeBuild, blas_core: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capped caffe left cold (MEMPLUGIN_WARM_UP=0, the witness above) spins in OpenBLAS's retry loop: the
    watchdog, following the pid the started record names, finds blas_memory_alloc on caffe's own stack (the runner's
    is in select) and ends the attempt as out of memory."""
    monkeypatch.setenv("MEMPLUGIN_WARM_UP", "0")
    manager = make_manager(cpu_memory_cap=40 * MIB, caffe=binary_caffe, preload=str(ensure_library()),
                           stall_seconds=5.0)
    job = manager.wait(manager.submit(lenet_request(max_iter=2, fallback={"max_attempts": 1})).id, timeout=180)
    (attempt,) = manager.attempts(job.id)
    assert attempt.status == "out_of_memory", attempt
    assert attempt.out_of_memory is not None and attempt.out_of_memory["signature"] in (
        "blas_allocation_retry", "allocation_retry",
    )
    if attempt.out_of_memory["signature"] == "blas_allocation_retry":
        assert "blas_memory_alloc" in attempt.out_of_memory["line"]


def test_a_cancel_through_the_binary_keeps_the_work_and_resume_continues_from_it(
    make_manager: ManagerFactory, binary_caffe: CaffeBuild
) -> None:
    """A cancel is SIGINT to the attempt's process group: caffe's own `--sigint_effect=stop` (its default) ends
    Solve early and snapshot_after_train saves where it got; the runner reports the snapshot, the attempt says the
    work was kept, and Resume continues from that state through `--snapshot`."""
    from test_jobs_fixtures import LENET_SOLVER, wait_for

    manager = make_manager(caffe=binary_caffe, preload=str(ensure_library()))
    request = dataclasses.replace(lenet_request(max_iter=100_000), solver=LENET_SOLVER.replace("test_iter: 100", "test_iter: 2"))
    job = manager.submit(request)
    wait_for(lambda: manager.get(job.id).iteration >= 12, what="12 iterations")
    assert manager.get(job.id).snapshot is None  # the solver's interval (5000) is far off
    manager.cancel(job.id)
    cancelled = manager.wait(job.id, timeout=60)
    assert cancelled.status == "cancelled"
    [attempt] = manager.attempts(job.id)
    got = records(manager, job.id, 1)
    [snapshot] = [r for r in got if r["event"] == "snapshot"]
    iteration = snapshot["iteration"]
    assert iteration >= 12 and attempt.end_iteration == iteration
    assert (manager.folder(job.id) / snapshot["state"]).is_file()
    assert cancelled.message == f"cancelled at iteration {iteration}; a snapshot of it was saved (Resume continues from it)"
    manager.resume(job.id)
    second = wait_for(lambda: [a for a in manager.attempts(job.id) if a.number == 2], what="attempt 2")[0]
    assert (second.resumed_from, second.start_iteration) == (snapshot["state"], iteration)
    wait_for(lambda: manager.get(job.id).iteration > iteration, what="training to continue")
    manager.cancel(job.id)
    manager.wait(job.id, timeout=60)
