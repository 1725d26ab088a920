"""What jobs' tasks learn, written to the store and told to the listeners: the runner's records kept on the job
row (at most once per `store_progress_seconds` for iterations), writes the job's record must not lose (an attempt's
end, the job's end) retried until the database takes them, and meanwhile what they say shown on top of what the
database holds, so that a job whose child is gone does not read "running".

The manager (jobs.manager), the dispatcher and the attempt loop (jobs.scheduling) share one `Reporter`, on the
manager's run state (jobs.run_state): its lock, its table of placed jobs, its store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..run_state import Running, RunState
from ..store.database import JobStore, StoreError
from ..store.records import FINAL_STATES, RUNNING, Attempt, Job
from .pace import Pace

log = logging.getLogger(__name__)

_T = TypeVar("_T")
EventCallback = Callable[[str, dict[str, Any]], None]


@dataclasses.dataclass
class Unrecorded:
    """What a job's task knows about the job and its attempts but could not write to the database yet (a full disk,
    a lock held too long): what the manager shows until the write is made, so that a job whose child is gone does
    not read "running" meanwhile."""

    reason: str
    job: dict[str, Any] = dataclasses.field(default_factory=dict)
    attempts: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)


class Reporter:
    """The jobs' writes and events, on the manager's run `state`: its store (which raises while the manager is
    stopped), its table of placed jobs, its `finished` condition (notified when a job's end is written) and its
    `stopping` flag (a durable write then gives up). `on_event(name, payload)` tells the listeners."""

    def __init__(
        self,
        state: RunState,
        on_event: EventCallback,
        *,
        poll_seconds: float,
        store_progress_seconds: float,
    ) -> None:
        self.state = state
        self.on_event = on_event
        self.poll_seconds = poll_seconds
        self.store_progress_seconds = store_progress_seconds
        self.unrecorded: dict[str, Unrecorded] = {}
        """Per job whose task holds writes the database did not take yet: what they say (see Unrecorded)."""

    @property
    def store(self) -> JobStore:
        return self.state.store

    def settled(self, job_id: str) -> None:
        """What the job's task held is written by now, or left for the next start to mark: shown no longer."""
        with self.state.lock:
            self.unrecorded.pop(job_id, None)

    # --- events -------------------------------------------------------------------------------------------------

    def emit(self, name: str, payload: dict[str, Any]) -> None:
        try:
            self.on_event(name, payload)
        except Exception:
            log.exception("the %s event listener failed", name)

    def emit_job(self, job: Job) -> None:
        self.emit("job", self.paced(job).to_json())

    def paced(self, job: Job) -> Job:
        """The job with its running attempt's speed as measured now (the stored one is up to
        `store_progress_seconds` older, and another attempt's once a new one starts)."""
        with self.state.lock:
            entry = self.state.running.get(job.id)
            if entry is None or job.status != RUNNING or entry.attempt is None:
                return job
            live = entry.progress.get("pace")
        return dataclasses.replace(job, progress={**(job.progress or {}), "pace": live})

    # --- what the task knows, on top of the database ------------------------------------------------------------

    def view(self, job: Job) -> Job:
        """The job as its task knows it: what the database holds, with what could not be written yet on top, and
        the message saying so."""
        job = self.paced(job)
        with self.state.lock:
            pending = self.unrecorded.get(job.id)
            if pending is None:
                return job
            fields = dict(pending.job)
        message = fields.pop("message", job.message)
        return dataclasses.replace(job, **fields, message=f"{message} ({pending.reason})")

    def view_attempts(self, job_id: str, attempts: list[Attempt]) -> list[Attempt]:
        with self.state.lock:
            pending = self.unrecorded.get(job_id)
            changes = dict(pending.attempts) if pending is not None else {}
        return [dataclasses.replace(a, **changes[a.number]) if a.number in changes else a for a in attempts]

    def durable(
        self, job_id: str, what: str, write: Callable[[], _T], first: StoreError | None = None, *,
        job: dict[str, Any] | None = None, attempt: tuple[int, dict[str, Any]] | None = None,
    ) -> _T:
        """A write the job's record must not lose (an attempt's end, the job's end). Each try waits for the
        database as long as the store does. After a failed try, what the write says (`job`: the job's fields,
        `attempt`: an attempt's number and fields) is held and shown as the job's state (see `hold`), the job's
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
            if self.state.stopping:
                raise error
            if not told:
                log.error("job %s: %s is not recorded yet: %s; trying again until it is", job_id, what, error)
                self.hold(job_id, what, error, job=job, attempt=attempt)
                told = True
            time.sleep(self.poll_seconds)
            error = None

    def hold(
        self, job_id: str, what: str, error: StoreError, *, job: dict[str, Any] | None = None,
        attempt: tuple[int, dict[str, Any]] | None = None,
    ) -> None:
        """Keep what a write the database refused says, so that the job reads as its task knows it (a child that
        ended on a full disk: failed, not running) with a message saying it is not recorded yet; and tell the
        job's listeners."""
        with self.state.lock:
            pending = self.unrecorded.setdefault(job_id, Unrecorded(""))
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
                self.emit_job(self.view(stored))
            if attempt is not None:
                for held in self.view_attempts(job_id, self.store.attempts(job_id)):
                    if held.number == attempt[0]:
                        self.emit("job_attempt", {"job_id": job_id, **held.to_json()})

    # --- the runner's records -----------------------------------------------------------------------------------

    def on_record(self, job_id: str, number: int, record: dict[str, Any]) -> None:
        """A runner record: forwarded as `job_progress` (an iteration record with the attempt's speed and time
        left, `PACE_FIELDS`); iterations, test results and snapshots kept on the job (iterations and tests with their
        attempt's number, as the events and GET /jobs/<id>/progress carry them)."""
        event = record.get("event")
        forwarded = {"job_id": job_id, "attempt": number, **record}
        if event == "iteration":
            with self.state.lock:
                entry = self.state.running.get(job_id)
                measured = None
                if entry is not None and entry.attempt == number:
                    measured = entry.progress["pace"] = _paced_record(entry, record)
            forwarded.update(pace_fields(measured))
        self.emit("job_progress", forwarded)
        record = {**record, "attempt": number}
        changed: Job | None = None
        with self.state.lock:
            entry = self.state.running.get(job_id)
            if entry is None:
                return
            memory = record.get("memory_bytes")
            if isinstance(memory, int):  # what the attempt holds already is no longer held back for it
                entry.holds(memory, event)
            if event == "iteration":
                entry.progress["train"] = record
                self.store_progress(job_id, entry, first=record.get("iteration") == 1)
            elif event == "test":
                tests = entry.progress.setdefault("test", [])
                while len(tests) <= int(record.get("net", 0)):
                    tests.append(None)
                tests[int(record.get("net", 0))] = record
                self.store_progress(job_id, entry, force=True)
            elif event == "snapshot":
                entry.snapshot = {key: record[key] for key in ("iteration", "model", "state")}
                changed = self.store_progress(job_id, entry, force=True)
        if changed is not None:  # listeners are called outside the lock: they may take their time
            self.emit_job(changed)

    def store_progress(
        self, job_id: str, entry: Running, force: bool = False, first: bool = False, wait: bool = False
    ) -> Job | None:
        """Keep the latest progress (and a new snapshot) on the job row, at most once per `store_progress_seconds`
        for iterations. The child's records must keep flowing whatever the database does, so unless `wait` this
        write does not wait for another process's lock: when it cannot be made, the next one (or the attempt's
        end, which waits) makes it. The job as stored, or None when nothing was written."""
        now = time.monotonic()
        due = force or first or entry.snapshot is not None
        if not due and now - entry.last_stored < self.store_progress_seconds:
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

    # --- the job's end ------------------------------------------------------------------------------------------

    def finish(self, job_id: str, status: str, message: str) -> None:
        """Record how the job ended; retried (outside the manager's lock) while the database cannot be written."""
        fields: dict[str, Any] = {
            "status": status, "message": message, "finished_at": time.time() if status in FINAL_STATES else None,
        }
        failed: StoreError | None = None
        with self.state.lock:
            try:
                job = self.store.update_job(job_id, **fields)
            except StoreError as error:
                failed = error
            self.state.finished.notify_all()
        if failed is not None:
            job = self.durable(
                job_id, f"the job's end ({status})", lambda: self.store.update_job(job_id, **fields), failed, job=fields
            )
            with self.state.lock:
                self.state.finished.notify_all()
        self.emit_job(job)


PACE_FIELDS = ("iterations_per_second", "seconds_left")
"""What a running job's documents and iteration events say of its speed: null while unknown."""


def pace_fields(measured: Pace | dict[str, Any] | None) -> dict[str, float | None]:
    """{"iterations_per_second", "seconds_left"} of a measure (a Pace, or the dict kept in a job's progress)."""
    if isinstance(measured, Pace):
        return {"iterations_per_second": measured.iterations_per_second, "seconds_left": measured.seconds_left}
    if isinstance(measured, dict):
        return {key: measured.get(key) for key in PACE_FIELDS}
    return dict.fromkeys(PACE_FIELDS)


def _paced_record(entry: Running, record: dict[str, Any]) -> dict[str, Any] | None:
    """What a job's progress keeps of its attempt's speed once the iteration `record` is added (Running.measure)."""
    measured = entry.measure(record)
    if measured is None:
        return None
    return {"attempt": entry.attempt, "iteration": record["iteration"], **pace_fields(measured)}


def progress_fields(entry: Running) -> dict[str, Any]:
    """The job's progress fields from what its running attempt reported (as `Reporter.store_progress` writes them)."""
    fields: dict[str, Any] = {"progress": entry.progress}
    train = entry.progress.get("train")
    if train is not None:
        fields["iteration"] = int(train["iteration"])
    if entry.snapshot is not None:
        fields["snapshot"] = entry.snapshot
    return fields


__all__ = ["PACE_FIELDS", "Reporter", "Unrecorded", "pace_fields", "progress_fields"]
