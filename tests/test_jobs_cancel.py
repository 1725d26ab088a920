"""Cancel keeps the work (issue 26 point 3): a cancel is SIGINT, which the training child honours between two steps
(or two forward passes of a test pass) by writing a snapshot and a "stopped" record, as `caffe train`'s default
`--sigint_effect=stop` does; Resume then continues from it. A child that does not stop within the bound is stopped
as before (SIGTERM, then SIGKILL), and says so. Real pycaffe children on LeNet, as the other job tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import LENET_SOLVER, ManagerFactory, lenet_request, pid_alive, runner_pid, wait_for

from digits_memplugin.jobs.backends.attempt_process import AttemptProcess
from digits_memplugin.jobs.manager import JobManager

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]  # the datasets and make_manager fixtures

RARE_SNAPSHOTS = LENET_SOLVER.replace("test_iter: 100", "test_iter: 2")
"""The zoo's LeNet solver (a snapshot every 5000 iterations, as DIGITS' default) with a quick test pass."""


def main_thread_cpu_seconds(pid: int) -> float:
    """CPU time of a process's main thread alone (its /proc task), without the threads Caffe starts to prefetch."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def records(manager: JobManager, job_id: str, attempt: int) -> list[dict[str, Any]]:
    path = manager.folder(job_id) / "attempts" / str(attempt) / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cancel_snapshots_the_work_and_resume_continues_from_it(make_manager: ManagerFactory) -> None:
    manager = make_manager()
    request = dataclasses.replace(lenet_request(max_iter=100_000), solver=RARE_SNAPSHOTS)
    job = manager.submit(request)
    pid = runner_pid(manager, job)
    wait_for(lambda: manager.get(job.id).iteration >= 12, what="12 iterations")
    assert manager.get(job.id).snapshot is None  # the interval is far off: nothing saved yet
    asked = time.monotonic()
    manager.cancel(job.id)
    cancelled = manager.wait(job.id, timeout=60)
    took = time.monotonic() - asked
    assert cancelled.status == "cancelled"
    assert not pid_alive(pid)

    # The child stopped by itself (exit 0, no signal), after one snapshot of where it was.
    [attempt] = manager.attempts(job.id)
    assert (attempt.status, attempt.exit_code, attempt.signal) == ("cancelled", 0, None)
    got = records(manager, job.id, 1)
    stopped = got[-1]
    assert stopped["event"] == "stopped" and stopped["iteration"] >= 12
    iteration = stopped["iteration"]
    snapshot = [r for r in got if r["event"] == "snapshot"]
    assert [r["iteration"] for r in snapshot] == [iteration]
    assert stopped["snapshot"] == snapshot[0]["state"]
    folder = manager.folder(job.id)
    assert (folder / snapshot[0]["state"]).is_file() and (folder / snapshot[0]["model"]).is_file()
    assert cancelled.snapshot == {key: snapshot[0][key] for key in ("iteration", "model", "state")}
    assert attempt.end_iteration == iteration
    message = f"cancelled at iteration {iteration}; a snapshot of it was saved (Resume continues from it)"
    assert attempt.message == message and cancelled.message == message
    # Caffe's log ends as `caffe train`'s does after a SIGINT.
    assert f"Optimization stopped early at iteration {iteration}; snapshot " in (folder / attempt.log).read_text()
    assert took < 30, f"the cancel took {took:.1f} s"

    assert manager.resume(job.id).message == f"waiting to resume from iteration {iteration}"
    second = wait_for(lambda: [a for a in manager.attempts(job.id) if a.number == 2], what="attempt 2")[0]
    assert (second.resumed_from, second.start_iteration) == (snapshot[0]["state"], iteration)
    wait_for(lambda: manager.get(job.id).iteration > iteration, what="training to continue")
    assert records(manager, job.id, 2)[1]["event"] == "constructed"
    assert records(manager, job.id, 2)[1]["iteration"] == iteration  # restored, not from 0
    manager.cancel(job.id)
    manager.wait(job.id, timeout=60)


def test_a_cancel_during_a_test_pass_ends_it_at_once(make_manager: ManagerFactory) -> None:
    """The stop is honoured between two forward passes too: a cancel during the initial test pass (20,000 passes,
    minutes) ends the attempt in seconds, before training, with nothing to snapshot."""
    manager = make_manager()
    long_test = RARE_SNAPSHOTS.replace("test_iter: 2", "test_iter: 20000")
    job = manager.submit(dataclasses.replace(lenet_request(max_iter=100_000), solver=long_test))
    progress = manager.folder(job.id) / "attempts" / "1" / "progress.jsonl"
    wait_for(lambda: progress.is_file() and '"constructed"' in progress.read_text(), what="the solver")
    # After its "constructed" record the child does nothing but the initial test pass: CPU time its main thread
    # spends from now on is spent in it.
    pid = runner_pid(manager, job)
    spent = main_thread_cpu_seconds(pid)
    wait_for(lambda: main_thread_cpu_seconds(pid) >= spent + 0.3, what="the test pass to be under way")
    asked = time.monotonic()
    manager.cancel(job.id)
    cancelled = manager.wait(job.id, timeout=60)
    assert time.monotonic() - asked < 15
    [attempt] = manager.attempts(job.id)
    assert (attempt.status, attempt.exit_code, attempt.signal) == ("cancelled", 0, None)
    got = records(manager, job.id, 1)
    assert got[-1]["event"] == "stopped" and got[-1]["iteration"] == 0 and got[-1]["snapshot"] is None
    assert not [r for r in got if r["event"] in ("test", "snapshot")]
    assert cancelled.message == "cancelled before training started (nothing to snapshot)"
    assert "Test interrupted." in (manager.folder(job.id) / attempt.log).read_text()


IGNORES_SIGINT = """
import json, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
if sys.argv[1] == "both":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("signals set", file=sys.stderr, flush=True)
for iteration in range(1, 3000):  # 60 s at most, whatever happens
    print(json.dumps({"event": "iteration", "iteration": iteration, "loss": 2.3}), flush=True)
    time.sleep(0.02)  # a child that trains slowly, as a real one does: what is tested
"""
"""A child that does not honour the cancel's SIGINT (a runner stuck in a step, a `caffe` told to ignore it); it
says on its log (stderr) once its signals are set."""


def signals_set(log: Path) -> bool:
    return log.is_file() and "signals set" in log.read_text()


@pytest.mark.parametrize(("ignores", "signal_name"), [("sigint", "SIGTERM"), ("both", "SIGKILL")])
def test_a_child_that_does_not_stop_in_time_is_stopped_without_a_snapshot(
    tmp_path: Path, ignores: str, signal_name: str
) -> None:
    process = AttemptProcess(
        tmp_path, "attempt.json", "caffe.log", grace_seconds=0.5, cancel_seconds=1.0,
        command=[sys.executable, "-c", IGNORES_SIGINT, ignores],
    )
    process.start()
    wait_for(lambda: signals_set(tmp_path / "caffe.log"), what="the child to set its signals")
    asked = time.monotonic()
    process.cancel()
    result = process.wait()
    took = time.monotonic() - asked
    assert 1.0 <= took < 10, took  # the bound was waited for, then the stop as before
    assert result.outcome.status == "cancelled" and result.outcome.signal == signal_name
    assert result.stopped is None
    assert result.outcome.message.startswith(f"cancelled at iteration {result.last_iteration} without a snapshot: ")
    assert f"did not snapshot and stop within 1 s of the request, so it was ended ({signal_name})" in (
        result.outcome.message
    )


STOPS_LIKE_CAFFE = """
import json, signal, sys, time
asked = []
signal.signal(signal.SIGINT, lambda number, frame: asked.append(number))
print("signals set", file=sys.stderr, flush=True)
iteration = 0
while iteration < 3000:  # 60 s at most, whatever happens
    iteration += 1
    print(json.dumps({"event": "iteration", "iteration": iteration, "loss": 2.3}), flush=True)
    if asked:  # Solver::Step breaks out, Solver::Solve snapshots: records of a runner that reads caffe's log
        print(json.dumps({"event": "snapshot", "iteration": iteration, "model": f"s_iter_{iteration}.caffemodel",
                          "state": f"s_iter_{iteration}.solverstate"}), flush=True)
        sys.exit(0)
    time.sleep(0.02)  # a child that trains slowly, as a real one does: what is tested
"""
"""A runner that honours SIGINT as `caffe train --sigint_effect=stop` does but writes no "stopped" record."""


def test_a_runner_without_stopped_records_that_stops_by_itself_is_said_to_have_kept_its_work(tmp_path: Path) -> None:
    process = AttemptProcess(
        tmp_path, "attempt.json", "caffe.log", grace_seconds=0.5, cancel_seconds=10.0,
        command=[sys.executable, "-c", STOPS_LIKE_CAFFE],
    )
    process.start()
    wait_for(lambda: signals_set(tmp_path / "caffe.log"), what="the child to set its signals")
    process.cancel()
    result = process.wait()
    assert (result.outcome.status, result.outcome.exit_code, result.outcome.signal) == ("cancelled", 0, None)
    assert result.outcome.message == (
        f"cancelled at iteration {result.last_iteration}; a snapshot of it was saved (Resume continues from it)"
    )
