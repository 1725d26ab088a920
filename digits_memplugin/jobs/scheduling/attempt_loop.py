"""A running job's attempts: plan the next one from the device's limit and what earlier ones told, write its
files, run it as a child process, classify how it ended, record it, and try again after an out-of-memory until
the fallback policy (core.planning.fallback) gives up or an attempt ends the job (a success, a failure, a cancel, or a net
output that became NaN: core.divergence).

The planning is core.planning.job_plan.plan_job, the function the form, the REST estimate and the command line plan with
too (`plan_for` gives it the job's request and definition); the rest is the loop (`AttemptLoop`), which writes
through the manager's `Reporter` (jobs.events.reporter) on its run state (jobs.run_state) and runs as the job's
task (jobs.scheduling.dispatcher).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.cost import Meter
from ...core.device_kinds import AUTO, CPU
from ...core.divergence import DEFAULT_POLICY
from ...core.estimator import ApartFootprints
from ...core.flavour import NVCAFFE, NVCAFFE_SAFETY_MARGIN
from ...core.layers.base import ENGINE_CPU
from ...core.net import ShapeOracle
from ...core.oom import OUTCOME_CANCELLED, OUTCOME_FAILED, OUTCOME_INTERRUPTED, OUTCOME_OUT_OF_MEMORY
from ...core.planning.apart import Apart, ApartTester, StopCost, TesterDevice
from ...core.planning.fallback import Failure
from ...core.planning.fit import Decision
from ...core.planning.job_plan import START_PLAN, JobAsk, PlanningPolicy, plan_job
from ...core.planning.planner import usable_bytes
from ...core.test_net_modes import SAME_DEVICE, TEST_NET_APART, TEST_NET_AUTO, TEST_NET_SHARED
from ...devices.reader import GPU, DeviceReader, DeviceSelectionError, allowed_gpus, child_cuda_environment
from ...estimate.pool import PoolBusy
from ..backends.attempt_process import AttemptResult
from ..backends.local import AttemptHandle, Backend, Launch, LocalBackend
from ..child.attempt_spec import BINARY_RUNNER, PYCAFFE_RUNNER, AttemptDevice, AttemptSpec
from ..child.caffe_build import BINARY
from ..child.runner import THREAD_STACK_BYTES
from ..config import ManagerConfig
from ..definition.attempt_files import AttemptFiles, snapshot_prefix, test_iters, write_attempt
from ..definition.definition import JobDefinition
from ..definition.job_folder import check_job_folder
from ..errors import JobError, JobNotFound
from ..events.reporter import Reporter, progress_fields
from ..run_state import Running, RunState
from ..store.database import StoreError
from ..store.quota import Quota
from ..store.records import CANCELLED, FAILED, FINAL_STATES, INTERRUPTED, RUNNING, Attempt, Job
from .apart_run import ApartRun, SharedWatch, TesterPlace, TesterReport, tester_nets
from .attempt_end import INTERRUPTED_MESSAGE, failure_of, job_end, note_full_disk
from .scheduler import Limit, limit_for, memory_cap

if TYPE_CHECKING:
    from .planning import Planner
    from .submission import Definitions

log = logging.getLogger(__name__)


def job_ask(spec: Mapping[str, Any], definition: JobDefinition, *, effective_batch: int | None = None,
            iteration: int = 0) -> JobAsk:
    """What a job (its stored request and its definition) asks of its plan. A job stored before its test nets had a
    placement keeps them shared, as it was planned."""
    fallback = spec.get("fallback") or {}
    return JobAsk(
        batch=spec.get("batch"), net_batch=definition.net_batch, test_batch=definition.test_batch,
        test_iter=definition.test_iter, train_items=definition.train_items,
        safety_margin=fallback.get("safety_margin"), growth=fallback.get("growth"),
        max_attempts=fallback.get("max_attempts"), start=fallback.get("start") or START_PLAN,
        effective_batch=effective_batch, iteration=iteration, test_net=spec.get("test_net") or TEST_NET_SHARED,
    )


TESTER_OUT_OF_MEMORY = (
    "test nets shared: a tester ran out of memory at the test nets' own batch, which a tester never shrinks; beside "
    "the train net their batch shrinks if it must"
)


def plan_for(
    spec: Mapping[str, Any], definition: JobDefinition, oracle: ShapeOracle | None, *, engine: str, limit_bytes: int,
    policy: PlanningPolicy, failures: Sequence[Failure] = (), attempts_made: int = 0, placing: bool = False,
    effective_batch: int | None = None, iteration: int = 0, meter: Meter | None = None,
    testers: Sequence[TesterDevice] = (), stop_cost: StopCost | None = None, tester_failed: bool = False,
) -> Decision:
    """A job's plan on a device of `engine` with `limit_bytes` for it (the manager's attempts, its preview), in
    this process (jobs.scheduling.planning decides where); `meter` may stop it (core.cost.TimeUp). Footprints come from
    those known for the definition (`Estimator.total`: a worker's too), so a plan asked again builds nothing.

    With its test nets `apart` or `auto` (the job's `test_net`), the tester goes to the first of `testers` (other
    devices, in the order the job prefers them) where it fits, else on the trainer's device; `stop_cost` is what
    stopping and resuming was measured to cost on the job's first interval there (core.planning.apart.StopCost);
    after a tester ran out of memory (`tester_failed`) the test nets are shared, and the plan says why."""
    estimator = definition.estimator(engine, oracle, meter)

    def footprint(batch: int, test_batch: int | None) -> int:
        return estimator.total(batch, test_batch)

    ask = job_ask(spec, definition, effective_batch=effective_batch, iteration=iteration)
    if definition.flavour == NVCAFFE and ask.safety_margin is None:
        # NVcaffe's figures are a model no GPU has checked yet: the estimate's wider margin (core.flavour).
        ask = dataclasses.replace(ask, safety_margin=max(policy.safety_margin(engine), NVCAFFE_SAFETY_MARGIN))
    shared_why = TESTER_OUT_OF_MEMORY if tester_failed and ask.test_net != TEST_NET_SHARED else None
    apart = None
    if ask.test_net != TEST_NET_SHARED and shared_why is None and definition.test_batch is not None and (
        not policy.apart_refused  # plan_job says why they stay shared
    ):
        apart_footprints = ApartFootprints(estimator)
        tester = _tester(definition, oracle, meter, testers, policy, ask) or ApartTester(apart_footprints.tester())
        apart = Apart(apart_footprints.trainer, tester, stop_cost or StopCost())
    if shared_why is not None:
        ask = dataclasses.replace(ask, test_net=TEST_NET_SHARED)
    decision = plan_job(
        footprint, ask, engine=engine,
        limit_bytes=limit_bytes, policy=policy, failures=failures, attempts_made=attempts_made, placing=placing,
        apart=apart,
    )
    if shared_why is None:
        return decision
    return dataclasses.replace(decision, test_net_note=shared_why, message=f"{decision.message}; {shared_why}")


def _tester(
    definition: JobDefinition, oracle: ShapeOracle | None, meter: Meter | None, testers: Sequence[TesterDevice],
    policy: PlanningPolicy, ask: JobAsk,
) -> ApartTester | None:
    """The tester on the first of `testers` with room for it at the test nets' own batch, counted with that device's
    engine and kept within its margin; None: none has room (the tester shares the trainer's device)."""
    for device in testers:
        needs = ApartFootprints(definition.estimator(device.engine, oracle, meter)).tester()
        margin = policy.margin(device.engine, ask.safety_margin)
        if needs <= usable_bytes(device.limit_bytes, margin):
            return ApartTester(needs, device.limit_bytes, margin, device.key)
    return None


@dataclasses.dataclass
class ApartSoFar:
    """What a running job's attempts told of its test nets apart, for its next plan (`plan_for`)."""

    stop_cost: StopCost = dataclasses.field(default_factory=StopCost)
    """Stopping and resuming for the tester, as measured on the job's first interval (unmeasured until then)."""
    tester_failed: bool = False
    """A tester ran out of memory at the test nets' own batch: the test nets are shared from then on."""
    testers: tuple[TesterDevice, ...] = ()
    """The devices other than the trainer's where its tester may go now, best first."""

    def plan_fields(self) -> dict[str, Any]:
        return {"testers": self.testers, "stop_cost": self.stop_cost, "tester_failed": self.tester_failed}


def tester_failed(attempt: Attempt) -> bool:
    """Whether the attempt's tester (the test nets apart) ran out of memory and ended it: a tester never shrinks its
    batch, so its job's test nets are shared from then on. (A tester that failed otherwise, killed say, tells
    nothing of memory: its job resumes as it was.)"""
    return attempt.status == OUTCOME_OUT_OF_MEMORY and bool(attempt.tester and attempt.tester.get("failed"))


def stacks(definition: JobDefinition) -> int:
    """Address space the runner's capped child reserves for Caffe's thread stacks."""
    return definition.threads * THREAD_STACK_BYTES


class AttemptLoop:
    """The attempts of the manager's running jobs, on its run `state` (the placed jobs' entries, the lock, the
    store, whether it stops). `run(job_id)` is a placed job's task (the dispatcher's `_run_job`): it returns once the
    job's end is recorded (or raises; the dispatcher records the error as the job's end). `definitions` gives a
    job's definition, `quota` measures its folder after each attempt."""

    def __init__(
        self,
        config: ManagerConfig,
        devices: DeviceReader,
        state: RunState,
        reporter: Reporter,
        definitions: Definitions,
        quota: Quota,
        *,
        jobs_root: Path,
        oracle: ShapeOracle | None,
        backend: Backend | None = None,
        planner: Planner | None = None,
    ) -> None:
        self.config = config
        self.planner = planner
        """Where plans are made (jobs.scheduling.planning: a costly one in an estimate worker); None: here."""
        self.backend: Backend = backend or LocalBackend()
        self.devices = devices
        self.state = state
        self.reporter = reporter
        self.definitions = definitions
        self.quota = quota
        self.jobs_root = jobs_root
        self.oracle = oracle

    def plan(
        self, job: Job, definition: JobDefinition, engine: str, limit: int, failures: Sequence[Failure] = (),
        made: int = 0, *, placing: bool = False, apart: ApartSoFar | None = None,
    ) -> Decision:
        """The job's plan on a device of `engine` (the scheduler's plan with `placing`): core.planning.job_plan.plan_job,
        which the form, the REST estimate and the command line plan with too; made where the planner says (a
        costly one in an estimate worker: estimate_pool's PoolErrors then reach the caller). `apart`: what the job's
        attempts so far tell of its test nets apart, and where its tester may go."""
        asked = (apart or ApartSoFar()).plan_fields()
        if self.planner is None:
            return plan_for(job.spec, definition, self.oracle, engine=engine, limit_bytes=limit,
                            policy=self.config.policy, failures=failures, attempts_made=made, placing=placing,
                            effective_batch=job.effective_batch, iteration=job.iteration, **asked)
        return self.planner.plan(job.spec, definition, engine=engine, limit_bytes=limit, policy=self.config.policy,
                                 failures=failures, attempts_made=made, placing=placing,
                                 effective_batch=job.effective_batch, iteration=job.iteration, **asked)

    def _attempt_plan(
        self, job: Job, definition: JobDefinition, engine: str, limit: int, failures: Sequence[Failure], made: int,
        cancelled: Callable[[], bool], apart: ApartSoFar,
    ) -> Decision | None:
        """The next attempt's plan; while every estimate worker is busy and their queue full, the job waits for
        one (its attempt is not failed for it). None when it was cancelled or the server stops meanwhile."""
        while True:
            try:
                return self.plan(job, definition, engine, limit, failures, made, apart=apart)
            except PoolBusy as busy:
                log.info("job %s: its plan waits for an estimate worker (%s)", job.id, busy)
                waited = 0.0
                while waited < busy.retry_after:
                    if cancelled():
                        return None
                    time.sleep(min(1.0, busy.retry_after - waited))
                    waited += 1.0

    def _job(self, job_id: str) -> Job:
        job = self.state.store.get_job(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return self.reporter.view(job)

    def run(self, job_id: str) -> None:
        store, reporter, state = self.state.store, self.reporter, self.state
        job = self._job(job_id)
        entry = state.running[job_id]
        definition = self.definitions.get(job)
        engine = self.config.gpu_engine if entry.kind == GPU else ENGINE_CPU
        earlier = [a for a in store.attempts(job_id) if a.device == entry.device]
        failures = [failure_of(a) for a in earlier
                    if a.status == OUTCOME_OUT_OF_MEMORY and a.limit_bytes is not None and not tester_failed(a)]
        apart = ApartSoFar(tester_failed=any(tester_failed(a) for a in earlier))
        made = 0
        job = store.update_job(job_id, started_at=job.started_at or time.time())
        reporter.emit_job(job)
        while True:
            with state.lock:
                if entry.cancel or state.stopping:
                    stopping = state.stopping
                    reporter.finish(job_id, INTERRUPTED if stopping else CANCELLED,
                                    INTERRUPTED_MESSAGE if stopping else "cancelled")
                    return
            device = self.devices.read().get(entry.device)
            cap = memory_cap(job.spec.get("memory_cap"), self.config.cpu_memory_cap)
            limit = None if device is None else limit_for(
                device, reserved=state.reserved(entry.device, exclude=job_id), cap=cap, cap_overhead=stacks(definition)
            )
            if device is None or limit is None:
                reporter.finish(job_id, FAILED, f"device {entry.device} cannot be read any more")
                return
            job = self._job(job_id)
            apart.testers = self.tester_devices(job.spec, entry.device, cap, definition, job_id)
            decision = self._attempt_plan(job, definition, engine, limit.limit_bytes, failures, made,
                                          lambda: entry.cancel or state.stopping, apart)
            if decision is None:
                continue  # cancelled or stopping while it waited: said at the top of the loop
            if decision.stop or decision.plan is None:
                prefix = "out of memory: " if failures else ""
                reporter.finish(job_id, FAILED, prefix + decision.message)
                return
            result, attempt, report = self._run_attempt(job, definition, entry, limit, decision, apart)
            self.quota.measure(job_id)
            ending = job_end(result, store.attempts(job_id))
            if ending is not None:
                reporter.finish(job_id, *ending)
                return
            if result.outcome.status != OUTCOME_OUT_OF_MEMORY:
                continue  # replanned: the next plan, with what the attempt measured
            made += 1
            if report is not None and report.failed is not None:
                apart.tester_failed = True  # a tester never shrinks its batch: the test nets are shared from here
            else:
                failures.append(self._failure_after(attempt, limit, result, decision.test_net))

    def tester_devices(
        self, spec: Mapping[str, Any], trainer: str, cap: int | None, definition: JobDefinition,
        job_id: str | None = None,
    ) -> tuple[TesterDevice, ...]:
        """The devices other than the `trainer`'s where a job's tester may go (the job's stored `spec`; `job_id`'s
        own reservations left out), best first: the one the job named (`tester_device`), or with "auto" the other
        GPUs this server may use, most free memory first (the CPU only when named: a test pass there may take
        longer than an interval of training on a GPU). None for a job whose test nets are shared, or named to share
        the trainer's device."""
        choice = spec.get("tester_device") or AUTO
        if (spec.get("test_net") or TEST_NET_SHARED) == TEST_NET_SHARED or choice in (SAME_DEVICE, trainer):
            return ()
        devices = self.devices.read()
        if choice == AUTO:
            if self.config.gpus_simulated:
                return ()  # no CUDA device is behind a simulated GPU: a tester there could not run
            try:
                named = [gpu for gpu in allowed_gpus(devices.gpus) if gpu.error is None and gpu.key != trainer]
            except DeviceSelectionError:
                return ()
        else:
            found = devices.get(choice)
            named = [] if found is None or found.error is not None else [found]
        policy = self.config.policy
        testers = []
        for device in named:
            on_cpu = device.kind != GPU
            limit = limit_for(device, reserved=self.state.reserved(device.key, exclude=job_id),
                              cap=cap if on_cpu else None, cap_overhead=stacks(definition) if on_cpu else 0)
            if limit is not None:
                engine = policy.engine(CPU if on_cpu else GPU)
                testers.append(TesterDevice(device.key, engine, limit.limit_bytes, policy.safety_margin(engine)))
        return tuple(sorted(testers, key=lambda tester: -tester.limit_bytes))

    def _failure_after(self, attempt: Attempt, limit: Limit, result: AttemptResult, test_net: str) -> Failure:
        """What the failed attempt tells, with its limit lowered to what the device had free once it ended
        (another process may have taken memory meanwhile); a cap stays the cap."""
        overhead = limit.overhead_bytes
        effective = limit.cap_bytes - overhead if limit.cap_bytes is not None else limit.limit_bytes
        if limit.cap_bytes is None:
            device = self.devices.read().get(limit.device.key)
            if device is not None and device.memory_free is not None:
                effective = min(effective, device.memory_free)
        record = result.outcome.out_of_memory
        failure = Failure(
            batch_size=attempt.batch_size,
            test_batch_size=attempt.test_batch_size,
            limit_bytes=effective,
            requested_bytes=None if record is None else record.requested_bytes,
            free_bytes=None if record is None else record.free_bytes,
            used_bytes=None if result.peak_bytes is None else max(0, result.peak_bytes - overhead),
            test_net=test_net,
        )
        self.reporter.durable(
            attempt.job_id, f"attempt {attempt.number}'s limit",
            lambda: self.state.store.update_attempt(attempt.job_id, attempt.number, limit_bytes=effective),
            attempt=(attempt.number, {"limit_bytes": effective}),
        )
        return failure

    def _spec(
        self, job: Job, definition: JobDefinition, entry: Running, limit: Limit, decision: Decision, number: int
    ) -> tuple[AttemptSpec, dict[str, str], AttemptFiles]:
        """The attempt's spec, with its files written, the child's environment (its CUDA device), and the files."""
        plan = decision.plan
        if plan is None:
            raise ValueError("an attempt needs a plan")
        folder = self.jobs_root / job.folder
        attempt_dir = f"attempts/{number}"
        test_batch = decision.test_plan["batch_size"] if decision.test_plan else None
        device, environment = self._child_device(entry.device, entry.kind)
        caffe = self.config.caffe
        binary = caffe.runner == BINARY
        if caffe.pycaffe and not binary:  # a Caffe root's own pycaffe, before this Python's
            environment["PYTHONPATH"] = os.pathsep.join(filter(None, [caffe.pycaffe, os.environ.get("PYTHONPATH")]))
        # A job by epochs trains as long as its effective batch says, the same in every attempt once it is fixed.
        length = definition.length(job.effective_batch if job.effective_batch and job.iteration else plan.effective_batch)
        apart = decision.test_net == TEST_NET_APART
        files = write_attempt(
            definition, folder, attempt_dir, batch_size=plan.batch_size, iter_size=plan.iter_size,
            test_batch=test_batch, gpu=device.cuda_index, caffe_runs=binary, max_iter=length.max_iter,
            test_interval=length.test_interval, tests_apart=apart,
        )
        resume = job.snapshot["state"] if job.snapshot and (folder / job.snapshot["state"]).is_file() else None
        tested = resume is not None and job.snapshot is not None and self._tested(job, int(job.snapshot["iteration"]))
        solver = definition.solver
        spec = AttemptSpec(
            job_id=job.id,
            attempt=number,
            solver=files.solver,
            log=f"{attempt_dir}/caffe.log",
            progress=f"{attempt_dir}/progress.jsonl",
            device=device,
            batch_size=plan.batch_size,
            iter_size=plan.iter_size,
            resume=resume,
            memory_cap=limit.cap_bytes,
            max_iter=length.max_iter,
            test_interval=length.test_interval,
            test_iter=tuple(test_iters(definition, test_batch)),
            test_initialization=bool(solver.test_initialization),
            snapshot=int(solver.snapshot),
            snapshot_after_train=bool(solver.snapshot_after_train),
            snapshot_prefix=snapshot_prefix(solver),
            snapshot_format="HDF5" if solver.snapshot_format == 0 else "BINARYPROTO",
            schedule=definition.schedule_for(length).to_dict(),
            nice=self.config.job_nice,
            divergence=job.spec.get("divergence") or DEFAULT_POLICY,
            runner=BINARY_RUNNER if binary else PYCAFFE_RUNNER,
            caffe=caffe.binary if binary else None,
            preload=self.config.preload if binary else None,
            read_paths=files.reads,
            write_paths=files.writes,
            test_net=TEST_NET_APART if apart else TEST_NET_SHARED,
            pause_at_tests=apart and decision.tester_device is None,
            tests_from=int(job.snapshot["iteration"]) + 1 if tested and job.snapshot else 0,
        )
        spec.write(folder / attempt_dir / "attempt.json")
        return spec, environment, files

    def _tested(self, job: Job, iteration: int) -> bool:
        """Whether a tester of the job's latest attempt tested the snapshot of `iteration` (the attempt that resumes
        from it then does not test it again: a replan from an apart attempt to a shared one)."""
        attempts = self.state.store.attempts(job.id)
        last = attempts[-1] if attempts else None
        return bool(last and last.tester and iteration in (last.tester.get("tested") or ()))

    def _child_device(self, key: str, kind: str) -> tuple[AttemptDevice, dict[str, str]]:
        """A child's device (the CPU, or a GPU by CUDA's number inside the child) and its CUDA environment."""
        if kind != GPU:
            return AttemptDevice("cpu"), {"CUDA_VISIBLE_DEVICES": ""}
        gpus = self.devices.read().gpus
        host = next((gpu.host for gpu in gpus if gpu.key == key), None)
        try:  # CUDA numbers the GPUs of the host the attempt runs on
            child = child_cuda_environment([key], [gpu for gpu in gpus if gpu.host == host])
        except DeviceSelectionError as error:
            raise JobError(str(error)) from None
        return AttemptDevice("gpu", key, child.cuda_index[key]), dict(child.environment)

    def _run_attempt(
        self, job: Job, definition: JobDefinition, entry: Running, limit: Limit, decision: Decision,
        so_far: ApartSoFar,
    ) -> tuple[AttemptResult, Attempt, TesterReport | None]:
        """One attempt: its files and row written, its child (or, with the test nets apart, its trainer and testers)
        launched and followed to its end, the end recorded; with the test nets apart, what its testers did. What it
        measured of the test nets' placement goes into `so_far` (the stop's cost, an interval shared)."""
        spec, environment, files = self._begin_attempt(job, definition, entry, limit, decision)
        apart: ApartRun | None = None
        watch = None
        if decision.test_net == TEST_NET_SHARED and decision.by_stop_cost and spec.test_interval and (
            so_far.stop_cost.shared_interval_seconds is None
        ):  # `auto` chose shared on the stop's cost alone: an interval shared is timed, to compare
            watch = SharedWatch(so_far.stop_cost, spec.test_interval)
        if decision.test_net == TEST_NET_APART:
            place = self._tester_place(entry, spec, environment, decision, files, job, definition.train_items)
            place = dataclasses.replace(place, shared_interval_seconds=so_far.stop_cost.shared_interval_seconds)

            def start(launch: Launch) -> AttemptHandle:
                nonlocal apart
                apart = ApartRun(self.backend, launch, place, attempt_dir=f"attempts/{spec.attempt}",
                                 on_process=lambda handle: self._store_handle(job.id, spec.attempt, handle))
                apart.start()
                with self.state.lock:
                    entry.tester_device = None if place.same_device else place.device
                    entry.tester_estimated = 0 if place.same_device else (decision.tester_bytes or 0)
                    entry.holds_between = place.same_device  # its device is held for whichever child runs next
                    if place.same_device:
                        entry.estimated = max(entry.estimated, decision.tester_bytes or 0)
                return apart

            process = self._launch(job, entry, spec, environment, decision, start)
        else:
            process = self._launch(job, entry, spec, environment, decision, self.backend.launch,
                                   observe=watch.on_record if watch is not None else None)
            if watch is not None:
                watch.attach(process)
        try:
            ended = process.wait()
            if watch is not None and not entry.cancel:
                ended = watch.ended(ended)
            result = self._outcome(self.jobs_root / job.folder, entry, ended)
        finally:
            with self.state.lock:
                entry.tester_device, entry.tester_estimated, entry.holds_between = None, 0, False
        report = apart.report if apart is not None else None
        if report is not None and report.cost.fraction is not None:
            so_far.stop_cost = report.cost  # measured on the job's own intervals: what `auto` decides on next
        if watch is not None and watch.measured is not None:
            so_far.stop_cost = dataclasses.replace(so_far.stop_cost, shared_interval_seconds=watch.measured)
        attempt = self._record_end(job, spec.attempt, entry, result, report)
        return dataclasses.replace(result, peak_bytes=attempt.peak_bytes), attempt, report

    def _tester_place(
        self, entry: Running, spec: AttemptSpec, environment: Mapping[str, str], decision: Decision,
        files: AttemptFiles, job: Job, train_items: int | None,
    ) -> TesterPlace:
        """Where the attempt's testers run: the device the plan gave them, or the trainer's."""
        key = decision.tester_device
        auto = (job.spec.get("test_net") or TEST_NET_SHARED) == TEST_NET_AUTO
        nets = tester_nets(files.tests_apart)
        if key is None or key == entry.device:
            return TesterPlace(entry.device, True, spec.device, environment, spec.memory_cap, decision.tester_bytes,
                               nets, auto, train_items)
        device = self.devices.read().get(key)
        kind = GPU if device is not None and device.kind == GPU else CPU
        attempt_device, tester_environment = self._child_device(key, kind)
        if "PYTHONPATH" in environment:
            tester_environment["PYTHONPATH"] = environment["PYTHONPATH"]
        cap = memory_cap(job.spec.get("memory_cap"), self.config.cpu_memory_cap) if kind == CPU else None
        return TesterPlace(key, False, attempt_device, tester_environment, cap, decision.tester_bytes, nets, auto,
                           train_items)

    def _begin_attempt(
        self, job: Job, definition: JobDefinition, entry: Running, limit: Limit, decision: Decision
    ) -> tuple[AttemptSpec, dict[str, str], AttemptFiles]:
        """The next attempt's files written, its row added and the job's fields set to where it starts; the
        listeners told. Its spec, the child's environment and the attempt's files."""
        store, reporter = self.state.store, self.reporter
        check_job_folder(self.jobs_root, self.jobs_root / job.folder)
        reporter.settled(job.id)  # what earlier attempts could not write at first is written by now (the writes block)
        number = len(store.attempts(job.id)) + 1
        spec, environment, files = self._spec(job, definition, entry, limit, decision, number)
        apart = decision.test_net == TEST_NET_APART
        attempt = store.add_attempt(
            Attempt(
                job_id=job.id, number=number, status=RUNNING, device=entry.device, batch_size=spec.batch_size,
                iter_size=spec.iter_size, started_at=time.time(), log=spec.log,
                test_batch_size=decision.test_plan["batch_size"] if decision.test_plan else definition.test_batch,
                test_iter=spec.test_iter[0] if spec.test_iter else None, resumed_from=spec.resume,
                start_iteration=job.snapshot["iteration"] if spec.resume and job.snapshot else 0,
                limit_bytes=limit.limit_bytes, estimated_bytes=decision.plan.bytes if decision.plan else None,
                correction=decision.correction, test_net=decision.test_net,
                tester=TesterReport(decision.tester_device or entry.device, decision.tester_device is None,
                                    decision.tester_bytes).to_json() if apart else None,
            )
        )
        updated = store.update_job(
            job.id, batch_size=spec.batch_size, iter_size=spec.iter_size, test_batch_size=attempt.test_batch_size,
            test_iter=attempt.test_iter, message=f"attempt {number}: {decision.message}",
            # The job is where this attempt starts: an earlier attempt's iteration, loss and tests are not its own
            # (a restart from 0, or from a snapshot before them), and would read as the current run.
            iteration=attempt.start_iteration, max_iter=spec.max_iter, progress=None,
            **({} if spec.resume else {"snapshot": None}),  # a snapshot not resumed from is gone: none to show
        )
        reporter.emit("job_attempt", {"job_id": job.id, **attempt.to_json()})
        reporter.emit_job(updated)
        return spec, environment, files

    def _launch(
        self, job: Job, entry: Running, spec: AttemptSpec, environment: dict[str, str], decision: Decision,
        start: Callable[[Launch], AttemptHandle], observe: Callable[[dict[str, Any]], None] | None = None,
    ) -> AttemptHandle:
        """The attempt's child started by `start` (the backend's launch, or the test nets apart's), its records
        (shown to `observe` first) and log lines passed on; a cancel or a stop that came while it started is applied
        to it."""
        reporter, state, number = self.reporter, self.state, spec.attempt

        def on_record(record: dict[str, Any]) -> None:
            if observe is not None:
                observe(record)
            reporter.on_record(job.id, number, record)

        launch = Launch(
            self.jobs_root / job.folder, f"attempts/{number}/attempt.json", spec, entry.device, environment,
            on_record=on_record,
            on_log=lambda lines: reporter.emit("job_log", {"job_id": job.id, "attempt": number, "lines": lines}),
            grace_seconds=self.config.grace_seconds, stall_seconds=self.config.stall_seconds,
            cancel_seconds=self.config.cancel_seconds,
        )
        with state.lock:
            entry.start_attempt(number, spec.max_iter)
            entry.estimated = (decision.plan.bytes if decision.plan else None) or 0
        try:  # outside the lock: a backend may take a request's time (the Ray backend submits over HTTP)
            process = start(launch)
        except Exception as error:
            message = f"the attempt could not be started ({self.backend.name} backend): {error}"
            state.store.update_attempt(job.id, number, status=OUTCOME_FAILED, finished_at=time.time(), message=message)
            raise JobError(message) from error
        with state.lock:  # a cancel or a stop that came meanwhile found no process: it is applied now
            entry.process = process
            if state.stopping:
                process.kill()
            elif entry.cancel:
                process.cancel()
        self._store_handle(job.id, number, process.handle)
        return process

    def _store_handle(self, job_id: str, number: int, handle: str) -> None:
        """The attempt's child as the store names it; the child runs now: nothing may stop this task from following
        it, a refused write included."""
        try:
            self.state.store.update_attempt(job_id, number, handle=handle)
        except StoreError as error:
            log.warning("job %s attempt %d: %s not stored (%s)", job_id, number, handle, error)

    def _outcome(self, folder: Path, entry: Running, result: AttemptResult) -> AttemptResult:
        """How the attempt ended, as the job reads it: a cancel by a stop is an interruption, a failure on a full
        disk says so, and the peak is the larger of the child's and NVML's."""
        outcome = result.outcome
        if self.state.stopping and outcome.status == OUTCOME_CANCELLED:
            outcome = dataclasses.replace(outcome, status=OUTCOME_INTERRUPTED, message=INTERRUPTED_MESSAGE)
        if outcome.status == OUTCOME_FAILED:
            outcome = note_full_disk(folder, result, outcome)
        peak = max(p for p in (result.peak_bytes, entry.peak, -1) if p is not None)
        return dataclasses.replace(result, outcome=outcome, peak_bytes=None if peak < 0 else peak)

    def _record_end(
        self, job: Job, number: int, entry: Running, result: AttemptResult, report: TesterReport | None = None
    ) -> Attempt:
        """The attempt's end and its last progress written for sure (durable writes), the listeners told; with the
        test nets apart, what its testers did (`report`)."""
        store, reporter, outcome = self.state.store, self.reporter, result.outcome
        ended = {
            "status": outcome.status, "finished_at": time.time(), "exit_code": outcome.exit_code,
            "signal": outcome.signal, "message": outcome.message,
            "out_of_memory": None if outcome.out_of_memory is None else outcome.out_of_memory.to_dict(),
            "peak_bytes": result.peak_bytes, "allocated_bytes": result.allocated_bytes,
            "end_iteration": result.last_iteration,
            **({} if report is None else {"tester": report.to_json()}),
        }
        # What the job is once this attempt has ended, shown while the writes below wait for the database.
        known = progress_fields(entry)
        ending = job_end(result, store.attempts(job.id))
        if ending is not None:
            known.update(status=ending[0], message=ending[1], finished_at=time.time() if ending[0] in FINAL_STATES else None)
        # The last progress and a snapshot the database did not take yet are the job's record: stored for sure.
        reporter.durable(
            job.id, f"attempt {number}'s progress", lambda: reporter.store_progress(job.id, entry, force=True, wait=True),
            job=known, attempt=(number, ended),
        )
        attempt = reporter.durable(
            job.id, f"the end of attempt {number}", lambda: store.update_attempt(job.id, number, **ended),
            job=known, attempt=(number, ended),
        )
        reporter.emit("job_attempt", {"job_id": job.id, **attempt.to_json()})
        return attempt


__all__ = ["INTERRUPTED_MESSAGE", "AttemptLoop", "failure_of", "job_ask", "job_end", "plan_for", "stacks"]
