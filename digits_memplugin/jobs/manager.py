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
import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from ..core.errors import BatchLimitError, NetError
from ..core.fallback import (
    CPU_SAFETY_MARGIN,
    DEFAULT_MAX_ATTEMPTS,
    GPU_SAFETY_MARGIN,
    Decision,
    Failure,
    Policy,
    decide,
)
from ..core.layers.base import ENGINE_CPU, ENGINE_CUDNN
from ..core.net import ShapeOracle
from ..core.oom import CANCELLED as OUTCOME_CANCELLED
from ..core.oom import FAILED as FAILED_OUTCOME
from ..core.oom import INTERRUPTED as OUTCOME_INTERRUPTED
from ..core.oom import OUT_OF_MEMORY, SUCCESS, Outcome
from ..core.planner import BatchPlan, auto_batch_limit, usable_bytes
from ..devices import CPU_KEY, GPU, DeviceList, DeviceReader, DeviceSelectionError, child_cuda_environment
from ..errors import MemPluginError
from ..inputs import shown, surrogate_in
from ..sizes import format_size
from .attempt import AttemptProcess, AttemptResult
from .definition import (
    SOLVER_SOURCE,
    DataSourceError,
    JobDefinition,
    check_job_folder,
    load_definition,
    snapshot_prefix,
    test_iters,
    write_attempt,
)
from .placement import Limit, candidates, limit_for, normalise_device
from .records import (
    ACTIVE_STATES,
    CANCELLED,
    DONE,
    FAILED,
    FINAL_STATES,
    INTERRUPTED,
    JOB_STATES,
    QUEUED,
    RUNNING,
    Attempt,
    Job,
)
from .request import JobRequest
from .runner import DISK_FULL, THREAD_STACK_BYTES
from .store import BUSY_SECONDS, JobStore, StoreError

log = logging.getLogger(__name__)

_T = TypeVar("_T")
EventCallback = Callable[[str, dict[str, Any]], None]
Spawn = Callable[[Callable[[], None]], Any]

STORE_FILE = "jobs.sqlite"
LOCK_FILE = "jobs.lock"
JOBS_FOLDER = "jobs"
MAX_ID = 100
"""Job ids are "YYYYmmdd-HHMMSS-xxxxxx"; a longer one is not looked up."""
RUNNER_MODULE = "digits_memplugin.jobs.runner"
INTERRUPTED_MESSAGE = "the server stopped while the job was queued or running; resume it to continue"
MAX_QUEUED_JOBS = 100
MAX_STORED_JOBS = 1000
MAX_STORED_BYTES = 20 * 1024**3
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
"""Jobs in one page of the list (GET /jobs, the jobs page, subscribe_jobs): by default, and at most."""
JOB_NICE = 10
STALL_SECONDS = 600.0
SIMULATED_GPUS = (
    "the GPUs are simulated (--simulate-gpus): their memory is made up and no CUDA device is behind them, so a job "
    'cannot train there; choose the CPU (device "cpu")'
)
LOW_DISK_BYTES = 1 << 20
"""Less than this free on the job folder's disk when an attempt failed: the disk is said to be full."""


def start_thread(target: Callable[[], None]) -> threading.Thread:
    """The default `spawn`: a daemon thread (a greenlet once gevent has monkey-patched threading)."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


class JobError(MemPluginError):
    """A request about a job that cannot be done; the message says why."""


class JobNotFound(JobError):
    def __init__(self, job_id: Any) -> None:
        super().__init__(f"no job {shown(job_id)!r}")


class JobStateError(JobError):
    """The job is not in a state that allows this (delete while running, resume a finished job...)."""


class JobValidationError(JobError):
    """A submission that cannot become a job: `errors` maps fields to messages (the API's 400 body)."""

    def __init__(self, errors: dict[str, Any]) -> None:
        super().__init__("; ".join(f"{key}: {value}" for key, value in errors.items()))
        self.errors = errors


class QueueFull(JobValidationError):
    """The queue already holds `max_queued_jobs` waiting jobs: a submission is refused before anything is written."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            {
                "queue": f"{limit} jobs are already waiting, the most this server queues (MEMPLUGIN_MAX_QUEUED_JOBS); "
                "submit again once some have started, or cancel some"
            }
        )
        self.limit = limit


class DiskFull(JobError):
    """The disk holding the data folder has no room left for a job's files."""


class StoredJobsFull(JobValidationError):
    """`max_stored_jobs` jobs are kept already (whatever their state): a submission is refused, saying what to
    delete, before anything is written."""

    def __init__(self, count: int, limit: int, oldest: list[Job]) -> None:
        super().__init__(
            {
                "stored_jobs": f"{count} jobs are stored, the most this server keeps (MEMPLUGIN_MAX_STORED_JOBS): "
                "delete jobs you no longer need (DELETE .../api/jobs/<id>, or Delete on the job's page), then submit "
                "again" + _candidates("the oldest that are not running", oldest)
            }
        )


class StoredBytesFull(DiskFull):
    """The jobs' folders hold `max_stored_bytes` or more: the 507 a submission gets, saying what to delete."""


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


class JobPageError(JobError):
    """A page of the jobs list that cannot be given (a limit out of range, `before` naming no job)."""


class DataFolderInUse(JobError):
    """Another manager (a server, a `train` command) holds the data folder."""


@dataclasses.dataclass(frozen=True)
class ManagerConfig:
    data_dir: Path
    dataset_roots: tuple[Path, ...]
    jobs_per_gpu: int = 1
    jobs_per_cpu: int = 1
    cpu_memory_cap: int | None = None
    cpu_safety_margin: float = CPU_SAFETY_MARGIN
    gpu_safety_margin: float = GPU_SAFETY_MARGIN
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    gpu_engine: str = ENGINE_CUDNN
    poll_seconds: float = 1.0
    """How often waiting jobs are placed again and GPU memory of running attempts is sampled."""
    grace_seconds: float = 5.0
    """Between SIGTERM and SIGKILL when an attempt is cancelled."""
    store_progress_seconds: float = 1.0
    """Iteration records are written to the store at most this often per job (tests and snapshots always)."""
    max_queued_jobs: int = MAX_QUEUED_JOBS
    """Jobs that may wait in the queue at once; a submission (or a resume) beyond it is refused."""
    store_busy_seconds: float = BUSY_SECONDS
    """How long a store call waits while another process holds the database's write lock."""
    job_nice: int = JOB_NICE
    """The training child's nice value: the web server keeps the CPU first where training takes every core."""
    stall_seconds: float | None = STALL_SECONDS
    """Silence after which the watchdog ends an attempt (jobs.watchdog); None: never (not for production)."""
    gpus_simulated: bool = False
    """The demo mode (--simulate-gpus): the GPUs' memory is made up and no CUDA device is behind them, so jobs that
    would train on a GPU are refused at submission rather than failing in Caffe."""
    max_stored_jobs: int = MAX_STORED_JOBS
    """Jobs kept at once, whatever their state; a submission beyond it is refused until some are deleted."""
    max_stored_bytes: int = MAX_STORED_BYTES
    """Bytes the jobs' folders may hold; a submission while they hold more is refused until some are deleted."""

    @classmethod
    def from_settings(cls, settings: Any) -> ManagerConfig:
        roots = settings.dataset_roots or (settings.data_dir / "datasets",)
        return cls(
            data_dir=settings.data_dir,
            dataset_roots=tuple(roots),
            jobs_per_gpu=settings.jobs_per_gpu,
            jobs_per_cpu=settings.jobs_per_cpu,
            cpu_memory_cap=settings.cpu_memory_cap,
            cpu_safety_margin=_first(settings.job_safety_margin, CPU_SAFETY_MARGIN),
            gpu_safety_margin=_first(settings.job_safety_margin, GPU_SAFETY_MARGIN),
            max_attempts=settings.job_max_attempts,
            gpu_engine=settings.gpu_engine,
            max_queued_jobs=settings.max_queued_jobs,
            store_busy_seconds=settings.store_busy_seconds,
            job_nice=settings.job_nice,
            stall_seconds=settings.job_stall_seconds,
            gpus_simulated=settings.simulate_gpus is not None,
            max_stored_jobs=settings.max_stored_jobs,
            max_stored_bytes=settings.max_stored_bytes,
        )


@dataclasses.dataclass
class _Running:
    """A job placed on a device: its slot, and its current attempt once started."""

    job_id: str
    device: str
    kind: str
    process: AttemptProcess | None = None
    attempt: int | None = None
    estimated: int = 0
    peak: int | None = None
    cancel: bool = False
    task: Any = None
    last_stored: float = 0.0
    progress: dict[str, Any] = dataclasses.field(default_factory=dict)
    snapshot: dict[str, Any] | None = None
    """The latest snapshot record not yet written to the store (the database was locked)."""
    store_warned: bool = False


@dataclasses.dataclass
class _Unrecorded:
    """What a job's task knows about the job and its attempts but could not write to the database yet (a full disk,
    a lock held too long): what the manager shows until the write is made, so that a job whose child is gone does
    not read "running" meanwhile."""

    reason: str
    job: dict[str, Any] = dataclasses.field(default_factory=dict)
    attempts: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)


class JobManager:
    """Jobs of one data folder. `start` before use, `stop` when done (both idempotent)."""

    def __init__(
        self,
        config: ManagerConfig,
        devices: DeviceReader,
        *,
        on_event: EventCallback | None = None,
        spawn: Spawn = start_thread,
        oracle: ShapeOracle | None = None,
    ) -> None:
        self.config = config
        self.devices = devices
        self.on_event = on_event or (lambda name, payload: None)
        self.spawn = spawn
        self.oracle = oracle
        self.jobs_root = config.data_dir / JOBS_FOLDER
        self._store: JobStore | None = None
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = False
        self._started = False
        self._scheduler: Any = None
        self._running: dict[str, _Running] = {}
        self._definitions: dict[str, JobDefinition] = {}
        self._lock_file: IO[str] | None = None
        self._finished = threading.Condition(self._lock)
        self._unrecorded: dict[str, _Unrecorded] = {}
        """Per job whose task holds writes the database did not take yet: what they say (see _Unrecorded)."""
        self._sizes: dict[str, int] | None = None
        """Bytes of each job's folder, measured when it is stored and when each of its attempts ends (None until
        the first submission measures them all)."""

    # --- life cycle ---------------------------------------------------------------------------------------------

    @property
    def store(self) -> JobStore:
        if self._store is None:
            raise JobError("the job manager has not been started")
        return self._store

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> None:
        """Take the data folder, mark what a previous process left running as interrupted, start scheduling."""
        with self._lock:
            if self._started:
                return
            self.config.data_dir.mkdir(parents=True, exist_ok=True)
            self.jobs_root.mkdir(exist_ok=True)
            self._lock_file = self._take_folder()
            try:
                self._store = JobStore(self.config.data_dir / STORE_FILE, busy_seconds=self.config.store_busy_seconds)
                leftovers = self._store.mark_interrupted(INTERRUPTED_MESSAGE)
            except BaseException:
                # A store that cannot be opened (locked, full disk) leaves the folder free for the next try.
                if self._store is not None:
                    self._store.close()
                    self._store = None
                self._lock_file.close()
                self._lock_file = None
                raise
            for attempt in leftovers:
                self._kill_leftover(attempt)
            self._stopping = False
            self._started = True
            self._scheduler = self.spawn(self._loop)
            # A server that exits normally (SIGTERM) stops its jobs as interrupted rather than leaving them running.
            atexit.register(self.stop)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop scheduling, kill running attempts (their jobs become interrupted, resumable), release the folder."""
        with self._lock:
            if not self._started:
                return
            self._stopping = True
            running = list(self._running.values())
            for entry in running:
                if entry.process is not None:
                    entry.process.kill()
            self._wake.set()
        deadline = time.monotonic() + timeout
        for task in [self._scheduler, *(entry.task for entry in running)]:
            if task is not None and hasattr(task, "join"):
                task.join(max(0.0, deadline - time.monotonic()))
        atexit.unregister(self.stop)
        with self._lock:
            self._started = False
            if self._store is not None:
                self._store.close()
                self._store = None
            if self._lock_file is not None:
                self._lock_file.close()
                self._lock_file = None

    def _take_folder(self) -> IO[str]:
        handle = (self.config.data_dir / LOCK_FILE).open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            handle.close()
            if error.errno in (errno.EAGAIN, errno.EACCES):
                raise DataFolderInUse(
                    f"another server or train command is using the data folder {self.config.data_dir}"
                ) from None
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        return handle

    def _kill_leftover(self, attempt: Attempt) -> None:
        """A runner the previous server left (its death signal normally took it along): killed, never adopted."""
        if attempt.pid is None:
            return
        try:
            cmdline = Path(f"/proc/{attempt.pid}/cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(f"/proc/{attempt.pid}/cwd"))
        except OSError:
            return
        if RUNNER_MODULE.encode() in cmdline and cwd == (self.jobs_root / attempt.job_id).resolve():
            log.warning("killing training process %d left by a previous server (job %s)", attempt.pid, attempt.job_id)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(attempt.pid, signal.SIGKILL)

    def _emit(self, name: str, payload: dict[str, Any]) -> None:
        try:
            self.on_event(name, payload)
        except Exception:
            log.exception("the %s event listener failed", name)

    def _emit_job(self, job: Job) -> None:
        self._emit("job", job.to_json())

    # --- requests -----------------------------------------------------------------------------------------------

    def submit(self, request: JobRequest) -> Job:
        """Check the request against the devices and the dataset folders, store the job, queue it."""
        devices = self.devices.read()
        try:
            device = normalise_device(request.device, devices)
        except ValueError as error:
            raise JobValidationError({"device": str(error)}) from None
        if request.memory_cap is not None and device not in (CPU_KEY,) and not (device == "auto" and not devices.gpus):
            raise JobValidationError({"memory_cap": "a memory cap applies to CPU jobs only (device \"cpu\")"})
        if self.config.gpus_simulated and device != CPU_KEY and devices.gpus:
            raise JobValidationError({"device": SIMULATED_GPUS})
        self._check_queue()  # before anything is written: a full queue costs a refused request nothing
        self._check_storage(len(request.net) + len(request.solver))  # likewise for the stored jobs and bytes
        job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        folder = self.jobs_root / job_id
        try:
            folder.mkdir(parents=True)
            (folder / "net.prototxt").write_text(request.net, encoding="utf-8")
            (folder / SOLVER_SOURCE).write_text(request.solver, encoding="utf-8")
            spec = request.spec(device)
            definition = self._load(folder, spec)
        except NetError as error:
            shutil.rmtree(folder, ignore_errors=True)
            raise JobValidationError({_error_field(error, request.data): error.to_dict()}) from None
        except OSError as error:
            shutil.rmtree(folder, ignore_errors=True)
            if _disk_full(error):
                raise DiskFull(f"no space left on the disk holding the data folder: {_free_note(self.jobs_root)}") from None
            raise
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        now = time.time()
        name = request.name or (definition.training.train.param.name or "job")
        job = Job(
            id=job_id, name=name, status=QUEUED, created_at=now, updated_at=now, folder=job_id, spec=spec,
            max_iter=definition.max_iter, message="waiting for a device",
        )
        with self._lock:
            try:
                self._check_queue()  # again: other submissions may have filled it while this one was checked
                written = _folder_bytes(folder)
                self._check_storage(written)
                self.store.add_job(job)
                self._sizes[job_id] = written  # type: ignore[index] # _check_storage measured the others
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            self._definitions[job_id] = definition
        stored = self.get(job_id)
        self._emit_job(stored)
        self._wake.set()
        return stored

    def _check_queue(self) -> None:
        if self.store.count_jobs([QUEUED]) >= self.config.max_queued_jobs:
            raise QueueFull(self.config.max_queued_jobs)

    def _check_storage(self, incoming: int) -> None:
        """Refuse a job beyond MEMPLUGIN_MAX_STORED_JOBS (400) or MEMPLUGIN_MAX_STORED_BYTES (507), naming jobs
        to delete. `incoming`: the bytes the new job brings."""
        count = self.store.count_jobs(JOB_STATES)
        if count >= self.config.max_stored_jobs:
            oldest = self.store.list_jobs(sorted(set(JOB_STATES) - ACTIVE_STATES))[:5]
            raise StoredJobsFull(count, self.config.max_stored_jobs, oldest)
        used = self.stored_bytes()
        if used + incoming > self.config.max_stored_bytes:
            with self._lock:
                sizes = dict(self._sizes or {})
            idle = self.store.list_jobs(sorted(set(JOB_STATES) - ACTIVE_STATES))
            largest = sorted(idle, key=lambda job: sizes.get(job.id, 0), reverse=True)[:5]
            raise StoredBytesFull(
                f"the jobs' folders hold {format_size(used)} and this job brings {format_size(incoming)}; this "
                f"server keeps at most {format_size(self.config.max_stored_bytes)} of them "
                "(MEMPLUGIN_MAX_STORED_BYTES): delete jobs you no longer need (DELETE .../api/jobs/<id>, or Delete "
                "on the job's page), then submit again"
                + _candidates("the largest that are not running", largest, sizes)
            )

    def stored_bytes(self) -> int:
        """What the jobs' folders hold, as last measured (all of them measured at the first call)."""
        with self._lock:
            if self._sizes is None:
                self._sizes = {job.id: _folder_bytes(self.jobs_root / job.folder) for job in self.store.list_jobs()}
            return sum(self._sizes.values())

    def _measure(self, job_id: str) -> None:
        """Measure a job's folder again (its attempts write logs, records and snapshots)."""
        with self._lock:
            if self._sizes is not None and job_id in self._sizes:
                self._sizes[job_id] = _folder_bytes(self.jobs_root / job_id)

    def get(self, job_id: str) -> Job:
        if not isinstance(job_id, str) or len(job_id) > MAX_ID or surrogate_in(job_id) is not None:
            raise JobNotFound(job_id)  # no job has such an id, and SQLite cannot even look up a lone surrogate
        job = self.store.get_job(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return self._view(job)

    def list_jobs(self) -> list[Job]:
        return [self._view(job) for job in self.store.list_jobs()]

    def _view(self, job: Job) -> Job:
        """The job as its task knows it: what the database holds, with what could not be written yet on top, and
        the message saying so."""
        with self._lock:
            pending = self._unrecorded.get(job.id)
            if pending is None:
                return job
            fields = dict(pending.job)
        message = fields.pop("message", job.message)
        return dataclasses.replace(job, **fields, message=f"{message} ({pending.reason})")

    def _view_attempts(self, job_id: str, attempts: list[Attempt]) -> list[Attempt]:
        with self._lock:
            pending = self._unrecorded.get(job_id)
            changes = dict(pending.attempts) if pending is not None else {}
        return [dataclasses.replace(a, **changes[a.number]) if a.number in changes else a for a in attempts]

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
        page = [self._view(job) for job in reversed(jobs[:limit])]
        return JobPage(page, self.store.count_jobs(JOB_STATES), limit, before, older)

    def attempts(self, job_id: str) -> list[Attempt]:
        self.get(job_id)
        return self._view_attempts(job_id, self.store.attempts(job_id))

    def document(self, job_id: str) -> dict[str, Any]:
        """GET /jobs/<id>: the job with its attempts."""
        job = self.get(job_id)
        attempts = self._view_attempts(job_id, self.store.attempts(job_id))
        return {**job.to_json(), "attempts": [attempt.to_json() for attempt in attempts]}

    def folder(self, job_id: str) -> Path:
        return self.jobs_root / self.get(job_id).folder

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
            if job.status == QUEUED:
                job = self.store.update_job(job_id, status=CANCELLED, finished_at=time.time(), message="cancelled")
                self._finished.notify_all()
            elif job.status == RUNNING and job_id in self._running:
                entry = self._running[job_id]
                entry.cancel = True
                if entry.process is not None:
                    entry.process.cancel()
                try:
                    job = self.store.update_job(job_id, message="cancelling")
                except StoreError as error:  # the cancel is made all the same: the child is being stopped
                    self._hold(job_id, "the cancel", error, job={"message": "cancelling"})
                    job = self.get(job_id)
            elif job_id in self._unrecorded:
                raise JobStateError(
                    f"the job has ended ({job.status}: {job.message}); only queued or running jobs can be cancelled"
                )
            else:
                raise JobStateError(f"the job is {job.status}; only queued or running jobs can be cancelled")
        self._emit_job(job)
        return job

    def delete(self, job_id: str) -> None:
        """Remove a job that is not running, with its folder."""
        with self._lock:
            job = self.get(job_id)
            if job.status == RUNNING:
                raise JobStateError("the job is running; cancel it first")
            if job_id in self._unrecorded:
                raise JobStateError(_NOT_RECORDED)
            self.store.delete_job(job_id)
            self._definitions.pop(job_id, None)
            if self._sizes is not None:
                self._sizes.pop(job_id, None)
        shutil.rmtree(self.jobs_root / job.folder, ignore_errors=True)
        self._emit("job_deleted", {"id": job_id})

    def resume(self, job_id: str) -> Job:
        """Queue an interrupted, cancelled or failed job again; it continues from its last snapshot if it has one."""
        with self._lock:
            job = self.get(job_id)
            if job.status not in (INTERRUPTED, CANCELLED, FAILED):
                raise JobStateError(f"the job is {job.status}; only interrupted, cancelled or failed jobs resume")
            if job_id in self._unrecorded:
                raise JobStateError(_NOT_RECORDED)
            try:
                self._check_queue()
            except QueueFull as full:
                raise JobStateError(full.errors["queue"]) from None
            where = f"from iteration {job.snapshot['iteration']}" if job.snapshot else "from the start (no snapshot)"
            job = self.store.update_job(job_id, status=QUEUED, finished_at=None, message=f"waiting to resume {where}")
        self._emit_job(job)
        self._wake.set()
        return job

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is done, failed or cancelled (or interrupted by a stop); the job as it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._finished:
            while True:
                job = self.get(job_id)
                ended = job.status in FINAL_STATES or (job.status == INTERRUPTED and job_id not in self._running)
                if ended and job_id not in self._unrecorded:  # as recorded, not only as known
                    return job
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return job
                self._finished.wait(0.5 if remaining is None else min(0.5, remaining))

    # --- scheduling ---------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                busy = bool(self._running)
            self._wake.wait(self.config.poll_seconds if busy or self._queued() else None)
            self._wake.clear()
            if self._stopping:
                return
            try:
                self._schedule()
            except StoreError as error:  # locked, full or damaged: the message says which, no traceback needed
                log.error("scheduling failed: %s", error)
            except Exception:
                log.exception("scheduling failed")

    def _queued(self) -> bool:
        try:
            return bool(self._store is not None and self._store.list_jobs([QUEUED]))
        except StoreError:  # locked, full or damaged: look again at the next poll (_schedule says why)
            return True

    def _schedule(self) -> None:
        devices = self.devices.read()
        self._sample_gpu_memory(devices)
        for job in self.store.list_jobs([QUEUED]):
            if self._stopping:
                return
            self._try_place(job, devices)

    def _sample_gpu_memory(self, devices: DeviceList) -> None:
        """Peak GPU memory of running attempts, from NVML's process list (the runner cannot see it in CUDA)."""
        with self._lock:
            entries = [entry for entry in self._running.values() if entry.kind == GPU and entry.process]
        for entry in entries:
            device = devices.get(entry.device)
            pid = entry.process.pid if entry.process else None
            for process in (device.processes or ()) if device else ():
                if process.pid == pid and process.used_memory is not None:
                    entry.peak = max(entry.peak or 0, process.used_memory)

    def _try_place(self, job: Job, devices: DeviceList) -> None:
        try:
            definition = self._definition(job)
        except (NetError, OSError) as error:  # OSError: its folder went with a delete since the queue was read
            failed = self.store.update_job_if(
                job.id, QUEUED, status=FAILED, finished_at=time.time(),
                message=f"the job's definition cannot be used any more: {error}",
            )
            if failed is not None:
                self._emit_job(failed)
            return
        choices, reason = candidates(job.spec["device"], devices)
        engine_for = {GPU: self.config.gpu_engine, CPU_KEY: ENGINE_CPU}
        best: tuple[int, Limit, Decision] | None = None
        waits: list[str] = []
        never: list[str] = []
        with self._lock:
            busy = {key: sum(1 for e in self._running.values() if e.device == key) for key in {d.key for d in choices}}
            for order, device in enumerate(choices):
                slots = self.config.jobs_per_gpu if device.kind == GPU else self.config.jobs_per_cpu
                label = _label(device)
                if busy[device.key] >= slots:
                    waits.append(f"{label} is busy")
                    continue
                limit = limit_for(
                    device, reserved=self._reserved(device.key), cap=self._cap(job), cap_overhead=_stacks(definition)
                )
                if limit is None:
                    waits.append(f"the memory of {label} is unknown")
                    continue
                engine = engine_for[GPU if device.kind == GPU else CPU_KEY]
                decision = self._decide(job, definition, engine, limit.limit_bytes, [], 0)
                if decision.plan is not None:
                    rank = decision.plan.iter_size * 1000 + order
                    if best is None or rank < best[0]:
                        best = (rank, limit, decision)
                    continue
                empty = self._decide(job, definition, engine, limit.capacity_bytes, [], 0)
                (waits if empty.plan is not None else never).append(f"{label}: {decision.message}")
            if best is not None:
                _, limit, decision = best
                entry = _Running(job.id, limit.device.key, GPU if limit.device.kind == GPU else CPU_KEY)
                entry.estimated = decision.estimated_bytes or 0
                # Stored first (a store that cannot be written must not leave a slot taken), and only while the job
                # is still queued: a cancel or a delete since the queue was read wins.
                placed = self.store.update_job_if(
                    job.id, QUEUED, status=RUNNING, device=limit.device.key, message=decision.message
                )
                if placed is None:
                    return
                self._running[job.id] = entry
                entry.task = self.spawn(lambda: self._run_job(job.id))
                return
        if choices and len(never) == len(choices):
            message = "does not fit even when nothing else runs; " + "; ".join(never)
            failed = self.store.update_job_if(job.id, QUEUED, status=FAILED, message=message, finished_at=time.time())
            if failed is not None:
                with self._lock:
                    self._finished.notify_all()
                self._emit_job(failed)
            return
        message = "waiting for a device: " + "; ".join(waits + never) if (waits or never) else f"waiting: {reason}"
        if message != job.message:
            waiting = self.store.update_job_if(job.id, QUEUED, message=message)
            if waiting is not None:
                self._emit_job(waiting)

    def _reserved(self, device_key: str, exclude: str | None = None) -> int:
        """Memory our running attempts on the device were planned to take and have not taken yet."""
        return sum(
            max(0, entry.estimated - (entry.peak or 0))
            for entry in self._running.values()
            if entry.device == device_key and entry.job_id != exclude
        )

    def _cap(self, job: Job) -> int | None:
        caps = [cap for cap in (job.spec.get("memory_cap"), self.config.cpu_memory_cap) if cap is not None]
        return min(caps) if caps else None

    def _definition(self, job: Job) -> JobDefinition:
        definition = self._definitions.get(job.id)
        if definition is None:
            definition = self._load(self.jobs_root / job.folder, job.spec)
            self._definitions[job.id] = definition
        return definition

    def _load(self, folder: Path, spec: dict[str, Any]) -> JobDefinition:
        return load_definition(
            (folder / "net.prototxt").read_text(encoding="utf-8"),
            (folder / SOLVER_SOURCE).read_text(encoding="utf-8"),
            folder=folder,
            roots=self.config.dataset_roots,
            data=spec.get("data") or {},
            data_shapes={key: tuple(value) for key, value in (spec.get("data_shapes") or {}).items()},
            classes=spec.get("classes"),
            max_iter=spec.get("max_iter"),
            oracle=self.oracle,
        )

    def _margin(self, job: Job, engine: str) -> float:
        """The request's safety margin, or the default of the device kind."""
        given = (job.spec.get("fallback") or {}).get("safety_margin")
        if given is not None:
            return float(given)
        return self.config.cpu_safety_margin if engine == ENGINE_CPU else self.config.gpu_safety_margin

    def _wanted(self, job: Job, definition: JobDefinition) -> int | None:
        """The effective batch to keep: fixed once training has started; else as asked (None: auto)."""
        if job.effective_batch is not None and job.iteration > 0:
            return job.effective_batch
        requested = job.spec.get("batch")
        if requested == "auto":
            return None
        return int(requested) if requested is not None else definition.net_batch

    def _decide(
        self, job: Job, definition: JobDefinition, engine: str, limit: int, failures: list[Failure], made: int
    ) -> Decision:
        estimator = definition.estimator(engine, self.oracle)
        fallback = job.spec.get("fallback") or {}
        policy = Policy(
            safety_margin=self._margin(job, engine),
            growth=fallback.get("growth", Policy().growth),
            max_attempts=fallback.get("max_attempts", self.config.max_attempts),
        )

        def footprint(batch: int, test_batch: int | None) -> int:
            return estimator.report(batch, test_batch)[0].total_bytes

        wanted = self._wanted(job, definition)
        return decide(
            policy, footprint, wanted, limit, failures, attempts_made=made,
            test_batch=definition.test_batch, test_iter=definition.test_iter,
            max_batch=auto_batch_limit(definition.train_items) if wanted is None else None,
        )

    # --- one job ------------------------------------------------------------------------------------------------

    def _run_job(self, job_id: str) -> None:
        """The job's task: its attempts until one ends it. Never raises: whatever stops the job is recorded as its
        end (a store that cannot be written at all is left for the next start to mark interrupted)."""
        try:
            self._attempts(job_id)
        except Exception as error:
            if isinstance(error, OSError) and _disk_full(error):
                message = (
                    f"no space left on the disk holding the job's folder ({_free_note(self.jobs_root)}); "
                    "free some space, then resume the job"
                )
            elif isinstance(error, MemPluginError):
                message = str(error)
            else:
                message = f"internal error: {error}"
            log.log(logging.ERROR if isinstance(error, (MemPluginError, OSError)) else logging.CRITICAL,
                    "job %s failed in the manager: %s", job_id, error, exc_info=not isinstance(error, MemPluginError))
            try:
                self._finish(job_id, FAILED, message)
            except StoreError as store_error:
                log.error("job %s: its failure could not be recorded (%s); the next start marks it interrupted",
                          job_id, store_error)
        finally:
            with self._lock:
                self._running.pop(job_id, None)
                self._unrecorded.pop(job_id, None)  # written by now, or left for the next start to mark
                self._finished.notify_all()
            self._wake.set()

    def _durable(
        self, job_id: str, what: str, write: Callable[[], _T], first: StoreError | None = None, *,
        job: dict[str, Any] | None = None, attempt: tuple[int, dict[str, Any]] | None = None,
    ) -> _T:
        """A write the job's record must not lose (an attempt's end, the job's end). Each try waits for the
        database as long as the store does. After a failed try, what the write says (`job`: the job's fields,
        `attempt`: an attempt's number and fields) is held and shown as the job's state (see `_hold`), the job's
        listeners are told, and the write is tried again every poll interval until it is stored or the manager
        stops (then the next start finds the job running and marks it interrupted, resumable)."""
        error = first
        told = False
        while True:
            if error is None:
                try:
                    return write()
                except StoreError as failed:
                    error = failed
            if self._stopping:
                raise error
            if not told:
                log.error("job %s: %s is not recorded yet: %s; trying again until it is", job_id, what, error)
                self._hold(job_id, what, error, job=job, attempt=attempt)
                told = True
            time.sleep(self.config.poll_seconds)
            error = None

    def _hold(
        self, job_id: str, what: str, error: StoreError, *, job: dict[str, Any] | None = None,
        attempt: tuple[int, dict[str, Any]] | None = None,
    ) -> None:
        """Keep what a write the database refused says, so that the job reads as its task knows it (a child that
        ended on a full disk: failed, not running) with a message saying it is not recorded yet; and tell the
        job's listeners."""
        with self._lock:
            pending = self._unrecorded.setdefault(job_id, _Unrecorded(""))
            pending.reason = (
                f"{what} is not recorded yet in the jobs database: {error}; the server keeps it and writes it as "
                "soon as it can"
            )
            pending.job.update(job or {})
            if attempt is not None:
                pending.attempts.setdefault(attempt[0], {}).update(attempt[1])
        with contextlib.suppress(StoreError):  # reads go on where writes fail (a full disk, a lock)
            stored = self.store.get_job(job_id)
            if stored is not None:
                self._emit_job(self._view(stored))
            if attempt is not None:
                for held in self._view_attempts(job_id, self.store.attempts(job_id)):
                    if held.number == attempt[0]:
                        self._emit("job_attempt", {"job_id": job_id, **held.to_json()})

    def _attempts(self, job_id: str) -> None:
        job = self.get(job_id)
        entry = self._running[job_id]
        definition = self._definition(job)
        engine = self.config.gpu_engine if entry.kind == GPU else ENGINE_CPU
        earlier = [a for a in self.store.attempts(job_id) if a.device == entry.device]
        failures = [_failure(a) for a in earlier if a.status == OUT_OF_MEMORY and a.limit_bytes is not None]
        made = 0
        job = self.store.update_job(job_id, started_at=job.started_at or time.time())
        self._emit_job(job)
        while True:
            with self._lock:
                if entry.cancel or self._stopping:
                    status = INTERRUPTED if self._stopping else CANCELLED
                    self._finish(job_id, status, INTERRUPTED_MESSAGE if self._stopping else "cancelled")
                    return
            devices = self.devices.read()
            device = devices.get(entry.device)
            with self._lock:
                reserved = self._reserved(entry.device, exclude=job_id)
            limit = None if device is None else limit_for(
                device, reserved=reserved, cap=self._cap(job), cap_overhead=_stacks(definition)
            )
            if device is None or limit is None:
                self._finish(job_id, FAILED, f"device {entry.device} cannot be read any more")
                return
            job = self.get(job_id)
            decision = self._decide(job, definition, engine, limit.limit_bytes, failures, made)
            if decision.stop or decision.plan is None:
                prefix = "out of memory: " if failures else ""
                self._finish(job_id, FAILED, prefix + decision.message)
                return
            plan, message = decision.plan, decision.message
            wanted = self._wanted(job, definition)
            if made == 0 and not failures and job.spec.get("fallback", {}).get("start") == "wanted" and wanted:
                try:
                    cost = definition.estimator(engine, self.oracle).report(wanted, None)[0].total_bytes
                except BatchLimitError:
                    cost = None  # Caffe cannot build it in one pass at all: the planned iter_size is the start
                if cost is not None:
                    budget = usable_bytes(limit.limit_bytes, self._margin(job, engine))
                    plan = BatchPlan(wanted, 1, cost <= budget, cost, wanted)
                    message = f"the wanted batch {wanted} as given first (fallback start \"wanted\")"
            result, attempt = self._run_attempt(job, definition, entry, limit, plan, decision, message)
            self._measure(job_id)
            made += 1
            ending = _job_end(result)
            if ending is not None:
                self._finish(job_id, *ending)
                return
            failures.append(self._failure_after(attempt, limit, result))

    def _failure_after(self, attempt: Attempt, limit: Limit, result: AttemptResult) -> Failure:
        """What the failed attempt tells, with its limit lowered to what the device had free once it ended
        (another process may have taken memory meanwhile); a cap stays the cap."""
        overhead = limit.overhead_bytes
        effective = limit.cap_bytes - overhead if limit.cap_bytes is not None else limit.limit_bytes
        if limit.cap_bytes is None:
            device = self.devices.read().get(limit.device.key)
            if device is not None and device.memory_free is not None:
                effective = min(effective, device.memory_free)
        record = result.outcome.out_of_memory
        failure = Failure(
            batch_size=attempt.batch_size,
            test_batch_size=attempt.test_batch_size,
            limit_bytes=effective,
            requested_bytes=None if record is None else record.requested_bytes,
            free_bytes=None if record is None else record.free_bytes,
            used_bytes=None if result.peak_bytes is None else max(0, result.peak_bytes - overhead),
        )
        self._durable(
            attempt.job_id, f"attempt {attempt.number}'s limit",
            lambda: self.store.update_attempt(attempt.job_id, attempt.number, limit_bytes=effective),
            attempt=(attempt.number, {"limit_bytes": effective}),
        )
        return failure

    def _run_attempt(
        self, job: Job, definition: JobDefinition, entry: _Running, limit: Limit, plan: BatchPlan,
        decision: Decision, message: str,
    ) -> tuple[AttemptResult, Attempt]:
        folder = self.jobs_root / job.folder
        check_job_folder(self.jobs_root, folder)
        with self._lock:  # what earlier attempts could not write at first is written by now (the writes block)
            self._unrecorded.pop(job.id, None)
        number = len(self.store.attempts(job.id)) + 1
        attempt_dir = f"attempts/{number}"
        test_batch = decision.test_plan["batch_size"] if decision.test_plan else None
        environment: dict[str, str] = {}
        device: dict[str, Any] = {"kind": "cpu"}
        if entry.kind == GPU:
            try:
                child = child_cuda_environment([entry.device], self.devices.read().gpus)
            except DeviceSelectionError as error:
                raise JobError(str(error)) from None
            environment.update(child.environment)
            device = {"kind": "gpu", "uuid": entry.device, "cuda_index": child.cuda_index[entry.device]}
        else:
            environment["CUDA_VISIBLE_DEVICES"] = ""
        log_file = f"{attempt_dir}/caffe.log"
        iters = test_iters(definition, test_batch)
        files = write_attempt(
            definition, folder, attempt_dir, batch_size=plan.batch_size, iter_size=plan.iter_size,
            test_batch=test_batch, gpu=device.get("cuda_index"),
        )
        resume = job.snapshot["state"] if job.snapshot and (folder / job.snapshot["state"]).is_file() else None
        solver = definition.solver
        spec = {
            "job_id": job.id,
            "attempt": number,
            "solver": files.solver,
            "log": log_file,
            "progress": f"{attempt_dir}/progress.jsonl",
            "device": device,
            "batch_size": plan.batch_size,
            "iter_size": plan.iter_size,
            "resume": resume,
            "memory_cap": limit.cap_bytes,
            "max_iter": definition.max_iter,
            "test_interval": int(solver.test_interval) if definition.training.tests else 0,
            "test_iter": iters,
            "test_initialization": bool(solver.test_initialization),
            "snapshot": int(solver.snapshot),
            "snapshot_after_train": bool(solver.snapshot_after_train),
            "snapshot_prefix": snapshot_prefix(solver),
            "snapshot_format": "HDF5" if solver.snapshot_format == 0 else "BINARYPROTO",
            "schedule": definition.schedule.to_dict(),
            "nice": self.config.job_nice,
        }
        (folder / attempt_dir / "attempt.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
        attempt = self.store.add_attempt(
            Attempt(
                job_id=job.id, number=number, status=RUNNING, device=entry.device, batch_size=plan.batch_size,
                iter_size=plan.iter_size, started_at=time.time(), log=log_file,
                test_batch_size=test_batch or definition.test_batch, test_iter=iters[0] if iters else None,
                resumed_from=resume, start_iteration=job.snapshot["iteration"] if resume and job.snapshot else 0,
                limit_bytes=limit.limit_bytes, estimated_bytes=plan.bytes, correction=decision.correction,
            )
        )
        updated = self.store.update_job(
            job.id, batch_size=plan.batch_size, iter_size=plan.iter_size, test_batch_size=attempt.test_batch_size,
            test_iter=attempt.test_iter, message=f"attempt {number}: {message}",
            iteration=attempt.start_iteration,
        )
        self._emit("job_attempt", {"job_id": job.id, **attempt.to_json()})
        self._emit_job(updated)

        process = AttemptProcess(
            folder, f"{attempt_dir}/attempt.json", log_file, environment=environment,
            on_record=lambda record: self._on_record(job.id, number, record),
            on_log=lambda lines: self._emit("job_log", {"job_id": job.id, "attempt": number, "lines": lines}),
            grace_seconds=self.config.grace_seconds, stall_seconds=self.config.stall_seconds,
        )
        with self._lock:
            entry.process, entry.attempt, entry.estimated, entry.peak = process, number, plan.bytes or 0, None
            entry.progress = {"train": None, "test": []}
            stopping, cancel = self._stopping, entry.cancel
            pid = process.start()
            if stopping:
                process.kill()
            elif cancel:
                process.cancel()
        try:  # the child runs now: nothing may stop this task from following it
            self.store.update_attempt(job.id, number, pid=pid)
        except StoreError as error:
            log.warning("job %s attempt %d: pid %d not stored (%s)", job.id, number, pid, error)
        result = process.wait()
        outcome = result.outcome
        if self._stopping and outcome.status == OUTCOME_CANCELLED:
            outcome = dataclasses.replace(outcome, status=OUTCOME_INTERRUPTED, message=INTERRUPTED_MESSAGE)
            result = dataclasses.replace(result, outcome=outcome)
        if outcome.status == FAILED_OUTCOME:
            outcome = self._note_full_disk(folder, result, outcome)
            result = dataclasses.replace(result, outcome=outcome)
        peak = max(p for p in (result.peak_bytes, entry.peak, -1) if p is not None)
        ended = {
            "status": outcome.status, "finished_at": time.time(), "exit_code": outcome.exit_code,
            "signal": outcome.signal, "message": outcome.message,
            "out_of_memory": None if outcome.out_of_memory is None else outcome.out_of_memory.to_dict(),
            "peak_bytes": None if peak < 0 else peak, "allocated_bytes": result.allocated_bytes,
            "end_iteration": result.last_iteration,
        }
        # What the job is once this attempt has ended, shown while the writes below wait for the database.
        known = _progress_fields(entry)
        ending = _job_end(result)
        if ending is not None:
            known.update(status=ending[0], message=ending[1], finished_at=time.time() if ending[0] in FINAL_STATES else None)
        # The last progress and a snapshot the database did not take yet are the job's record: stored for sure.
        self._durable(
            job.id, f"attempt {number}'s progress", lambda: self._store_progress(job.id, entry, force=True, wait=True),
            job=known, attempt=(number, ended),
        )
        attempt = self._durable(
            job.id, f"the end of attempt {number}", lambda: self.store.update_attempt(job.id, number, **ended),
            job=known, attempt=(number, ended),
        )
        result = dataclasses.replace(result, peak_bytes=attempt.peak_bytes)
        self._emit("job_attempt", {"job_id": job.id, **attempt.to_json()})
        return result, attempt

    def _note_full_disk(self, folder: Path, result: AttemptResult, outcome: Outcome) -> Outcome:
        """A failed attempt whose disk is full says so. Caffe aborts when a snapshot cannot be written and glog's
        own line about it cannot reach the full disk either, so the free space is what tells."""
        free = _free_bytes(folder)
        reported = (result.error or {}).get("type") == DISK_FULL
        if not reported and (free is None or free >= LOW_DISK_BYTES):
            return outcome
        cause = (result.error or {}).get("message") if reported else outcome.message
        message = (
            f"no space left on the disk holding the job's folder ({_free_note(folder)}): the attempt stopped at "
            f"iteration {result.last_iteration or 0} ({cause}); free some space, then resume the job (it continues "
            "from its last snapshot)"
        )
        return dataclasses.replace(outcome, message=message)

    def _on_record(self, job_id: str, number: int, record: dict[str, Any]) -> None:
        """A runner record: forwarded as `job_progress`; iterations, test results and snapshots kept on the job."""
        self._emit("job_progress", {"job_id": job_id, "attempt": number, **record})
        event = record.get("event")
        changed: Job | None = None
        with self._lock:
            entry = self._running.get(job_id)
            if entry is None:
                return
            memory = record.get("memory_bytes")
            if isinstance(memory, int):  # what the attempt holds already is no longer held back for it
                entry.peak = max(entry.peak or 0, memory)
            if event == "iteration":
                entry.progress["train"] = record
                self._store_progress(job_id, entry, first=record.get("iteration") == 1)
            elif event == "test":
                tests = entry.progress.setdefault("test", [])
                while len(tests) <= int(record.get("net", 0)):
                    tests.append(None)
                tests[int(record.get("net", 0))] = record
                self._store_progress(job_id, entry, force=True)
            elif event == "snapshot":
                entry.snapshot = {key: record[key] for key in ("iteration", "model", "state")}
                changed = self._store_progress(job_id, entry, force=True)
        if changed is not None:  # listeners are called outside the lock: they may take their time
            self._emit_job(changed)

    def _store_progress(
        self, job_id: str, entry: _Running, force: bool = False, first: bool = False, wait: bool = False
    ) -> Job | None:
        """Keep the latest progress (and a new snapshot) on the job row, at most once per `store_progress_seconds`
        for iterations. The child's records must keep flowing whatever the database does, so unless `wait` this
        write does not wait for another process's lock: when it cannot be made, the next one (or the attempt's
        end, which waits) makes it. The job as stored, or None when nothing was written."""
        now = time.monotonic()
        due = force or first or entry.snapshot is not None
        if not due and now - entry.last_stored < self.config.store_progress_seconds:
            return None
        entry.last_stored = now
        train = entry.progress.get("train")
        fields: dict[str, Any] = {"progress": entry.progress}
        if entry.snapshot is not None:
            fields["snapshot"] = entry.snapshot
        try:
            if train is not None:
                fields["iteration"] = int(train["iteration"])
                job = self.store.get_job(job_id)
                if job is not None and job.effective_batch is None and job.batch_size and job.iter_size:
                    fields["effective_batch"] = job.batch_size * job.iter_size
            stored = self.store.update_job(job_id, busy_seconds=None if wait else 0.0, **fields)
        except StoreError as error:
            if wait:
                raise
            if not entry.store_warned:
                log.warning("job %s: progress not stored (%s); it is kept and stored with the next write", job_id, error)
                entry.store_warned = True
            return None
        entry.snapshot = None
        return stored

    def _finish(self, job_id: str, status: str, message: str) -> None:
        """Record how the job ended; retried (outside the manager's lock) while the database cannot be written."""
        fields: dict[str, Any] = {
            "status": status, "message": message, "finished_at": time.time() if status in FINAL_STATES else None,
        }
        failed: StoreError | None = None
        with self._lock:
            try:
                job = self.store.update_job(job_id, **fields)
            except StoreError as error:
                failed = error
            self._finished.notify_all()
        if failed is not None:
            job = self._durable(
                job_id, f"the job's end ({status})", lambda: self.store.update_job(job_id, **fields), failed, job=fields
            )
            with self._lock:
                self._finished.notify_all()
        self._emit_job(job)


_NOT_RECORDED = (
    "the job has ended but its end is not recorded yet in the jobs database (see its message); try again once it is"
)


def _job_end(result: AttemptResult) -> tuple[str, str] | None:
    """The job's status and message once an attempt ended so; None when the fallback tries again (out of memory)."""
    outcome = result.outcome
    if outcome.status == SUCCESS:
        return DONE, f"training finished at iteration {result.last_iteration}"
    if outcome.status == OUTCOME_INTERRUPTED:
        return INTERRUPTED, INTERRUPTED_MESSAGE
    if outcome.status == OUTCOME_CANCELLED:
        return CANCELLED, "cancelled"
    if outcome.status != OUT_OF_MEMORY:
        return FAILED, outcome.message
    return None


def _progress_fields(entry: _Running) -> dict[str, Any]:
    """The job's progress fields from what its running attempt reported (as `_store_progress` writes them)."""
    fields: dict[str, Any] = {"progress": entry.progress}
    train = entry.progress.get("train")
    if train is not None:
        fields["iteration"] = int(train["iteration"])
    if entry.snapshot is not None:
        fields["snapshot"] = entry.snapshot
    return fields


def _folder_bytes(path: Path) -> int:
    """What a folder takes on its disk, as du counts it: every file and folder in it, links not followed."""
    total = 0
    folders = [path]
    while folders:
        try:
            entries = os.scandir(folders.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
                except OSError:
                    continue
    return total


def _candidates(what: str, jobs: list[Job], sizes: dict[str, int] | None = None) -> str:
    """"; the oldest that are not running: <id> (name, failed), ..." for a refusal's message."""
    if not jobs:
        return ""
    listed = [
        f"{job.id} ({job.name[:80]!r}, {job.status}" + (f", {format_size(sizes.get(job.id, 0))})" if sizes else ")")
        for job in jobs
    ]
    return f"; {what}: " + ", ".join(listed)


def _disk_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


def _free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still put on the disk holding `path`."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def _free_note(path: Path) -> str:
    free = _free_bytes(path)
    return "free space unknown" if free is None else f"{format_size(free)} free"


def _first(value: float | None, default: float) -> float:
    return default if value is None else value


def _failure(attempt: Attempt) -> Failure:
    """An earlier out-of-memory attempt (before a restart or a resume), as the policy reads it."""
    record = attempt.out_of_memory or {}
    return Failure(
        batch_size=attempt.batch_size,
        test_batch_size=attempt.test_batch_size,
        limit_bytes=int(attempt.limit_bytes or 0),
        requested_bytes=record.get("requested_bytes"),
        free_bytes=record.get("free_bytes"),
        used_bytes=attempt.peak_bytes,
    )


def _stacks(definition: JobDefinition) -> int:
    """Address space the runner's capped child reserves for Caffe's thread stacks."""
    return definition.threads * THREAD_STACK_BYTES


def _label(device: Any) -> str:
    return "the CPU" if device.kind != GPU else f"GPU {device.index}"


def _error_field(error: NetError, data: dict[str, str]) -> str:
    """The request field an error belongs to: a source the request's `data` gave is the data's fault."""
    if isinstance(error, DataSourceError) or error.field == "data" or (error.field or "").startswith("data_shapes"):
        return "data"
    if error.source == SOLVER_SOURCE or (error.source or "").startswith(SOLVER_SOURCE):
        return "solver"
    return "net"


__all__ = [
    "ACTIVE_STATES",
    "DataFolderInUse",
    "JobError",
    "JobManager",
    "JobNotFound",
    "JobStateError",
    "JobValidationError",
    "ManagerConfig",
]
