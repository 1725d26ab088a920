"""The manager's scheduling task: it reads the devices, samples the GPU memory of running attempts, places each
queued job where the scheduler (jobs.scheduling.scheduler, pure) says, starts the placed job's task (jobs.scheduling.attempt_loop), and frees
its slot when the task ends. It wakes on a submission, a resume or a job's end, and polls while jobs wait or run;
on a shared store (several web workers, config.shared_store) it polls always, since another process's submission,
resume or cancel request cannot wake it, and applies the cancel requests (jobs.manager's followers write them).
Everything it shares with the manager's other parts is their run state (jobs.run_state)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...core.errors import MemPluginError, NetError
from ...core.layers.base import ENGINE_CPU
from ...core.planning.fit import Decision
from ...devices.reader import CPU, GPU, Device, DeviceList, DeviceReader
from ...estimate.pool import PoolBusy, PoolError
from ..config import ManagerConfig
from ..definition.definition import JobDefinition
from ..events.reporter import Reporter
from ..run_state import Running, RunState, reserved
from ..store.database import StoreError
from ..store.disk import disk_full, free_note
from ..store.records import FAILED, QUEUED, RUNNING, Job
from .apart_run import ApartRun
from .attempt_loop import AttemptLoop, stacks
from .scheduler import Never, Place, Wait, memory_cap, place
from .submission import Definitions

log = logging.getLogger(__name__)

Spawn = Callable[[Callable[[], None]], Any]


class Dispatcher:
    """Places the queued jobs of the run `state`'s store and runs them, each in an entry of its table (under its
    lock); the state's `wake` makes `loop` look again at once, its `stopping` ends it. `spawn` starts a placed
    job's task (`attempts.run`)."""

    def __init__(
        self,
        config: ManagerConfig,
        devices: DeviceReader,
        state: RunState,
        reporter: Reporter,
        attempts: AttemptLoop,
        definitions: Definitions,
        *,
        spawn: Spawn,
        jobs_root: Path,
    ) -> None:
        self.config = config
        self.devices = devices
        self.state = state
        self.reporter = reporter
        self.attempts = attempts
        self.definitions = definitions
        self.spawn = spawn
        self.jobs_root = jobs_root

    def loop(self) -> None:
        while True:
            polling = self.state.busy() or self.config.shared_store or self._queued()
            self.state.wake.wait(self.config.poll_seconds if polling else None)
            self.state.wake.clear()
            if self.state.stopping:
                return
            try:
                self.schedule()
            except StoreError as error:  # locked, full or damaged: the message says which, no traceback needed
                log.error("scheduling failed: %s", error)
            except Exception:
                log.exception("scheduling failed")

    def _queued(self) -> bool:
        try:
            return bool(self.state.store.list_jobs([QUEUED]))
        except StoreError:  # locked, full or damaged: look again at the next poll (schedule says why)
            return True
        except MemPluginError:  # not started, or stopped meanwhile
            return False

    def schedule(self) -> None:
        """One round of the loop: the cancels other processes asked for applied (on a shared store), then each
        queued job placed where it fits now, left waiting (saying why) or failed when it never can."""
        store = self.state.store
        if self.config.shared_store:
            for job_id in store.cancel_requests():
                if self.state.cancel(job_id):  # the follower has already written "cancelling" and told listeners
                    log.info("job %s: cancelled, as another server asked", job_id)
        queued = store.list_jobs([QUEUED])
        if self.config.shared_store and not queued and not self.state.busy():
            return  # polled with nothing to do: no device read every poll on an idle shared store
        devices = self.devices.read()
        self._sample_gpu_memory(devices)
        for job in queued:
            if self.state.stopping:
                return
            self._try_place(job, devices)

    def _sample_gpu_memory(self, devices: DeviceList) -> None:
        """Peak GPU memory of running attempts, from NVML's process list (the runner cannot see it in CUDA)."""
        entries = [entry for entry in self.state.entries() if entry.kind == GPU and entry.process]
        for entry in entries:
            device = devices.get(entry.device)
            pid = entry.process.pid if entry.process else None
            now = 0
            for process in (device.processes or ()) if device else ():
                if process.pid == pid and process.used_memory is not None:
                    entry.peak = max(entry.peak or 0, process.used_memory)
                    now = process.used_memory
            entry.used = now
        for entry in self.state.entries():  # a tester on another GPU: what it holds now is held no longer for it
            device = devices.get(entry.tester_device) if entry.tester_device else None
            tester = entry.process.tester_pid if isinstance(entry.process, ApartRun) else None
            used = [p.used_memory or 0 for p in (device.processes or ()) if p.pid == tester] if device and tester else []
            entry.tester_used = max(used, default=0)

    def _try_place(self, job: Job, devices: DeviceList) -> None:
        """Place the job now if a device has room for its plan. A plan may be made in an estimate worker
        (jobs.scheduling.planning): never while the lock is held, which every submission, cancel and page of the
        jobs takes. So the devices are planned first with what runs now, then placed under the lock from those
        plans; a limit changed meanwhile leaves the job for the next round."""
        try:
            definition = self.definitions.get(job)
        except PoolBusy as busy:  # its nets are built in a worker (a recurrent net), and all are busy
            self._wait_for_worker(job, busy)
            return
        except (NetError, OSError, PoolError) as error:  # OSError: its folder went with a delete since the queue was read
            self._fail(job, f"the job's definition cannot be used any more: {error}")
            return
        decisions: dict[tuple[str, int], Decision] = {}
        try:
            self._where(job, definition, devices, self._planning(job, definition, decisions))  # the plans made here
        except PoolBusy as busy:
            self._wait_for_worker(job, busy)
            return
        except PoolError as error:  # the worker ran out of time or died planning it: it would again
            self._fail(job, f"the job could not be planned: {error}")
            return
        with self.state.lock:
            if self.state.stopping:  # stop() has collected the running tasks it joins: start none after that
                return
            try:
                where = self._where(job, definition, devices, _planned(decisions))
            except _Replan:
                self.state.wake.set()  # what runs changed while it was planned: plan again at once
                return
            if isinstance(where, Place):
                self._start(job, where)
                return
        if isinstance(where, Never):
            self._fail(job, where.reason)
        elif where.reason != job.message:
            self._tell_waiting(job, where.reason)

    def _planning(
        self, job: Job, definition: JobDefinition, decisions: dict[tuple[str, int], Decision]
    ) -> Callable[[Device, int], Decision]:
        """The scheduler's plans of the job, made (by the attempt loop's planning) and kept in `decisions`."""

        def plan(device: Device, limit: int) -> Decision:
            key = (device.key, limit)
            if key not in decisions:
                engine = self.config.gpu_engine if device.kind == GPU else ENGINE_CPU
                decisions[key] = self.attempts.plan(job, definition, engine, limit, placing=True)
            return decisions[key]

        return plan

    def _where(
        self, job: Job, definition: JobDefinition, devices: DeviceList, plans: Callable[[Device, int], Decision]
    ) -> Place | Wait | Never:
        """Where the scheduler places the job with what runs now."""
        entries = self.state.entries()
        running = Counter(entry.device for entry in entries)
        return place(
            job.spec["device"], devices, plans, running=running,
            reserved={key: reserved(entries, key) for key in running},
            jobs_per_gpu=self.config.jobs_per_gpu, jobs_per_cpu=self.config.jobs_per_cpu,
            cap=memory_cap(job.spec.get("memory_cap"), self.config.cpu_memory_cap), cap_overhead=stacks(definition),
        )

    def _start(self, job: Job, where: Place) -> None:
        """The job placed (under the lock): stored first (a store that cannot be written must not leave a slot
        taken), and only while the job is still queued (a cancel or a delete since the queue was read wins); then
        its slot taken and its task started."""
        entry = Running(job.id, where.device.key, GPU if where.device.kind == GPU else CPU)
        entry.estimated = where.decision.estimated_bytes or 0
        placed = self.state.store.update_job_if(
            job.id, QUEUED, status=RUNNING, device=where.device.key, message=where.decision.message
        )
        if placed is None:
            return
        self.state.running[job.id] = entry
        entry.task = self.spawn(lambda: self._run_job(job.id))

    def _fail(self, job: Job, message: str) -> None:
        """A queued job that can never run, failed saying why (unless a cancel or a delete came first)."""
        failed = self.state.store.update_job_if(job.id, QUEUED, status=FAILED, finished_at=time.time(), message=message)
        if failed is not None:
            self.state.notify_finished()
            self.reporter.emit_job(failed)

    def _tell_waiting(self, job: Job, message: str) -> None:
        """The job stays queued, saying why (while it still is)."""
        waiting = self.state.store.update_job_if(job.id, QUEUED, message=message)
        if waiting is not None:
            self.reporter.emit_job(waiting)

    def _wait_for_worker(self, job: Job, busy: PoolBusy) -> None:
        """The job stays queued, saying why, and is planned again at a later poll."""
        message = f"waiting: its plan needs an estimate worker, and all are busy ({busy}); it is planned again soon"
        if message != job.message:
            self._tell_waiting(job, message)

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
                self.reporter.finish(job_id, FAILED, message)
            except StoreError as store_error:
                log.error("job %s: its failure could not be recorded (%s); the next start marks it interrupted",
                          job_id, store_error)
        finally:
            with self.state.lock:
                self.state.running.pop(job_id, None)
                self.reporter.settled(job_id)  # written by now, or left for the next start to mark
                self.state.finished.notify_all()
            self.state.wake.set()


def _planned(decisions: dict[tuple[str, int], Decision]) -> Callable[[Device, int], Decision]:
    """The plans made before the lock was taken; a plan not among them (a limit changed since) is _Replan."""

    def planned(device: Device, limit: int) -> Decision:
        if (device.key, limit) not in decisions:
            raise _Replan
        return decisions[(device.key, limit)]

    return planned


class _Replan(Exception):
    """A plan asked for under the lock that was not made before it (a limit changed since)."""
