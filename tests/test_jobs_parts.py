"""The job manager's parts, each built alone on a run state of its own (jobs.run_state) with a real store in a
temporary folder, real jobs written as a submission writes them, the real devices (the CPU) and real Caffe: the
Reporter, the Quota, the Dispatcher, the AttemptLoop and the Leadership, without a JobManager around them."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import lenet_request, wait_for

from digits_memplugin.devices.reader import DeviceReader
from digits_memplugin.jobs.config import ManagerConfig
from digits_memplugin.jobs.errors import QueueFull
from digits_memplugin.jobs.events.reporter import Reporter
from digits_memplugin.jobs.leadership import STORE_FILE, Leadership
from digits_memplugin.jobs.run_state import Running, RunState
from digits_memplugin.jobs.scheduling.attempt_end import INTERRUPTED_MESSAGE
from digits_memplugin.jobs.scheduling.attempt_loop import AttemptLoop
from digits_memplugin.jobs.scheduling.dispatcher import Dispatcher
from digits_memplugin.jobs.scheduling.submission import Definitions, write_job
from digits_memplugin.jobs.store.database import JobStore
from digits_memplugin.jobs.store.disk import folder_bytes
from digits_memplugin.jobs.store.quota import Quota
from digits_memplugin.jobs.store.records import CANCELLED, DONE, FAILED, INTERRUPTED, QUEUED, RUNNING, Job

pytest_plugins = ["test_jobs_fixtures"]  # datasets


@dataclass
class Parts:
    """A manager's parts wired as JobManager wires them, on one run state, with the events they emit."""

    config: ManagerConfig
    state: RunState
    reporter: Reporter
    quota: Quota
    definitions: Definitions
    attempts: AttemptLoop
    dispatcher: Dispatcher
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    spawned: list[Any] = field(default_factory=list)
    """The tasks the dispatcher started: kept, not run (the test runs one when it wants it)."""

    @property
    def store(self) -> JobStore:
        return self.state.store

    def queue(self, **fields: Any) -> Job:
        """A LeNet job on the CPU written and stored as a submission does."""
        job, definition = write_job(lenet_request(**fields), "cpu", self.definitions)
        self.store.add_job(job)
        self.definitions.keep(job.id, definition)
        return job

    def place(self, job: Job) -> Running:
        """The job placed on the CPU as the dispatcher places it: stored running, its entry in the table."""
        entry = Running(job.id, "cpu", "cpu")
        self.store.update_job(job.id, status=RUNNING, device="cpu")
        self.state.running[job.id] = entry
        return entry


@pytest.fixture
def parts(tmp_path: Path, datasets: Path) -> Iterator[Parts]:
    config = ManagerConfig(data_dir=tmp_path / "data", dataset_roots=(datasets,), poll_seconds=0.05,
                           store_progress_seconds=3600.0)
    jobs_root = config.data_dir / "jobs"
    jobs_root.mkdir(parents=True)
    state = RunState()
    state.open(JobStore(config.data_dir / STORE_FILE))
    events: list[tuple[str, dict[str, Any]]] = []
    reporter = Reporter(state, lambda name, payload: events.append((name, payload)),
                        poll_seconds=config.poll_seconds, store_progress_seconds=config.store_progress_seconds)
    quota = Quota(config, state, jobs_root)
    definitions = Definitions(config.dataset_roots, None, jobs_root)
    devices = DeviceReader()
    attempts = AttemptLoop(config, devices, state, reporter, definitions, quota, jobs_root=jobs_root, oracle=None)
    spawned: list[Any] = []
    dispatcher = Dispatcher(config, devices, state, reporter, attempts, definitions, spawn=spawned.append,
                            jobs_root=jobs_root)
    yield Parts(config, state, reporter, quota, definitions, attempts, dispatcher, events, spawned)
    state.kill_running()
    state.close()


# --- Reporter -------------------------------------------------------------------------------------------------


def test_progress_keeps_the_runners_records_on_the_job_and_passes_them_on(parts: Parts) -> None:
    job = parts.queue()
    entry = parts.place(job)
    entry.start_attempt(1, max_iter=100)
    parts.reporter.on_record(job.id, 1, {"event": "iteration", "iteration": 1, "loss": 0.5, "seconds": 0.0})
    parts.reporter.on_record(job.id, 1, {"event": "iteration", "iteration": 3, "loss": 0.25, "seconds": 1.0})

    stored = parts.store.get_job(job.id)
    assert stored is not None and stored.iteration == 1  # the first iteration is stored at once, the next one not yet
    forwarded = [payload for name, payload in parts.events if name == "job_progress"]
    assert [payload["iteration"] for payload in forwarded] == [1, 3]
    assert forwarded[0]["iterations_per_second"] is None  # one point: no speed yet
    assert forwarded[1]["iterations_per_second"] == pytest.approx(2.0)
    assert forwarded[1]["seconds_left"] == pytest.approx(48.5)
    assert entry.progress["pace"]["iteration"] == 3  # what the job's documents show of its speed

    parts.reporter.on_record(job.id, 1, {"event": "snapshot", "iteration": 3, "model": "m", "state": "s"})
    stored = parts.store.get_job(job.id)
    assert stored is not None and stored.snapshot == {"iteration": 3, "model": "m", "state": "s"}
    assert stored.iteration == 3 and stored.progress["train"]["loss"] == 0.25  # a snapshot stores what came before
    assert parts.events[-1][0] == "job" and parts.events[-1][1]["snapshot"]["iteration"] == 3


def test_progress_records_a_jobs_end_and_wakes_its_waiters(parts: Parts) -> None:
    job = parts.queue()
    parts.place(job)
    waiting, woken = threading.Event(), []

    def waiter() -> None:
        with parts.state.finished:
            waiting.set()  # under the lock: the end cannot be written before this wait has begun
            woken.append(parts.state.finished.wait(60))

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert waiting.wait(30)
    parts.reporter.finish(job.id, DONE, "training finished at iteration 4")
    thread.join(90)
    assert woken == [True], "the end was written without notifying the waiters"
    stored = parts.store.get_job(job.id)
    assert stored is not None and (stored.status, stored.message) == (DONE, "training finished at iteration 4")
    assert stored.finished_at is not None
    assert parts.events[-1] == ("job", parts.reporter.paced(stored).to_json())


# --- Quota ----------------------------------------------------------------------------------------------------


def test_the_quota_refuses_a_full_queue_and_counts_the_folders_it_measured(parts: Parts) -> None:
    config = dataclasses.replace(parts.config, max_queued_jobs=1)
    quota = Quota(config, parts.state, parts.quota.jobs_root)
    quota.check_queue()  # an empty queue has room
    job = parts.queue()
    with pytest.raises(QueueFull):
        quota.check_queue()
    folder = quota.jobs_root / job.folder
    assert quota.stored_bytes() == folder_bytes(folder) > 0
    (folder / "grown.bin").write_bytes(b"x" * 4096)
    quota.measure(job.id)
    assert quota.stored_bytes() == folder_bytes(folder)
    quota.deleted(job.id)
    assert quota.stored_bytes() == 0


# --- Dispatcher -----------------------------------------------------------------------------------------------


def test_the_dispatcher_places_a_job_where_it_fits_and_leaves_the_next_one_waiting(parts: Parts) -> None:
    first, second = parts.queue(), parts.queue()
    parts.dispatcher.schedule()

    placed = parts.store.get_job(first.id)
    assert placed is not None and (placed.status, placed.device) == (RUNNING, "cpu")
    entry = parts.state.running[first.id]
    assert entry.device == "cpu" and entry.estimated > 0  # the plan's bytes, held back while it starts
    assert len(parts.spawned) == 1  # its task was started
    waiting = parts.store.get_job(second.id)
    assert waiting is not None and waiting.status == QUEUED and set(parts.state.running) == {first.id}
    assert waiting.message != second.message  # it says why it waits (the CPU's one slot is taken)
    assert ("job", waiting.to_json()) in parts.events


def test_the_dispatcher_places_nothing_once_stopping(parts: Parts) -> None:
    job = parts.queue()
    parts.state.stopping = True
    parts.dispatcher.schedule()
    stored = parts.store.get_job(job.id)
    assert stored is not None and stored.status == QUEUED
    assert parts.state.running == {} and parts.spawned == []


def test_the_dispatcher_fails_a_job_whose_definition_is_gone(parts: Parts) -> None:
    job = parts.queue()
    parts.definitions.forget(job.id)
    (parts.quota.jobs_root / job.folder / "net.prototxt").unlink()
    parts.dispatcher.schedule()
    stored = parts.store.get_job(job.id)
    assert stored is not None and stored.status == FAILED and stored.finished_at is not None
    assert stored.message is not None and stored.message.startswith("the job's definition cannot be used any more")
    assert parts.state.running == {} and parts.spawned == []


def test_a_placed_jobs_task_frees_its_slot_and_wakes_the_loop_when_it_ends(parts: Parts) -> None:
    job = parts.queue(max_iter=2)
    parts.dispatcher.schedule()
    parts.state.cancel(job.id)  # asked before its first attempt: the task ends it without starting a child
    parts.state.wake.clear()
    (task,) = parts.spawned
    task()
    assert parts.state.running == {} and parts.state.wake.is_set()
    stored = parts.store.get_job(job.id)
    assert stored is not None and stored.status == CANCELLED
    assert parts.store.attempts(job.id) == []


# --- AttemptLoop ----------------------------------------------------------------------------------------------


def test_the_attempt_loop_trains_a_placed_job_to_its_end(parts: Parts) -> None:
    job = parts.queue(max_iter=4)
    parts.place(job)
    before = parts.quota.stored_bytes()
    parts.attempts.run(job.id)  # the job's task, here in the test's thread: it returns once the end is recorded

    stored = parts.store.get_job(job.id)
    assert stored is not None and stored.status == DONE and stored.iteration == 4
    assert stored.message is not None and stored.message.startswith("training finished at iteration 4")
    (attempt,) = parts.store.attempts(job.id)
    assert attempt.status == "success" and attempt.device == "cpu" and attempt.batch_size == stored.batch_size
    assert (parts.quota.jobs_root / job.folder / attempt.log).is_file()
    names = [name for name, _ in parts.events]
    assert names.count("job_attempt") == 2 and "job_progress" in names and "job_log" in names
    assert parts.quota.stored_bytes() > before  # the folder was measured again: the attempt wrote its files


@pytest.mark.parametrize("stop", [False, True], ids=["cancelled", "stopping"])
def test_the_attempt_loop_ends_a_job_cancelled_or_stopped_before_its_attempt(parts: Parts, stop: bool) -> None:
    job = parts.queue()
    entry = parts.place(job)
    if stop:
        parts.state.stopping = True
    else:
        entry.cancel = True
    parts.attempts.run(job.id)
    stored = parts.store.get_job(job.id)
    assert stored is not None
    assert (stored.status, stored.message) == ((INTERRUPTED, INTERRUPTED_MESSAGE) if stop else (CANCELLED, "cancelled"))
    assert parts.store.attempts(job.id) == []


# --- Leadership -----------------------------------------------------------------------------------------------


def test_the_leader_takes_over_leftovers_and_a_follower_leads_once_it_has_gone(parts: Parts) -> None:
    config = dataclasses.replace(parts.config, shared_store=True)
    jobs_root = parts.quota.jobs_root
    left = parts.queue()
    parts.place(left)  # running in the store: what a server that died left behind
    parts.state.running.clear()

    leader_state, follower_state = RunState(), RunState()
    leader = Leadership(config, leader_state, parts.reporter, parts.attempts.backend, jobs_root)
    follower = Leadership(config, follower_state, parts.reporter, parts.attempts.backend, jobs_root)
    try:
        assert leader.open() is True and leader.follower is False
        interrupted = leader_state.store.get_job(left.id)
        assert interrupted is not None and interrupted.status == INTERRUPTED
        assert follower.open() is False and follower.follower is True  # the same store, the lock held elsewhere
        assert follower_state.store.get_job(left.id) == interrupted

        led = threading.Event()
        task = threading.Thread(target=follower.follow, args=(led.set,), daemon=True)
        task.start()
        leader.release()
        leader_state.close()
        wait_for(led.is_set, timeout=30, what="the follower to lead")
        task.join(30)
        assert not task.is_alive() and follower.follower is False
    finally:
        follower_state.stopping = True
        follower_state.wake.set()
        for state, leadership in ((leader_state, leader), (follower_state, follower)):
            leadership.release()
            state.close()
