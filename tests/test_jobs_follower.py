"""Several managers on one data folder (several web workers, docs/scale-out.md), without Redis: plain JobManager
objects in one process. With a shared store the second becomes a follower that writes to the store while the
leader runs every job; without one it is refused as before. The end-to-end test with real `serve` processes and
a real Redis is tests/test_jobs_workers.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import Calls, ManagerFactory, lenet_request, pid_alive, runner_pid, wait_for

from digits_memplugin.devices.reader import DeviceList, DeviceReader
from digits_memplugin.jobs import leadership
from digits_memplugin.jobs.errors import DataFolderInUse, JobStateError
from digits_memplugin.jobs.manager import JobManager, ManagerConfig

pytest_plugins = ["test_jobs_fixtures"]  # make_manager, datasets


def test_without_a_shared_store_a_second_manager_is_refused(make_manager: ManagerFactory) -> None:
    make_manager()
    with pytest.raises(DataFolderInUse):
        make_manager()


def test_a_follower_submits_and_the_leader_runs_the_job_without_being_woken(make_manager: ManagerFactory) -> None:
    leader_events: list[tuple[str, dict[str, Any]]] = []
    follower_events: list[tuple[str, dict[str, Any]]] = []
    leader = make_manager(leader_events, shared_store=True)
    follower = make_manager(follower_events, shared_store=True)
    assert (leader.follower, follower.follower) == (False, True)

    job = follower.submit(lenet_request(max_iter=4))
    assert job.status == "queued" and (follower.jobs_root / job.id / "net.prototxt").is_file()
    assert follower_events[0] == ("job", job.to_json())  # the follower tells its listeners (the message queue)
    done = leader.wait(job.id, timeout=120)  # the leader's poll found it: nothing woke it
    assert done.status == "done" and done.iteration == 4
    assert not follower.state.running  # the follower ran nothing
    assert any(name == "job_progress" for name, _ in leader_events)
    assert follower.document(job.id) == leader.document(job.id)
    assert follower.page().to_json() == leader.page().to_json()
    log = follower.log_path(job.id).read_text()
    assert "Snapshotting solver state" in log

    follower.delete(job.id)
    assert leader.list_jobs() == [] and not (leader.jobs_root / job.id).exists()


def leader_polls(monkeypatch: pytest.MonkeyPatch, leader: JobManager) -> Calls:
    """The leader's dispatcher polls on a shared store: each poll begins by reading the store's cancel requests."""
    return Calls(monkeypatch, leader.store, "cancel_requests")


def test_a_follower_does_not_interrupt_the_leaders_running_job_and_its_cancel_reaches_the_leader(
    make_manager: ManagerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = make_manager(shared_store=True)
    polls = leader_polls(monkeypatch, leader)
    job = leader.submit(lenet_request(max_iter=100_000))
    pid = runner_pid(leader, job)
    wait_for(lambda: leader.get(job.id).snapshot, what="a snapshot")
    follower = make_manager(shared_store=True)  # started while the job runs: it is not a leftover to reap
    assert follower.follower and follower.get(job.id).status == "running" and pid_alive(pid)

    asked = follower.cancel(job.id)
    assert (asked.status, asked.message) == ("running", "cancelling")
    cancelled = leader.wait(job.id, timeout=60)
    assert cancelled.status == "cancelled" and not pid_alive(pid)
    assert leader.attempts(job.id)[-1].status == "cancelled"
    assert follower.get(job.id).status == "cancelled"
    with pytest.raises(JobStateError):
        follower.cancel(job.id)

    # Resumed (on the follower), the job runs again: the old request does not cancel it a second time.
    assert follower.resume(job.id).status == "queued"
    wait_for(lambda: len(leader.attempts(job.id)) == 2, timeout=60, what="attempt 2")
    start = leader.attempts(job.id)[1].start_iteration
    wait_for(lambda: leader.get(job.id).iteration > start, timeout=60, what="training to continue")
    polls.wait_rounds(2, what="the leader's polls")  # polls that would have applied a stale request
    assert leader.get(job.id).status == "running" and leader.get(job.id).cancel_requested_at is None
    follower.cancel(job.id)
    assert leader.wait(job.id, timeout=60).status == "cancelled"


def test_a_follower_cancels_a_queued_job_and_the_leader_never_places_it(
    make_manager: ManagerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = make_manager(shared_store=True)
    polls = leader_polls(monkeypatch, leader)
    follower = make_manager(shared_store=True)
    running = leader.submit(lenet_request(max_iter=100_000))  # the CPU's one slot
    wait_for(lambda: leader.get(running.id).status == "running", what="the first job to run")
    queued = follower.submit(lenet_request(max_iter=4))
    assert follower.cancel(queued.id).status == "cancelled"
    leader.cancel(running.id)
    leader.wait(running.id, timeout=60)
    polls.wait_rounds(2, what="the leader's polls")  # with the CPU free: polls that would have placed the job
    assert leader.get(queued.id).status == "cancelled" and leader.attempts(queued.id) == []


def test_a_follower_leads_once_the_leader_has_stopped(
    make_manager: ManagerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader = make_manager(shared_store=True)
    events: list[tuple[str, dict[str, Any]]] = []
    follower = make_manager(events, shared_store=True)
    polls = leader_polls(monkeypatch, leader)
    tries = Calls(monkeypatch, leadership, "take_folder")  # once started, only the follower tries the lock
    running = leader.submit(lenet_request(max_iter=100_000))  # the CPU's one slot
    pid = runner_pid(leader, running)
    queued = follower.submit(lenet_request(max_iter=4))
    tries.wait_rounds(2, what="the follower's tries of the folder's lock")
    polls.wait_rounds(2, what="the leader's polls")  # which see the job queued and the CPU taken
    assert follower.follower and leader.get(queued.id).status == "queued"

    leader.stop()
    wait_for(lambda: not follower.follower, timeout=30, what="the follower to lead")
    assert not pid_alive(pid)
    # As after a restart: what the old leader ran or kept queued is interrupted, and says so to the listeners.
    assert {follower.get(running.id).status, follower.get(queued.id).status} == {"interrupted"}
    assert ("job", follower.get(queued.id).to_json()) in events
    assert follower.resume(queued.id).status == "queued"
    assert follower.wait(queued.id, timeout=120).status == "done"  # the new leader runs jobs
    assert follower.attempts(queued.id)[-1].status == "success"


class CountingReader(DeviceReader):
    """The devices, counting the reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self) -> DeviceList:
        self.reads += 1
        return super().read()


class RecordedWaits(threading.Event):
    """The manager's wake-up event, recording the timeout of each wait on it: the dispatcher's loop waits on it
    once a round, for a poll's time (polling) or until woken (None)."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return super().wait(timeout)


@pytest.mark.parametrize("shared", [False, True], ids=["one-process", "shared-store"])
def test_an_idle_leader_reads_no_devices(tmp_path: Path, datasets: Path, shared: bool) -> None:
    """Without jobs the dispatcher sleeps until woken (one process) or polls only the store (shared): no NVML."""
    reader = CountingReader()
    config = ManagerConfig(data_dir=tmp_path / "data", dataset_roots=(datasets,), poll_seconds=0.05,
                           shared_store=shared)
    manager = JobManager(config, reader)
    waits = RecordedWaits()
    manager.state.wake = waits  # before the loop starts: the one event the parts share (jobs.run_state)
    manager.start()
    try:
        if shared:  # three polls of the store done: the fourth wait has begun
            wait_for(lambda: len(waits.timeouts) >= 4, what="three polls of the store")
            assert set(waits.timeouts) == {0.05}
        else:  # the loop looked and went to sleep until woken: it will not look again by itself
            wait_for(lambda: waits.timeouts, what="the dispatcher to wait")
            assert waits.timeouts == [None]
        assert reader.reads == 0
    finally:
        manager.stop()
