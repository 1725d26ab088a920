"""At most N iteration and log events per second per job, without losing the last of them.

A LeNet attempt reports hundreds of iterations a second and Caffe writes hundreds of log lines while it builds a
net; browsers need a few updates a second. Iteration records beyond the rate are coalesced (the latest is sent
when the interval has passed), log lines are batched (all of them, in order, in the next event). Everything else
(job states, test results, snapshots) goes out at once. An attempt's `job_attempt` event (its start or its end)
and `job_deleted` first send whatever was pending for that job, so a client has an attempt's last iteration
and log lines before the event that says the attempt ended. A background task sends what is pending once its
interval is over, and ends when nothing is pending.

The other direction has a limit too: `ClientRateLimiter` bounds the events one socketio client may send (a token
bucket per client), so a client flooding `subscribe_jobs` cannot make the server spend its time and memory on it.
An event is charged what it costs, not one token whatever it asks for: a page of 500 jobs is a 350 KB answer that
takes the server's one thread some 20 ms, twenty times a cheap event (issue 23, item 3), so it takes as many tokens
(`allow(client, cost)`, the part not used given back with `refund`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Emit = Callable[[str, dict[str, Any]], None]
Spawn = Callable[[Callable[[], None]], Any]
Sleep = Callable[[float], None]

PROGRESS = "job_progress"
LOG = "job_log"
FLUSHING = frozenset({"job_attempt", "job_deleted"})
"""Events that first send what is pending for their job."""


class _Pending:
    def __init__(self) -> None:
        self.progress: dict[str, Any] | None = None
        self.log: dict[str, Any] | None = None
        self.sent_progress = 0.0
        self.sent_log = 0.0


class EventThrottle:
    """Wraps an emit function; call it with every event of the job manager."""

    def __init__(
        self, emit: Emit, per_second: float, *, spawn: Spawn | None = None, sleep: Sleep = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_second <= 0:
            raise ValueError(f"per_second must be positive, got {per_second}")
        self._emit = emit
        self.interval = 1.0 / per_second
        self._spawn = spawn or _thread
        self._sleep = sleep
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[str, _Pending] = {}
        self._flushing = False

    def __call__(self, name: str, payload: dict[str, Any]) -> None:
        job_id = str(payload.get("job_id") or payload.get("id") or "")
        out: list[tuple[str, dict[str, Any]]] = []
        with self._lock:
            pending = self._jobs.setdefault(job_id, _Pending())
            now = self._clock()
            if name == PROGRESS and payload.get("event") == "iteration":
                if now - pending.sent_progress >= self.interval and pending.progress is None:
                    pending.sent_progress = now
                    out.append((name, payload))
                else:
                    pending.progress = payload
                    self._ensure_flusher()
            elif name == LOG:
                if pending.log is None or pending.log.get("attempt") != payload.get("attempt"):
                    out += self._take_log(pending)
                    pending.log = {**payload, "lines": list(payload.get("lines", []))}
                else:
                    pending.log["lines"].extend(payload.get("lines", []))
                if now - pending.sent_log >= self.interval:
                    pending.sent_log = now
                    out += self._take_log(pending)
                else:
                    self._ensure_flusher()
            else:
                if name in FLUSHING:
                    out += self._take_all(pending, now)
                out.append((name, payload))
                if name == "job_deleted":
                    self._jobs.pop(job_id, None)
        for event in out:
            self._emit(*event)

    def flush(self) -> None:
        """Send everything pending now."""
        with self._lock:
            now = self._clock()
            out = [event for pending in self._jobs.values() for event in self._take_all(pending, now)]
        for event in out:
            self._emit(*event)

    def _take_log(self, pending: _Pending) -> list[tuple[str, dict[str, Any]]]:
        if pending.log is None or not pending.log["lines"]:
            pending.log = None
            return []
        event = (LOG, pending.log)
        pending.log = None
        return [event]

    def _take_all(self, pending: _Pending, now: float) -> list[tuple[str, dict[str, Any]]]:
        out = self._take_log(pending)
        if pending.progress is not None:
            out.append((PROGRESS, pending.progress))
            pending.progress = None
            pending.sent_progress = now
        return out

    def _ensure_flusher(self) -> None:
        if not self._flushing:
            self._flushing = True
            self._spawn(self._run)

    def _run(self) -> None:
        while True:
            self._sleep(self.interval)
            out: list[tuple[str, dict[str, Any]]] = []
            with self._lock:
                now = self._clock()
                for pending in self._jobs.values():
                    if pending.progress is not None and now - pending.sent_progress >= self.interval:
                        out.append((PROGRESS, pending.progress))
                        pending.progress = None
                        pending.sent_progress = now
                    if pending.log is not None and now - pending.sent_log >= self.interval:
                        pending.sent_log = now
                        out += self._take_log(pending)
                if not any(p.progress is not None or p.log is not None for p in self._jobs.values()):
                    self._flushing = False
                    idle = True
                else:
                    idle = False
            for event in out:
                self._emit(*event)
            if idle:
                return


class ClientRateLimiter:
    """A token bucket per client: `burst` tokens at once, then `per_second` on average. `allow` says whether a
    client's event may be handled now and takes its cost (in cheap events: 1 unless said otherwise); `forget`
    drops a client that disconnected (the buckets are the only state, one small entry per connected client).

    An event is handled when its client has a token left, and takes its whole cost, so that a costly one puts the
    bucket in debt: the client's next events wait until the debt is paid at `per_second` (a page of 500 jobs, 50
    tokens, leaves a client of 40 with a debt of 10: half a second at 20 a second). The cost is taken before the
    event is handled, so that events handled at once cannot all find the same tokens; `refund` gives back what an
    event turned out not to need (a page asked for 500 jobs lists the 12 stored)."""

    def __init__(self, per_second: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if per_second <= 0 or burst < 1:
            raise ValueError(f"per_second must be positive and burst at least 1, got {per_second} and {burst}")
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}
        """client -> (tokens left, below zero for a debt, and when they were counted)."""
        self.refused = 0
        """Events refused since the start, for the logs and the load benchmark."""

    def _tokens(self, client: str, now: float) -> float:
        tokens, then = self._buckets.get(client, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - then) * self.per_second)

    def allow(self, client: str, cost: float = 1.0) -> bool:
        with self._lock:
            now = self._clock()
            tokens = self._tokens(client, now)
            if tokens < 1.0:
                self._buckets[client] = (tokens, now)
                self.refused += 1
                return False
            self._buckets[client] = (tokens - max(1.0, cost), now)
            return True

    def refund(self, client: str, amount: float) -> None:
        """Give back `amount` tokens an allowed event did not use (never more than a full bucket)."""
        if amount <= 0:
            return
        with self._lock:
            now = self._clock()
            self._buckets[client] = (min(float(self.burst), self._tokens(client, now) + amount), now)

    def retry_after(self, client: str) -> float:
        """Seconds until the client's next event would be allowed: at least one token's time."""
        with self._lock:
            missing = 1.0 - self._tokens(client, self._clock())
        return max(1.0, missing) / self.per_second

    def forget(self, client: str) -> None:
        with self._lock:
            self._buckets.pop(client, None)

    @property
    def clients(self) -> int:
        with self._lock:
            return len(self._buckets)


def _thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread
