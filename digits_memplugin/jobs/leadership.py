"""Who runs a data folder's jobs: the server that holds the folder's lock (jobs.store.datafolder) leads; with a
shared store (several web workers with a message queue, config.shared_store) the others follow it. A follower
reads and writes the same store but runs nothing, tries the lock at every poll, and leads once the leader has
stopped or died, as a restarted server would: what the old leader left queued or running becomes interrupted
(resumable) and its training processes are ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .backends.local import Backend
from .config import ManagerConfig
from .errors import DataFolderInUse
from .events.reporter import Reporter
from .run_state import RunState
from .scheduling.attempt_end import INTERRUPTED_MESSAGE
from .store.database import JobStore, StoreError
from .store.datafolder import take_folder
from .store.records import ACTIVE_STATES

log = logging.getLogger(__name__)

STORE_FILE = "jobs.sqlite"


class Leadership:
    """The data folder's lock held (`follower` False) or followed (True), on the manager's run `state`: `open`
    opens the store into it, `follow` is a follower's task until it leads, `release` lets the folder go."""

    def __init__(
        self, config: ManagerConfig, state: RunState, reporter: Reporter, backend: Backend, jobs_root: Path
    ) -> None:
        self.config = config
        self.state = state
        self.reporter = reporter
        self.backend = backend
        self.jobs_root = jobs_root
        self.follower = False
        self._lock_file: IO[str] | None = None

    def open(self) -> bool:
        """Take the data folder and open its store, marking what a previous process left running as interrupted
        (True: this server leads); or, on a shared store whose folder another server holds, open the store only
        (False: it follows; nothing reaped, the leader's jobs are running, not left over). DataFolderInUse without a
        shared store; whatever else fails leaves the folder free for the next try."""
        try:
            self._lock_file = take_folder(self.config.data_dir)
        except DataFolderInUse:
            if not self.config.shared_store:
                raise
            self.state.open(self._store())
            self.follower = True
            log.info("the data folder %s is held by another server: this one follows it (its jobs run there)",
                     self.config.data_dir)
            return False
        try:
            self.state.open(self._store())
            self.take_over_leftovers()
        except BaseException:  # a store that cannot be opened (locked, full disk) leaves the folder free
            self.state.close()
            self._unlock()
            raise
        return True

    def _store(self) -> JobStore:
        return JobStore(self.config.data_dir / STORE_FILE, busy_seconds=self.config.store_busy_seconds)

    def take_over_leftovers(self) -> list[str]:
        """What the folder's previous holder left queued or running becomes interrupted (resumable), and its
        training processes are ended; the jobs that changed."""
        store = self.state.store
        active = [job.id for job in store.list_jobs(ACTIVE_STATES)]
        leftovers = store.mark_interrupted(INTERRUPTED_MESSAGE)
        self.backend.reap(leftovers, self.jobs_root)
        return active

    def follow(self, lead: Callable[[], None]) -> None:
        """A follower's task: try the folder's lock at every poll; once the leader has stopped or died, lead (its
        leftovers taken over, the browsers watching them told) and run `lead` (the scheduling loop) from then on,
        so that the workers left keep running jobs. Returns once the manager stops."""
        while True:
            self.state.wake.wait(self.config.poll_seconds)
            self.state.wake.clear()
            with self.state.lock:
                if self.state.stopping:
                    return
                changed = self._try_to_lead()
                if changed is None:
                    continue
                self.follower = False
            log.warning("the data folder %s was left by its leader: this server leads now (%d jobs interrupted)",
                        self.config.data_dir, len(changed))
            try:  # the browsers watching them see them interrupted
                for job in filter(None, map(self.state.store.get_job, changed)):
                    self.reporter.emit_job(job)
            except StoreError as error:
                log.warning("the interrupted jobs' events were not sent: %s", error)
            lead()
            return

    def _try_to_lead(self) -> list[str] | None:
        """The folder's lock taken and the old leader's jobs taken over: the jobs that changed; None while the
        folder is held (or cannot be taken over yet)."""
        try:
            self._lock_file = take_folder(self.config.data_dir)
        except DataFolderInUse:
            return None
        except OSError as error:  # the folder went away or turned read-only: try again at the next poll
            log.warning("following %s: cannot try its lock (%s)", self.config.data_dir, error)
            return None
        try:
            return self.take_over_leftovers()
        except (StoreError, OSError) as error:  # a busy or damaged database: follow on, try again later
            log.warning("cannot take the lead of %s yet: %s", self.config.data_dir, error)
            self._unlock()
            return None

    def release(self) -> None:
        """Let the folder go (a follower holds nothing): the next server, or a follower, may take it."""
        self.follower = False
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


__all__ = ["STORE_FILE", "Leadership"]
