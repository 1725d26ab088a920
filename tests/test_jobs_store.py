"""jobs.store.database: SQLite with a schema version and WAL, rows of plain columns and JSON (no pickles), attempts numbered
per job, and the restart rule: what was queued or running becomes interrupted."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from digits_memplugin.jobs.store.database import SCHEMA_VERSION, JobStore, StoreError
from digits_memplugin.jobs.store.records import Attempt, Job


def job(job_id: str = "j1", status: str = "queued") -> Job:
    return Job(
        id=job_id, name="lenet", status=status, created_at=1.0, updated_at=1.0, folder=job_id,
        spec={"device": "cpu", "batch": 64, "fallback": {"max_attempts": 5}},
    )


def attempt(job_id: str = "j1", number: int = 0) -> Attempt:
    return Attempt(
        job_id=job_id, number=number, status="running", device="cpu", batch_size=64, iter_size=1, started_at=2.0,
        log="attempts/1/caffe.log", handle="pid:12345",
    )


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "jobs.sqlite")


def test_schema_version_and_wal(store: JobStore, tmp_path: Path) -> None:
    assert store.schema_version == SCHEMA_VERSION
    with sqlite3.connect(tmp_path / "jobs.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"schema_version", "jobs", "attempts"}


def test_a_newer_schema_is_refused_not_guessed(tmp_path: Path) -> None:
    JobStore(tmp_path / "jobs.sqlite").close()
    with sqlite3.connect(tmp_path / "jobs.sqlite") as db:
        db.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        JobStore(tmp_path / "jobs.sqlite")


def test_a_version_1_database_is_migrated_keeping_its_jobs(tmp_path: Path) -> None:
    """Version 1 (before attempts had allocated_bytes) as the previous release wrote it: the columns it had."""
    path = tmp_path / "jobs.sqlite"
    JobStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE attempts DROP COLUMN test_net")
        db.execute("ALTER TABLE attempts DROP COLUMN tester")
        db.execute("ALTER TABLE attempts DROP COLUMN allocated_bytes")
        db.execute("ALTER TABLE attempts DROP COLUMN handle")
        db.execute("ALTER TABLE attempts ADD COLUMN pid INTEGER")
        db.execute("ALTER TABLE jobs DROP COLUMN cancel_requested_at")
        db.execute("UPDATE schema_version SET version = 1")
    old = JobStore(path)
    try:
        assert old.schema_version == SCHEMA_VERSION == 5
        old.add_job(job())
        old.add_attempt(Attempt(job_id="j1", number=1, status="running", device="cpu", batch_size=8, iter_size=1,
                                started_at=1.0, log="attempts/1/caffe.log"))
        ended = old.update_attempt("j1", 1, peak_bytes=3 << 20, allocated_bytes=2 << 20)
        assert (ended.peak_bytes, ended.allocated_bytes) == (3 << 20, 2 << 20)
    finally:
        old.close()
    reopened = JobStore(path)
    try:
        assert reopened.attempts("j1")[0].allocated_bytes == 2 << 20
    finally:
        reopened.close()


def test_a_version_2_database_keeps_its_pids_as_handles(tmp_path: Path) -> None:
    """Version 2 stored an attempt's child as a pid; version 3 as a backend's handle ("pid:N", "ray:<id>")."""
    path = tmp_path / "jobs.sqlite"
    new = JobStore(path)
    new.add_job(job())
    new.add_attempt(dataclasses.replace(attempt(number=1), handle=None))
    new.close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE attempts DROP COLUMN test_net")
        db.execute("ALTER TABLE attempts DROP COLUMN tester")
        db.execute("ALTER TABLE attempts DROP COLUMN handle")
        db.execute("ALTER TABLE attempts ADD COLUMN pid INTEGER")
        db.execute("UPDATE attempts SET pid = 4242")
        db.execute("ALTER TABLE jobs DROP COLUMN cancel_requested_at")
        db.execute("UPDATE schema_version SET version = 2")
    old = JobStore(path)
    try:
        (migrated,) = old.attempts("j1")
        assert (old.schema_version, migrated.handle, migrated.pid) == (5, "pid:4242", 4242)
        ray = old.update_attempt("j1", 1, handle="ray:j1-1")
        assert (ray.handle, ray.pid) == ("ray:j1-1", None)
    finally:
        old.close()


def test_a_version_3_database_gets_cancel_requests(tmp_path: Path) -> None:
    """Version 3 had no cancel requests (a follower's cancel of a job the leader runs); version 4 stores them."""
    path = tmp_path / "jobs.sqlite"
    new = JobStore(path)
    new.add_job(job(status="running"))
    new.close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE attempts DROP COLUMN test_net")
        db.execute("ALTER TABLE attempts DROP COLUMN tester")
        db.execute("ALTER TABLE jobs DROP COLUMN cancel_requested_at")
        db.execute("UPDATE schema_version SET version = 3")
    old = JobStore(path)
    try:
        assert old.schema_version == 5
        assert old.get_job("j1").cancel_requested_at is None and old.cancel_requests() == []
        assert old.request_cancel("j1", "cancelling") is not None
        assert old.cancel_requests() == ["j1"]
    finally:
        old.close()


def test_a_version_4_database_gets_where_each_attempts_test_nets_were(tmp_path: Path) -> None:
    """Version 4 had no test nets apart (issue 28): its attempts read as shared (None), and version 5 stores an
    attempt's placement and what its tester did."""
    path = tmp_path / "jobs.sqlite"
    new = JobStore(path)
    new.add_job(job())
    new.add_attempt(attempt(number=1))
    new.close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE attempts DROP COLUMN test_net")
        db.execute("ALTER TABLE attempts DROP COLUMN tester")
        db.execute("UPDATE schema_version SET version = 4")
    old = JobStore(path)
    try:
        assert old.schema_version == 5
        (before,) = old.attempts("j1")
        assert (before.test_net, before.tester) == (None, None)
        old.add_attempt(dataclasses.replace(attempt(number=2), test_net="apart", tester={"device": "cpu"}))
        tested = old.update_attempt("j1", 2, tester={"device": "cpu", "tested": [0, 4], "stop_cost": None})
        assert (tested.test_net, tested.tester) == ("apart", {"device": "cpu", "tested": [0, 4], "stop_cost": None})
        assert old.attempts("j1")[1].to_json()["tester"]["tested"] == [0, 4]
    finally:
        old.close()


def test_a_cancel_request_holds_only_for_a_running_job_and_a_restart_clears_it(store: JobStore) -> None:
    store.add_job(job("q", status="queued"))
    store.add_job(job("r", status="running"))
    assert store.request_cancel("q", "cancelling") is None  # not running: nothing to ask the leader
    asked = store.request_cancel("r", "cancelling")
    assert asked is not None and asked.cancel_requested_at is not None and asked.message == "cancelling"
    assert store.cancel_requests() == ["r"]
    assert "cancel_requested_at" not in asked.to_json()  # the API is unchanged: the message says it
    store.mark_interrupted("server stopped")
    assert store.cancel_requests() == [] and store.get_job("r").cancel_requested_at is None


def test_a_delete_with_a_status_spares_a_job_placed_meanwhile(store: JobStore) -> None:
    store.add_job(job("j1", status="queued"))
    store.update_job("j1", status="running")  # placed by the leader after a follower read it queued
    assert store.delete_job("j1", "queued") is False and store.get_job("j1") is not None
    assert store.delete_job("j1", "running") is True and store.get_job("j1") is None


def test_jobs_round_trip_with_json_columns_as_text(store: JobStore, tmp_path: Path) -> None:
    store.add_job(job())
    store.update_job("j1", progress={"train": {"iteration": 3, "loss": 0.5}}, snapshot={"iteration": 2})
    found = store.get_job("j1")
    assert found is not None
    assert found.spec["fallback"] == {"max_attempts": 5}
    assert found.progress == {"train": {"iteration": 3, "loss": 0.5}}
    assert found.updated_at > 1.0
    with sqlite3.connect(tmp_path / "jobs.sqlite") as db:
        spec, progress = db.execute("SELECT spec, progress FROM jobs").fetchone()
    assert spec.startswith("{") and progress.startswith("{")  # JSON text, readable by any tool


def test_unknown_fields_and_jobs_are_errors(store: JobStore) -> None:
    store.add_job(job())
    with pytest.raises(ValueError, match="nonsense"):
        store.update_job("j1", nonsense=1)
    with pytest.raises(KeyError):
        store.update_job("missing", status="done")
    assert store.get_job("missing") is None


def test_attempts_are_numbered_per_job_and_deleted_with_it(store: JobStore) -> None:
    store.add_job(job("j1"))
    store.add_job(job("j2"))
    assert [store.add_attempt(attempt("j1")).number for _ in range(2)] == [1, 2]
    assert store.add_attempt(attempt("j2")).number == 1
    assert [a.number for a in store.attempts("j1")] == [1, 2]
    assert store.get_job("j1").attempt_count == 2  # type: ignore[union-attr]
    updated = store.update_attempt("j1", 2, status="out_of_memory", out_of_memory={"requested_bytes": 10})
    assert updated.out_of_memory == {"requested_bytes": 10}
    assert store.delete_job("j1")
    assert store.attempts("j1") == []
    with pytest.raises(sqlite3.IntegrityError):
        store.add_attempt(attempt("j2", number=1))  # a number in use


def test_queue_order_is_submission_order(store: JobStore) -> None:
    for name in ("b", "a", "c"):
        store.add_job(job(name))
    assert [j.id for j in store.list_jobs(["queued"])] == ["b", "a", "c"]


def test_after_a_restart_active_jobs_and_running_attempts_are_interrupted(store: JobStore) -> None:
    store.add_job(job("running", "running"))
    store.add_job(job("queued", "queued"))
    store.add_job(job("done", "done"))
    store.add_attempt(attempt("running"))
    left = store.mark_interrupted("the server stopped")
    assert [(a.job_id, a.pid) for a in left] == [("running", 12345)]
    assert {j.id: j.status for j in store.list_jobs()} == {
        "running": "interrupted", "queued": "interrupted", "done": "done",
    }
    (interrupted,) = store.attempts("running")
    assert interrupted.status == "interrupted" and interrupted.finished_at is not None
    assert interrupted.message == "the server stopped"


def test_an_update_racing_a_delete_is_the_job_or_none_never_an_error(store: JobStore) -> None:
    """The scheduler updates a queued job while a request deletes it (found by bench/fuzz_api.py): the update
    returns the job as updated, or None once it is gone; it must never fail between its write and its read-back."""
    import threading

    ids = [f"j{i}" for i in range(400)]
    for job_id in ids:
        store.add_job(job(job_id))
    errors: list[BaseException] = []
    results: list[Job | None] = []

    def update() -> None:
        try:
            for job_id in ids:
                results.append(store.update_job_if(job_id, "queued", message="waiting"))
        except BaseException as error:  # noqa: BLE001 - collected for the assertion below
            errors.append(error)

    def delete() -> None:
        for job_id in ids:
            store.delete_job(job_id)

    threads = [threading.Thread(target=update), threading.Thread(target=delete)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert all(result is None or (result.message == "waiting" and result.id in ids) for result in results)
    assert store.list_jobs() == []


def test_two_stores_on_one_file_write_at_once_without_losing_a_write(tmp_path: Path) -> None:
    """Two processes' stores (a leader writing progress, a follower adding jobs: docs/scale-out.md) meet each
    other's write lock and wait for it in Python (busy_seconds), never failing nor losing a row."""
    import threading

    leader, follower = JobStore(tmp_path / "jobs.sqlite"), JobStore(tmp_path / "jobs.sqlite", busy_seconds=10)
    leader.add_job(job("run", status="running"))
    errors: list[BaseException] = []

    def progress() -> None:
        try:
            for iteration in range(300):
                leader.update_job("run", iteration=iteration, progress={"train": {"iteration": iteration}})
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    writer = threading.Thread(target=progress)
    writer.start()
    try:
        for index in range(100):
            follower.add_job(job(f"q{index}"))
            follower.request_cancel("run", "cancelling")
    finally:
        writer.join(timeout=60)
    try:
        assert not writer.is_alive() and errors == []
        assert leader.count_jobs(["queued"]) == 100 and leader.get_job("run").iteration == 299
        assert follower.cancel_requests() == ["run"]
    finally:
        leader.close()
        follower.close()
