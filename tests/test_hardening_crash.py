"""Crashes and broken resources around a running job, with real training children: the child killed with SIGKILL,
the disk full while the attempt writes its log, the SQLite file locked by another process. In each case the job's
record and what was written survive, the job ends clearly (failed with the reason, or done once the database is
free), and the server goes on serving. (The server itself killed with SIGKILL mid-job: tests/test_jobs_restart.py.)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from test_jobs_fixtures import LENET, LENET_DATA, LENET_SOLVER, ManagerFactory, lenet_request, pid_alive, wait_for

from digits_memplugin import create_app
from digits_memplugin.core.oom import OUTCOME_FAILED, OUTCOME_OUT_OF_MEMORY, classify
from digits_memplugin.devices.reader import DeviceReader
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.jobs.backends import attempt_process as attempt_module
from digits_memplugin.jobs.backends.attempt_process import oom_kill_count
from digits_memplugin.jobs.errors import JobStateError
from digits_memplugin.jobs.manager import JobManager, ManagerConfig
from digits_memplugin.jobs.store.database import JobStore, StoreBusy, StoreFull
from digits_memplugin.jobs.store.records import Job

pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api/jobs"
# LeNet's solver with a short test pass and a snapshot every 20 iterations (each one is 3.4 MB on disk).
SOLVER_20 = LENET_SOLVER.replace("test_iter: 100", "test_iter: 2").replace("snapshot: 5000", "snapshot: 20")


def progress_records(manager: JobManager, job: Job, attempt: int = 1) -> list[dict[str, Any]]:
    """The runner's records of an attempt, complete lines only (a full disk may have cut the last one)."""
    path = manager.folder(job.id) / "attempts" / str(attempt) / "progress.jsonl"
    records: list[dict[str, Any]] = []
    if not path.is_file():
        return records
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def first_pid(manager: JobManager, job: Job, attempt: int = 1) -> int:
    started = wait_for(lambda: progress_records(manager, job, attempt), what="the runner's first record")
    return int(started[0]["pid"])


# ============================================================================ SIGKILL of the training child


@pytest.mark.parametrize(
    ("oom_killer", "status", "signature"),
    [(None, OUTCOME_OUT_OF_MEMORY, "sigkill"), (True, OUTCOME_OUT_OF_MEMORY, "sigkill"), (False, OUTCOME_FAILED, None)],
)
def test_a_sigkill_we_did_not_send_is_out_of_memory_unless_the_kernel_killed_nothing(
    oom_killer: bool | None, status: str, signature: str | None
) -> None:
    """The policy: a SIGKILL from outside is retried as a likely OOM kill, except when the kernel's count of OOM
    kills did not move while the attempt ran; then it was someone else's kill, which ends the job."""
    outcome = classify(-signal.SIGKILL, "I1202 10:00:00.000000  1 solver.cpp:1] Iteration 3\n", oom_killer=oom_killer)
    assert outcome.status == status and outcome.signal == "SIGKILL"
    assert (outcome.out_of_memory.signature if outcome.out_of_memory else None) == signature
    if status == OUTCOME_FAILED:
        assert "not by the kernel's out-of-memory killer" in outcome.message and "resume" in outcome.message
    else:
        assert outcome.out_of_memory is not None and outcome.out_of_memory.ambiguous
        assert ("counted an out-of-memory kill" in outcome.message) == bool(oom_killer)


def test_oom_kill_count_reads_the_kernels_counter(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 12\noom_kill 7\npgfault 3\n")
    assert oom_kill_count(vmstat) == 7
    vmstat.write_text("nr_free_pages 12\n")  # kernels before 4.13 do not count
    assert oom_kill_count(vmstat) is None
    assert oom_kill_count(tmp_path / "missing") is None


@pytest.fixture
def vmstat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kernel's count of out-of-memory kills as this test's own /proc/vmstat (read by the real reader at the
    attempt's start and end): whether it moves is the test's to say, not what the machine did meanwhile."""
    path = tmp_path / "vmstat"
    path.write_text("nr_free_pages 12\noom_kill 7\npgfault 3\n")
    monkeypatch.setattr(attempt_module, "oom_kill_count", lambda vmstat=path: oom_kill_count(vmstat))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("counted", [False, True], ids=["someone-elses-kill", "the-oom-killers-kill"])
def test_the_child_killed_with_sigkill_fails_the_job_clearly_and_it_resumes(
    make_manager: ManagerFactory, vmstat: Path, counted: bool
) -> None:
    """A SIGKILL the server did not send: with the kernel's OOM-kill count unmoved it was someone else's, and the
    job fails saying so; with the count moved while the attempt ran, it is the policy's likely out of memory,
    retried at once. Either way the record survives and Resume continues from the snapshot."""
    manager = make_manager()
    job = manager.submit(lenet_request(solver=SOLVER_20, max_iter=100_000))
    snapshot = wait_for(lambda: manager.get(job.id).snapshot, timeout=120, what="a snapshot")
    child = first_pid(manager, job)
    if counted:
        vmstat.write_text("nr_free_pages 12\noom_kill 8\npgfault 3\n")  # the kernel killed something meanwhile
    os.kill(child, signal.SIGKILL)  # not the server's doing
    if counted:  # the retry, from the snapshot: ended here by a cancel
        retry = wait_for(lambda: len(manager.attempts(job.id)) >= 2 and manager.attempts(job.id)[1], what="the retry")
        assert retry.resumed_from is not None
        manager.cancel(job.id)
    ended = manager.wait(job.id, timeout=60)
    wait_for(lambda: not pid_alive(child), what="the child to be gone")
    attempt = manager.attempts(job.id)[0]
    assert attempt.signal == "SIGKILL" and attempt.exit_code is None
    if counted:
        assert attempt.status == "out_of_memory" and attempt.out_of_memory is not None
        assert ended.status == "cancelled"
    else:
        assert len(manager.attempts(job.id)) == 1
        assert ended.status == "failed" and attempt.status == "failed" and attempt.out_of_memory is None
        assert "killed with SIGKILL by someone else" in (ended.message or "")
    # The record survives: the attempt's log, its records up to the kill, the snapshot it took.
    folder = manager.folder(job.id)
    assert "Solver scaffolding done" in (folder / attempt.log).read_text()
    records = progress_records(manager, job)
    assert records[0]["event"] == "started" and any(r["event"] == "snapshot" for r in records)
    assert ended.resumable and ended.snapshot is not None and ended.snapshot["iteration"] >= snapshot["iteration"]
    assert (folder / ended.snapshot["state"]).is_file()

    made = len(manager.attempts(job.id))
    manager.resume(job.id)
    resumed = wait_for(lambda: len(manager.attempts(job.id)) > made and manager.attempts(job.id)[made],
                       what="the resumed attempt")
    assert resumed.resumed_from == ended.snapshot["state"] and resumed.start_iteration == ended.snapshot["iteration"]
    wait_for(lambda: any(r["event"] == "iteration" for r in progress_records(manager, job, made + 1)),
             what="training again")
    manager.cancel(job.id)
    assert manager.wait(job.id, timeout=60).status == "cancelled"


# ============================================================================ a full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs for the jobs folder (the SQLite store stays on the real disk): the disk that fills up.
    Needs the right to mount (root here); skipped, saying so, where there is none."""
    jobs = tmp_path / "data" / "jobs"
    jobs.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", str(jobs)], capture_output=True, text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}); the full-disk tests need one")
    try:
        yield jobs
    finally:
        subprocess.run(["umount", "-l", str(jobs)], check=False, capture_output=True)


def fill(disk: Path, leave: int) -> Path:
    """Fill `disk` until `leave` bytes are free (0: completely, until the kernel says ENOSPC)."""
    filler = disk / "filler"
    stats = os.statvfs(disk)
    size = stats.f_bavail * stats.f_frsize - leave if leave else 1 << 40
    block = b"\0" * (1 << 16)
    with filler.open("wb", buffering=0) as out:
        try:
            while size > 0:
                size -= out.write(block[: min(len(block), size)]) or 0
        except OSError as error:
            if error.errno != errno.ENOSPC or leave:
                raise
    return filler


@pytest.fixture
def disk_app(tmp_path: Path, datasets: Path, small_disk: Path) -> Iterator[Flask]:
    app = create_app(
        {
            "MEMPLUGIN_DATA_DIR": tmp_path / "data",
            "MEMPLUGIN_ASYNC_MODE": "threading",
            "MEMPLUGIN_DATASET_ROOTS": [str(datasets)],
            "TESTING": True,
        }
    )
    yield app
    get_plugin(app).close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("what", "snapshot", "leave"),
    [("the log and the progress file", 0, 0), ("a snapshot", 50, 64 * 1024)],
)
def test_a_full_disk_fails_the_job_saying_so_and_the_server_goes_on(
    disk_app: Flask, small_disk: Path, what: str, snapshot: int, leave: int
) -> None:
    """The disk fills while the attempt writes (its log and records, or a 3.4 MB snapshot that cannot fit): the job
    fails with a message that says the disk is full, what was written stays readable, and once space is freed the
    same server resumes the job and trains it to the end."""
    api = disk_app.test_client()
    solver = LENET_SOLVER.replace("test_iter: 100", "test_iter: 2").replace("snapshot: 5000", f"snapshot: {snapshot}")
    body = {"net": LENET, "solver": solver, "data": LENET_DATA, "device": "cpu", "max_iter": 3000}
    created = api.post(API, json=body)
    assert created.status_code == 201, created.get_json()
    job_id = created.get_json()["id"]
    manager = get_plugin(disk_app).jobs
    job = manager.get(job_id)
    wait_for(lambda: any(r["event"] == "iteration" for r in progress_records(manager, job)), what="training")
    filler = fill(small_disk, leave)

    ended = wait_for(lambda: (d := api.get(f"{API}/{job_id}").get_json())["status"] != "running" and d, timeout=120)
    assert ended["status"] == "failed", ended
    assert "no space left on the disk holding the job's folder" in ended["message"], ended["message"]
    (attempt,) = ended["attempts"]
    assert attempt["status"] == "failed" and "no space left" in attempt["message"]
    # What was written before the disk filled is there and readable, through the API too.
    records = progress_records(manager, job)
    assert records[0]["event"] == "started" and any(r["event"] == "iteration" for r in records)
    log = api.get(f"{API}/{job_id}/log")
    assert log.status_code == 200 and "Solver scaffolding done" in log.get_data(as_text=True)
    assert api.get("/memplugin/api/health").status_code == 200

    filler.unlink()
    assert api.post(f"{API}/{job_id}/resume").status_code == 200
    wait_for(lambda: any(r["event"] == "iteration" for r in progress_records(manager, job, 2)), what="training again")
    api.post(f"{API}/{job_id}/cancel")  # the point is made: the same server trains the job again
    done = wait_for(lambda: (d := api.get(f"{API}/{job_id}").get_json())["status"] in ("cancelled", "done") and d)
    assert len(done["attempts"]) == 2 and done["attempts"][1]["status"] in ("cancelled", "success")


def test_the_runner_reports_a_full_disk_on_stdout_and_stops(tmp_path: Path, small_disk: Path) -> None:
    """The runner's reporter: a record that cannot reach the progress file still reaches the server (stdout first),
    and the failure is a ReportDiskFull the runner turns into its error record."""
    import io

    from digits_memplugin.jobs.child.runner import DISK_FULL, ReportDiskFull, Reporter, _report_error

    out = io.StringIO()
    report = Reporter(out, small_disk / "progress.jsonl")
    report("started", pid=1)
    fill(small_disk, 0)
    iteration = 0
    with pytest.raises(ReportDiskFull, match=r"could not write .*progress\.jsonl: no space left on the device"):
        for iteration in range(1, 1000):  # the rest of the file's last page takes a few records, then it is full
            report("iteration", iteration=iteration, loss=0.5)
    assert _report_error(report, DISK_FULL, "no space left on the disk holding the job's folder") == 3
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["started"] + ["iteration"] * iteration + ["error"]
    assert lines[-1]["type"] == DISK_FULL
    assert json.loads((small_disk / "progress.jsonl").read_text().splitlines()[0])["event"] == "started"


# ============================================================================ the SQLite file locked


class Locker:
    """Another process holding the jobs database's write lock (BEGIN EXCLUSIVE) until it is told to let go."""

    def __init__(self, path: Path) -> None:
        script = textwrap.dedent(
            f"""
            import sqlite3, sys
            db = sqlite3.connect({str(path)!r}, isolation_level=None)
            db.execute("BEGIN EXCLUSIVE")
            print("locked", flush=True)
            sys.stdin.readline()
            db.execute("COMMIT")
            print("released", flush=True)
            """
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None and self.process.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None and self.process.stdout is not None
            self.process.stdin.write("\n")
            self.process.stdin.flush()
            assert self.process.stdout.readline().strip() == "released"
            self.process.wait(timeout=30)

    def __enter__(self) -> Locker:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def stored_job(store: JobStore) -> Job:
    job = Job(id="j1", name="lenet", status="queued", created_at=1.0, updated_at=1.0, folder="j1", spec={})
    return store.add_job(job)


def test_a_write_waits_for_the_lock_while_reads_go_on(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite", busy_seconds=120)
    stored_job(store)
    with Locker(store.path) as locker:
        done: list[Job] = []
        writer = threading.Thread(target=lambda: done.append(store.update_job("j1", message="written")))
        writer.start()
        # While the writer waits for the other process, reads of this store are not held up behind it.
        for _ in range(20):
            assert store.get_job("j1") is not None and store.list_jobs()
        assert writer.is_alive() and not done
        locker.release()
        writer.join(timeout=60)
    assert done and done[0].message == "written" and store.get_job("j1").message == "written"  # type: ignore[union-attr]
    store.close()


def test_a_lock_held_too_long_is_a_clear_error_and_nothing_is_half_written(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite", busy_seconds=0.3)
    stored_job(store)
    with Locker(store.path) as locker:
        with pytest.raises(StoreBusy, match=r"locked by another process; gave up after waiting 0\.3 s"):
            store.update_job("j1", message="lost?", status="running")
        assert store.get_job("j1").status == "queued"  # type: ignore[union-attr]
        locker.release()
    assert store.update_job("j1", message="now").message == "now"
    store.close()


GEVENT_WAIT = """
from gevent import monkey; monkey.patch_all()
import sys, time, gevent
from pathlib import Path
from digits_memplugin.jobs.store.database import JobStore
from digits_memplugin.jobs.store.records import Job
store = JobStore(Path(sys.argv[1]), busy_seconds=120)
print("open", flush=True)
sys.stdin.readline()             # the test has locked the database now
ticks = []
def tick():
    while True:
        ticks.append(1)
        gevent.sleep(0.01)       # a greenlet that ticks: what is tested
ticker = gevent.spawn(tick)
writer = gevent.spawn(store.update_job, "j1", message="under gevent")
while len(ticks) < 50:           # the hub keeps running other greenlets while the write waits
    gevent.sleep(0.01)
print("ticked", len(ticks), writer.ready(), flush=True)
sys.stdin.readline()             # the test releases the lock now
writer.join()
print("written", store.get_job("j1").message, flush=True)
"""


def test_under_gevent_a_locked_database_does_not_stop_the_server(tmp_path: Path) -> None:
    """SQLite's own busy handler would sleep in C and freeze every greenlet; the store's wait yields instead."""
    path = tmp_path / "jobs.sqlite"
    store = JobStore(path)
    stored_job(store)
    store.close()
    child = subprocess.Popen(
        [sys.executable, "-c", GEVENT_WAIT, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "open"
        with Locker(path) as locker:
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().split() == ["ticked", "50", "False"]  # ticked while the writer waited
            locker.release()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "written under gevent"
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def test_a_manager_that_cannot_open_a_locked_store_frees_the_folder_for_the_next_try(
    tmp_path: Path, datasets: Path
) -> None:
    config = ManagerConfig(data_dir=tmp_path / "data", dataset_roots=(datasets,), store_busy_seconds=0.3)
    first = JobManager(config, DeviceReader())
    first.start()  # creates the store
    first.stop()
    manager = JobManager(config, DeviceReader())
    with Locker(tmp_path / "data" / "jobs.sqlite") as locker:
        with pytest.raises(StoreBusy, match="locked by another process"):
            manager.start()  # marking what a previous server left as interrupted is a write
        assert not manager.started
        locker.release()
    manager.start()  # the failed start let go of the data folder's lock (it used to keep it: "in use")
    try:
        assert manager.started and manager.list_jobs() == []
    finally:
        manager.stop()


@pytest.fixture
def locked_app(tmp_path: Path, datasets: Path) -> Iterator[Flask]:
    app = create_app(
        {
            "MEMPLUGIN_DATA_DIR": tmp_path / "data",
            "MEMPLUGIN_ASYNC_MODE": "threading",
            "MEMPLUGIN_DATASET_ROOTS": [str(datasets)],
            "MEMPLUGIN_STORE_BUSY_SECONDS": 0.3,
            "TESTING": True,
        }
    )
    yield app
    get_plugin(app).close()


def submit_while_locked(app: Flask) -> Any:
    api = app.test_client()
    assert api.get(API).status_code == 200  # the manager is started, the store open
    body = {"net": LENET, "solver": SOLVER_20, "data": LENET_DATA, "device": "cpu", "max_iter": 4}
    with Locker(get_plugin(app).jobs.store.path) as locker:
        response = api.post(API, json=body)
        reads = api.get(API)
        locker.release()
    return response, reads


def test_a_submission_while_the_database_is_locked_leaves_nothing_behind(locked_app: Flask, tmp_path: Path) -> None:
    response, reads = submit_while_locked(locked_app)
    assert response.status_code != 201 and response.is_json and "Traceback" not in response.get_data(as_text=True)
    assert reads.status_code == 200 and reads.get_json()["jobs"] == []  # reading went on while it was locked
    assert list((tmp_path / "data" / "jobs").iterdir()) == []  # no folder left for a job that was not stored
    api = locked_app.test_client()
    assert api.get(API).get_json()["jobs"] == []
    again = api.post(API, json={"net": LENET, "solver": SOLVER_20, "data": LENET_DATA, "device": "cpu", "max_iter": 4})
    assert again.status_code == 201
    api.post(f"{API}/{again.get_json()['id']}/cancel")


def test_a_submission_while_the_database_is_locked_is_503_saying_so(locked_app: Flask) -> None:
    response, _ = submit_while_locked(locked_app)
    assert response.status_code == 503
    assert "locked by another process" in response.get_json()["error"]


@pytest.mark.slow
def test_a_job_ending_while_the_database_is_locked_is_recorded_once_it_is_free(make_manager: ManagerFactory) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    manager = make_manager(events, store_busy_seconds=0.3)
    job = manager.submit(lenet_request(solver=SOLVER_20, max_iter=60))
    wait_for(lambda: any(r["event"] == "iteration" for r in progress_records(manager, job)), what="training")
    with Locker(manager.store.path) as locker:
        # The child trains on and ends while nothing can be written: its records keep flowing to listeners.
        wait_for(lambda: any(r["event"] == "finished" for r in progress_records(manager, job)), timeout=120)
        wait_for(
            lambda: any(name == "job" and "is not recorded yet" in (p.get("message") or "") for name, p in events),
            what="the job's listeners to be told the end is not recorded yet",
        )
        assert manager.store.get_job(job.id).status == "running"  # not lost, not guessed: the store says running
        shown = manager.get(job.id)  # while the manager shows what it knows, saying it is not recorded yet
        assert shown.status == "done" and "is not recorded yet in the jobs database" in (shown.message or "")
        assert any(name == "job_progress" and p.get("event") == "finished" for name, p in events)
        locker.release()
    ended = manager.wait(job.id, timeout=60)
    assert ended.status == "done" and ended.iteration == 60, ended
    assert ended.snapshot is not None and ended.snapshot["iteration"] == 60
    (attempt,) = manager.attempts(job.id)
    assert attempt.status == "success" and attempt.end_iteration == 60


@pytest.mark.slow
def test_a_job_whose_snapshot_hits_a_full_disk_says_so_at_once_and_cancel_is_409(
    tmp_path: Path, datasets: Path
) -> None:
    """The data folder (the database and the job folders) on one disk that fills up: a snapshot cannot be written,
    Caffe aborts, and nothing can be written to the database either. The job must not read "running" (nor cancel
    answer 507) until space returns: it reads failed at once, saying the disk is full and that this is not recorded
    yet; cancel is a 409 saying the job has ended; delete and resume wait for the record. Once space is freed the
    end is recorded as it was shown, and the job resumes."""
    data = tmp_path / "data"
    data.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", str(data)], capture_output=True, text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}); the full-disk tests need one")
    app = create_app({"MEMPLUGIN_DATA_DIR": data, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "MEMPLUGIN_STORE_BUSY_SECONDS": 0.5,
                      "TESTING": True})
    try:
        api = app.test_client()
        solver = LENET_SOLVER.replace("test_iter: 100", "test_iter: 2").replace("snapshot: 5000", "snapshot: 50")
        created = api.post(API, json={"net": LENET, "solver": solver, "data": LENET_DATA, "device": "cpu",
                                      "max_iter": 3000})
        assert created.status_code == 201, created.get_json()
        job_id = created.get_json()["id"]
        manager = get_plugin(app).jobs
        job = manager.get(job_id)
        wait_for(lambda: any(r["event"] == "iteration" for r in progress_records(manager, job)), what="training")
        filler = fill(data, 64 * 1024)  # room for a few records, not for a 3.4 MB snapshot
        child = first_pid(manager, job)
        wait_for(lambda: not pid_alive(child), timeout=120, what="the child to stop at its snapshot")

        shown = wait_for(lambda: (d := api.get(f"{API}/{job_id}").get_json())["status"] != "running" and d,
                         timeout=15, what="the job to stop reading running")
        assert shown["status"] == "failed", shown
        assert "no space left" in shown["message"] and "not recorded yet" in shown["message"], shown["message"]
        assert shown["attempts"][0]["status"] == "failed"
        assert manager.store.get_job(job_id).status == "running"  # what the database still says: nothing guessed
        assert [j["status"] for j in api.get(API).get_json()["jobs"]] == ["failed"]  # the list says the same
        cancelled = api.post(f"{API}/{job_id}/cancel")
        assert cancelled.status_code == 409 and "has ended" in cancelled.get_json()["error"], cancelled.get_json()
        for method, path in (("POST", f"{API}/{job_id}/resume"), ("DELETE", f"{API}/{job_id}")):
            waiting = api.open(path, method=method)
            assert waiting.status_code == 409 and "not recorded yet" in waiting.get_json()["error"]
        assert api.get("/memplugin/api/health").status_code == 200

        filler.unlink()
        recorded = wait_for(lambda: (j := manager.store.get_job(job_id)).status != "running" and j, timeout=30,
                            what="the end to be recorded")
        assert recorded.status == "failed" and "no space left" in (recorded.message or "")
        assert "not recorded" not in api.get(f"{API}/{job_id}").get_json()["message"]
        assert api.post(f"{API}/{job_id}/resume").status_code == 200
        api.post(f"{API}/{job_id}/cancel")
        manager.wait(job_id, timeout=60)
    finally:
        get_plugin(app).close()
        subprocess.run(["umount", "-l", str(data)], check=False, capture_output=True)


class FailingWrites:
    """The job store's writes failing with StoreFull while `full` is set (a database on a full disk), reads going
    on: installed on a running manager's store."""

    def __init__(self, store: JobStore) -> None:
        self.full = threading.Event()
        for name in ("update_job", "update_attempt", "add_attempt"):
            original = getattr(store, name)
            setattr(store, name, self._guard(original))

    def _guard(self, write: Any) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.full.is_set():
                raise StoreFull("the disk holding the jobs database jobs.sqlite is full; free some space")
            return write(*args, **kwargs)

        return guarded


@pytest.mark.slow
def test_an_attempt_that_ends_while_the_database_cannot_be_written_shows_its_end_at_once(
    make_manager: ManagerFactory,
) -> None:
    """The same, on the manager, with the database's writes failing for sure: the job reads done with the
    attempt's end as soon as the child has ended, the events say so, cancel/delete/resume refuse with the
    reason, `wait` does not call the job ended until it is recorded, and then the record is what was shown."""
    events: list[tuple[str, dict[str, Any]]] = []
    manager = make_manager(events, store_busy_seconds=0.2)
    writes = FailingWrites(manager.store)
    job = manager.submit(lenet_request(solver=SOLVER_20, max_iter=40))
    wait_for(lambda: any(r["event"] == "iteration" for r in progress_records(manager, job)), what="training")
    writes.full.set()
    wait_for(lambda: any(r["event"] == "finished" for r in progress_records(manager, job)), timeout=120)
    shown = wait_for(lambda: (j := manager.get(job.id)).status != "running" and j, timeout=15)
    assert shown.status == "done" and shown.iteration == 40, shown
    assert "not recorded yet in the jobs database" in (shown.message or "")
    assert manager.store.get_job(job.id).status == "running"
    (attempt,) = manager.attempts(job.id)
    assert attempt.status == "success" and attempt.end_iteration == 40
    assert manager.document(job.id)["attempts"][0]["status"] == "success"
    assert any(name == "job" and p["status"] == "done" for name, p in events)
    assert any(name == "job_attempt" and p["status"] == "success" for name, p in events)
    with pytest.raises(JobStateError, match="has ended"):
        manager.cancel(job.id)
    with pytest.raises(JobStateError, match="only interrupted, cancelled or failed jobs resume"):
        manager.resume(job.id)
    with pytest.raises(JobStateError, match="not recorded yet"):
        manager.delete(job.id)
    assert manager.wait(job.id, timeout=1).status == "done"  # timed out: returns what it knows
    assert job.id in manager.reporter.unrecorded

    writes.full.clear()
    ended = manager.wait(job.id, timeout=60)
    assert job.id not in manager.reporter.unrecorded
    stored = manager.store.get_job(job.id)
    assert (ended.status, stored.status, stored.iteration) == ("done", "done", 40)
    assert "not recorded" not in (ended.message or "")
    assert manager.store.attempts(job.id)[0].status == "success"


def test_a_submission_to_a_full_disk_is_507_saying_so_and_creates_nothing(tmp_path: Path, datasets: Path) -> None:
    """The disk holding the data folder (the database and the job folders) is full: the submission is refused with
    a 507 whose message says so, not the generic 500, no job folder is left behind, and once space is freed the
    same server takes the job."""
    data = tmp_path / "data"
    data.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(data)], capture_output=True, text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}); the full-disk tests need one")
    app = create_app({"MEMPLUGIN_DATA_DIR": data, "MEMPLUGIN_ASYNC_MODE": "threading",
                      "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "TESTING": True})
    try:
        api = app.test_client()
        assert api.get(API).get_json()["jobs"] == []  # the store exists before the disk fills
        filler = fill(data, 0)
        body = {"net": LENET, "solver": SOLVER_20, "data": LENET_DATA, "device": "cpu", "max_iter": 4}
        refused = api.post(API, json=body)
        assert refused.status_code == 507 and refused.is_json, (refused.status_code, refused.get_data(as_text=True))
        assert "disk" in refused.get_json()["error"] and "Traceback" not in refused.get_data(as_text=True)
        assert not (data / "jobs").exists() or list((data / "jobs").iterdir()) == []
        filler.unlink()
        taken = api.post(API, json=body)
        assert taken.status_code == 201, taken.get_json()
        api.post(f"{API}/{taken.get_json()['id']}/cancel")
    finally:
        get_plugin(app).close()
        subprocess.run(["umount", "-l", str(data)], check=False, capture_output=True)


def test_a_second_server_on_the_same_data_folder_is_503_saying_so(tmp_path: Path, datasets: Path) -> None:
    """Two servers must not run jobs from one data folder (each would take the other's queue): the second one's job
    API answers 503 naming the folder, and its other pages go on."""
    config = {"MEMPLUGIN_DATA_DIR": tmp_path / "data", "MEMPLUGIN_ASYNC_MODE": "threading",
              "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "TESTING": True}
    first, second = create_app(config), create_app(config)
    try:
        assert first.test_client().get(API).get_json()["jobs"] == []  # the first takes the folder
        refused = second.test_client().get(API)
        assert refused.status_code == 503 and refused.is_json
        assert "another server or train command is using the data folder" in refused.get_json()["error"]
        page = second.test_client().get("/memplugin/jobs")  # the jobs list page says so too, as an HTML 503
        assert page.status_code == 503 and "another server or train command" in page.get_data(as_text=True)
        assert second.test_client().get("/memplugin/api/health").status_code == 200
    finally:
        get_plugin(second).close()
        get_plugin(first).close()
