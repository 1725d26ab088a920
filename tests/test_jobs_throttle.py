"""web.socket.throttle: progress and log events limited per job and per second, the latest never lost, order kept.

A fake clock and a flusher that the test runs by hand make every case exact."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest

from digits_memplugin.web.socket.throttle import EventThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, per_second: float = 4.0) -> None:
        self.clock = Clock()
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.flushers: list[Callable[[], None]] = []
        self.throttle = EventThrottle(
            lambda name, payload: self.sent.append((name, payload)), per_second,
            spawn=self.flushers.append, sleep=self.advance, clock=self.clock,
        )

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    def iteration(self, n: int, job: str = "a") -> None:
        self.throttle("job_progress", {"job_id": job, "attempt": 1, "event": "iteration", "iteration": n})

    def run_flusher(self) -> None:
        """One flusher task, run to its end (it sleeps by advancing the clock)."""
        self.flushers.pop(0)()


def iterations(sent: list[tuple[str, dict[str, Any]]]) -> list[int]:
    return [p["iteration"] for name, p in sent if name == "job_progress" and p["event"] == "iteration"]


def test_iterations_beyond_the_rate_are_coalesced_and_the_latest_is_sent() -> None:
    h = Harness(per_second=4.0)
    for n in range(1, 101):  # a burst within one instant
        h.iteration(n)
    assert iterations(h.sent) == [1]
    assert len(h.flushers) == 1
    h.run_flusher()
    assert iterations(h.sent) == [1, 100]  # the latest one, after one interval
    assert h.flushers == []  # the flusher ended: nothing pending


class SimulatedTime:
    """A clock for the throttle and for its real flusher threads: a flusher's sleep blocks until the test moves the
    clock past its end. The test's `advance_to` wakes each sleeper at its own wake-up time, in order, and returns once
    every flusher is asleep again or has ended, so a stream of events is replayed exactly, on any machine."""

    def __init__(self) -> None:
        self.now = 100.0
        self._changed = threading.Condition()
        self._wakeups: list[float] = []
        self.active = 0
        self.spawned = 0

    def __call__(self) -> float:
        with self._changed:
            return self.now

    def spawn(self, target: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                target()
            finally:
                with self._changed:
                    self.active -= 1
                    self._changed.notify_all()

        with self._changed:
            self.active += 1
            self.spawned += 1
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def sleep(self, seconds: float) -> None:
        with self._changed:
            wake = self.now + seconds
            self._wakeups.append(wake)
            self._changed.notify_all()
            assert self._changed.wait_for(lambda: self.now >= wake, timeout=30), "the test never moved the clock"
            self._wakeups.remove(wake)
            self._changed.notify_all()

    def _settled(self) -> bool:
        """Every flusher alive is asleep until a time still to come."""
        return len([wake for wake in self._wakeups if wake > self.now]) == self.active

    def settle(self) -> None:
        with self._changed:
            assert self._changed.wait_for(self._settled, timeout=30), "a flusher neither slept nor ended"

    def advance_to(self, moment: float) -> None:
        self.settle()
        while True:
            with self._changed:
                due = [wake for wake in self._wakeups if wake <= moment]
                self.now = min(due) if due else moment
                self._changed.notify_all()
            self.settle()
            if not due:
                return


def test_at_most_n_per_second_over_a_steady_stream() -> None:
    """Real flusher threads on a simulated clock: 20 events a second allowed, 1000 offered over a second (one a
    millisecond); every two sent are an interval apart, and the last one offered arrives."""
    clock = SimulatedTime()
    sent: list[tuple[float, int]] = []
    throttle = EventThrottle(lambda name, payload: sent.append((clock.now, payload["iteration"])), 20.0,
                             spawn=clock.spawn, sleep=clock.sleep, clock=clock)
    start = clock.now
    n = 0
    for millisecond in range(1000):
        clock.advance_to(start + millisecond / 1000)
        n += 1
        throttle("job_progress", {"job_id": "a", "event": "iteration", "iteration": n})
    clock.advance_to(start + 2.0)  # long after the stream: the flusher has sent what was pending and ended
    clock.settle()
    times = [t for t, _ in sent]
    assert sent[-1][1] == n  # the latest is never lost
    assert sent[0] == (start, 1)  # the first at once
    elapsed = times[-1] - times[0]
    assert len(times) <= 20 * elapsed + 2
    assert all(later - earlier >= throttle.interval - 1e-9 for earlier, later in itertools.pairwise(times)), times
    assert n > 200 and len(times) < n / 5  # it really throttled
    assert clock.spawned >= 1 and clock.active == 0  # a flusher ran, and it ended once nothing was pending


def test_attempt_events_send_what_is_pending_first() -> None:
    h = Harness()
    h.iteration(1)
    h.iteration(2)
    h.throttle("job_log", {"job_id": "a", "attempt": 1, "lines": ["one"]})
    h.throttle("job_log", {"job_id": "a", "attempt": 1, "lines": ["two"]})
    h.throttle("job_attempt", {"job_id": "a", "number": 1, "status": "success"})
    assert [(name, p.get("event") or p.get("lines") or p.get("status")) for name, p in h.sent] == [
        ("job_progress", "iteration"), ("job_log", ["one"]), ("job_log", ["two"]), ("job_progress", "iteration"),
        ("job_attempt", "success"),
    ]


def test_other_events_go_out_at_once_and_do_not_break_the_rate() -> None:
    h = Harness()
    for n in range(1, 11):
        h.iteration(n)
        h.throttle("job_progress", {"job_id": "a", "attempt": 1, "event": "snapshot", "iteration": n})
        h.throttle("job", {"id": "a", "status": "running"})
    assert iterations(h.sent) == [1]  # snapshots and job states do not release the coalesced iterations
    assert len([name for name, p in h.sent if name == "job_progress" and p["event"] == "snapshot"]) == 10
    assert len([name for name, _ in h.sent if name == "job"]) == 10
    h.run_flusher()
    assert iterations(h.sent) == [1, 10]


def test_log_lines_are_batched_never_dropped() -> None:
    h = Harness()
    for n in range(50):
        h.throttle("job_log", {"job_id": "a", "attempt": 1, "lines": [f"line {n}"]})
    h.run_flusher()
    lines = [line for name, p in h.sent if name == "job_log" for line in p["lines"]]
    assert lines == [f"line {n}" for n in range(50)]
    assert len([name for name, _ in h.sent if name == "job_log"]) == 2


def test_jobs_are_throttled_separately() -> None:
    h = Harness()
    h.iteration(1, job="a")
    h.iteration(1, job="b")
    assert [(p["job_id"], p["iteration"]) for _, p in h.sent] == [("a", 1), ("b", 1)]


def test_flush_sends_everything_pending() -> None:
    h = Harness()
    h.iteration(1)
    h.iteration(2)
    h.throttle("job_log", {"job_id": "a", "attempt": 1, "lines": ["x"]})
    h.throttle("job_log", {"job_id": "a", "attempt": 1, "lines": ["y"]})
    h.throttle.flush()
    assert iterations(h.sent) == [1, 2]
    assert [line for name, p in h.sent if name == "job_log" for line in p["lines"]] == ["x", "y"]


def test_the_rate_must_be_positive() -> None:
    with pytest.raises(ValueError):
        EventThrottle(lambda name, payload: None, 0)
