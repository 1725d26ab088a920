"""The job manager: a queue of training jobs, placed on devices where their plan fits, each trained by attempts in
child processes, with the out-of-memory fallback between attempts.

Embedded and gevent-friendly: it runs inside the web server (or the `train` command) with no server of its own.
Its tasks are started through `spawn` (socketio.start_background_task in the web app, a thread otherwise) and use
only threading, subprocess and time, which gevent's monkey-patching makes cooperative; device reads go through
the plugin's DeviceReader (gevent's threadpool under the gevent server). It knows nothing of Flask or socketio:
it reports through `on_event(name, payload)`, which the web layer binds to socketio rooms.

Events (payloads are what the REST API returns):
    job           the job document (GET /jobs/<id> without attempts), on every change of state or plan
    job_attempt   {"job_id", **attempt} when an attempt starts and when it ends
    job_progress  {"job_id", "attempt", **record} for each runner record (iteration, test, snapshot, ...)
    job_log       {"job_id", "attempt", "lines": [...]} new lines of Caffe's log
    job_deleted   {"id"}
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.errors import FieldErrors
from ..core.inputs import surrogate_in
from ..core.net import ShapeOracle
from ..devices.reader import DeviceReader
from ..estimate.pool import EstimatePool
from .backends.local import Backend, LocalBackend
from .config import ManagerConfig
from .definition.loading import Trainer
from .definition.request import JobRequest
from .errors import JobNotFound, JobStateError, JobValidationError, QueueFull
from .events.reporter import EventCallback, Reporter
from .leadership import STORE_FILE, Leadership
from .paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, JobPage, check_page, gone_before, read_page
from .run_state import RunState
from .scheduling.attempt_loop import AttemptLoop
from .scheduling.dispatcher import Dispatcher, Spawn
from .scheduling.planning import Planner
from .scheduling.scheduler import admit, admit_tester, memory_cap
from .scheduling.submission import Definitions, JobPreview, preview, write_job
from .store.database import JobStore, StoreError
from .store.disk import folder_bytes, remove_folder
from .store.quota import Quota
from .store.records import CANCELLED, FAILED, FINAL_STATES, INTERRUPTED, QUEUED, RUNNING, Attempt, Job

JOBS_FOLDER = "jobs"
MAX_ID = 100
"""Job ids are "YYYYmmdd-HHMMSS-xxxxxx"; a longer one is not looked up."""


def start_thread(target: Callable[[], None]) -> threading.Thread:
    """The default `spawn`: a daemon thread (a greenlet once gevent has monkey-patched threading)."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


class JobManager:
    """Jobs of one data folder. `start` before use, `stop` when done (both idempotent).

    A facade over the parts, which share one run state (jobs.run_state: the lock, the table of running jobs, the
    store): jobs.leadership takes the folder (or follows its leader); jobs.scheduling.dispatcher places queued jobs
    (where jobs.scheduling.scheduler, pure, says) and runs each placed job's attempts (jobs.scheduling.attempt_loop);
    jobs.events.reporter writes what they learn and tells the listeners; jobs.store.quota and
    jobs.scheduling.submission check and write a new job.

    With `config.shared_store` (several web workers with a message queue), a manager that finds the data folder
    held by another one starts as a follower: it reads the same store and writes submissions, cancels, resumes and
    deletes to it, but runs nothing; the leader, which holds the folder, places and runs every job, and applies
    the cancel a follower requested for a job it runs. When the leader stops or dies, the first follower to take
    the folder's lock leads, as a restarted server would."""

    def __init__(
        self,
        config: ManagerConfig,
        devices: DeviceReader,
        *,
        on_event: EventCallback | None = None,
        spawn: Spawn = start_thread,
        oracle: ShapeOracle | None = None,
        backend: Backend | None = None,
        offload: EstimatePool | None = None,
    ) -> None:
        self.backend: Backend = backend or LocalBackend()
        # The backend that runs attempts decides what they can do (the test nets apart: this host's children only).
        self.config = config = dataclasses.replace(config, backend=self.backend.name)
        self.devices = self.backend.device_reader(devices)
        self.spawn = spawn
        self.oracle = oracle
        self.jobs_root = config.jobs_dir or config.data_dir / JOBS_FOLDER
        self.state = RunState()
        """What the parts share while the manager runs (jobs.run_state)."""
        self._started = False
        self._scheduler: Any = None
        self.reporter = Reporter(
            self.state, on_event or (lambda name, payload: None),
            poll_seconds=config.poll_seconds, store_progress_seconds=config.store_progress_seconds,
        )
        self.quota = Quota(config, self.state, self.jobs_root)
        self.planner = Planner(oracle, offload)
        """Builds and plans definitions; with `offload` (the web app's estimate pool), a costly one in its workers."""
        self.definitions = Definitions(
            config.dataset_roots, oracle, self.jobs_root, Trainer(config.caffe.flavour, config.caffe.label),
            self.planner,
        )
        attempts = AttemptLoop(
            config, self.devices, self.state, self.reporter, self.definitions, self.quota, jobs_root=self.jobs_root,
            oracle=oracle, backend=self.backend, planner=self.planner,
        )
        self.dispatcher = Dispatcher(
            config, self.devices, self.state, self.reporter, attempts, self.definitions, spawn=spawn,
            jobs_root=self.jobs_root,
        )
        self.leadership = Leadership(config, self.state, self.reporter, self.backend, self.jobs_root)

    @property
    def on_event(self) -> EventCallback:
        return self.reporter.on_event

    @on_event.setter
    def on_event(self, callback: EventCallback) -> None:
        self.reporter.on_event = callback

    # --- life cycle ---------------------------------------------------------------------------------------------

    @property
    def store(self) -> JobStore:
        return self.state.store

    @property
    def started(self) -> bool:
        return self._started

    @property
    def follower(self) -> bool:
        """Whether this manager follows: another server (the leader) holds the data folder and runs the jobs (see
        the class); a follower leads once the folder comes free."""
        return self.leadership.follower

    def start(self) -> None:
        """Take the data folder, mark what a previous process left running as interrupted, start scheduling; or,
        on a shared store whose folder another server holds, start as a follower (see the class)."""
        with self.state.lock:
            if self._started:
                return
            self.config.data_dir.mkdir(parents=True, exist_ok=True)
            self.jobs_root.mkdir(parents=True, exist_ok=True)
            leads = self.leadership.open()
            self.state.stopping = False
            self._started = True
            loop = self.dispatcher.loop
            self._scheduler = self.spawn(loop if leads else lambda: self.leadership.follow(loop))
            # A server that exits normally (SIGTERM) stops its jobs as interrupted rather than leaving them running.
            atexit.register(self.stop)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop scheduling, kill running attempts (their jobs become interrupted, resumable), release the folder."""
        with self.state.lock:
            if not self._started:
                return
            self.state.stopping = True
            self.state.kill_running()
            self.state.wake.set()
        deadline = time.monotonic() + timeout

        def join(task: Any) -> None:
            if task is not None and hasattr(task, "join"):
                task.join(max(0.0, deadline - time.monotonic()))

        # The scheduler first: it places nothing once stopping is set (under the lock), so the tasks collected after
        # it are all there are, and none is left reading the store closed below.
        join(self._scheduler)
        for entry in self.state.kill_running():
            join(entry.task)
        atexit.unregister(self.stop)
        with self.state.lock:
            self._started = False
            self.state.close()
            self.leadership.release()

    # --- requests -----------------------------------------------------------------------------------------------

    def submit(self, request: JobRequest) -> Job:
        """Check the request against the devices and the dataset folders, store the job, queue it."""
        devices = self.devices.read()
        try:
            device = admit(
                request.device, devices, memory_cap=request.memory_cap, gpus_simulated=self.config.gpus_simulated
            )
            tester = admit_tester(request.tester_device, request.test_net, devices,
                                  apart_refused=self.config.apart_refused, gpus_simulated=self.config.gpus_simulated)
        except FieldErrors as error:
            raise JobValidationError(error.errors) from None
        request = dataclasses.replace(request, tester_device=tester)
        self.quota.check_queue()  # before anything is written: a full queue costs a refused request nothing
        self.quota.check_storage(len(request.net) + len(request.solver))  # likewise for the stored jobs and bytes
        job, definition = write_job(request, device, self.definitions)
        folder = self.jobs_root / job.folder
        with self.state.lock:
            try:
                self.quota.check_queue()  # again: other submissions may have filled it while this one was checked
                written = folder_bytes(folder)
                self.quota.check_storage(written)
                self.store.add_job(job)
                self.quota.stored(job.id, written)
            except BaseException:
                remove_folder(folder)
                raise
            self.definitions.keep(job.id, definition)
        stored = self.get(job.id)
        self.reporter.emit_job(stored)
        self.state.wake.set()
        return stored

    def preview(self, request: JobRequest, device_key: str) -> JobPreview:
        """The plan a job for `request` would get on the device `device_key` now: its definition checked as
        `submit` checks it, the memory the scheduler would give it there, and the planning function its attempts
        use (core.planning.job_plan), so the batch the New model form shows is the batch the job trains. Nothing is stored;
        JobValidationError as `submit` gives."""
        devices = self.devices.read()
        device = devices.get(device_key)
        if device is None:
            raise JobValidationError({"device": f"no device {device_key!r}"})
        try:
            tester = admit_tester(request.tester_device, request.test_net, devices,
                                  apart_refused=self.config.apart_refused, gpus_simulated=self.config.gpus_simulated)
        except FieldErrors as error:
            raise JobValidationError(error.errors) from None
        request = dataclasses.replace(request, tester_device=tester)
        cap = memory_cap(request.memory_cap, self.config.cpu_memory_cap)
        loop = self.dispatcher.attempts
        return preview(request, device, self.state.reserved(device.key), self.definitions, self.config,
                       testers=lambda spec, definition: loop.tester_devices(spec, device.key, cap, definition))

    def stored_bytes(self) -> int:
        """What the jobs' folders hold, as last measured (all of them measured at the first call)."""
        return self.quota.stored_bytes()

    def get(self, job_id: str) -> Job:
        if not isinstance(job_id, str) or len(job_id) > MAX_ID or surrogate_in(job_id) is not None:
            raise JobNotFound(job_id)  # no job has such an id, and SQLite cannot even look up a lone surrogate
        job = self.store.get_job(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return self.reporter.view(job)

    def list_jobs(self) -> list[Job]:
        return [self.reporter.view(job) for job in self.store.list_jobs()]

    def page(self, limit: int = DEFAULT_PAGE_SIZE, before: str | None = None) -> JobPage:
        """The `limit` newest jobs queued before the job `before` (None: the newest); see JobPage."""
        check_page(limit, before)
        try:
            position = None if before is None else self.get(before).position
        except JobNotFound:
            raise gone_before(str(before)) from None
        return read_page(self.store, self.reporter, limit, before, position)

    def attempts(self, job_id: str) -> list[Attempt]:
        self.get(job_id)
        return self.reporter.view_attempts(job_id, self.store.attempts(job_id))

    def document(self, job_id: str) -> dict[str, Any]:
        """GET /jobs/<id>: the job with its attempts."""
        job = self.get(job_id)
        attempts = self.reporter.view_attempts(job_id, self.store.attempts(job_id))
        return {**job.to_json(), "attempts": [attempt.to_json() for attempt in attempts]}

    def folder(self, job_id: str) -> Path:
        return self.jobs_root / self.get(job_id).folder

    def running_attempts(self) -> list[tuple[Job, Attempt]]:
        """Each running job with its attempt now training, as the store (and what is not written yet) says: on a
        follower too, whose leader runs them. For the Devices page: which of our jobs each device trains."""
        found = []
        for job in self.store.list_jobs([RUNNING]):
            viewed = self.reporter.view(job)
            if viewed.status != RUNNING:
                continue
            attempts = self.reporter.view_attempts(job.id, self.store.attempts(job.id))
            if attempts and attempts[-1].status == RUNNING:
                found.append((viewed, attempts[-1]))
        return found

    def log_path(self, job_id: str, attempt: int | None = None) -> Path:
        """Caffe's log of an attempt (the latest by default)."""
        attempts = self.attempts(job_id)
        if not attempts:
            raise JobStateError("the job has not started an attempt yet, so there is no log")
        chosen = attempts[-1] if attempt is None else next((a for a in attempts if a.number == attempt), None)
        if chosen is None:
            raise JobNotFound(f"{job_id} attempt {attempt}")
        return self.folder(job_id) / chosen.log

    def cancel(self, job_id: str) -> Job:
        """A queued job is cancelled at once; a running one once its child has stopped (SIGTERM, then SIGKILL)."""
        with self.state.lock:
            job = self._cancel_queued(job_id) or self._cancel_running(job_id)
        self.reporter.emit_job(job)
        return job

    def _cancel_queued(self, job_id: str) -> Job | None:
        """The job cancelled if it is queued; None when it is not (or was placed meanwhile: on a shared store the
        leader may have placed it since it was read)."""
        if self.get(job_id).status != QUEUED:
            return None
        cancelled = self.store.update_job_if(
            job_id, QUEUED, status=CANCELLED, finished_at=time.time(), message="cancelled"
        )
        if cancelled is not None:
            self.state.finished.notify_all()
        return cancelled

    def _cancel_running(self, job_id: str) -> Job:
        """A running job asked to stop: on a follower, a request in the store, which the leader's dispatcher
        applies at its next poll; here, its child asked to snapshot and stop. JobStateError for any other job."""
        job = self.get(job_id)
        if job.status == RUNNING and self.follower:
            asked = self.store.request_cancel(job_id, "cancelling")
            if asked is None:
                raise JobStateError("the job ended meanwhile; only queued or running jobs can be cancelled")
            return asked
        if job.status != RUNNING or job_id not in self.state.running:
            ended = job_id in self.reporter.unrecorded
            raise JobStateError(
                f"the job has ended ({job.status}: {job.message}); only queued or running jobs can be cancelled"
                if ended else f"the job is {job.status}; only queued or running jobs can be cancelled"
            )
        self.state.cancel(job_id)
        try:
            return self.store.update_job(job_id, message="cancelling")
        except StoreError as error:  # the cancel is made all the same: the child is being stopped
            self.reporter.hold(job_id, "the cancel", error, job={"message": "cancelling"})
            return self.get(job_id)

    def delete(self, job_id: str) -> None:
        """Remove a job that is not running, with its folder."""
        with self.state.lock:
            job = self.get(job_id)
            if job.status == RUNNING:
                raise JobStateError("the job is running; cancel it first")
            if job_id in self.reporter.unrecorded:
                raise JobStateError(_NOT_RECORDED)
            # Only in the state it was read in: on a shared store the leader may have placed it meanwhile.
            if not self.store.delete_job(job_id, job.status):
                raise JobStateError("the job changed meanwhile (placed by another server?); look at it again")
            self.definitions.forget(job_id)
            self.quota.deleted(job_id)
        remove_folder(self.jobs_root / job.folder)
        self.reporter.emit("job_deleted", {"id": job_id})

    def resume(self, job_id: str) -> Job:
        """Queue an interrupted, cancelled or failed job again; it continues from its last snapshot if it has one."""
        with self.state.lock:
            job = self.get(job_id)
            if job.status not in (INTERRUPTED, CANCELLED, FAILED):
                raise JobStateError(f"the job is {job.status}; only interrupted, cancelled or failed jobs resume")
            if job_id in self.reporter.unrecorded:
                raise JobStateError(_NOT_RECORDED)
            try:
                self.quota.check_queue()
            except QueueFull as full:
                raise JobStateError(full.errors["queue"]) from None
            kept = job.snapshot is not None and (self.jobs_root / job.folder / job.snapshot["state"]).is_file()
            where = f"from iteration {job.snapshot['iteration']}" if job.snapshot and kept else (
                "from the start (no snapshot)" if not job.snapshot else
                f"from the start (the snapshot of iteration {job.snapshot['iteration']} is gone)")
            job = self.store.update_job(
                job_id, status=QUEUED, finished_at=None, message=f"waiting to resume {where}", cancel_requested_at=None
            )
        self.reporter.emit_job(job)
        self.state.wake.set()
        return job

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is done, failed or cancelled (or interrupted by a stop); the job as it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.state.finished:
            while True:
                job = self.get(job_id)
                ended = job.status in FINAL_STATES or (job.status == INTERRUPTED and job_id not in self.state.running)
                if ended and job_id not in self.reporter.unrecorded:  # as recorded, not only as known
                    return job
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return job
                self.state.finished.wait(0.5 if remaining is None else min(0.5, remaining))


_NOT_RECORDED = (
    "the job has ended but its end is not recorded yet in the jobs database (see its message); try again once it is"
)


__all__ = [
    "DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "STORE_FILE", "JobManager", "JobPage", "JobPreview", "ManagerConfig",
    "start_thread",
]
