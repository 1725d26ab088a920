"""One attempt as a child process: started in its own process group, its JSON records and Caffe's log followed
live, cancelled with SIGINT (the runner snapshots and stops; SIGTERM then SIGKILL when it does not in time),
ended by the watchdog when it makes no progress (jobs.backends.watchdog), and classified once it has ended (core.oom).

A cancel is SIGINT to the child's process group, the signal both runners understand: the pycaffe runner
(jobs.child.runner) and `caffe train` (its default `--sigint_effect=stop`) each stop at the next step, write a snapshot
and exit; the pycaffe runner then writes a "stopped" record naming the snapshot, which a runner wrapping `caffe`
writes too. One that has not ended `cancel_seconds` after the request gets SIGTERM, then SIGKILL after the grace
period, as before there was a snapshot to wait for.

Written with the standard library's threading, subprocess and time: under the gevent server they are
monkey-patched, so the reads and waits here yield to the hub instead of blocking it; in tests and in the CLI they
are plain threads. Caffe's log is followed by reading its file (the child writes it directly, so a server that
dies leaves the whole log behind).

A net output that becomes NaN or infinite (core.divergence) ends the attempt, unless its job asked to train on
regardless: the records are watched as they come, and from the first such record the child has the grace period
to stop by itself (jobs.child.runner does, before its next step or snapshot, with a "diverged" record), then it is
stopped (SIGTERM, then SIGKILL after the grace period), and `classify` is told why. Every record goes through
`take_record`, so a runner whose records are made here (from a log) is watched the same way.

A SIGKILL this server did not send is the kernel's out-of-memory killer's only when the kernel counted a kill
meanwhile: /proc/vmstat's `oom_kill` (every OOM kill, the cgroups' included) is read when the attempt starts and
when it ends, and `classify` is told whether it moved. A kill by someone else (an administrator, a watchdog) is
then a plain failure, not an out-of-memory to retry with a smaller batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from ...core import nonfinite
from ...core.divergence import DEFAULT_POLICY, DivergenceWatch
from ...core.oom import OUTCOME_CANCELLED, Outcome, Stall, classify
from .watchdog import Watchdog

LOG_TAIL_BYTES = 256 * 1024
"""How much of the end of Caffe's log the classification reads."""
POLL_SECONDS = 0.2
CANCEL_SECONDS = 60.0
"""How long a cancelled attempt may take to finish its step, write its snapshot and exit before it is killed."""
VMSTAT = Path("/proc/vmstat")
MAX_LINE = 4096
"""A log line longer than this is cut in the events (the file keeps it whole)."""

ENDED_WELL = ("finished", "paused", "tested")
"""The records of a child whose work is done: the runner's end of training, or of a stretch of it before its tester
runs on the same device (the test nets apart), and the tester's end."""
RecordCallback = Callable[[dict[str, Any]], None]
LogCallback = Callable[[list[str]], None]


@dataclasses.dataclass
class AttemptResult:
    """How the child ended and what it reported."""

    returncode: int
    outcome: Outcome
    records: int
    last_iteration: int | None
    peak_bytes: int | None
    finished: bool
    error: dict[str, Any] | None
    allocated_bytes: int | None = None
    """Caffe's own allocation at its largest (the runner's allocated_bytes), where the records gave it."""
    stopped: dict[str, Any] | None = None
    """The runner's "stopped" record, when it stopped as a cancel asked (with the snapshot it wrote)."""


class AttemptProcess:
    """The child of one attempt. `start`, then `wait` (blocking; run it in the manager's task), `cancel` from any
    task. Records go to `on_record` and new complete log lines to `on_log`, both from the waiting task."""

    def __init__(
        self,
        folder: Path,
        spec_file: str,
        log_file: str,
        *,
        environment: Mapping[str, str] | None = None,
        on_record: RecordCallback | None = None,
        on_log: LogCallback | None = None,
        grace_seconds: float = 5.0,
        stall_seconds: float | None = None,
        command: list[str] | None = None,
        divergence: str = DEFAULT_POLICY,
        cancel_seconds: float = CANCEL_SECONDS,
        watchdog: Callable[[int, float], Watchdog] = Watchdog,
    ) -> None:
        self.folder = folder
        self.spec_file = spec_file
        self.log_path = folder / log_file
        self.environment = dict(environment or {})
        self.on_record = on_record or (lambda record: None)
        self.on_log = on_log or (lambda lines: None)
        self.grace_seconds = grace_seconds
        self.cancel_seconds = cancel_seconds
        """After a cancel's SIGINT, how long the child has to snapshot and stop before SIGTERM."""
        self.stall_seconds = stall_seconds
        """Silence (no record, no log line) after which the watchdog ends the child; None: never."""
        self.watchdog = watchdog
        """Makes the child's watchdog from its pid and `stall_seconds` (a test gives it a clock of its own)."""
        self.command = command or [sys.executable, "-m", "digits_memplugin.jobs.child.runner", spec_file]
        self.process: subprocess.Popen[str] | None = None
        self.divergence = DivergenceWatch(divergence)
        """The job's policy for non-finite outputs (core.divergence), and the first one the records showed."""
        self._diverged_at: float | None = None
        """When `divergence.first` ended the attempt (not cancelled before): the child stops by itself or is stopped
        after the grace period."""
        self._cancel_at: float | None = None
        """When a cancel (or a kill) was asked for: the attempt is then "cancelled"."""
        self._stopped: dict[str, Any] | None = None
        """The runner's "stopped" record (a cancel honoured: snapshot written, training stopped)."""
        self._snapshot: dict[str, Any] | None = None
        """The latest snapshot record."""
        self._stop_at: float | None = None
        """When SIGTERM was sent (a cancel, or a divergence): SIGKILL follows after the grace period."""
        self._killed = False
        self._lock = threading.Lock()
        self._finished = False
        self._error: dict[str, Any] | None = None
        self._records = 0
        self._last_iteration: int | None = None
        self._peak: int | None = None
        self._allocated: int | None = None
        self._log_offset = 0
        self._partial = b""
        self._oom_kills: int | None = None
        self._activity = False
        self._stall: Stall | None = None
        self._trainer: int | None = None

    @property
    def pid(self) -> int | None:
        """The process that trains: the child's own, or the `caffe` it runs (its `started` record names it), whose
        GPU memory NVML lists and whom the watchdog looks at."""
        if self.process is None:
            return None
        return self._trainer or self.process.pid

    @property
    def handle(self) -> str:
        """The attempt as the store keeps it (jobs.backends.local): "pid:N"."""
        if self.process is None:
            raise RuntimeError("the attempt was not started")
        return f"pid:{self.process.pid}"

    @property
    def cancelled(self) -> bool:
        return self._cancel_at is not None

    def start(self) -> int:
        """Start the child; its stderr (Python's own errors before the runner takes over) goes to the log too."""
        env = {**os.environ, "GLOG_logtostderr": "1", "GLOG_minloglevel": "0", **self.environment}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._oom_kills = oom_kill_count()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC  # never through a symlink
        with os.fdopen(os.open(self.log_path, flags, 0o644), "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                # Its own process group (cancel stops Caffe's threads and anything it starts) in the server's own
                # session: a new session would be a new scheduler autogroup, where the child's nice value counts
                # for nothing against the server (bench/load.py measured it).
                process_group=0,
            )
        return self.process.pid

    def cancel(self, snapshot: bool = True) -> None:
        """Ask the child to snapshot and stop (SIGINT to its process group); `wait` sends SIGTERM once
        `cancel_seconds` have passed without its end, and SIGKILL after the grace period. `snapshot` False: SIGTERM
        now, the stop without a snapshot (a node whose cluster gives it seconds only)."""
        with self._lock:
            if self._cancel_at is None:
                self._cancel_at = time.monotonic()
                if snapshot:
                    self._signal(signal.SIGINT)
            if not snapshot:
                self._stop()

    def _stop(self) -> None:
        """SIGTERM to the child's group, once (under the lock); `wait` sends SIGKILL after the grace period."""
        if self._stop_at is None:
            self._stop_at = time.monotonic()
            self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """Stop the child at once (SIGKILL to its process group), e.g. when the server shuts down."""
        with self._lock:
            if self._cancel_at is None:
                self._cancel_at = time.monotonic()
            self._stop_at = self._stop_at or time.monotonic()
            self._signal(signal.SIGKILL)
            self._killed = True

    def _signal(self, number: int) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, number)

    def wait(self) -> AttemptResult:
        """Follow the child until it ends; then classify how it ended."""
        process = self.process
        if process is None or process.stdout is None:
            raise RuntimeError("the attempt was not started")
        reader = threading.Thread(target=self._read_records, args=(process.stdout,), daemon=True)
        reader.start()
        watchdog = None if self.stall_seconds is None else self.watchdog(process.pid, self.stall_seconds)
        while process.poll() is None:
            if watchdog is not None and self._trainer is not None and watchdog.pid != self._trainer:
                watchdog.follow(self._trainer)
            if self._follow_log() or self._activity:
                self._activity = False
                if watchdog is not None:
                    watchdog.activity()
            if watchdog is not None and self._stall is None and not self.cancelled:
                self._stall = watchdog.stalled()
                if self._stall is not None:
                    with self._lock:  # ended, not cancelled: the classification says why
                        self._signal(signal.SIGKILL)
                        self._killed = True
            with self._lock:
                if self._diverged_at is not None and time.monotonic() - self._diverged_at > self.grace_seconds:
                    self._stop()
                if self._cancel_at is not None and time.monotonic() - self._cancel_at > self.cancel_seconds:
                    self._stop()  # the snapshot did not come in time: stopped as a cancel always was
                overdue = (
                    self._stop_at is not None
                    and not self._killed
                    and time.monotonic() - self._stop_at > self.grace_seconds
                )
                if overdue:
                    self._signal(signal.SIGKILL)
                    self._killed = True
            time.sleep(POLL_SECONDS)
        reader.join(timeout=30)
        # The group may still hold processes the child started; nothing of an ended attempt may keep running.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        while self._follow_log(final=True):
            pass
        returncode = process.returncode
        kills = oom_kill_count()
        diverged = self._diverged_at is not None or self.divergence.trains_on
        outcome = classify(
            returncode, self._log_tail(), cancelled=self.cancelled, finished=self._finished, runner_error=self._error,
            oom_killer=None if kills is None or self._oom_kills is None else kills > self._oom_kills,
            stall=self._stall, divergence=self.divergence.first if diverged else None,
            train_on=self.divergence.trains_on,
        )
        if outcome.status == OUTCOME_CANCELLED:
            outcome = dataclasses.replace(outcome, message=cancel_message(
                self._stopped, self._last_iteration, outcome.signal, self.cancel_seconds,
                snapshot=self._snapshot, forced=self._stop_at is not None,
            ))
        return AttemptResult(
            returncode, outcome, self._records, self._last_iteration, self._peak, self._finished, self._error,
            self._allocated, self._stopped,
        )

    def _read_records(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                record = nonfinite.loads(line)
            except ValueError:
                continue  # not ours (a library printing to stdout); the log has the rest
            if isinstance(record, dict):
                self.take_record(record)
        stream.close()

    def take_record(self, record: dict[str, Any]) -> None:
        """One record of the child's (a JSON object, non-finite numbers as core.nonfinite's strings): counted,
        watched for divergence (the attempt ends at the first non-finite output unless the job trains on), and
        handed to `on_record`. Called from one task at a time (the records' reader)."""
        self._records += 1
        self._activity = True
        event = record.get("event")
        if event == "started" and isinstance(record.get("pid"), int) and record["pid"] != process_pid(self):
            self._trainer = record["pid"]
        if event in ENDED_WELL:
            self._finished = True
        elif event == "stopped":
            self._stopped = record
        elif event == "snapshot":
            self._snapshot = record
        elif event == "error":
            self._error = {"type": record.get("type"), "message": record.get("message")}
        if isinstance(record.get("iteration"), int):
            self._last_iteration = record["iteration"]
        memory = record.get("memory_bytes")
        if isinstance(memory, int):
            self._peak = memory if self._peak is None else max(self._peak, memory)
        allocated = record.get("allocated_bytes")
        if isinstance(allocated, int):
            self._allocated = allocated if self._allocated is None else max(self._allocated, allocated)
        if self.divergence.see(record):
            with self._lock:
                if self._cancel_at is None:  # a cancel asked for before it stays a cancel
                    self._diverged_at = time.monotonic()
        self.on_record(record)

    def _follow_log(self, final: bool = False) -> bool:
        """Hand the log lines written since the last look to `on_log` (complete lines; the rest at the end).
        True when there may be more to read."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                chunk = log.read(1 << 20)
        except OSError:
            return False
        if not chunk and not (final and self._partial):
            return False
        self._log_offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        if lines:
            self.on_log([line.decode("utf-8", errors="replace")[:MAX_LINE] for line in lines])
        return bool(chunk)

    def _log_tail(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - LOG_TAIL_BYTES))
                return log.read().decode("utf-8", errors="replace")
        except OSError:
            return ""


def process_pid(attempt: AttemptProcess) -> int | None:
    return None if attempt.process is None else attempt.process.pid


def cancel_message(
    stopped: Mapping[str, Any] | None, last_iteration: int | None, signal_name: str | None, bound: float, *,
    snapshot: Mapping[str, Any] | None = None, forced: bool = False,
) -> str:
    """How a cancelled attempt ended, for people: where it stopped and whether its work was kept in a snapshot.
    `stopped`: the runner's "stopped" record; without one, `snapshot` (the latest snapshot record) and `forced`
    (this side stopped it, the bound having passed) tell."""
    if stopped is not None:
        iteration = stopped.get("iteration")
        if stopped.get("snapshot"):
            return f"cancelled at iteration {iteration}; a snapshot of it was saved (Resume continues from it)"
        if not iteration:
            return "cancelled before training started (nothing to snapshot)"
        return f"cancelled at iteration {iteration}, without a snapshot"
    if not last_iteration:
        return "cancelled before training started (nothing to snapshot)"
    if not forced:  # it stopped by itself, without saying how (a runner without "stopped" records)
        if snapshot is not None and snapshot.get("iteration") == last_iteration:
            return f"cancelled at iteration {last_iteration}; a snapshot of it was saved (Resume continues from it)"
        return f"cancelled at iteration {last_iteration}, without a snapshot of it"
    how = f" ({signal_name})" if signal_name else ""
    return (f"cancelled at iteration {last_iteration} without a snapshot: the attempt did not snapshot and stop "
            f"within {bound:g} s of the request, so it was ended{how}")


def oom_kill_count(vmstat: Path = VMSTAT) -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot; None where it does not say."""
    try:
        with vmstat.open(encoding="ascii") as lines:
            for line in lines:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None
