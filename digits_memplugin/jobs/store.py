"""Jobs and attempts in SQLite under the data folder: no pickles, a schema version, WAL, one writer.

DIGITS pickled its jobs and patched them by version on load; here a row is plain columns and JSON text, and the
schema carries its version, so a later release migrates with SQL instead of guessing. Every write goes through
one connection under one lock (the manager's greenlets or threads share it); WAL lets a second process (a CLI
reading the same folder) read meanwhile. Calls are short, so they may run on gevent's hub.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .records import ACTIVE_STATES, INTERRUPTED, RUNNING, Attempt, Job, dumps, loads

SCHEMA_VERSION = 1

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
    position INTEGER NOT NULL
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
    started_at REAL NOT NULL,
    finished_at REAL,
    exit_code INTEGER,
    signal TEXT,
    message TEXT,
    out_of_memory TEXT,
    log TEXT NOT NULL,
    pid INTEGER,
    PRIMARY KEY (job_id, number)
);
CREATE INDEX jobs_by_status ON jobs (status, position);
"""

_JSON_JOB_FIELDS = frozenset({"spec", "snapshot", "progress"})
_JSON_ATTEMPT_FIELDS = frozenset({"out_of_memory"})
_JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(Job)) - {"attempt_count"}
_ATTEMPT_FIELDS = frozenset(f.name for f in dataclasses.fields(Attempt))


class StoreError(RuntimeError):
    """The database cannot be used (a newer schema, a broken file)."""


class JobStore:
    """The jobs database of one data folder."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

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
            if version != SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has jobs schema version {version}; this release reads version {SCHEMA_VERSION}"
                )

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT version FROM schema_version").fetchone()[0])

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

    def update_job(self, job_id: str, **fields: Any) -> Job:
        """Set columns of a job (JSON fields as Python values); `updated_at` is set to now. Returns the new row."""
        unknown = set(fields) - _JOB_FIELDS
        if unknown:
            raise ValueError(f"unknown job field(s): {', '.join(sorted(unknown))}")
        fields["updated_at"] = time.time()
        values = _job_values(fields)
        with self._transaction() as db:
            assignments = ", ".join(f"{name} = ?" for name in values)
            cursor = db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*values.values(), job_id))
            if cursor.rowcount != 1:
                raise KeyError(job_id)
        job = self.get_job(job_id)
        if job is None:  # pragma: no cover - deleted between the two statements
            raise KeyError(job_id)
        return job

    def get_job(self, job_id: str) -> Job | None:
        with self._lock:
            row = self._db.execute(_SELECT_JOBS + " WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def list_jobs(self, statuses: Iterable[str] | None = None) -> list[Job]:
        """Jobs in queue order (oldest first), optionally only those in `statuses`."""
        query, args = _SELECT_JOBS, ()
        if statuses is not None:
            wanted = tuple(statuses)
            query += f" WHERE status IN ({', '.join('?' for _ in wanted)})"
            args = wanted  # type: ignore[assignment]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY position", args).fetchall()
        return [_job(row) for row in rows]

    def delete_job(self, job_id: str) -> bool:
        with self._transaction() as db:
            return db.execute("DELETE FROM jobs WHERE id = ?", (job_id,)).rowcount == 1

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
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM attempts WHERE job_id = ? ORDER BY number", (job_id,)
            ).fetchall()
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
                f"UPDATE jobs SET status = ?, message = ?, updated_at = ? WHERE status IN ({', '.join('?' for _ in states)})",
                (INTERRUPTED, message, now, *states),
            )
        return [_attempt(row) for row in rows]


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
