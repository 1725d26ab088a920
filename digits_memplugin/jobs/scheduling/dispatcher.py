"""The manager's scheduling task: it reads the devices, samples the GPU memory of running attempts, places each
queued job where the scheduler (jobs.scheduling.scheduler, pure) says, starts the placed job's task (jobs.scheduling.attempt_loop), and frees
its slot when the task ends. It wakes on a submission, a resume or a job's end, and polls while jobs wait or run;
on a shared store (several web workers, config.shared_store) it polls always, since another process's submission,
resume or cancel request cannot wake it, and applies the cancel requests (jobs.manager's followers write them)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...core.errors import MemPluginError, NetError
from ...core.layers.base import ENGINE_CPU
from ...core.planning.fit import Decision
from ...devices.reader import CPU_KEY, GPU, Device, DeviceList, DeviceReader
from ...estimate.pool import PoolBusy, PoolError
from ..config import ManagerConfig
from ..events.progress import Progress, Running, reserved
from ..store.database import JobStore, StoreError
from ..store.disk import disk_full, free_note
from ..store.records import FAILED, QUEUED, RUNNING, Job
from .attempt_loop import AttemptLoop, stacks
from .scheduler import Never, Place, Wait, memory_cap, place
from .submission import Definitions

log = logging.getLogger(__name__)

Spawn = Callable[[Callable[[], None]], Any]


class Dispatcher:
    """Places the queued jobs of `store` (the manager's) and runs them, in `running` (the manager's table, under
    `lock`); `wake` makes `loop` look again at once, `stopping` ends it."""

    def __init__(
        self,
        config: ManagerConfig,
        devices: DeviceReader,
        store: Callable[[], JobStore],
        progress: Progress,
        attempts: AttemptLoop,
        definitions: Definitions,
        *,
        lock: threading.RLock,
        finished: threading.Condition,
        running: dict[str, Running],
        wake: threading.Event,
        spawn: Spawn,
        stopping: Callable[[], bool],
        jobs_root: Path,
        cancel_requested: Callable[[str], None] = lambda job_id: None,
    ) -> None:
        self.config = config
        self.devices = devices
        self._store = store
        self.progress = progress
        self.attempts = attempts
        self.definitions = definitions
        self._lock = lock
        self._finished = finished
        self._running = running
        self._wake = wake
        self.spawn = spawn
        self._stopping = stopping
        self.jobs_root = jobs_root
        self.cancel_requested = cancel_requested
        """Applies a cancel another process asked for (the store's cancel_requests), on a shared store."""

    def loop(self) -> None:
        while True:
            with self._lock:
                busy = bool(self._running)
            polling = busy or self.config.shared_store or self._queued()
            self._wake.wait(self.config.poll_seconds if polling else None)
            self._wake.clear()
            if self._stopping():
                return
            try:
                self._schedule()
            except StoreError as error:  # locked, full or damaged: the message says which, no traceback needed
                log.error("scheduling failed: %s", error)
            except Exception:
                log.exception("scheduling failed")

    def _queued(self) -> bool:
        try:
            return bool(self._store().list_jobs([QUEUED]))
        except StoreError:  # locked, full or damaged: look again at the next poll (_schedule says why)
            return True
        except MemPluginError:  # not started, or stopped meanwhile
            return False

    def _schedule(self) -> None:
        if self.config.shared_store:
            for job_id in self._store().cancel_requests():
                self.cancel_requested(job_id)
        queued = self._store().list_jobs([QUEUED])
        with self._lock:
            busy = bool(self._running)
        if self.config.shared_store and not queued and not busy:
            return  # polled with nothing to do: no device read every poll on an idle shared store
        devices = self.devices.read()
        self._sample_gpu_memory(devices)
        for job in queued:
            if self._stopping():
                return
            self._try_place(job, devices)

    def _sample_gpu_memory(self, devices: DeviceList) -> None:
        """Peak GPU memory of running attempts, from NVML's process list (the runner cannot see it in CUDA)."""
        with self._lock:
            entries = [entry for entry in self._running.values() if entry.kind == GPU and entry.process]
        for entry in entries:
            device = devices.get(entry.device)
            pid = entry.process.pid if entry.process else None
            for process in (device.processes or ()) if device else ():
                if process.pid == pid and process.used_memory is not None:
                    entry.peak = max(entry.peak or 0, process.used_memory)

    def _try_place(self, job: Job, devices: DeviceList) -> None:
        store = self._store()
        try:
            definition = self.definitions.get(job)
        except PoolBusy as busy:  # its nets are built in a worker (a recurrent net), and all are busy
            self._wait_for_worker(job, busy)
            return
        except (NetError, OSError, PoolError) as error:  # OSError: its folder went with a delete since the queue was read
            failed = store.update_job_if(
                job.id, QUEUED, status=FAILED, finished_at=time.time(),
                message=f"the job's definition cannot be used any more: {error}",
            )
            if failed is not None:
                self.progress.emit_job(failed)
            return

        # A plan may be made in an estimate worker (jobs.scheduling.planning): never while the lock is held, which every
        # submission, cancel and page of the jobs takes. So the devices are planned first with what runs now, then
        # placed under the lock from those plans; a limit changed meanwhile leaves the job for the next poll.
        decisions: dict[tuple[str, int], Decision] = {}

        def plan(device: Device, limit: int) -> Decision:
            key = (device.key, limit)
            if key not in decisions:
                engine = self.config.gpu_engine if device.kind == GPU else ENGINE_CPU
                decisions[key] = self.attempts.plan(job, definition, engine, limit, placing=True)
            return decisions[key]

        def planned(device: Device, limit: int) -> Decision:
            if (device.key, limit) not in decisions:
                raise _Replan
            return decisions[(device.key, limit)]

        cap = memory_cap(job.spec.get("memory_cap"), self.config.cpu_memory_cap)

        def where_now(plans: Callable[[Device, int], Decision]) -> Place | Wait | Never:
            with self._lock:
                entries = list(self._running.values())
            running = Counter(entry.device for entry in entries)
            return place(
                job.spec["device"], devices, plans, running=running,
                reserved={key: reserved(entries, key) for key in running},
                jobs_per_gpu=self.config.jobs_per_gpu, jobs_per_cpu=self.config.jobs_per_cpu,
                cap=cap, cap_overhead=stacks(definition),
            )

        try:
            where_now(plan)  # outside the lock: the plans are made here
        except PoolBusy as busy:
            self._wait_for_worker(job, busy)
            return
        except PoolError as error:  # the worker ran out of time or died planning it: it would again
            failed = store.update_job_if(job.id, QUEUED, status=FAILED, finished_at=time.time(),
                                         message=f"the job could not be planned: {error}")
            if failed is not None:
                with self._lock:
                    self._finished.notify_all()
                self.progress.emit_job(failed)
            return
        with self._lock:
            if self._stopping():  # stop() has collected the running tasks it joins: start none after that
                return
            try:
                where = where_now(planned)
            except _Replan:
                self._wake.set()  # what runs changed while it was planned: plan again at once
                return
            if isinstance(where, Place):
                entry = Running(job.id, where.device.key, GPU if where.device.kind == GPU else CPU_KEY)
                entry.estimated = where.decision.estimated_bytes or 0
                # Stored first (a store that cannot be written must not leave a slot taken), and only while the job
                # is still queued: a cancel or a delete since the queue was read wins.
                placed = store.update_job_if(
                    job.id, QUEUED, status=RUNNING, device=where.device.key, message=where.decision.message
                )
                if placed is None:
                    return
                self._running[job.id] = entry
                entry.task = self.spawn(lambda: self._run_job(job.id))
                return
        if isinstance(where, Never):
            failed = store.update_job_if(job.id, QUEUED, status=FAILED, message=where.reason, finished_at=time.time())
            if failed is not None:
                with self._lock:
                    self._finished.notify_all()
                self.progress.emit_job(failed)
            return
        if where.reason != job.message:
            waiting = store.update_job_if(job.id, QUEUED, message=where.reason)
            if waiting is not None:
                self.progress.emit_job(waiting)

    def _wait_for_worker(self, job: Job, busy: PoolBusy) -> None:
        """The job stays queued, saying why, and is planned again at a later poll."""
        message = f"waiting: its plan needs an estimate worker, and all are busy ({busy}); it is planned again soon"
        if message != job.message:
            waiting = self._store().update_job_if(job.id, QUEUED, message=message)
            if waiting is not None:
                self.progress.emit_job(waiting)


    def _run_job(self, job_id: str) -> None:
        """The job's task: its attempts until one ends it. Never raises: whatever stops the job is recorded as its
        end (a store that cannot be written at all is left for the next start to mark interrupted)."""
        try:
            self.attempts.run(job_id)
        except Exception as error:
            if isinstance(error, OSError) and disk_full(error):
                message = (
                    f"no space left on the disk holding the job's folder ({free_note(self.jobs_root)}); "
                    "free some space, then resume the job"
                )
            elif isinstance(error, MemPluginError):
                message = str(error)
            else:
                message = f"internal error: {error}"
            log.log(logging.ERROR if isinstance(error, (MemPluginError, OSError)) else logging.CRITICAL,
                    "job %s failed in the manager: %s", job_id, error, exc_info=not isinstance(error, MemPluginError))
            try:
                self.progress.finish(job_id, FAILED, message)
            except StoreError as store_error:
                log.error("job %s: its failure could not be recorded (%s); the next start marks it interrupted",
                          job_id, store_error)
        finally:
            with self._lock:
                self._running.pop(job_id, None)
                self.progress.unrecorded.pop(job_id, None)  # written by now, or left for the next start to mark
                self._finished.notify_all()
            self._wake.set()


class _Replan(Exception):
    """A plan asked for under the lock that was not made before it (a limit changed since)."""
