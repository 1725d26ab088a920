"""jobs.scheduling.apart_run.ApartRun's own decisions, one at a time: what a pause leads to, when the stop's cost
ends the attempt "replanned", and how a tester's failure or a cancel ends it. The trainers here are scripted
handles (a backend's, as tests/test_jobs_backend.py's) and the testers a scripted child started as ApartRun starts
the real one (a Python script that answers with the records jobs.child.tester writes), on a clock the script moves:
what is tested is the composite's logic. The real trainer and tester are in tests/test_jobs_apart.py."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from digits_memplugin.core.oom import (
    OUTCOME_CANCELLED,
    OUTCOME_OUT_OF_MEMORY,
    OUTCOME_REPLANNED,
    OUTCOME_SUCCESS,
    Outcome,
)
from digits_memplugin.core.planning.apart import StopCost
from digits_memplugin.jobs.backends.attempt_process import AttemptResult
from digits_memplugin.jobs.backends.local import Launch
from digits_memplugin.jobs.child import tester_spec as specs
from digits_memplugin.jobs.child.attempt_spec import AttemptDevice, AttemptSpec
from digits_memplugin.jobs.scheduling import apart_run
from digits_memplugin.jobs.scheduling.apart_run import ApartRun, SharedWatch

K = 4
Step = tuple[str, Any]
"""A scripted trainer's step: ("record", {...}) handed on, ("tick", seconds) on the clock, ("stop_honoured", it)
stops it there with a "stopped" record if a cancel came, ("end", outcome status)."""

TESTER = r'''
import json, sys, time
spec = json.load(open(sys.argv[-1]))
mode = open("tester-mode").read().strip()
def say(event, **fields):
    print(json.dumps({"event": event, "iteration": spec["iteration"], **fields}), flush=True)
say("started", pid=0)
say("constructed")
if mode == "oom":
    print(json.dumps({"event": "error", "type": "MemoryError", "message": "std::bad_alloc"}), flush=True)
    sys.exit(3)
if mode == "slow":
    time.sleep(30)
say("test", net=0, outputs={"accuracy": spec["iteration"] / 100}, loss=1.0)
say("tested", nets=1, memory_bytes=1000)
'''
"""The tester's records (jobs.child.tester), or an out-of-memory, or a long pass, as the file tester-mode says."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Scripted:
    """A trainer process that hands on its script's records and ends as it says."""

    def __init__(self, launch: Launch, script: Sequence[Step], clock: Clock, number: int) -> None:
        self.launch, self.script, self.clock, self.number = launch, list(script), clock, number
        self.cancelled = threading.Event()

    @property
    def handle(self) -> str:
        return f"pid:{1000 + self.number}"

    @property
    def pid(self) -> int | None:
        return 1000 + self.number

    def cancel(self) -> None:
        self.cancelled.set()

    def kill(self) -> None:
        self.cancelled.set()

    def wait(self) -> AttemptResult:
        last = None
        stopped = None
        for kind, value in self.script:
            if kind == "tick":
                self.clock.now += value
            elif kind == "record":
                last = value.get("iteration", last)
                self.launch.on_record(dict(value))
            elif kind == "stop_honoured" and self.cancelled.is_set():
                stopped = {"event": "stopped", "iteration": value, "snapshot": f"s_iter_{value}.solverstate"}
                self.launch.on_record(stopped)
                return AttemptResult(0, Outcome(OUTCOME_CANCELLED, "cancelled"), 1, value, 10, False, None,
                                     stopped=stopped)
            elif kind == "end":
                status = value
                return AttemptResult(0 if status == OUTCOME_SUCCESS else 134, Outcome(status, status), 1, last, 10,
                                     status == OUTCOME_SUCCESS, None)
        raise AssertionError("a script ends with ('end', status)")


class Backend:
    name = "local"

    def __init__(self, scripts: Sequence[Sequence[Step]], clock: Clock) -> None:
        self.scripts, self.clock = list(scripts), clock
        self.launched: list[Scripted] = []

    def launch(self, launch: Launch) -> Scripted:
        handle = Scripted(launch, self.scripts.pop(0), self.clock, len(self.launched) + 1)
        self.launched.append(handle)
        return handle


def stretch(start: int, end: int, *, pause: bool, per_iteration: float = 1.0, start_seconds: float = 2.0) -> list[Step]:
    """A trainer's script from `start` to `end`: built in `start_seconds`, one iteration each `per_iteration`
    seconds, a snapshot due a test at `end`, then paused (or finished)."""
    steps: list[Step] = [("tick", start_seconds), ("record", {"event": "constructed", "iteration": start})]
    steps.append(("stop_honoured", start))
    for iteration in range(start + 1, end + 1):
        steps += [("tick", per_iteration), ("record", {"event": "iteration", "iteration": iteration})]
    state = f"snapshots/s_iter_{end}.solverstate"
    steps += [("record", {"event": "snapshot", "iteration": end, "model": state.replace("solverstate", "caffemodel"),
                          "state": state}),
              ("record", {"event": "test_due", "iteration": end, "model": state.replace("solverstate", "caffemodel"),
                          "state": state})]
    steps.append(("record", {"event": "paused", "iteration": end, "snapshot": state}) if pause
                 else ("record", {"event": "finished", "iteration": end}))
    return [*steps, ("end", OUTCOME_SUCCESS)]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "attempts" / "1").mkdir(parents=True)
    (tmp_path / "tester.py").write_text(TESTER)
    (tmp_path / "tester-mode").write_text("ok")
    return tmp_path


def make_run(
    folder: Path, scripts: Sequence[Sequence[Step]], *, auto: bool = False, train_items: int | None = None,
    shared_interval: float | None = None,
) -> tuple[ApartRun, Backend, list[dict[str, Any]], Clock]:
    clock = Clock()
    backend = Backend(scripts, clock)
    records: list[dict[str, Any]] = []
    spec = AttemptSpec(
        job_id="j1", attempt=1, solver="attempts/1/solver.prototxt", log="attempts/1/caffe.log",
        progress="attempts/1/progress.jsonl", device=AttemptDevice("cpu"), batch_size=24, iter_size=2, resume=None,
        memory_cap=None, max_iter=3 * K, test_interval=K, test_iter=(2,), test_initialization=False, snapshot=0,
        snapshot_after_train=False, snapshot_prefix="snapshots/s", snapshot_format="BINARYPROTO", schedule={},
        test_net="apart", pause_at_tests=True,
    )
    launch = Launch(folder, "attempts/1/attempt.json", spec, "cpu", {}, on_record=records.append,
                    on_log=lambda lines: None, grace_seconds=1.0, stall_seconds=None, cancel_seconds=5.0)
    place = apart_run.TesterPlace("cpu", True, AttemptDevice("cpu"), {}, None, 1000,
                                  (specs.TestNet("attempts/1/test0.prototxt", 2),), auto, train_items, shared_interval)
    run = ApartRun(backend, launch, place, attempt_dir="attempts/1", clock=clock)
    run.python = str(folder / "python")
    (folder / "python").write_text(f"#!/bin/sh\nexec {sys.executable} {folder / 'tester.py'} \"$@\"\n")
    (folder / "python").chmod(0o755)
    return run, backend, records, clock


def events(records: list[dict[str, Any]], kind: str) -> list[Any]:
    return [record.get("iteration") for record in records if record["event"] == kind]


def test_a_pause_tests_its_snapshot_then_resumes_past_it_where_the_data_was(folder: Path) -> None:
    run, backend, records, _ = make_run(folder, [stretch(0, K, pause=True), stretch(K, 2 * K, pause=False)],
                                        train_items=100)
    run.start()
    result = run.wait()
    assert result.outcome.status == OUTCOME_SUCCESS and result.finished
    assert events(records, "test") == [K, 2 * K]  # the tester's results, handed on as the runner's would be
    assert run.report.tested == [K, 2 * K] and run.report.pauses == 1 and run.report.failed is None
    second = backend.launched[1].launch.spec
    assert (second.resume, second.tests_from) == (f"snapshots/s_iter_{K}.solverstate", K + 1)
    # K iterations of 2 passes at batch 24 on 100 items: 8 passes of the data layers (they come round every 25).
    assert second.skip_forwards == 2 * K and second.seconds_before > 0
    assert AttemptSpec.read(folder / "attempts/1/attempt.json") == second  # the file the child reads
    tester = json.loads((folder / "attempts/1/tester" / f"iter_{K}.json").read_text())
    assert tester["weights"] == f"snapshots/s_iter_{K}.caffemodel" and tester["iteration"] == K
    assert "snapshots" not in tester["write_paths"]


def test_the_skip_comes_round_with_the_training_set() -> None:
    """forwards x batch mod items is where the data is: 40 iterations x 2 passes at batch 24 on 100 items is 80
    passes, and the position comes round every 25."""
    clock = Clock()
    spec = AttemptSpec(
        job_id="j", attempt=1, solver="s", log="l", progress="p", device=AttemptDevice("cpu"), batch_size=24,
        iter_size=2, resume=None, memory_cap=None, max_iter=100, test_interval=40, test_iter=(1,),
        test_initialization=False, snapshot=0, snapshot_after_train=False, snapshot_prefix="s",
        snapshot_format="BINARYPROTO", schedule={},
    )
    for items, expected in ((100, 80 % 25), (None, 80), (96, 80 % 4)):
        launch = Launch(Path("."), "a.json", spec, "cpu", {}, lambda r: None, lambda lines: None, 1.0, None)
        place = apart_run.TesterPlace("cpu", True, AttemptDevice("cpu"), {}, None, 1, (), False, items)
        run = ApartRun(Backend([], clock), launch, place, attempt_dir="a", clock=clock)
        run._stretches.append(_stretch_at(0))
        assert run._skip(spec, 40) == expected


def _stretch_at(iteration: int) -> Any:
    return apart_run._Stretch(0.0, 0.0, (iteration, 0.0))


def test_auto_replans_once_pausing_costs_five_percent_of_an_interval(folder: Path) -> None:
    """Intervals of 4 s of training, a restart of 2 s: 50%. The resumed trainer is stopped as soon as it is built,
    and the attempt ends replanned there, its cost said."""
    run, backend, records, _ = make_run(folder, [stretch(0, K, pause=True), stretch(K, 2 * K, pause=False)],
                                        auto=True)
    run.start()
    result = run.wait()
    assert result.outcome.status == OUTCOME_REPLANNED, result.outcome
    assert backend.launched[1].cancelled.is_set()
    assert run.report.tested == [K] and run.report.interval_seconds == 4.0
    assert run.report.setup_seconds is not None and run.report.setup_seconds >= 2.0
    assert (run.report.cost.fraction or 0) >= 0.05
    assert result.outcome.message.startswith(f"replanned at iteration {K}: stopping and resuming for the tester")
    assert events(records, "stopped") == [K]


def test_auto_keeps_apart_while_pausing_costs_under_five_percent(folder: Path) -> None:
    """Intervals of 400 s, a restart of 2 s: 0.5%. Training goes on apart."""
    slow = [stretch(0, K, pause=True, per_iteration=100.0), stretch(K, 2 * K, pause=False, per_iteration=100.0)]
    run, backend, _, _ = make_run(folder, slow, auto=True)
    run.start()
    result = run.wait()
    assert result.outcome.status == OUTCOME_SUCCESS and not backend.launched[1].cancelled.is_set()
    assert run.report.tested == [K, 2 * K] and (run.report.cost.fraction or 1) < 0.05


def test_a_trainer_that_pauses_before_the_stop_comes_ends_the_attempt_at_its_pause_tested(folder: Path) -> None:
    """The stop is asked for, but the trainer gets to its next interval first: its snapshot is tested, and the
    attempt ends replanned there rather than at a stop that never came."""
    no_stop = [step for step in stretch(K, 2 * K, pause=True) if step[0] != "stop_honoured"]
    run, _, records, _ = make_run(folder, [stretch(0, K, pause=True), no_stop], auto=True)
    run.start()
    result = run.wait()
    assert result.outcome.status == OUTCOME_REPLANNED
    assert run.report.tested == [K, 2 * K] and events(records, "test") == [K, 2 * K]
    assert f"replanned at iteration {2 * K}" in result.outcome.message


def test_a_tester_out_of_memory_ends_the_attempt_as_the_testers(folder: Path) -> None:
    (folder / "tester-mode").write_text("oom")
    run, backend, records, _ = make_run(folder, [stretch(0, K, pause=True)])
    run.start()
    result = run.wait()
    assert result.outcome.status == OUTCOME_OUT_OF_MEMORY, result.outcome
    assert result.outcome.message.startswith(f"the tester of iteration {K}")
    assert run.report.failed is not None and run.report.failed.startswith("tester: ")
    assert len(backend.launched) == 1 and events(records, "test") == []


def test_a_cancel_while_the_tester_runs_keeps_the_pauses_snapshot(folder: Path) -> None:
    (folder / "tester-mode").write_text("slow")
    run, backend, records, _ = make_run(folder, [stretch(0, K, pause=True)])
    run.start()
    waiting = threading.Thread(target=lambda: results.append(run.wait()))
    results: list[AttemptResult] = []
    waiting.start()
    wait_until(lambda: run._tester is not None and run._tester.process is not None)
    run.cancel()
    waiting.join(timeout=60)
    (result,) = results
    assert result.outcome.status == OUTCOME_CANCELLED
    assert f"cancelled at iteration {K}; a snapshot of it was saved" in result.outcome.message
    assert run.report.tested == [] and len(backend.launched) == 1 and events(records, "test") == []


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0) -> None:
    import time

    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_past_five_percent_auto_keeps_apart_where_an_interval_shared_was_measured_slower(folder: Path) -> None:
    """A 2 s stop per 4 s interval (50%), but the job's shared attempt took 7 s an interval: apart, 6 s with its stop,
    is faster, and training goes on apart. Had shared taken 5 s, the attempt would end replanned, saying so."""
    run, backend, _, _ = make_run(folder, [stretch(0, K, pause=True), stretch(K, 2 * K, pause=False)], auto=True,
                                  shared_interval=7.0)
    run.start()
    assert run.wait().outcome.status == OUTCOME_SUCCESS and not backend.launched[1].cancelled.is_set()
    assert run.report.cost.apart_faster and run.report.shared_interval_seconds == 7.0
    (folder / "attempts" / "1" / "tester").rename(folder / "attempts" / "1" / "tester-before")
    run, _, _, _ = make_run(folder, [stretch(0, K, pause=True), stretch(K, 2 * K, pause=False)], auto=True,
                            shared_interval=5.0)
    run.start()
    result = run.wait()
    assert result.outcome.status == OUTCOME_REPLANNED and "(shared is faster)" in result.outcome.message


def watched(cost: StopCost, records: Sequence[tuple[float, dict[str, Any]]]) -> tuple[SharedWatch, Scripted]:
    """A SharedWatch fed `records` at their times, on a handle whose cancel it may ask for."""
    clock = Clock()
    watch = SharedWatch(cost, K, clock=clock)
    handle = Scripted(None, [], clock, 1)  # type: ignore[arg-type] - only its cancel is used
    watch.attach(handle)
    for at, record in records:
        clock.now = at
        watch.on_record(record)
    return watch, handle


def interval_shared(per_iteration: float, test_pass: float) -> list[tuple[float, dict[str, Any]]]:
    """A shared attempt resumed at 5: iterations every `per_iteration` s, and at 8 a test pass of `test_pass` s."""
    records, now = [(0.0, {"event": "constructed", "iteration": 5})], 0.0
    for iteration in range(6, 10):
        now += per_iteration
        records.append((now, {"event": "iteration", "iteration": iteration}))
        if iteration == 8:
            now += test_pass
            records.append((now, {"event": "test", "iteration": 8, "net": 0}))
    return records


def test_a_shared_interval_is_timed_without_its_test_pass_and_stops_the_attempt_where_apart_is_faster() -> None:
    apart_cost = StopCost(setup_seconds=2.0, interval_seconds=4.0)  # 50%: auto went shared, not knowing what it gains
    slow, handle = watched(apart_cost, interval_shared(per_iteration=2.0, test_pass=30.0))
    assert slow.measured == 8.0  # 4 iterations of 2 s; the 30 s test pass is not training
    assert slow.replan and handle.cancelled.is_set()  # 8 s shared against 4 + 2 apart
    stopped = AttemptResult(0, Outcome(OUTCOME_CANCELLED, "cancelled"), 5, 9, None, False, None,
                            stopped={"event": "stopped", "iteration": 9, "snapshot": "s_iter_9.solverstate"})
    ended = slow.ended(stopped)
    assert ended.outcome.status == OUTCOME_REPLANNED
    assert ended.outcome.message.startswith("replanned at iteration 9: stopping and resuming for the tester costs 2.0 s")
    assert "apart is faster, its stop included" in ended.outcome.message
    fast, handle = watched(apart_cost, interval_shared(per_iteration=1.0, test_pass=30.0))
    assert fast.measured == 4.0 and not fast.replan and not handle.cancelled.is_set()
    assert fast.ended(stopped) is stopped  # a cancel it did not ask for stays a cancel
