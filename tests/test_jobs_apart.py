"""Jobs with their test nets apart (issue 28, jobs.scheduling.apart_run): real pycaffe trainers and testers on the
CPU. On the trainer's own device the trainer stops at each test interval for its tester and resumes where it
stopped, so that training and its test results are those of the test nets shared; under a memory cap where the
test net holds the train batch back, apart trains the larger batch and tests as shared does."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import LENET, LENET_SOLVER, ManagerFactory, wait_for, write_lmdb

from digits_memplugin.jobs.definition.request import JobRequest, parse_job_request
from digits_memplugin.jobs.manager import JobManager
from digits_memplugin.jobs.store.records import Job

pytest_plugins = ["test_jobs_fixtures"]

K = 4
"""Test interval and snapshot interval of the jobs here."""
SOLVER = (
    "random_seed: 7\n"
    + LENET_SOLVER.replace("test_iter: 100", "test_iter: 2").replace("test_interval: 500", f"test_interval: {K}")
    .replace("snapshot: 5000", f"snapshot: {K}")
)
TRAIN_ITEMS = 100
"""Not a multiple of the batch: a trainer resumed after a pause must skip to where the data was."""


@pytest.fixture
def datasets(tmp_path: Path) -> Path:
    """Train and test LMDBs of MNIST-shaped items: 100 to train on, 8 to test on (a test pass of 2 x 100 items
    covers them a whole number of times, so that each pass begins at the first item however they are tested)."""
    root = tmp_path / "datasets"
    root.mkdir()
    write_lmdb(root / "mnist_train_lmdb", records=TRAIN_ITEMS)
    write_lmdb(root / "mnist_test_lmdb", records=8)
    return root


def request(**fields: Any) -> JobRequest:
    body = {"net": LENET, "solver": SOLVER, "data": {"train": "mnist_train_lmdb", "test": "mnist_test_lmdb"},
            "device": "cpu", "max_iter": 3 * K, "batch": 24, **fields}
    parsed, errors = parse_job_request(body, default_attempts=5)
    assert parsed is not None, errors
    return parsed


def records(manager: JobManager, job: Job, attempt: int = 1, *, tester: bool = False) -> list[dict[str, Any]]:
    folder = manager.folder(job.id) / "attempts" / str(attempt)
    path = folder / "tester" / "progress.jsonl" if tester else folder / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def trained(manager: JobManager, job_request: JobRequest) -> Job:
    job = manager.wait(manager.submit(job_request).id, timeout=300)
    assert job.status == "done", job.message
    return job


def key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What two runs of the same training must agree on, bit for bit."""
    return (record["event"], record["iteration"], record.get("net"), record.get("loss"),
            json.dumps(record.get("outputs"), sort_keys=True))


@pytest.mark.slow
def test_apart_on_the_trainers_device_trains_and_tests_as_shared_does(make_manager: ManagerFactory) -> None:
    manager = make_manager()
    shared = trained(manager, request(test_net="shared"))
    apart = trained(manager, request(test_net="apart"))

    (attempt,) = manager.attempts(apart.id)
    assert attempt.status == "success" and attempt.test_net == "apart"
    assert attempt.tester is not None and attempt.tester["same_device"] and attempt.tester["device"] == "cpu"
    assert attempt.tester["tested"] == [0, K, 2 * K, 3 * K]
    assert attempt.tester["pauses"] == 3  # at 0 (test_initialization), K and 2K; at 3K training was over
    assert manager.attempts(shared.id)[0].test_net == "shared"

    trainer = records(manager, apart)
    events = [record["event"] for record in trainer]
    assert events.count("paused") == 3 and events.count("started") == 4 and "test" not in events
    constructed = [record for record in trainer if record["event"] == "constructed"]
    # Each trainer resumed after a pause read on from where the data was: K iterations of 24 items are 4 passes
    # of the data layer each (100 items come round again every 25 passes).
    assert [record.get("skipped_forwards", 0) for record in constructed] == [0, 0, K, 2 * K]

    # The same training, step for step and to the last bit, and the same tests, now from the tester.
    expected = [key(r) for r in records(manager, shared) if r["event"] in ("iteration", "test")]
    got = [key(r) for r in trainer if r["event"] == "iteration"]
    got += [key(r) for r in records(manager, apart, tester=True) if r["event"] == "test"]
    assert sorted(got, key=str) == sorted(expected, key=str)
    assert len([g for g in got if g[0] == "test"]) == 4


def pid_of_tester(manager: JobManager, job: Job, iteration: int, attempt: int = 1) -> int | None:
    """The pid of the tester of `iteration`'s snapshot, once it has built its nets."""
    path = manager.folder(job.id) / "attempts" / str(attempt) / "tester" / "progress.jsonl"
    if not path.is_file():
        return None
    started = None
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("iteration") == iteration and record["event"] == "started":
            started = record["pid"]
        if record.get("iteration") == iteration and record["event"] == "constructed" and started:
            return int(started)
    return None


SLOW_TESTS = SOLVER.replace("test_iter: 2", "test_iter: 400")
"""A test pass of 400 x 100 items: long enough to be caught at it."""


@pytest.mark.slow
def test_a_tester_killed_loses_nothing_reported_and_the_job_resumes_from_the_pause(
    make_manager: ManagerFactory,
) -> None:
    manager = make_manager()
    job = manager.submit(request(test_net="apart", solver=SLOW_TESTS))
    pid = wait_for(lambda: pid_of_tester(manager, job, K), 240, "the tester of iteration K")
    running = manager.attempts(job.id)[0]
    assert running.handle == f"pid:{pid}"  # a next server would reap the child running now
    # The trainer is stopped, its memory free: still held for it (and the tester), not given to another job.
    assert manager.state.reserved("cpu") == max(running.estimated_bytes, running.tester["estimated_bytes"])
    os.kill(pid, signal.SIGKILL)
    failed = manager.wait(job.id, timeout=120)
    assert failed.status == "failed"
    assert f"the tester of iteration {K}" in failed.message and "SIGKILL" in failed.message
    (attempt,) = manager.attempts(job.id)
    assert attempt.tester["tested"] == [0] and attempt.tester["failed"].startswith("tester: ")
    # What was reported stays: the test at 0, and the pause's snapshot at K, which the job resumes from.
    tests = [r for r in records(manager, job, tester=True) if r["event"] == "test"]
    assert [r["iteration"] for r in tests] == [0]
    assert failed.snapshot is not None and failed.snapshot["iteration"] == K
    manager.resume(job.id)
    done = manager.wait(job.id, timeout=600)
    assert done.status == "done", done.message
    second = manager.attempts(job.id)[1]
    assert second.start_iteration == K and second.test_net == "apart"
    assert second.tester["tested"] == [K, 2 * K, 3 * K]  # the snapshot whose test was lost is tested again
    assert [r["iteration"] for r in records(manager, job, 2, tester=True) if r["event"] == "test"] == [K, 2 * K, 3 * K]


@pytest.mark.slow
def test_a_trainer_killed_while_training_leaves_its_tests_and_snapshots_and_the_job_resumes(
    make_manager: ManagerFactory,
) -> None:
    manager = make_manager()
    interval = 20  # a stretch of training of a second or two at batch 256, to be caught at
    job = manager.submit(request(test_net="apart", batch=256, test_interval=interval, max_iter=3 * interval))

    def progress() -> list[dict[str, Any]]:
        path = manager.folder(job.id) / "attempts" / "1" / "progress.jsonl"
        return records(manager, job) if path.is_file() else []

    wait_for(lambda: any(r["event"] == "iteration" and r["iteration"] > interval + 2 for r in progress()), 240,
             "training past the second pause")
    trainer = [r["pid"] for r in progress() if r["event"] == "started"][-1]
    os.kill(trainer, signal.SIGKILL)
    failed = manager.wait(job.id, timeout=120)
    assert failed.status == "failed" and "SIGKILL" in failed.message, failed.message
    assert manager.attempts(job.id)[0].tester["tested"] == [0, interval]
    assert [r["iteration"] for r in records(manager, job, tester=True) if r["event"] == "test"] == [0, interval]
    assert failed.snapshot is not None and failed.snapshot["iteration"] >= interval  # a pause's, or the solver's
    manager.resume(job.id)
    done = manager.wait(job.id, timeout=600)
    assert done.status == "done", done.message
    assert done.iteration == 3 * interval
    second = manager.attempts(job.id)[1]
    assert second.start_iteration == failed.snapshot["iteration"] and second.test_net == "apart"
    # From its snapshot on, every test interval's snapshot is tested, once: the one it resumed from too, unless the
    # first attempt's tester had tested it already.
    first = manager.attempts(job.id)[0].tester["tested"]
    assert second.tester["tested"] == [i for i in (interval, 2 * interval, 3 * interval)
                                       if i >= second.start_iteration and i not in first]


BIG_TEST_NET = LENET.replace("batch_size: 100", "batch_size: 1000")
"""LeNet whose test net takes 1000 items a batch: beside the train net it holds the train batch back."""
CAP = 128 << 20
"""A real cap (RLIMIT_DATA) where the test net shared leaves LeNet 74 items a pass of the wanted 512, and apart the
whole 512 in one (the trainer needs 96 MiB of the 122 MiB usable; the tester, alone while the trainer is stopped,
104 MiB)."""


def shared_runner_test(manager: JobManager, job: Job, snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The pycaffe runner with the test nets shared (the solver's own train and test nets in one process) resumed
    from `snapshot` and stopped there: the test records it gives that snapshot's weights."""
    from digits_memplugin.jobs.child.attempt_spec import AttemptSpec
    from digits_memplugin.jobs.definition.attempt_files import write_attempt

    folder = manager.folder(job.id)
    definition = manager.definitions.get(job)
    first = AttemptSpec.read(folder / "attempts" / "1" / "attempt.json")
    files = write_attempt(definition, folder, "attempts/shared-check", batch_size=first.batch_size, iter_size=1,
                          test_batch=None, gpu=None, max_iter=snapshot["iteration"], test_interval=K)
    spec = dataclasses.replace(
        first, attempt=99, solver=files.solver, log="attempts/shared-check/caffe.log", memory_cap=None,
        progress="attempts/shared-check/progress.jsonl", resume=snapshot["state"], max_iter=snapshot["iteration"],
        test_net="shared", pause_at_tests=False, tests_from=0, skip_forwards=0, seconds_before=0.0,
        write_paths=files.writes,
    )
    spec.write(folder / "attempts" / "shared-check" / "attempt.json")
    run = subprocess.run([sys.executable, "-m", "digits_memplugin.jobs.child.runner", "attempts/shared-check/attempt.json"],
                         cwd=folder, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, (folder / "attempts/shared-check/caffe.log").read_text()[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines() if '"event": "test"' in line]


@pytest.mark.slow
def test_under_a_cap_apart_trains_the_batch_shared_cannot_and_tests_as_shared_does(
    make_manager: ManagerFactory,
) -> None:
    manager = make_manager()
    asked = {"net": BIG_TEST_NET, "batch": 512, "memory_cap": CAP, "max_iter": 2 * K,
             "solver": SOLVER.replace("test_iter: 2", "test_iter: 1")}
    shared = trained(manager, request(test_net="shared", **asked))
    apart = trained(manager, request(test_net="apart", **asked))
    auto = trained(manager, request(**asked))  # the default: apart pays (six iter_size passes fewer), until measured

    (held_back,) = manager.attempts(shared.id)
    (alone,) = manager.attempts(apart.id)
    assert (held_back.batch_size, held_back.iter_size) == (74, 7) and held_back.test_net == "shared"
    assert (alone.batch_size, alone.iter_size) == (512, 1) and alone.test_net == "apart"
    # `auto` kept the test nets apart until the first interval measured what stopping for the tester costs here (a
    # second or so against under a second of LeNet's training: far over 5%), then went on with them shared from the
    # snapshot where it stopped, at the batch the shared plan gives, keeping the effective batch.
    measured, chosen = manager.attempts(auto.id)
    assert (measured.status, measured.test_net, measured.batch_size, measured.iter_size) == ("replanned", "apart", 512, 1)
    assert measured.tester["stop_cost"] >= 0.05 and measured.tester["tested"][:2] == [0, K]
    assert "stopping and resuming for the tester costs" in measured.message and "not under 5%" in measured.message
    assert (chosen.test_net, chosen.batch_size, chosen.iter_size) == ("shared", 74, 7)
    assert chosen.start_iteration == measured.end_iteration >= K and chosen.resumed_from is not None
    # Each interval tested once over both attempts: a snapshot its tester tested is not tested again on resuming.
    across = [r["iteration"] for r in records(manager, auto, tester=True) if r["event"] == "test"]
    across += [r["iteration"] for r in records(manager, auto, 2) if r["event"] == "test"]
    assert sorted(across) == [0, K, 2 * K]
    for attempt in (held_back, alone, chosen):
        assert attempt.status == "success" and attempt.limit_bytes is not None and attempt.limit_bytes <= CAP
    # Each ran under the real cap, the tester too, and stayed within it.
    started = [r for r in records(manager, apart, tester=True) if r["event"] == "started"]
    assert started and all(r["memory_cap"] == CAP for r in started)
    assert alone.tester["peak_bytes"] is not None and alone.tester["peak_bytes"] <= CAP
    assert alone.peak_bytes is not None and alone.peak_bytes <= CAP

    # The tester's results at each snapshot are the shared runner's on the same weights, to the last bit.
    tests = {r["iteration"]: r for r in records(manager, apart, tester=True) if r["event"] == "test"}
    assert sorted(tests) == [0, K, 2 * K]
    snapshots = [r for r in records(manager, apart) if r["event"] == "snapshot" and r["iteration"] in (K, 2 * K)]
    for snapshot in snapshots:
        (expected,) = shared_runner_test(manager, apart, snapshot)
        got = tests[snapshot["iteration"]]
        assert (got["outputs"], got["loss"]) == (expected["outputs"], expected["loss"])


BESIDE = "cpu-beside"
"""A second device for the tester that is this machine's CPU again: this machine has no second device (no GPU), and
what is tested here is the attempt's way of testing beside training (the trainer never stops, the testers run in
turn while it trains, their results arrive in order), not a device's arithmetic."""


@pytest.mark.slow
def test_a_tester_on_another_device_runs_while_training_goes_on_and_its_results_come_in_order(
    make_manager: ManagerFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from digits_memplugin.core.planning.apart import TesterDevice
    from digits_memplugin.jobs.scheduling.attempt_loop import AttemptLoop

    def beside(self: AttemptLoop, *args: Any, **kwargs: Any) -> tuple[TesterDevice, ...]:
        return (TesterDevice(BESIDE, "cpu", 8 << 30, 0.03),)

    monkeypatch.setattr(AttemptLoop, "tester_devices", beside)
    events: list[tuple[str, dict[str, Any]]] = []
    manager = make_manager(events)
    every = 10  # intervals of about a second at batch 128: the testers start while training goes on
    asked = {"solver": SLOW_TESTS.replace("test_iter: 400", "test_iter: 20"), "batch": 128, "max_iter": 4 * every,
             "test_interval": every}
    shared = trained(manager, request(test_net="shared", **asked))
    apart = trained(manager, request(test_net="apart", **asked))
    due = [0, every, 2 * every, 3 * every, 4 * every]

    (attempt,) = manager.attempts(apart.id)
    assert attempt.test_net == "apart" and attempt.tester["device"] == BESIDE and not attempt.tester["same_device"]
    assert attempt.tester["tested"] == due and attempt.tester["pauses"] == 0
    trainer = records(manager, apart)
    assert [r["event"] for r in trainer].count("started") == 1 and "paused" not in [r["event"] for r in trainer]
    tester = records(manager, apart, tester=True)
    # The testers ran while the trainer trained: the first began before training ended.
    finished = next(r["time"] for r in trainer if r["event"] == "finished")
    assert min(r["time"] for r in tester if r["event"] == "started") < finished
    # Their results, in order, are the job's tests, as events too; and the same as with the test nets shared.
    tests = [r for r in tester if r["event"] == "test"]
    assert [r["iteration"] for r in tests] == due
    told = [p for name, p in events if name == "job_progress" and p["job_id"] == apart.id and p["event"] == "test"]
    assert [(p["attempt"], p["iteration"]) for p in told] == [(1, r["iteration"]) for r in tests]
    expected = [key(r) for r in records(manager, shared) if r["event"] == "test"]
    assert [key(r) for r in tests] == expected
    assert manager.get(apart.id).progress["test"][0]["iteration"] == 4 * every


@pytest.mark.slow
def test_a_tester_out_of_memory_ends_its_attempt_and_the_job_goes_on_with_its_test_nets_shared(
    make_manager: ManagerFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tester really runs out of memory (a real cap, RLIMIT_DATA): here because it is given less than planned,
    as when another process takes memory on the tester's device between the plan and the test."""
    from digits_memplugin.jobs.scheduling.apart_run import TesterPlace
    from digits_memplugin.jobs.scheduling.attempt_loop import AttemptLoop

    planned = AttemptLoop._tester_place

    def squeezed(self: AttemptLoop, *args: Any) -> TesterPlace:
        return dataclasses.replace(planned(self, *args), memory_cap=8 << 20)

    monkeypatch.setattr(AttemptLoop, "_tester_place", squeezed)
    manager = make_manager()
    job = trained(manager, request(test_net="apart", net=BIG_TEST_NET))
    first, second = manager.attempts(job.id)
    assert (first.status, first.test_net) == ("out_of_memory", "apart")
    assert first.tester["failed"].startswith("tester: ") and first.tester["tested"] == []
    assert "the tester of iteration 0" in first.message and "ran out of memory" in first.message
    assert first.out_of_memory is not None
    # A tester never shrinks its batch: the next attempt has its test nets shared, from the pause's snapshot on.
    assert second.test_net == "shared" and second.status == "success" and second.tester is None
    assert (second.batch_size, second.iter_size) == (first.batch_size, first.iter_size)
    assert second.resumed_from is not None and second.start_iteration == 0
    tests = [r["iteration"] for r in records(manager, job, 2) if r["event"] == "test"]
    assert tests == [0, K, 2 * K, 3 * K]


def test_a_tester_left_by_a_previous_server_is_reaped_as_a_runner_is(tmp_path: Path) -> None:
    """The store names the child an attempt started last (a tester, with the test nets apart): a next server kills
    it if the previous one's death did not, and nothing else that happens to have its pid."""
    from digits_memplugin.jobs.store.datafolder import kill_leftover
    from digits_memplugin.jobs.store.records import Attempt

    folder = tmp_path / "jobs" / "j1"
    folder.mkdir(parents=True)
    code = "import sys, time; time.sleep(60)"
    ours = subprocess.Popen([sys.executable, "-c", code, "-m", "digits_memplugin.jobs.child.tester", "t.json"],
                            cwd=folder, process_group=0)
    other = subprocess.Popen([sys.executable, "-c", code, "not-ours"], cwd=folder, process_group=0)
    try:
        for child in (ours, other):
            kill_leftover(Attempt(job_id="j1", number=1, status="running", device="cpu", batch_size=1, iter_size=1,
                                  started_at=0.0, log="attempts/1/caffe.log", handle=f"pid:{child.pid}"),
                          tmp_path / "jobs")
        assert ours.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for child in (ours, other):
            if child.poll() is None:
                child.kill()
                child.wait()


def test_what_a_paused_trainer_left_stays_held_for_the_attempt() -> None:
    """Reservations (jobs.run_state.reserved): an attempt's estimate less what it holds; with the test nets apart on
    its device, what its running child holds now, not its peak: a paused trainer's memory is not another job's."""
    from digits_memplugin.jobs.run_state import Running, reserved

    apart = Running("a", "GPU-1", "gpu", estimated=100, peak=100, holds_between=True)
    shared = Running("s", "GPU-1", "gpu", estimated=100, peak=100)
    assert reserved([apart], "GPU-1") == 100 and reserved([shared], "GPU-1") == 0
    apart.used = 60
    assert reserved([apart, shared], "GPU-1") == 40
    beside = Running("b", "GPU-1", "gpu", estimated=10, peak=10, tester_device="GPU-2", tester_estimated=70)
    beside.tester_used = 30
    assert reserved([beside], "GPU-2") == 40 and reserved([beside], "GPU-1") == 0
    cpu = Running("c", "cpu", "cpu", estimated=50, holds_between=True)
    cpu.holds(20, "iteration")
    assert (cpu.peak, cpu.used, reserved([cpu], "cpu")) == (20, 20, 30)
    cpu.holds(25, "paused")
    assert (cpu.peak, cpu.used, reserved([cpu], "cpu")) == (25, 0, 50)
