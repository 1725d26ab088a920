"""jobs.backends.local, jobs.backends.ray, jobs.backends.node and devices.cluster without Ray: a fake backend through the manager's
attempt loop (handles stored, the out-of-memory retry, cancel, reaping at start), the Ray backend's reading of a
job's log against a fake Jobs API, and the Ray backend with its node wrapper run as plain subprocesses giving the
same attempts and records as the local backend for the same job."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import MIB, ManagerFactory, lenet_request, wait_for

from digits_memplugin.core.errors import FieldErrors
from digits_memplugin.core.oom import (
    OUTCOME_CANCELLED,
    OUTCOME_FAILED,
    OUTCOME_OUT_OF_MEMORY,
    OUTCOME_SUCCESS,
    Outcome,
    OutOfMemory,
)
from digits_memplugin.devices.cluster import ClusterDeviceReader, cpu_host
from digits_memplugin.devices.reader import DeviceList, DeviceReader, read_devices
from digits_memplugin.host.settings import ConfigError, Settings
from digits_memplugin.jobs.backends import ray as ray_backend
from digits_memplugin.jobs.backends.attempt_process import AttemptResult
from digits_memplugin.jobs.backends.local import Launch, LocalBackend
from digits_memplugin.jobs.backends.node import result_from_json, result_to_json
from digits_memplugin.jobs.backends.ray import RayAttempt, RayBackend, RayError, TailClosed
from digits_memplugin.jobs.child.attempt_spec import AttemptDevice, AttemptSpec
from digits_memplugin.jobs.manager import STORE_FILE, JobManager, ManagerConfig
from digits_memplugin.jobs.scheduling.scheduler import admit, normalise_device
from digits_memplugin.jobs.store.database import JobStore
from digits_memplugin.jobs.store.records import Attempt, Job

pytest_plugins = ["test_jobs_fixtures"]  # make_manager, datasets

REPO = Path(__file__).resolve().parent.parent


# --- a fake backend through the manager --------------------------------------------------------------------------


class FakeHandle:
    """An attempt that reports two records and ends as its backend's script says, without a child."""

    def __init__(self, launch: Launch, outcome: Outcome, number: int) -> None:
        self.launch = launch
        self.outcome = outcome
        self.number = number
        self.cancelled = threading.Event()
        self.hold = threading.Event()

    @property
    def handle(self) -> str:
        return f"fake:{self.launch.spec.job_id}-{self.number}"

    @property
    def pid(self) -> int | None:
        return None

    def cancel(self) -> None:
        self.cancelled.set()

    def kill(self) -> None:
        self.cancelled.set()

    def wait(self) -> AttemptResult:
        self.launch.on_record({"event": "started", "pid": 1})
        self.launch.on_record({"event": "iteration", "iteration": 1, "loss": 2.0})
        self.launch.on_log(["I1203 fake.cpp:1] one line"])
        while self.hold.is_set() and not self.cancelled.wait(0.05):
            pass
        outcome = Outcome(OUTCOME_CANCELLED, "cancelled") if self.cancelled.is_set() else self.outcome
        finished = outcome.status == OUTCOME_SUCCESS
        self.launch.on_record({"event": "finished", "iteration": 4} if finished else {"event": "iteration", "iteration": 2})
        return AttemptResult(0 if finished else 134, outcome, 2, 4 if finished else 2, None, finished, None)


class FakeBackend:
    name = "fake"

    def __init__(self, outcomes: Sequence[Outcome], hold: bool = False) -> None:
        self.outcomes = list(outcomes)
        self.launched: list[FakeHandle] = []
        self.reaped: list[Attempt] = []
        self.hold = hold

    def launch(self, launch: Launch) -> FakeHandle:
        handle = FakeHandle(launch, self.outcomes.pop(0), len(self.launched) + 1)
        if self.hold:
            handle.hold.set()
        self.launched.append(handle)
        return handle

    def reap(self, attempts: Sequence[Attempt], jobs_root: Path) -> None:
        self.reaped += attempts

    def device_reader(self, local: DeviceReader) -> DeviceReader:
        return local

    def close(self) -> None:
        pass


OOM = Outcome(OUTCOME_OUT_OF_MEMORY, "host memory ran out", OutOfMemory("host_allocation_failed", "cpu", "ran out"),
              signal="SIGABRT")


def test_attempts_run_through_the_backend_and_keep_its_handle(make_manager: ManagerFactory) -> None:
    backend = FakeBackend([OOM, Outcome(OUTCOME_SUCCESS, "finished")])
    manager = make_manager(backend=backend, poll_seconds=0.1, cpu_memory_cap=512 * MIB)
    job = manager.wait(manager.submit(lenet_request(batch=64)).id, timeout=60)
    assert job.status == "done", job.message
    first, second = manager.store.attempts(job.id)
    assert (first.status, first.handle, second.status, second.handle) == (
        OUTCOME_OUT_OF_MEMORY, f"fake:{job.id}-1", OUTCOME_SUCCESS, f"fake:{job.id}-2"
    )
    assert second.batch_size < first.batch_size  # the fallback ran on the backend's result
    launch = backend.launched[0].launch
    assert launch.device == "cpu" and launch.environment == {"CUDA_VISIBLE_DEVICES": ""}
    assert launch.spec.memory_cap is not None and (launch.folder / launch.spec_file).is_file()
    assert "handle" not in manager.document(job.id)["attempts"][0]  # the API shows no pid/handle, as before


def test_cancel_reaches_the_backends_handle(make_manager: ManagerFactory) -> None:
    backend = FakeBackend([Outcome(OUTCOME_SUCCESS, "finished")], hold=True)
    manager = make_manager(backend=backend, poll_seconds=0.1)
    job = manager.submit(lenet_request())
    wait_for(lambda: backend.launched, timeout=30, what="the backend's launch")
    manager.cancel(job.id)
    assert manager.wait(job.id, timeout=30).status == "cancelled"
    assert backend.launched[0].cancelled.is_set()


class DownBackend(FakeBackend):
    def launch(self, launch: Launch) -> FakeHandle:
        raise RayError("Ray POST /api/jobs/ at http://head:8265: [Errno 111] Connection refused")


def test_an_attempt_the_backend_cannot_start_fails_the_job_saying_why(make_manager: ManagerFactory) -> None:
    manager = make_manager(backend=DownBackend([]), poll_seconds=0.1)
    job = manager.wait(manager.submit(lenet_request()).id, timeout=30)
    assert job.status == "failed" and "could not be started (fake backend)" in (job.message or "")
    (attempt,) = manager.store.attempts(job.id)
    assert attempt.status == "failed" and "Connection refused" in (attempt.message or "")


def test_the_backend_reaps_what_a_previous_server_left_running(
    make_manager: ManagerFactory, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    store = JobStore(tmp_path / "data" / STORE_FILE)  # as a killed server left it: a job and its attempt running
    store.add_job(Job(id="j1", name="lenet", status="running", created_at=1.0, updated_at=1.0, folder="j1",
                      spec={"device": "cpu"}))
    store.add_attempt(Attempt(job_id="j1", number=1, status="running", device="cpu", batch_size=8, iter_size=1,
                              started_at=1.0, log="attempts/1/caffe.log", handle="ray:j1-1"))
    store.close()
    backend = FakeBackend([])
    manager = make_manager(backend=backend, poll_seconds=0.1)
    assert [(a.job_id, a.handle) for a in backend.reaped] == [("j1", "ray:j1-1")]
    assert manager.get("j1").status == "interrupted"


def test_the_local_backend_hands_back_a_pid_handle(tmp_path: Path) -> None:
    spec = _spec()
    launch = Launch(tmp_path, "attempt.json", spec, "cpu", {}, on_record=lambda r: None, on_log=lambda lines: None,
                    grace_seconds=1.0, stall_seconds=None)
    spec.write(tmp_path / "attempt.json")
    process = LocalBackend().launch(launch)
    try:
        assert process.handle == f"pid:{process.pid}"
    finally:
        process.kill()
        process.wait()


# --- the Ray backend against a fake Jobs API -------------------------------------------------------------------


def _spec(job_id: str = "j1", attempt: int = 1) -> AttemptSpec:
    return AttemptSpec(
        job_id=job_id, attempt=attempt, solver="attempts/1/solver.prototxt", log="attempts/1/caffe.log",
        progress="attempts/1/progress.jsonl", device=AttemptDevice("cpu"), batch_size=8, iter_size=1, resume=None,
        memory_cap=None, max_iter=4, test_interval=0, test_iter=(), test_initialization=False, snapshot=0,
        snapshot_after_train=False, snapshot_prefix="snapshots/snap", snapshot_format="HDF5",
        schedule={"policy": "fixed", "base_lr": 0.01},
    )


class ScriptedJobs:
    """Ray's answers, one per poll: (status, log text so far)."""

    def __init__(self, script: Sequence[tuple[str, str]]) -> None:
        self.script = list(script)
        self.polls = 0
        self.stopped: list[str] = []
        self.submitted: list[dict[str, Any]] = []

    def _now(self) -> tuple[str, str]:
        return self.script[min(self.polls, len(self.script) - 1)]

    def submit(self, submission_id: str, entrypoint: str, *, resources: Mapping[str, float],
               metadata: Mapping[str, str]) -> str:
        self.submitted.append({"id": submission_id, "entrypoint": entrypoint, "resources": dict(resources)})
        return submission_id

    def status(self, submission_id: str) -> dict[str, Any]:
        self.polls += 1
        return {"status": self._now()[0], "message": "Job failed due to an application error, last available logs"}

    def logs(self, submission_id: str) -> str:
        return self._now()[1]

    def tail(self, submission_id: str) -> Any:
        raise RayError("this dashboard has no log tail")  # the attempt reads the whole log at each poll

    def stop(self, submission_id: str) -> bool:
        self.stopped.append(submission_id)
        return True


class ScriptedTail:
    """A log-tail websocket that gives these chunks, then closes (as Ray does once the job has ended)."""

    def __init__(self, chunks: Sequence[str], *, closes: bool = True) -> None:
        self.chunks = list(chunks)
        self.closes = closes
        self.closed = False

    def read(self, timeout: float) -> str | None:
        if not self.chunks:
            if self.closes:
                raise TailClosed("closed by Ray")
            return None  # Ray's tail reads the file every second or two: the end may not have come through yet
        return self.chunks.pop(0)

    def close(self) -> None:
        self.closed = True


class TailedJobs(ScriptedJobs):
    """A Jobs API whose log is read through tails, one per opening, each from the start of the log."""

    def __init__(self, script: Sequence[tuple[str, str]], tails: Sequence[Sequence[str]]) -> None:
        super().__init__(script)
        self.tails = [ScriptedTail(chunks) for chunks in tails]
        self.opened: list[ScriptedTail] = []
        self.whole_reads = 0

    def tail(self, submission_id: str) -> ScriptedTail:
        if not self.tails:
            raise RayError("no more tails")
        self.opened.append(self.tails.pop(0))
        return self.opened[-1]

    def logs(self, submission_id: str) -> str:
        self.whole_reads += 1
        return super().logs(submission_id)


def _line(kind: str, **payload: Any) -> str:
    return json.dumps({"memplugin": kind, **payload}) + "\n"


def _follow(jobs: ScriptedJobs, tmp_path: Path) -> tuple[RayAttempt, list[dict[str, Any]], list[str]]:
    records: list[dict[str, Any]] = []
    lines: list[str] = []
    (tmp_path / "attempts" / "1").mkdir(parents=True, exist_ok=True)
    launch = Launch(tmp_path, "attempts/1/attempt.json", _spec(), "cpu@n1", {}, on_record=records.append,
                    on_log=lines.extend, grace_seconds=5.0, stall_seconds=None)
    attempt = RayAttempt(jobs, "j1-1", launch, poll_seconds=0.0)  # type: ignore[arg-type]
    return attempt, records, lines


def test_the_result_is_rebuilt_from_the_nodes_lines_however_the_log_is_cut(tmp_path: Path) -> None:
    result = AttemptResult(134, OOM, 3, 2, 5 * MIB, False, None, 4 * MIB)
    text = (
        "2026-12-03 09:37:31,194\tINFO job_manager.py:581 -- Runtime env is setting up.\n"
        + _line("started", host="n1", pid=7)
        + _line("record", record={"event": "iteration", "iteration": 1})
        + _line("log", lines=["F1203 syncedmem.cpp:56] Check failed: *ptr host allocation of size 9 failed"])
        + _line("outcome", result=result_to_json(result))
    )
    cut = len(text) // 2 + 3  # a poll that ends inside a line
    jobs = ScriptedJobs([("RUNNING", text[:cut]), ("RUNNING", text), ("FAILED", text)])
    attempt, records, lines = _follow(jobs, tmp_path)
    assert attempt.wait() == result
    assert records == [{"event": "iteration", "iteration": 1}]
    assert lines[0].startswith("F1203") and attempt.host == "n1"
    assert result_from_json(json.loads(json.dumps(result_to_json(result)))) == result


def test_the_log_is_followed_through_the_tail_not_read_whole_at_every_poll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long job prints a record per iteration: reading its whole log at every poll would grow without bound."""
    monkeypatch.setattr(ray_backend, "TAIL_AFTER_CHARS", 0)  # every log followed through the tail
    result = AttemptResult(0, Outcome(OUTCOME_SUCCESS, "done"), 3, 2, 5 * MIB, False, None, 4 * MIB)
    text = "".join(_line("record", record={"event": "iteration", "iteration": i}) for i in range(1, 200))
    text += _line("outcome", result=result_to_json(result))
    chunks = [text[i:i + 97] for i in range(0, len(text), 97)]  # chunks that end inside lines
    jobs = TailedJobs([("RUNNING", text)], [chunks])
    attempt, records, _ = _follow(jobs, tmp_path)
    assert attempt.wait() == result
    assert [r["iteration"] for r in records] == list(range(1, 200))
    assert jobs.whole_reads == 0 and jobs.opened[0].closed


def test_a_tail_opened_again_reads_each_line_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard closed the tail while the job ran (restarted): the next tail starts at the log's beginning."""
    monkeypatch.setattr(ray_backend, "TAIL_AFTER_CHARS", 0)  # every log followed through the tail
    result = AttemptResult(0, Outcome(OUTCOME_SUCCESS, "done"), 3, 2, 5 * MIB, False, None, 4 * MIB)
    head = "".join(_line("record", record={"event": "iteration", "iteration": i}) for i in (1, 2, 3))
    text = head + _line("record", record={"event": "iteration", "iteration": 4})
    text += _line("outcome", result=result_to_json(result))
    cut = len(head) + 5
    jobs = TailedJobs([("RUNNING", text)], [[text[:cut]], [text[:10], text[10:]]])
    attempt, records, _ = _follow(jobs, tmp_path)
    assert attempt.wait() == result
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert len(jobs.opened) == 2 and jobs.whole_reads == 0


def test_once_the_job_has_ended_its_result_is_read_from_the_whole_log_not_waited_for_on_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ray_backend, "TAIL_AFTER_CHARS", 0)  # every log followed through the tail
    result = AttemptResult(0, Outcome(OUTCOME_SUCCESS, "done"), 3, 2, 5 * MIB, False, None, 4 * MIB)
    first = _line("record", record={"event": "iteration", "iteration": 1})
    text = first + _line("outcome", result=result_to_json(result))
    jobs = TailedJobs([("RUNNING", first), ("RUNNING", first), ("SUCCEEDED", text)], [])
    jobs.tails = [ScriptedTail([first], closes=False)]
    attempt, records, _ = _follow(jobs, tmp_path)
    assert attempt.wait() == result
    assert [r["iteration"] for r in records] == [1]  # read once, from the tail
    assert jobs.opened[0].closed and jobs.whole_reads == 1


def test_a_short_log_is_read_whole_and_a_long_one_through_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a short log whole gets each record within a poll; past TAIL_AFTER_CHARS its reads would grow."""
    result = AttemptResult(0, Outcome(OUTCOME_SUCCESS, "done"), 3, 2, 5 * MIB, False, None, 4 * MIB)
    first = "".join(_line("record", record={"event": "iteration", "iteration": i}) for i in (1, 2))
    text = first + _line("record", record={"event": "iteration", "iteration": 3})
    text += _line("outcome", result=result_to_json(result))
    monkeypatch.setattr(ray_backend, "TAIL_AFTER_CHARS", len(first))
    jobs = TailedJobs([("RUNNING", ""), ("RUNNING", first[:-5]), ("RUNNING", first), ("RUNNING", first)], [[text[:7], text[7:]]])
    attempt, records, _ = _follow(jobs, tmp_path)
    assert attempt.wait() == result
    assert [r["iteration"] for r in records] == [1, 2, 3]
    assert jobs.whole_reads == 2 and len(jobs.opened) == 1  # whole while short, then the tail from its start


def test_without_a_tail_the_whole_log_is_read_from_where_it_ended(tmp_path: Path) -> None:
    result = AttemptResult(0, Outcome(OUTCOME_SUCCESS, "done"), 3, 2, 5 * MIB, False, None, 4 * MIB)
    first = _line("record", record={"event": "iteration", "iteration": 1})
    text = first + _line("outcome", result=result_to_json(result))
    jobs = TailedJobs([("RUNNING", first), ("RUNNING", first), ("RUNNING", text)], [])
    attempt, records, _ = _follow(jobs, tmp_path)
    assert attempt.wait() == result
    assert [r["iteration"] for r in records] == [1] and jobs.whole_reads == 2


def test_a_job_stopped_before_its_node_reported_is_cancelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = ScriptedJobs([("RUNNING", ""), ("STOPPED", "")])
    attempt, _, _ = _follow(jobs, tmp_path)
    decided = threading.Event()  # the cancel's own task has decided whether Ray's stop is needed
    stop_if_overdue = attempt._stop_if_overdue

    def deciding() -> None:
        try:
            stop_if_overdue()
        finally:
            decided.set()

    monkeypatch.setattr(attempt, "_stop_if_overdue", deciding)
    attempt.cancel()
    ray_backend.OUTCOME_SECONDS, saved = 0.0, ray_backend.OUTCOME_SECONDS
    try:
        result = attempt.wait()
    finally:
        ray_backend.OUTCOME_SECONDS = saved
    assert result.outcome.status == OUTCOME_CANCELLED
    assert (tmp_path / "attempts" / "1" / "cancel").is_file()  # a wrapper that starts later ends at once
    assert decided.wait(30), "the cancel's task did not end"
    assert jobs.stopped == []  # it ended by itself: Ray's stop (no time to snapshot) was not needed


class StopsWhenStopped(ScriptedJobs):
    """A running Ray job that ends only once Ray stops it (a wrapper that does not honour the cancel file)."""

    def status(self, submission_id: str) -> dict[str, Any]:
        self.polls += 1
        return {"status": "STOPPED" if self.stopped else self.script[0][0], "message": ""}


@pytest.mark.parametrize("state", ["RUNNING", "PENDING"])
def test_a_cancel_gives_the_wrapper_its_time_to_snapshot_before_rays_stop(tmp_path: Path, state: str) -> None:
    """Issue 26 point 3: Ray's stop is SIGTERM with SIGKILL 3 s later, no time for a snapshot. A cancel is the cancel
    file first (the wrapper answers it as a local cancel: snapshot, then stop); Ray's stop follows only once the
    cancel's bound has passed, or at once while Ray still holds the job pending (nothing to snapshot)."""
    jobs = StopsWhenStopped([(state, "")])
    (tmp_path / "attempts" / "1").mkdir(parents=True, exist_ok=True)
    launch = Launch(tmp_path, "attempts/1/attempt.json", _spec(), "cpu@n1", {}, on_record=lambda r: None,
                    on_log=lambda lines: None, grace_seconds=0.2, stall_seconds=None, cancel_seconds=0.6)
    attempt = RayAttempt(jobs, "j1-1", launch, poll_seconds=0.05)  # type: ignore[arg-type]
    assert "--cancel-seconds 0.6" in RayBackend("http://h:8265", tmp_path, client=jobs).entrypoint(launch)  # type: ignore[arg-type]
    waiter = threading.Thread(target=attempt.wait, daemon=True)
    ray_backend.OUTCOME_SECONDS, saved = 0.0, ray_backend.OUTCOME_SECONDS
    try:
        waiter.start()
        wait_for(lambda: jobs.polls, timeout=30, what="the first poll of the job's status")
        asked = time.monotonic()
        attempt.cancel()
        assert (tmp_path / "attempts" / "1" / "cancel").is_file()
        wait_for(lambda: jobs.stopped, timeout=5, what="Ray's stop")
        waited = time.monotonic() - asked
        waiter.join(timeout=5)
    finally:
        ray_backend.OUTCOME_SECONDS = saved
    assert jobs.stopped == ["j1-1"]
    if state == "RUNNING":
        assert waited >= 0.8  # the cancel's bound and the grace period first
    else:
        assert waited < 0.5


def test_a_pending_job_that_was_stopped_is_given_up_after_a_while(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_backend, "PENDING_CANCEL_SECONDS", 0.0)
    jobs = ScriptedJobs([("PENDING", "")])  # Ray's stop leaves a pending job pending
    attempt, _, _ = _follow(jobs, tmp_path)
    attempt.cancel()
    assert attempt.wait().outcome.status == OUTCOME_CANCELLED


def test_a_job_that_failed_without_a_result_says_what_ray_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_backend, "OUTCOME_SECONDS", 0.0)
    jobs = ScriptedJobs([("FAILED", "Traceback (most recent call last):\nModuleNotFoundError: digits_memplugin\n")])
    attempt, _, _ = _follow(jobs, tmp_path)
    result = attempt.wait()
    assert result.outcome.status == OUTCOME_FAILED
    assert "ended FAILED" in result.outcome.message and "ModuleNotFoundError" in result.outcome.message


def test_an_unreachable_cluster_fails_the_attempt_after_a_bounded_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_backend, "UNREACHABLE_SECONDS", 0.0)
    client = ray_backend.RayJobsClient("http://127.0.0.1:9", timeout=0.5)  # nothing listens on port 9
    records: list[dict[str, Any]] = []
    (tmp_path / "attempts" / "1").mkdir(parents=True)
    launch = Launch(tmp_path, "attempts/1/attempt.json", _spec(), "cpu", {}, on_record=records.append,
                    on_log=lambda lines: None, grace_seconds=5.0, stall_seconds=None)
    result = RayAttempt(client, "j1-1", launch, poll_seconds=0.0).wait()
    assert result.outcome.status == OUTCOME_FAILED and "stopped answering" in result.outcome.message
    with pytest.raises(RayError, match=re.escape("127.0.0.1:9")):
        client.nodes()


def test_the_entrypoint_pins_the_device_and_carries_our_cuda_environment(tmp_path: Path) -> None:
    backend = RayBackend("http://head:8265", tmp_path, python="/opt/venv/bin/python", client=ScriptedJobs([]))  # type: ignore[arg-type]
    launch = Launch(tmp_path / "jobs" / "j1", "attempts/1/attempt.json", _spec(), "GPU-abc", {
        "CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, on_record=lambda r: None,
        on_log=lambda lines: None, grace_seconds=5.0, stall_seconds=600.0)
    words = shlex.split(backend.entrypoint(launch))
    assert words[:4] == ["/opt/venv/bin/python", "-m", "digits_memplugin.jobs.backends.node", "attempts/1/attempt.json"]
    assert words[words.index("CUDA_VISIBLE_DEVICES=1") - 1:][:2] == ["--env", "CUDA_VISIBLE_DEVICES=1"]
    assert float(words[words.index("--grace") + 1]) < ray_backend.STOP_WAIT_SECONDS  # it reports before Ray's SIGKILL
    assert RayBackend.resources("GPU-abc") == {"memplugin_gpu:GPU-abc": 1.0}
    assert RayBackend.resources("cpu@n2") == {"memplugin_cpu:n2": 1.0}
    assert RayBackend.resources("cpu") == {}


class ProbedJobs(ScriptedJobs):
    """Two hosts; the probe fails on n2 (its mount is missing)."""

    def __init__(self) -> None:
        super().__init__([])

    def nodes(self) -> list[dict[str, Any]]:
        return [{"resources_total": {"CPU": 2.0, "memplugin_cpu:n1": 1.0}},
                {"resources_total": {"memplugin_cpu:n2": 1.0, "memplugin_gpu:GPU-1": 1.0}}]

    def status(self, submission_id: str) -> dict[str, Any]:
        return {"status": "FAILED" if submission_id.endswith("-n2") else "SUCCEEDED"}

    def logs(self, submission_id: str) -> str:
        return "Running entrypoint\nn2: cannot read /srv/x/.probe: No such file or directory\n"


def test_the_ray_backend_refuses_a_cluster_whose_nodes_cannot_see_the_shared_folder(tmp_path: Path) -> None:
    jobs = ProbedJobs()
    backend = RayBackend("http://head:8265", tmp_path, client=jobs)  # type: ignore[arg-type]
    with pytest.raises(RayError, match="not visible on every node: n2: n2: cannot read"):
        backend.check(timeout=5)
    assert [job["resources"] for job in jobs.submitted] == [{"memplugin_cpu:n1": 0.001}, {"memplugin_cpu:n2": 0.001}]
    assert not list(tmp_path.glob(".probe-*"))  # the probe file is removed


# --- the hosts' devices ----------------------------------------------------------------------------------------


def _report(root: Path, host: str, devices: DeviceList, age: float = 0.0) -> None:
    (root / "nodes").mkdir(parents=True, exist_ok=True)
    document = {"host": host, "time": time.time() - age, **devices.to_json()}
    (root / "nodes" / f"{host}.json").write_text(json.dumps(document))


def test_every_hosts_gpus_and_cpu_are_listed_with_the_host(tmp_path: Path, fake_gpus: Any) -> None:
    own = read_devices()
    _report(tmp_path, "n1", own)
    _report(tmp_path, "gone", own, age=3600)  # a stale report: the host is gone
    devices = ClusterDeviceReader(tmp_path, DeviceReader()).read()
    assert [cpu.key for cpu in devices.other_cpus] == ["cpu@n1"] and cpu_host("cpu@n1") == "n1"
    assert devices.cpu.key == "cpu" and devices.cpu.host is None
    assert {gpu.host for gpu in devices.gpus} == {"n1"}  # this server's own GPUs are n1's in this test
    assert "host" in devices.to_json()["devices"][0] and "host" not in own.to_json()["devices"][0]
    assert normalise_device("cpu@n1", devices) == "cpu@n1"
    assert admit("cpu@n1", devices, memory_cap=64 * MIB, gpus_simulated=False) == "cpu@n1"
    with pytest.raises(FieldErrors, match="no host's CPU"):
        admit("cpu@gone", devices, memory_cap=None, gpus_simulated=False)


def test_the_backend_settings_are_checked_at_start() -> None:
    assert Settings.from_config({}).job_backend == "local"
    with pytest.raises(ConfigError, match="'local' or 'ray'"):
        Settings.from_config({"MEMPLUGIN_JOB_BACKEND": "slurm"})
    with pytest.raises(ConfigError, match="http"):
        Settings.from_config({"MEMPLUGIN_RAY_ADDRESS": "head:8265"})
    settings = Settings.from_config({"MEMPLUGIN_JOB_BACKEND": "ray", "MEMPLUGIN_RAY_ADDRESS": "http://head:8265/"})
    assert settings.ray_address == "http://head:8265"
    assert Settings.from_config({"MEMPLUGIN_MESSAGE_QUEUE": "redis://127.0.0.1:6379/0"}).message_queue
    with pytest.raises(ConfigError, match="redis://"):
        Settings.from_config({"MEMPLUGIN_MESSAGE_QUEUE": "127.0.0.1:6379"})


# --- the Ray backend and the node wrapper as plain subprocesses: the same job as the local backend -----------------


class SubprocessJobs:
    """The Jobs API's behaviour without Ray: each submission's entrypoint runs as a shell child here; its output
    is the job's log."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.jobs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.stopped: set[str] = set()

    def submit(self, submission_id: str, entrypoint: str, *, resources: Mapping[str, float],
               metadata: Mapping[str, str]) -> str:
        if submission_id in self.jobs:
            raise RayError("HTTP 500: a submission id is used once")
        out = self.folder / f"{submission_id}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with out.open("wb") as log:
            process = subprocess.Popen(entrypoint, shell=True, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        self.jobs[submission_id] = (process, out)
        return submission_id

    def status(self, submission_id: str) -> dict[str, Any]:
        process, _ = self.jobs[submission_id]
        code = process.poll()
        state = "RUNNING" if code is None else "STOPPED" if submission_id in self.stopped else (
            "SUCCEEDED" if code == 0 else "FAILED")
        return {"status": state, "driver_exit_code": code}

    def logs(self, submission_id: str) -> str:
        return self.jobs[submission_id][1].read_text(errors="replace")

    def tail(self, submission_id: str) -> FileTail:
        return FileTail(*self.jobs[submission_id])

    def stop(self, submission_id: str) -> bool:
        process, _ = self.jobs[submission_id]
        self.stopped.add(submission_id)
        os.killpg(process.pid, signal.SIGTERM)
        return True

    def close(self) -> None:
        for process, _ in self.jobs.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


class FileTail:
    """Ray's log tail over a subprocess's output file: each new chunk once, closed when the process has ended and
    everything was read."""

    def __init__(self, process: subprocess.Popen[bytes], path: Path) -> None:
        self.process, self.file = process, path.open("rb")

    def read(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while True:
            ended = self.process.poll() is not None
            data = self.file.read()
            if data:
                return data.decode("utf-8", errors="replace")
            if ended:
                raise TailClosed("the job ended")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)  # a tail of a growing file looks again (as Ray's tail does over its log)

    def close(self) -> None:
        self.file.close()


def _shape(records: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What must agree between backends: each record's kind and iteration (times and memory vary)."""
    return [(r.get("event"), r.get("iteration")) for r in records]


@pytest.mark.slow
def test_the_ray_backend_gives_the_same_attempts_and_records_as_the_local_one(
    tmp_path: Path, datasets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_backend, "TAIL_AFTER_CHARS", 0)  # the records through the tail (FileTail)
    runs: dict[str, tuple[list[Attempt], list[dict[str, Any]]]] = {}
    jobs = SubprocessJobs(tmp_path)
    try:
        for name in ("local", "ray"):
            data = tmp_path / name
            backend: Any = LocalBackend() if name == "local" else RayBackend(
                "http://unused", data, client=jobs, poll_seconds=0.2)  # type: ignore[arg-type]
            records: list[dict[str, Any]] = []

            def keep(event: str, payload: dict[str, Any], records: list[dict[str, Any]] = records) -> None:
                if event == "job_progress":
                    records.append(payload)

            manager = JobManager(ManagerConfig(data_dir=data, dataset_roots=(datasets,), poll_seconds=0.1,
                                               cpu_memory_cap=64 * MIB), DeviceReader(), on_event=keep,
                                 backend=backend)
            manager.start()
            try:
                # Shared on both: the Ray backend keeps the test nets beside the train net (docs/jobs.md).
                job = manager.submit(lenet_request(batch=512, fallback={"start": "wanted"}, test_net="shared"))
                ended = manager.wait(job.id, timeout=240)
                assert ended.status == "done", manager.document(job.id)
                runs[name] = (manager.store.attempts(job.id), records)
            finally:
                manager.stop()
    finally:
        jobs.close()
    (local, local_records), (ray, ray_records) = runs["local"], runs["ray"]
    assert [a.handle.split(":")[0] for a in ray] == ["ray"] * len(ray)
    assert [(a.status, a.batch_size, a.iter_size, a.signal, a.end_iteration) for a in ray] == [
        (a.status, a.batch_size, a.iter_size, a.signal, a.end_iteration) for a in local]
    assert ray[0].status == OUTCOME_OUT_OF_MEMORY and ray[0].out_of_memory and local[0].out_of_memory
    assert ray[0].out_of_memory["signature"] == local[0].out_of_memory["signature"] == "host_allocation_failed"
    assert _shape(ray_records) == _shape(local_records)
