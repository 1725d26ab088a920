"""Jobs and attempts in SQLite under the data folder: no pickles, a schema version, WAL, one writer.

DIGITS pickled its jobs and patched them by version on load; here a row is plain columns and JSON text, and the
schema carries its version, so a later release migrates with SQL instead of guessing. Every write goes through
one connection under one lock (the manager's greenlets or threads share it); WAL lets a second process (a CLI
reading the same folder) read meanwhile. Calls are short, so they may run on gevent's hub.

Another process may hold the write lock (a backup taken with `sqlite3 jobs.sqlite .backup`, someone's
`BEGIN EXCLUSIVE`). SQLite's own busy handler would sleep inside the C library, which under gevent stops the whole
server; so the connection does not wait (timeout 0) and the store retries in Python, with `time.sleep` (gevent's
once monkey-patched), releasing its lock between tries so that reads go on, for at most `busy_seconds`. Then it
raises StoreBusy, and a full disk raises StoreFull: errors of the project's type with a message that says what to
do, never sqlite3's own.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from ...core.errors import MemPluginError
from .records import ACTIVE_STATES, INTERRUPTED, RUNNING, Attempt, Job, dumps, loads

SCHEMA_VERSION = 5
BUSY_SECONDS = 10.0
"""How long a store call waits for another process's write lock before it gives up with StoreBusy."""
_RETRY_FIRST, _RETRY_MAX = 0.01, 0.25
"""Seconds between tries while the database is locked: doubling from the first to the most."""
_BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED
_FULL_CODES = frozenset({13})  # SQLITE_FULL
_DAMAGED_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    folder TEXT NOT NULL,
    spec TEXT NOT NULL,
    device TEXT,
    batch_size INTEGER,
    iter_size INTEGER,
    test_batch_size INTEGER,
    test_iter INTEGER,
    effective_batch INTEGER,
    iteration INTEGER NOT NULL DEFAULT 0,
    max_iter INTEGER,
    snapshot TEXT,
    progress TEXT,
    message TEXT,
    position INTEGER NOT NULL,
    cancel_requested_at REAL
);
CREATE TABLE attempts (
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    number INTEGER NOT NULL,
    status TEXT NOT NULL,
    device TEXT NOT NULL,
    batch_size INTEGER NOT NULL,
    iter_size INTEGER NOT NULL,
    test_batch_size INTEGER,
    test_iter INTEGER,
    resumed_from TEXT,
    start_iteration INTEGER NOT NULL,
    end_iteration INTEGER,
    limit_bytes INTEGER,
    estimated_bytes INTEGER,
    correction REAL,
    peak_bytes INTEGER,
    allocated_bytes INTEGER,
    started_at REAL NOT NULL,
    finished_at REAL,
    exit_code INTEGER,
    signal TEXT,
    message TEXT,
    out_of_memory TEXT,
    log TEXT NOT NULL,
    handle TEXT,
    test_net TEXT,
    tester TEXT,
    PRIMARY KEY (job_id, number)
);
CREATE INDEX jobs_by_status ON jobs (status, position);
"""

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE attempts ADD COLUMN allocated_bytes INTEGER",),
    # An attempt runs under a backend (jobs.backends.local): its child's pid becomes a handle, "pid:N" or "ray:<id>".
    2: (
        "ALTER TABLE attempts ADD COLUMN handle TEXT",
        "UPDATE attempts SET handle = 'pid:' || pid WHERE pid IS NOT NULL",
        "ALTER TABLE attempts DROP COLUMN pid",
    ),
    # A follower (a second web worker on the data folder) asks the leader, which runs the job, to cancel it.
    3: ("ALTER TABLE jobs ADD COLUMN cancel_requested_at REAL",),
    # The test nets apart (issue 28): where an attempt's test nets were, and what its tester did.
    4: ("ALTER TABLE attempts ADD COLUMN test_net TEXT", "ALTER TABLE attempts ADD COLUMN tester TEXT"),
}
"""Statements that take the schema from version N to N + 1."""

_JSON_JOB_FIELDS = frozenset({"spec", "snapshot", "progress"})
_JSON_ATTEMPT_FIELDS = frozenset({"out_of_memory", "tester"})
_JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(Job)) - {"attempt_count"}
_ATTEMPT_FIELDS = frozenset(f.name for f in dataclasses.fields(Attempt))


class StoreError(MemPluginError):
    """The database cannot be used (a newer schema, a broken file, a lock held too long, a full disk)."""


class StoreBusy(StoreError):
    """Another process held the database's write lock for longer than the store waits."""


class StoreFull(StoreError):
    """The disk holding the database is full: nothing more can be written until space is freed."""


class StoreDamaged(StoreError):
    """The database file is not an SQLite database, or its pages are corrupt: nothing can be read from it."""


class JobStore:
    """The jobs database of one data folder."""

    def __init__(self, path: Path, *, busy_seconds: float = BUSY_SECONDS) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.busy_seconds = busy_seconds
        self._lock = threading.RLock()
        # timeout=0: SQLite's busy handler would sleep inside C, where gevent cannot switch; _retry waits instead.
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=0)
        try:
            self._db.row_factory = sqlite3.Row
            for pragma in ("PRAGMA journal_mode=WAL", "PRAGMA foreign_keys=ON", "PRAGMA synchronous=NORMAL"):
                self._read(pragma)
            self._migrate()
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _retry(self, operation: Callable[[], T], busy_seconds: float | None = None) -> T:
        """Run `operation` under the store's lock; while another process holds the database, try again (the lock
        released, so other callers go on) until `busy_seconds` (default: the store's) have passed."""
        limit = self.busy_seconds if busy_seconds is None else busy_seconds
        deadline = time.monotonic() + limit
        delay = _RETRY_FIRST
        while True:
            try:
                with self._lock:
                    return operation()
            except sqlite3.DatabaseError as error:
                if not _about_the_file(error):
                    raise
                failure = self._error(error, limit)
                if not isinstance(failure, StoreBusy) or time.monotonic() >= deadline:
                    raise failure from None
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, _RETRY_MAX)

    def _error(self, error: sqlite3.Error, waited: float) -> StoreError:
        """sqlite3's error as the store's own, with a message that says what happened and what to do."""
        code = getattr(error, "sqlite_errorcode", None)
        text = str(error)
        if code in _BUSY_CODES or "locked" in text or "busy" in text:
            return StoreBusy(
                f"the jobs database {self.path.name} is locked by another process; gave up after waiting "
                f"{waited:g} s (a backup or another sqlite3 session holding a write transaction?)"
            )
        if code in _FULL_CODES or "disk is full" in text:
            return StoreFull(f"the disk holding the jobs database {self.path.name} is full; free some space")
        if code in _DAMAGED_CODES or "malformed" in text or "not a database" in text:
            return StoreDamaged(
                f"the jobs database {self.path} is damaged ({text}); the jobs' folders beside it are kept: stop the "
                "server, move the file aside (or put back a backup of it) and start the server again"
            )
        return StoreError(f"the jobs database {self.path.name} cannot be used: {text}")

    @contextmanager
    def _transaction(self, busy_seconds: float | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction: BEGIN IMMEDIATE takes the write lock at once (retried while another process has
        it), so the statements inside never meet a lock; the store's lock is held until COMMIT or ROLLBACK."""
        self._retry(self._begin, busy_seconds)
        try:
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException as error:
                if self._db.in_transaction:  # SQLite rolls some failures (a full disk) back by itself
                    with suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                if isinstance(error, sqlite3.DatabaseError) and _about_the_file(error):
                    raise self._error(error, 0.0) from None
                raise
        finally:
            self._lock.release()

    def _begin(self) -> None:
        """BEGIN IMMEDIATE, keeping the store's lock acquired once more when it succeeds (released by the caller)."""
        self._db.execute("BEGIN IMMEDIATE")
        self._lock.acquire()

    def _read(self, query: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        return self._retry(lambda: self._db.execute(query, args).fetchall())

    def _migrate(self) -> None:
        with self._transaction() as db:
            exists = db.execute("SELECT name FROM sqlite_master WHERE name = 'schema_version'").fetchone()
            if exists is None:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                return
            row = db.execute("SELECT version FROM schema_version").fetchone()
            version = None if row is None else row[0]
            while isinstance(version, int) and version < SCHEMA_VERSION and version in MIGRATIONS:
                for statement in MIGRATIONS[version]:
                    db.execute(statement)
                version += 1
                db.execute("UPDATE schema_version SET version = ?", (version,))
            if version != SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has jobs schema version {version}; this release reads version {SCHEMA_VERSION}"
                )

    @property
    def schema_version(self) -> int:
        return int(self._read("SELECT version FROM schema_version")[0][0])

    # --- jobs ---------------------------------------------------------------------------------------------------

    def add_job(self, job: Job) -> Job:
        values = _job_values(dataclasses.asdict(job))
        with self._transaction() as db:
            position = db.execute("SELECT COALESCE(MAX(position), 0) + 1 FROM jobs").fetchone()[0]
            values["position"] = position
            columns = ", ".join(values)
            db.execute(f"INSERT INTO jobs ({columns}) VALUES ({', '.join('?' for _ in values)})", tuple(values.values()))
        job.position = position
        return job

    def update_job(self, job_id: str, *, busy_seconds: float | None = None, **fields: Any) -> Job:
        """Set columns of a job (JSON fields as Python values); `updated_at` is set to now. Returns the new row.
        `busy_seconds` overrides how long to wait for another process's lock (0: one try, for writes that the
        next one makes up for)."""
        job = self._update_job(job_id, None, busy_seconds, fields)
        if job is None:
            raise KeyError(job_id)
        return job

    def update_job_if(self, job_id: str, expected: str, /, **fields: Any) -> Job | None:
        """`update_job` only while the job's status is `expected`, in one statement; None when it is not (any
        more): the scheduler places or fails a queued job this way, so that a cancel or a delete in between wins."""
        return self._update_job(job_id, expected, None, fields)

    def _update_job(
        self, job_id: str, status: str | None, busy_seconds: float | None, fields: dict[str, Any]
    ) -> Job | None:
        unknown = set(fields) - _JOB_FIELDS
        if unknown:
            raise ValueError(f"unknown job field(s): {', '.join(sorted(unknown))}")
        fields["updated_at"] = time.time()
        values = _job_values(fields)
        condition, extra = ("id = ?", (job_id,)) if status is None else ("id = ? AND status = ?", (job_id, status))
        with self._transaction(busy_seconds) as db:
            assignments = ", ".join(f"{name} = ?" for name in values)
            cursor = db.execute(f"UPDATE jobs SET {assignments} WHERE {condition}", (*values.values(), *extra))
            if cursor.rowcount != 1:
                return None
            # Read back in the same transaction: a delete from another thread cannot come in between.
            row = db.execute(_SELECT_JOBS + " WHERE id = ?", (job_id,)).fetchone()
        return _job(row)

    def get_job(self, job_id: str) -> Job | None:
        rows = self._read(_SELECT_JOBS + " WHERE id = ?", (job_id,))
        return _job(rows[0]) if rows else None

    def list_jobs(self, statuses: Iterable[str] | None = None) -> list[Job]:
        """Jobs in queue order (oldest first), optionally only those in `statuses`."""
        query, args = _SELECT_JOBS, ()
        if statuses is not None:
            wanted = tuple(statuses)
            query += f" WHERE status IN ({', '.join('?' for _ in wanted)})"
            args = wanted  # type: ignore[assignment]
        rows = self._read(query + " ORDER BY position", args)
        return [_job(row) for row in rows]

    def count_jobs(self, statuses: Iterable[str]) -> int:
        """How many jobs are in `statuses` (the queue limit counts the queued ones)."""
        wanted = tuple(statuses)
        query = f"SELECT COUNT(*) FROM jobs WHERE status IN ({', '.join('?' for _ in wanted)})"
        return int(self._read(query, wanted)[0][0])

    def page_jobs(self, limit: int, before: int | None = None) -> list[Job]:
        """At most `limit` jobs, newest first, of those queued before `position` `before` (None: from the newest)."""
        where, args = ("", ()) if before is None else (" WHERE position < ?", (before,))
        rows = self._read(_SELECT_JOBS + where + " ORDER BY position DESC LIMIT ?", (*args, limit))
        return [_job(row) for row in rows]

    def delete_job(self, job_id: str, status: str | None = None) -> bool:
        """Delete the job (only while its status is `status`, when given: another process may have placed it since
        it was read); False when no row was deleted."""
        condition, args = ("id = ?", (job_id,)) if status is None else ("id = ? AND status = ?", (job_id, status))
        with self._transaction() as db:
            return db.execute(f"DELETE FROM jobs WHERE {condition}", args).rowcount == 1

    def request_cancel(self, job_id: str, message: str) -> Job | None:
        """Record that a running job is to be cancelled, for the process that runs it (the leader) to apply; None
        when the job is not running (any more)."""
        return self.update_job_if(job_id, RUNNING, cancel_requested_at=time.time(), message=message)

    def cancel_requests(self) -> list[str]:
        """The running jobs whose cancel was requested (request_cancel), oldest first."""
        rows = self._read(
            "SELECT id FROM jobs WHERE status = ? AND cancel_requested_at IS NOT NULL ORDER BY position", (RUNNING,)
        )
        return [str(row[0]) for row in rows]

    # --- attempts -----------------------------------------------------------------------------------------------

    def add_attempt(self, attempt: Attempt) -> Attempt:
        """Store a new attempt; a number of 0 becomes the next of its job (a number in use is an error)."""
        values = _attempt_values(dataclasses.asdict(attempt))
        with self._transaction() as db:
            number = attempt.number or db.execute(
                "SELECT COALESCE(MAX(number), 0) + 1 FROM attempts WHERE job_id = ?", (attempt.job_id,)
            ).fetchone()[0]
            values["number"] = number
            columns = ", ".join(values)
            db.execute(
                f"INSERT INTO attempts ({columns}) VALUES ({', '.join('?' for _ in values)})", tuple(values.values())
            )
        attempt.number = number
        return attempt

    def update_attempt(self, job_id: str, number: int, **fields: Any) -> Attempt:
        unknown = set(fields) - _ATTEMPT_FIELDS
        if unknown:
            raise ValueError(f"unknown attempt field(s): {', '.join(sorted(unknown))}")
        values = _attempt_values(fields)
        with self._transaction() as db:
            assignments = ", ".join(f"{name} = ?" for name in values)
            cursor = db.execute(
                f"UPDATE attempts SET {assignments} WHERE job_id = ? AND number = ?", (*values.values(), job_id, number)
            )
            if cursor.rowcount != 1:
                raise KeyError((job_id, number))
        found = [attempt for attempt in self.attempts(job_id) if attempt.number == number]
        return found[0]

    def attempts(self, job_id: str) -> list[Attempt]:
        rows = self._read("SELECT * FROM attempts WHERE job_id = ? ORDER BY number", (job_id,))
        return [_attempt(row) for row in rows]

    # --- restart ------------------------------------------------------------------------------------------------

    def mark_interrupted(self, message: str) -> list[Attempt]:
        """After a restart: every queued or running job and every running attempt becomes interrupted.

        Returns the attempts that were running, so the caller can make sure their processes are gone.
        """
        now = time.time()
        with self._transaction() as db:
            rows = db.execute("SELECT * FROM attempts WHERE status = ?", (RUNNING,)).fetchall()
            db.execute(
                "UPDATE attempts SET status = ?, finished_at = ?, message = ? WHERE status = ?",
                (INTERRUPTED, now, message, RUNNING),
            )
            states = tuple(ACTIVE_STATES)
            db.execute(
                f"UPDATE jobs SET status = ?, message = ?, updated_at = ?, cancel_requested_at = NULL "
                f"WHERE status IN ({', '.join('?' for _ in states)})",
                (INTERRUPTED, message, now, *states),
            )
        return [_attempt(row) for row in rows]


def _about_the_file(error: sqlite3.DatabaseError) -> bool:
    """Whether sqlite3's error is about the database itself (locked, full: OperationalError; damaged: a plain
    DatabaseError), not about a statement (IntegrityError, ProgrammingError: the store's own mistake)."""
    return isinstance(error, sqlite3.OperationalError) or type(error) is sqlite3.DatabaseError


_SELECT_JOBS = "SELECT jobs.*, (SELECT COUNT(*) FROM attempts WHERE attempts.job_id = jobs.id) AS attempt_count FROM jobs"


def _job_values(fields: dict[str, Any]) -> dict[str, Any]:
    fields = dict(fields)
    fields.pop("attempt_count", None)
    return {name: dumps(value) if name in _JSON_JOB_FIELDS else value for name, value in fields.items()}


def _attempt_values(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: dumps(value) if name in _JSON_ATTEMPT_FIELDS else value for name, value in fields.items()}


def _job(row: sqlite3.Row) -> Job:
    values = dict(zip(row.keys(), tuple(row), strict=True))  # iterating a Row gives its values
    for name in _JSON_JOB_FIELDS:
        values[name] = loads(values[name])
    return Job(**values)


def _attempt(row: sqlite3.Row) -> Attempt:
    values = dict(zip(row.keys(), tuple(row), strict=True))  # iterating a Row gives its values
    for name in _JSON_ATTEMPT_FIELDS:
        values[name] = loads(values[name])
    return Attempt(**values)
