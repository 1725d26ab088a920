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
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ..core.inputs import surrogate_in
from ..core.net import ShapeOracle
from ..devices.reader import DeviceReader
from ..estimate.pool import EstimatePool
from .backends.local import Backend, LocalBackend
from .config import ManagerConfig
from .definition.definition import Trainer
from .definition.request import JobRequest
from .errors import DataFolderInUse, JobError, JobNotFound, JobPageError, JobStateError, JobValidationError, QueueFull
from .events.progress import EventCallback, Progress, Running, reserved
from .scheduling.attempt_loop import INTERRUPTED_MESSAGE, AttemptLoop
from .scheduling.dispatcher import Dispatcher, Spawn
from .scheduling.planning import Planner
from .scheduling.scheduler import DeviceRefused, admit
from .scheduling.submission import Definitions, JobPreview, preview, write_job
from .store.database import JobStore, StoreError
from .store.datafolder import take_folder
from .store.disk import folder_bytes
from .store.quota import Quota
from .store.records import (
    ACTIVE_STATES,
    CANCELLED,
    FAILED,
    FINAL_STATES,
    INTERRUPTED,
    JOB_STATES,
    QUEUED,
    RUNNING,
    Attempt,
    Job,
)

log = logging.getLogger(__name__)

STORE_FILE = "jobs.sqlite"
JOBS_FOLDER = "jobs"
MAX_ID = 100
"""Job ids are "YYYYmmdd-HHMMSS-xxxxxx"; a longer one is not looked up."""
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
"""Jobs in one page of the list (GET /jobs, the jobs page, subscribe_jobs): by default, and at most."""


def start_thread(target: Callable[[], None]) -> threading.Thread:
    """The default `spawn`: a daemon thread (a greenlet once gevent has monkey-patched threading)."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@dataclasses.dataclass(frozen=True)
class JobPage:
    """One page of the jobs list, newest first as pages go: `jobs` oldest first within the page (as the whole
    list was), `older` the id to give as `before` for the next page (None: this page reaches the oldest job)."""

    jobs: list[Job]
    total: int
    limit: int
    before: str | None
    older: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": [job.to_json() for job in self.jobs], "total": self.total, "limit": self.limit,
            "before": self.before, "older": self.older,
        }


class JobManager:
    """Jobs of one data folder. `start` before use, `stop` when done (both idempotent).

    A facade over the parts, which share its lock and its table of running jobs: jobs.scheduling.dispatcher places queued
    jobs (where jobs.scheduling.scheduler, pure, says) and runs each placed job's attempts (jobs.scheduling.attempt_loop); jobs.events.progress
    writes what they learn and tells the listeners; jobs.store.quota and jobs.scheduling.submission check and write a new job.

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
        self.config = config
        self.backend: Backend = backend or LocalBackend()
        self.devices = self.backend.device_reader(devices)
        self.spawn = spawn
        self.oracle = oracle
        self.jobs_root = config.jobs_dir or config.data_dir / JOBS_FOLDER
        self._store: JobStore | None = None
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = False
        self._started = False
        self._scheduler: Any = None
        self._running: dict[str, Running] = {}
        self._lock_file: IO[str] | None = None
        self._follower = False
        self._finished = threading.Condition(self._lock)
        self.progress = Progress(
            lambda: self.store, self._lock, self._finished, self._running,
            on_event or (lambda name, payload: None), lambda: self._stopping,
            poll_seconds=config.poll_seconds, store_progress_seconds=config.store_progress_seconds,
        )
        self.quota = Quota(config, lambda: self.store, self.jobs_root, self._lock)
        self.planner = Planner(oracle, offload)
        """Builds and plans definitions; with `offload` (the web app's estimate pool), a costly one in its workers."""
        self.definitions = Definitions(
            config.dataset_roots, oracle, self.jobs_root, Trainer(config.caffe.flavour, config.caffe.label),
            self.planner,
        )
        attempts = AttemptLoop(
            config, self.devices, self.progress, self._lock, self._running, jobs_root=self.jobs_root, oracle=oracle,
            definition=self.definitions.get, measure=self.quota.measure, stopping=lambda: self._stopping,
            backend=self.backend, planner=self.planner,
        )
        self.dispatcher = Dispatcher(
            config, self.devices, lambda: self.store, self.progress, attempts, self.definitions, lock=self._lock,
            finished=self._finished, running=self._running, wake=self._wake, spawn=spawn,
            stopping=lambda: self._stopping, jobs_root=self.jobs_root, cancel_requested=self._apply_cancel_request,
        )

    @property
    def on_event(self) -> EventCallback:
        return self.progress.on_event

    @on_event.setter
    def on_event(self, callback: EventCallback) -> None:
        self.progress.on_event = callback

    # --- life cycle ---------------------------------------------------------------------------------------------

    @property
    def store(self) -> JobStore:
        if self._store is None:
            raise JobError("the job manager has not been started")
        return self._store

    @property
    def started(self) -> bool:
        return self._started

    @property
    def follower(self) -> bool:
        """Whether this manager follows: another server (the leader) holds the data folder and runs the jobs (see
        the class); a follower leads once the folder comes free."""
        return self._follower

    def start(self) -> None:
        """Take the data folder, mark what a previous process left running as interrupted, start scheduling; or,
        on a shared store whose folder another server holds, start as a follower (see the class)."""
        with self._lock:
            if self._started:
                return
            self.config.data_dir.mkdir(parents=True, exist_ok=True)
            self.jobs_root.mkdir(parents=True, exist_ok=True)
            try:
                self._lock_file = take_folder(self.config.data_dir)
            except DataFolderInUse:
                if not self.config.shared_store:
                    raise
                self._start_follower()
                return
            try:
                self._store = JobStore(self.config.data_dir / STORE_FILE, busy_seconds=self.config.store_busy_seconds)
                self._take_over_leftovers()
            except BaseException:
                # A store that cannot be opened (locked, full disk) leaves the folder free for the next try.
                if self._store is not None:
                    self._store.close()
                    self._store = None
                self._lock_file.close()
                self._lock_file = None
                raise
            self._stopping = False
            self._started = True
            self._scheduler = self.spawn(self.dispatcher.loop)
            # A server that exits normally (SIGTERM) stops its jobs as interrupted rather than leaving them running.
            atexit.register(self.stop)

    def _take_over_leftovers(self) -> list[str]:
        """What the folder's previous holder left queued or running becomes interrupted (resumable), and its
        training processes are ended; the jobs that changed."""
        active = [job.id for job in self.store.list_jobs(ACTIVE_STATES)]
        leftovers = self.store.mark_interrupted(INTERRUPTED_MESSAGE)
        self.backend.reap(leftovers, self.jobs_root)
        return active

    def _start_follower(self) -> None:
        """The same store, nothing reaped and nothing scheduled: the leader's jobs are running, not left over. The
        follower's task takes the lead when the folder comes free (`_follow`)."""
        self._store = JobStore(self.config.data_dir / STORE_FILE, busy_seconds=self.config.store_busy_seconds)
        self._follower = True
        self._stopping = False
        self._started = True
        self._scheduler = self.spawn(self._follow)
        atexit.register(self.stop)
        log.info("the data folder %s is held by another server: this one follows it (its jobs run there)",
                 self.config.data_dir)

    def _follow(self) -> None:
        """A follower's task: try the folder's lock at every poll; once the leader has stopped or died, lead as a
        restarted server does (its queued and running jobs become interrupted, its processes are ended) and
        schedule from then on, so that the workers left keep running jobs."""
        while True:
            self._wake.wait(self.config.poll_seconds)
            self._wake.clear()
            with self._lock:
                if self._stopping:
                    return
                try:
                    self._lock_file = take_folder(self.config.data_dir)
                except DataFolderInUse:
                    continue
                except OSError as error:  # the folder went away or turned read-only: try again at the next poll
                    log.warning("following %s: cannot try its lock (%s)", self.config.data_dir, error)
                    continue
                try:
                    changed = self._take_over_leftovers()
                except (StoreError, OSError) as error:  # a busy or damaged database: follow on, try again later
                    log.warning("cannot take the lead of %s yet: %s", self.config.data_dir, error)
                    self._lock_file.close()
                    self._lock_file = None
                    continue
                self._follower = False
            log.warning("the data folder %s was left by its leader: this server leads now (%d jobs interrupted)",
                        self.config.data_dir, len(changed))
            try:  # the browsers watching them see them interrupted
                for job in filter(None, map(self.store.get_job, changed)):
                    self.progress.emit_job(job)
            except StoreError as error:
                log.warning("the interrupted jobs' events were not sent: %s", error)
            self.dispatcher.loop()
            return

    def stop(self, timeout: float = 30.0) -> None:
        """Stop scheduling, kill running attempts (their jobs become interrupted, resumable), release the folder."""
        with self._lock:
            if not self._started:
                return
            self._stopping = True
            self._kill_running()
            self._wake.set()
        deadline = time.monotonic() + timeout

        def join(task: Any) -> None:
            if task is not None and hasattr(task, "join"):
                task.join(max(0.0, deadline - time.monotonic()))

        # The scheduler first: it places nothing once stopping is set (under the lock), so the tasks collected after
        # it are all there are, and none is left reading the store closed below.
        join(self._scheduler)
        with self._lock:
            running = self._kill_running()
        for entry in running:
            join(entry.task)
        atexit.unregister(self.stop)
        with self._lock:
            self._started = False
            self._follower = False
            if self._store is not None:
                self._store.close()
                self._store = None
            if self._lock_file is not None:
                self._lock_file.close()
                self._lock_file = None

    def _kill_running(self) -> list[Running]:
        """Kill every running attempt's process (under the lock); the entries, whose tasks then end."""
        running = list(self._running.values())
        for entry in running:
            if entry.process is not None:
                entry.process.kill()
        return running

    # --- requests -----------------------------------------------------------------------------------------------

    def submit(self, request: JobRequest) -> Job:
        """Check the request against the devices and the dataset folders, store the job, queue it."""
        devices = self.devices.read()
        try:
            device = admit(
                request.device, devices, memory_cap=request.memory_cap, gpus_simulated=self.config.gpus_simulated
            )
        except DeviceRefused as error:
            raise JobValidationError({error.field: str(error)}) from None
        self.quota.check_queue()  # before anything is written: a full queue costs a refused request nothing
        self.quota.check_storage(len(request.net) + len(request.solver))  # likewise for the stored jobs and bytes
        job, definition = write_job(request, device, self.definitions)
        folder = self.jobs_root / job.folder
        with self._lock:
            try:
                self.quota.check_queue()  # again: other submissions may have filled it while this one was checked
                written = folder_bytes(folder)
                self.quota.check_storage(written)
                self.store.add_job(job)
                self.quota.stored(job.id, written)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            self.definitions.keep(job.id, definition)
        stored = self.get(job.id)
        self.progress.emit_job(stored)
        self._wake.set()
        return stored

    def preview(self, request: JobRequest, device_key: str) -> JobPreview:
        """The plan a job for `request` would get on the device `device_key` now: its definition checked as
        `submit` checks it, the memory the scheduler would give it there, and the planning function its attempts
        use (core.planning.job_plan), so the batch the New model form shows is the batch the job trains. Nothing is stored;
        JobValidationError as `submit` gives."""
        device = self.devices.read().get(device_key)
        if device is None:
            raise JobValidationError({"device": f"no device {device_key!r}"})
        with self._lock:
            held = reserved(self._running.values(), device.key)
        return preview(request, device, held, self.definitions, self.config)

    def stored_bytes(self) -> int:
        """What the jobs' folders hold, as last measured (all of them measured at the first call)."""
        return self.quota.stored_bytes()

    def get(self, job_id: str) -> Job:
        if not isinstance(job_id, str) or len(job_id) > MAX_ID or surrogate_in(job_id) is not None:
            raise JobNotFound(job_id)  # no job has such an id, and SQLite cannot even look up a lone surrogate
        job = self.store.get_job(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return self.progress.view(job)

    def list_jobs(self) -> list[Job]:
        return [self.progress.view(job) for job in self.store.list_jobs()]

    def page(self, limit: int = DEFAULT_PAGE_SIZE, before: str | None = None) -> JobPage:
        """The `limit` newest jobs queued before the job `before` (None: the newest); see JobPage."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
            raise JobPageError(f"limit must be a whole number from 1 to {MAX_PAGE_SIZE}")
        position = None
        if before is not None and not isinstance(before, str):
            raise JobPageError("before must be a job id")
        if before is not None:
            try:
                position = self.get(before).position
            except JobNotFound:
                raise JobPageError(
                    f"no job {before[:100]!r} to list the jobs before (deleted meanwhile?); ask again without before"
                ) from None
        jobs = self.store.page_jobs(limit + 1, position)
        older = jobs[limit - 1].id if len(jobs) > limit else None
        page = [self.progress.view(job) for job in reversed(jobs[:limit])]
        return JobPage(page, self.store.count_jobs(JOB_STATES), limit, before, older)

    def attempts(self, job_id: str) -> list[Attempt]:
        self.get(job_id)
        return self.progress.view_attempts(job_id, self.store.attempts(job_id))

    def document(self, job_id: str) -> dict[str, Any]:
        """GET /jobs/<id>: the job with its attempts."""
        job = self.get(job_id)
        attempts = self.progress.view_attempts(job_id, self.store.attempts(job_id))
        return {**job.to_json(), "attempts": [attempt.to_json() for attempt in attempts]}

    def folder(self, job_id: str) -> Path:
        return self.jobs_root / self.get(job_id).folder

    def running_attempts(self) -> list[tuple[Job, Attempt]]:
        """Each running job with its attempt now training, as the store (and what is not written yet) says: on a
        follower too, whose leader runs them. For the Devices page: which of our jobs each device trains."""
        found = []
        for job in self.store.list_jobs([RUNNING]):
            viewed = self.progress.view(job)
            if viewed.status != RUNNING:
                continue
            attempts = self.progress.view_attempts(job.id, self.store.attempts(job.id))
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
        with self._lock:
            job = self.get(job_id)
            cancelled = None
            if job.status == QUEUED:
                # Only while still queued: on a shared store the leader may have placed it since it was read.
                cancelled = self.store.update_job_if(
                    job_id, QUEUED, status=CANCELLED, finished_at=time.time(), message="cancelled"
                )
                if cancelled is None:
                    job = self.get(job_id)
            if cancelled is not None:
                job = cancelled
                self._finished.notify_all()
            elif job.status == RUNNING and self._follower:
                # The leader runs it: a request in the store, which its dispatcher applies at its next poll.
                asked = self.store.request_cancel(job_id, "cancelling")
                if asked is None:
                    raise JobStateError("the job ended meanwhile; only queued or running jobs can be cancelled")
                job = asked
            elif job.status == RUNNING and job_id in self._running:
                entry = self._running[job_id]
                entry.cancel = True
                if entry.process is not None:
                    entry.process.cancel()
                try:
                    job = self.store.update_job(job_id, message="cancelling")
                except StoreError as error:  # the cancel is made all the same: the child is being stopped
                    self.progress.hold(job_id, "the cancel", error, job={"message": "cancelling"})
                    job = self.get(job_id)
            elif job_id in self.progress.unrecorded:
                raise JobStateError(
                    f"the job has ended ({job.status}: {job.message}); only queued or running jobs can be cancelled"
                )
            else:
                raise JobStateError(f"the job is {job.status}; only queued or running jobs can be cancelled")
        self.progress.emit_job(job)
        return job

    def delete(self, job_id: str) -> None:
        """Remove a job that is not running, with its folder."""
        with self._lock:
            job = self.get(job_id)
            if job.status == RUNNING:
                raise JobStateError("the job is running; cancel it first")
            if job_id in self.progress.unrecorded:
                raise JobStateError(_NOT_RECORDED)
            # Only in the state it was read in: on a shared store the leader may have placed it meanwhile.
            if not self.store.delete_job(job_id, job.status):
                raise JobStateError("the job changed meanwhile (placed by another server?); look at it again")
            self.definitions.forget(job_id)
            self.quota.deleted(job_id)
        shutil.rmtree(self.jobs_root / job.folder, ignore_errors=True)
        self.progress.emit("job_deleted", {"id": job_id})

    def resume(self, job_id: str) -> Job:
        """Queue an interrupted, cancelled or failed job again; it continues from its last snapshot if it has one."""
        with self._lock:
            job = self.get(job_id)
            if job.status not in (INTERRUPTED, CANCELLED, FAILED):
                raise JobStateError(f"the job is {job.status}; only interrupted, cancelled or failed jobs resume")
            if job_id in self.progress.unrecorded:
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
        self.progress.emit_job(job)
        self._wake.set()
        return job

    def _apply_cancel_request(self, job_id: str) -> None:
        """The leader's side of a follower's cancel (the dispatcher's poll found it in the store): the job's child
        stopped as `cancel` stops it; the follower has already written "cancelling" and told the listeners."""
        with self._lock:
            entry = self._running.get(job_id)
            if entry is None or entry.cancel:
                return
            entry.cancel = True
            if entry.process is not None:
                entry.process.cancel()
        log.info("job %s: cancelled, as another server asked", job_id)

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is done, failed or cancelled (or interrupted by a stop); the job as it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._finished:
            while True:
                job = self.get(job_id)
                ended = job.status in FINAL_STATES or (job.status == INTERRUPTED and job_id not in self._running)
                if ended and job_id not in self.progress.unrecorded:  # as recorded, not only as known
                    return job
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return job
                self._finished.wait(0.5 if remaining is None else min(0.5, remaining))


_NOT_RECORDED = (
    "the job has ended but its end is not recorded yet in the jobs database (see its message); try again once it is"
)


__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "JobManager", "JobPage", "JobPreview", "ManagerConfig", "start_thread"]
