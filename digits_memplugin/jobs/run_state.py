"""What the job manager's parts share while it runs, in one object: the lock every change of a job's state is made
under, the table of placed jobs (`Running`, one per job on a device), the condition a job's end is announced on,
the event that wakes the scheduling loop, whether the manager is stopping, and the open store.

The manager (jobs.manager) makes one `RunState` and hands it to each part (jobs.leadership, jobs.store.quota,
jobs.events.reporter, jobs.scheduling.dispatcher and attempt_loop), so that none of them reaches into another's
attributes or is given lambdas over the manager's: a part can be built and tested alone on a `RunState` of its own.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from ..core.device_kinds import GPU
from .backends.local import AttemptHandle
from .errors import JobError
from .events.pace import Pace, Window
from .store.database import JobStore


@dataclasses.dataclass
class Running:
    """A job placed on a device: its slot, and its current attempt once started."""

    job_id: str
    device: str
    kind: str
    process: AttemptHandle | None = None
    attempt: int | None = None
    estimated: int = 0
    peak: int | None = None
    cancel: bool = False
    task: Any = None
    last_stored: float = 0.0
    progress: dict[str, Any] = dataclasses.field(default_factory=dict)
    snapshot: dict[str, Any] | None = None
    """The latest snapshot record not yet written to the store (the database was locked)."""
    store_warned: bool = False
    max_iter: int | None = None
    """The current attempt's max_iter (what the time left is counted to)."""
    window: Window = dataclasses.field(default_factory=Window)
    """The current attempt's latest (iteration, seconds) points, bounded (pace.Window): its speed and time left."""
    tester_device: str | None = None
    """With the test nets apart on another device, that device (jobs.scheduling.apart_run); None otherwise."""
    tester_estimated: int = 0
    """The tester's planned peak there, held for it while the attempt runs."""
    tester_used: int = 0
    """What a tester running there holds now (NVML's figure for it), no longer held back for it."""
    holds_between: bool = False
    """With the test nets apart on its own device the attempt's children come and go (the trainer stops for its
    tester and starts again): what the one running now holds (`used`), not the attempt's peak, is taken off its
    reservation, so that the memory a paused trainer left is not given to another job."""
    used: int = 0
    """What the attempt's running child holds now (NVML's figure on a GPU, its latest record on the CPU)."""

    def start_attempt(self, number: int, max_iter: int) -> None:
        """A new attempt: its own progress and its own speed, from its own records."""
        self.attempt, self.peak, self.max_iter, self.used = number, None, max_iter, 0
        self.progress = {"train": None, "test": []}
        self.window = Window()

    def holds(self, memory: int, event: Any) -> None:
        """A record's memory figure: the attempt's peak so far and, on the CPU, what its child holds now (nothing
        once it said it stops; on a GPU, NVML says it: the dispatcher samples it)."""
        self.peak = max(self.peak or 0, memory)
        if self.kind != GPU:
            self.used = 0 if event in ("paused", "finished", "stopped") else memory

    def measure(self, record: dict[str, Any]) -> Pace | None:
        """The attempt's speed and time left once an iteration record is added; None until two records say."""
        seconds, iteration = record.get("seconds"), record.get("iteration")
        if not isinstance(seconds, (int, float)) or isinstance(iteration, bool) or not isinstance(iteration, int):
            return None
        self.window.add(iteration, float(seconds))
        return self.window.pace(self.max_iter) if self.max_iter else None


class RunState:
    """The manager's shared state (see the module). `running` and each entry's fields change under `lock`;
    `finished` (on `lock`) is notified when a job's end is written; `wake` makes the scheduling loop look again;
    `stopping` is set (under `lock`) once `JobManager.stop` begins; `store` is the store while the manager runs."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.finished = threading.Condition(self.lock)
        self.wake = threading.Event()
        self.running: dict[str, Running] = {}
        self.stopping = False
        self._store: JobStore | None = None

    # --- the store ----------------------------------------------------------------------------------------------

    @property
    def store(self) -> JobStore:
        """The open store; JobError while the manager is not started (or stopped meanwhile)."""
        store = self._store
        if store is None:
            raise JobError("the job manager has not been started")
        return store

    def open(self, store: JobStore) -> None:
        self._store = store

    def close(self) -> None:
        """Close the store (if open): the parts' reads raise JobError from then on."""
        with self.lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()

    # --- the placed jobs ----------------------------------------------------------------------------------------

    def entries(self) -> list[Running]:
        with self.lock:
            return list(self.running.values())

    def busy(self) -> bool:
        with self.lock:
            return bool(self.running)

    def reserved(self, device: str, exclude: str | None = None) -> int:
        """Memory our running attempts on the device were planned to take and have not taken yet."""
        return reserved(self.entries(), device, exclude)

    def cancel(self, job_id: str) -> bool:
        """Ask the attempt of a job placed here to stop (its child snapshots and stops; a child not started yet is
        cancelled once it is). False when the job is not placed here or was asked already."""
        with self.lock:
            entry = self.running.get(job_id)
            if entry is None or entry.cancel:
                return False
            entry.cancel = True
            if entry.process is not None:
                entry.process.cancel()
            return True

    def kill_running(self) -> list[Running]:
        """Kill every running attempt's process; the entries, whose tasks then end."""
        with self.lock:
            running = list(self.running.values())
            for entry in running:
                if entry.process is not None:
                    entry.process.kill()
            return running

    def notify_finished(self) -> None:
        """A job's end is written (or its task is gone): `JobManager.wait` looks again."""
        with self.lock:
            self.finished.notify_all()


def reserved(running: list[Running], device: str, exclude: str | None = None) -> int:
    """Memory the running attempts on the device were planned to take and have not taken yet, their testers on it
    (the test nets apart on another device) included: a tester is held for between two snapshots too."""
    trainers = sum(
        max(0, entry.estimated - (entry.used if entry.holds_between else entry.peak or 0))
        for entry in running
        if entry.device == device and entry.job_id != exclude
    )
    testers = sum(
        max(0, entry.tester_estimated - entry.tester_used)
        for entry in running
        if entry.tester_device == device and entry.job_id != exclude
    )
    return trainers + testers


__all__ = ["RunState", "Running", "reserved"]
