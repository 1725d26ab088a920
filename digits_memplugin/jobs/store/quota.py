"""The limits on what a data folder keeps: the jobs waiting in the queue, the jobs stored, and the bytes of their
folders; a submission beyond them is refused before anything is written, naming what to delete."""

from __future__ import annotations

from pathlib import Path

from ..config import ManagerConfig
from ..errors import QueueFull, StoredBytesFull, StoredJobsFull
from ..run_state import RunState
from .disk import folder_bytes
from .records import ACTIVE_STATES, JOB_STATES, QUEUED


class Quota:
    """The limits of `config` on the jobs of the manager's store (its run `state`'s), whose folders are under
    `jobs_root`. The sizes are kept under the state's lock, so that a submission checks and records its job in one
    step (JobManager.submit)."""

    def __init__(self, config: ManagerConfig, state: RunState, jobs_root: Path) -> None:
        self.config = config
        self.state = state
        self.jobs_root = jobs_root
        self._sizes: dict[str, int] | None = None
        """Bytes of each job's folder, measured when it is stored and when each of its attempts ends (None until
        the first submission measures them all)."""

    def check_queue(self) -> None:
        if self.state.store.count_jobs([QUEUED]) >= self.config.max_queued_jobs:
            raise QueueFull(self.config.max_queued_jobs)

    def check_storage(self, incoming: int) -> None:
        """Refuse a job beyond MEMPLUGIN_MAX_STORED_JOBS (400) or MEMPLUGIN_MAX_STORED_BYTES (507), naming jobs
        to delete. `incoming`: the bytes the new job brings."""
        store = self.state.store
        count = store.count_jobs(JOB_STATES)
        if count >= self.config.max_stored_jobs:
            oldest = store.list_jobs(sorted(set(JOB_STATES) - ACTIVE_STATES))[:5]
            raise StoredJobsFull(count, self.config.max_stored_jobs, oldest)
        used = self.stored_bytes()
        if used + incoming > self.config.max_stored_bytes:
            with self.state.lock:
                sizes = dict(self._sizes or {})
            idle = store.list_jobs(sorted(set(JOB_STATES) - ACTIVE_STATES))
            largest = sorted(idle, key=lambda job: sizes.get(job.id, 0), reverse=True)[:5]
            raise StoredBytesFull(used, incoming, self.config.max_stored_bytes, largest, sizes)

    def stored_bytes(self) -> int:
        """What the jobs' folders hold, as last measured (all of them measured at the first call)."""
        with self.state.lock:
            if self._sizes is None:
                self._sizes = {job.id: folder_bytes(self.jobs_root / job.folder) for job in self.state.store.list_jobs()}
            return sum(self._sizes.values())

    def stored(self, job_id: str, size: int) -> None:
        """A new job's folder holds `size` bytes (after `check_storage`, which measured the others)."""
        with self.state.lock:
            if self._sizes is not None:
                self._sizes[job_id] = size

    def measure(self, job_id: str) -> None:
        """Measure a job's folder again (its attempts write logs, records and snapshots)."""
        with self.state.lock:
            if self._sizes is not None and job_id in self._sizes:
                self._sizes[job_id] = folder_bytes(self.jobs_root / job_id)

    def deleted(self, job_id: str) -> None:
        with self.state.lock:
            if self._sizes is not None:
                self._sizes.pop(job_id, None)
