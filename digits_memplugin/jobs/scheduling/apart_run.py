"""One attempt whose test nets are apart (issue 28, core.test_nets): its trainer and its testers, followed as one
attempt handle (jobs.backends.local.AttemptHandle), so that the attempt loop runs it as it runs any attempt.

The trainer is the runner with the spec's test_net "apart" (jobs.child.runner): its solver has no test net, and at
each test interval it names a snapshot due a test ("test_due"). A tester child (jobs.child.tester) tests each such
snapshot, one at a time and in order, and its "test" records go to the job as the runner's own would (the same
progress records, events and chart; the tester's progress file sits beside the runner's).

- On another device (a second GPU, the CPU), the tester runs while training goes on; testers still due when
  training ends are waited for, in order.
- On the trainer's own device, the trainer stops after the snapshot ("paused"), the tester runs, and a new trainer
  process resumes from that snapshot once the tester has ended: the two never hold the device at once. What that
  costs per interval (the trainer's pause and restart, the tester's start) against an interval's training is
  measured on the job's first interval (`StopCost`); for a job that left the choice to the planner (`auto`), when
  it is not under core.planning.apart.STOP_COST_LIMIT, the attempt ends "replanned" once its tester has tested the
  snapshot, and the attempt loop plans the next one with that cost (its test nets then shared).

How it ends: as its trainer ends (success, cancelled, out of memory, ...), unless a tester fails first: a tester's
out-of-memory is the attempt's (the loop then plans the test nets shared: a tester never shrinks its batch), any
other failure of a tester fails the attempt, naming the snapshot. A cancel stops the child running (the trainer
snapshots; a tester reports nothing), and the snapshot of a pause is kept: Resume continues from it. Nothing is
reported before it is whole: a snapshot's test records come only once its tester tested every net.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...core.oom import OUTCOME_CANCELLED, OUTCOME_OUT_OF_MEMORY, OUTCOME_REPLANNED, OUTCOME_SUCCESS, Outcome
from ...core.planning.apart import STOP_COST_LIMIT, StopCost
from ...core.test_net_modes import TESTER
from ..backends.attempt_process import AttemptProcess, AttemptResult, cancel_message
from ..backends.local import AttemptHandle, Backend, Launch
from ..child.attempt_spec import AttemptDevice, AttemptSpec
from ..child.tester_spec import TesterSpec, TestNet
from ..definition.attempt_files import TESTER_FOLDER

JOIN_SECONDS = 1.0
"""How often waiting for the testers looks again at a cancel."""


@dataclasses.dataclass(frozen=True)
class TesterPlace:
    """Where an attempt's testers run and how they are started."""

    device: str
    """The device's key (the trainer's, or another's)."""
    same_device: bool
    attempt_device: AttemptDevice
    environment: Mapping[str, str]
    """The tester's CUDA environment."""
    memory_cap: int | None
    """RLIMIT_DATA above a CPU tester's baseline (None: none)."""
    estimated_bytes: int | None
    nets: tuple[TestNet, ...]
    auto: bool
    """The job left the placement to the planner: a stop cost over STOP_COST_LIMIT ends the attempt "replanned"."""
    train_items: int | None = None
    """Items in the training set, when known: where a resumed trainer's skip through the data comes round again."""
    shared_interval_seconds: float | None = None
    """An interval's training with the test nets shared, as an earlier attempt of the job measured it (`SharedWatch`):
    with it, `auto` keeps them apart past STOP_COST_LIMIT where apart is faster, its stop included."""


@dataclasses.dataclass
class TesterReport:
    """What an attempt's testers did (kept on the attempt row, `Attempt.tester`)."""

    device: str
    same_device: bool
    estimated_bytes: int | None
    peak_bytes: int | None = None
    tested: list[int] = dataclasses.field(default_factory=list)
    """The iterations whose snapshots were tested, in order."""
    pauses: int = 0
    """Times the trainer stopped for its tester (same device)."""
    setup_seconds: float | None = None
    """Stopping and resuming at one test interval (same device): the trainer's snapshot, exit and restart, and the
    tester's start (not its forward passes, which the test nets shared take too)."""
    interval_seconds: float | None = None
    """Training time of one test interval, as measured."""
    failed: str | None = None
    """Which process ended the attempt when it was not the trainer ("tester"), with the tester's message."""
    shared_interval_seconds: float | None = None
    """An interval's training with the test nets shared, as an earlier attempt measured it (TesterPlace)."""

    @property
    def cost(self) -> StopCost:
        return StopCost(self.setup_seconds, self.interval_seconds, self.shared_interval_seconds)

    def to_json(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["stop_cost"] = self.cost.fraction
        return document


@dataclasses.dataclass
class _Stretch:
    """One trainer process's run: when it was launched, and what its records said when."""

    launched: float
    constructed: float | None = None
    first: tuple[int, float] | None = None
    """The iteration it started from and when (its "constructed" record)."""
    last: tuple[int, float] | None = None
    """Its latest iteration record: the iteration and when it came."""
    paused: dict[str, Any] | None = None
    ended: float | None = None


class ApartRun:
    """An attempt with its test nets apart (see the module). `wait` runs it to its end (in the job's task);
    `cancel` and `kill` may come from any task."""

    def __init__(
        self,
        backend: Backend,
        launch: Launch,
        tester: TesterPlace,
        *,
        attempt_dir: str,
        on_process: Callable[[str], None] = lambda handle: None,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_process = on_process
        """Told each new child's handle ("pid:N"), so that the store names the child running now (a next server
        reaps what this one left: jobs.store.datafolder.kill_leftover)."""
        self.backend = backend
        self.launch = launch
        self.place = tester
        self.attempt_dir = attempt_dir
        self.python = python
        self.clock = clock
        self.report = TesterReport(tester.device, tester.same_device, tester.estimated_bytes,
                                   shared_interval_seconds=tester.shared_interval_seconds)
        self._lock = threading.Lock()
        self._due: list[dict[str, Any]] = []
        """Snapshots due a test, oldest first."""
        self._wake = threading.Condition(self._lock)
        self._trainer: AttemptHandle | None = None
        self._tester: AttemptProcess | None = None
        self._cancelled = False
        self._killed = False
        self._training_over = False
        self._tester_result: tuple[dict[str, Any], AttemptResult] | None = None
        """The first tester that did not end well: its snapshot and result."""
        self._stretches: list[_Stretch] = []
        self._results: list[AttemptResult] = []
        """Each trainer process's result, in order."""
        self._tester_passes: list[float] = []
        """Each tester's forward passes, in order: "constructed" to "tested"."""
        self._replan: _Stretch | None = None
        """The trainer stopped because the stop cost went over STOP_COST_LIMIT (`auto`): the attempt is replanned."""
        self._started = clock()

    # --- the handle ---------------------------------------------------------------------------------------------

    @property
    def handle(self) -> str:
        trainer = self._trainer
        if trainer is None:
            raise RuntimeError("the attempt was not started")
        return trainer.handle

    @property
    def pid(self) -> int | None:
        """The process holding the trainer's device now: the trainer, or on a shared device its tester."""
        tester, trainer = self._tester, self._trainer
        if self.place.same_device and tester is not None:
            return tester.pid
        return None if trainer is None else trainer.pid

    @property
    def tester_pid(self) -> int | None:
        """The tester running on another device now (NVML's figure for it is its memory there), else None."""
        tester = self._tester
        return None if self.place.same_device or tester is None else tester.pid

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            self._wake.notify_all()
            trainer, tester = self._trainer, self._tester
        for process in (trainer, tester):
            if process is not None:
                process.cancel()

    def kill(self) -> None:
        with self._lock:
            self._cancelled = self._killed = True
            self._wake.notify_all()
            trainer, tester = self._trainer, self._tester
        for process in (trainer, tester):
            if process is not None:
                process.kill()

    def start(self) -> None:
        """Start the first trainer process (the backend raises when it cannot be started)."""
        self._start_trainer(self.launch.spec)

    def wait(self) -> AttemptResult:
        """Run the attempt to its end: the trainer's stretches and the testers; how it ended."""
        if self.place.same_device:
            return self._wait_pausing()
        return self._wait_beside()

    # --- on the trainer's device: pause, test, resume -----------------------------------------------------------

    def _wait_pausing(self) -> AttemptResult:
        spec = self.launch.spec
        while True:
            trainer = self._trainer
            assert trainer is not None
            result = trainer.wait()
            self._results.append(result)
            stretch = self._stretches[-1]
            stretch.ended = self.clock()
            replanning = self._replan is not None and not self._cancelled
            if replanning and result.outcome.status == OUTCOME_CANCELLED:  # it stopped as `_on_started_again` asked
                return self._replanned(result)
            due = self._take_due()
            if result.outcome.status != OUTCOME_SUCCESS:
                return self._ended(result)
            for snapshot in due:
                failed = self._test(snapshot)
                if failed is not None:
                    return failed
            if stretch.paused is None:  # training finished (before a stop could come), its last snapshot tested
                return self._ended(result)
            if self._cancelled:
                return self._cancelled_at(result, stretch.paused)
            if replanning:  # it paused before the stop came: the attempt ends at the pause, its snapshot tested
                return self._replanned(result)
            self.report.pauses += 1
            iteration = int(stretch.paused["iteration"])
            spec = dataclasses.replace(
                spec, resume=stretch.paused["snapshot"], tests_from=iteration + 1,
                skip_forwards=self._skip(spec, iteration), seconds_before=round(self.clock() - self._started, 3),
            )
            spec.write(self.launch.folder / self.launch.spec_file)
            self._start_trainer(spec)

    def _skip(self, spec: AttemptSpec, iteration: int) -> int:
        """The data layers' forward passes that bring a trainer resumed at `iteration` to where the training data
        was: one per pass of each iteration since the attempt's first trainer began (which read from the first
        item), fewer where the training set's size says where they come round again."""
        first = self._stretches[0].first
        start = first[0] if first is not None else iteration
        forwards = max(0, iteration - start) * spec.iter_size
        items = self.place.train_items
        if items:
            forwards %= items // math.gcd(items, spec.batch_size)  # position = forwards x batch mod items
        return forwards

    def _on_started_again(self, stretch: _Stretch) -> None:
        """A trainer constructed after a pause: what that pause cost is known (`_measure`); for an `auto` job whose
        stop cost is no longer under STOP_COST_LIMIT, this trainer stops at once (it has trained nothing) and the
        attempt ends "replanned" (`_replanned`)."""
        self._measure()
        if not self.place.auto or self.report.cost.keeps_apart() in (None, True) or self._replan is not None:
            return
        self._replan = stretch
        trainer = self._trainer
        if trainer is not None:
            trainer.cancel()

    def _measure(self) -> float | None:
        """The stop cost as measured so far: the mean of each pause's set-up (`_setups`) over one test interval's
        training (`_interval_seconds`); None until both are known."""
        report = self.report
        if report.interval_seconds is None:
            report.interval_seconds = self._interval_seconds(self.launch.spec.test_interval)
        setups = self._setups()
        if setups:
            report.setup_seconds = round(sum(setups) / len(setups), 3)
        return report.cost.fraction

    def _interval_seconds(self, test_interval: int) -> float | None:
        """One test interval's training time, from the first stretch that trained: its time per iteration from its
        construction to its last iteration record (snapshots written meanwhile included), times the interval."""
        for stretch in self._stretches:
            if stretch.first is None or stretch.last is None or stretch.last[0] <= stretch.first[0]:
                continue
            per_iteration = (stretch.last[1] - stretch.first[1]) / (stretch.last[0] - stretch.first[0])
            return round(per_iteration * test_interval, 3)
        return None

    def _setups(self) -> list[float]:
        """What each pause measured so far added: the whole pause, from the paused trainer's last iteration (or its
        construction) to the next trainer's construction (the snapshot, both exits, the tester's start, the restore
        and the skip through the training data, and every gap between the processes), less the tester's forward
        passes, which the test nets shared run too."""
        setups = []
        for index, (paused, resumed) in enumerate(zip(self._stretches, self._stretches[1:])):
            if index >= len(self._tester_passes) or resumed.constructed is None:
                break
            before = paused.last[1] if paused.last is not None else paused.constructed or paused.launched
            setups.append(max(0.0, resumed.constructed - before - self._tester_passes[index]))
        return setups

    def _replanned(self, result: AttemptResult) -> AttemptResult:
        """The attempt's end once the stop cost went over STOP_COST_LIMIT: its last trainer was stopped as soon as
        it was built (it snapshots where it stopped, a step or so on), and the next attempt, planned with the cost
        measured, goes on from there."""
        cost = self.report.cost
        why = "shared is faster" if cost.apart_faster is False else f"not under {STOP_COST_LIMIT:.0%}"
        return replanned(self._combined(result), cost, f" ({why}); the next attempt goes on from its snapshot")

    # --- on another device: training goes on ---------------------------------------------------------------------

    def _wait_beside(self) -> AttemptResult:
        worker = threading.Thread(target=self._test_in_turn, name="tester", daemon=True)
        worker.start()
        trainer = self._trainer
        assert trainer is not None
        result = trainer.wait()
        self._results.append(result)
        self._stretches[-1].ended = self.clock()
        with self._lock:
            self._training_over = True
            if result.outcome.status != OUTCOME_SUCCESS:
                self._due.clear()  # the attempt ends with its trainer: snapshots not tested yet are not
                tester = self._tester
                if tester is not None:
                    tester.cancel()
            self._wake.notify_all()
        while worker.is_alive():  # each tester is bounded by its own watchdog and the cancel's bound
            worker.join(JOIN_SECONDS)
        if self._tester_result is not None and result.outcome.status in (OUTCOME_SUCCESS, OUTCOME_CANCELLED):
            snapshot, failed = self._tester_result
            if not (self._cancelled and failed.outcome.status == OUTCOME_CANCELLED):
                return self._tester_failed(result, snapshot, failed)
        return self._ended(result)

    def _test_in_turn(self) -> None:
        """The testers, one at a time, in the order their snapshots came, until training is over and none is due;
        a tester that fails stops the trainer (it snapshots and stops) and the testing."""
        while True:
            with self._lock:
                while not self._due and not self._training_over and not self._cancelled:
                    self._wake.wait()
                if not self._due or self._cancelled:
                    return
                snapshot = self._due.pop(0)
            if self._test(snapshot) is not None:
                trainer = self._trainer
                if trainer is not None:
                    trainer.cancel()
                return

    # --- one tester ---------------------------------------------------------------------------------------------

    def _test(self, snapshot: Mapping[str, Any]) -> AttemptResult | None:
        """Test one snapshot in a tester child; None when it tested it, else the attempt's end (same device) or
        the tester's failure kept for the end (another device)."""
        if self._cancelled:
            return None
        iteration = int(snapshot["iteration"])
        folder = f"{self.attempt_dir}/{TESTER_FOLDER}"
        (self.launch.folder / folder).mkdir(exist_ok=True)
        spec_file = f"{folder}/iter_{iteration}.json"
        trainer_spec = self.launch.spec
        TesterSpec(
            weights=str(snapshot["model"]), iteration=iteration, nets=self.place.nets,
            device=self.place.attempt_device, memory_cap=self.place.memory_cap, log=f"{folder}/caffe.log",
            progress=f"{folder}/progress.jsonl", nice=trainer_spec.nice, read_paths=trainer_spec.read_paths,
            write_paths=tuple(path for path in trainer_spec.write_paths if path != "snapshots"),
        ).write(self.launch.folder / spec_file)
        built: list[float | None] = [None]

        def on_record(record: dict[str, Any]) -> None:
            event = record.get("event")
            if event == "constructed":
                built[0] = self.clock()
            elif event == "tested" and built[0] is not None:
                self._tester_passes.append(self.clock() - built[0])
            elif event == "test":
                self.launch.on_record(record)  # the job's test result, as the runner's own

        process = AttemptProcess(
            self.launch.folder, spec_file, f"{folder}/caffe.log", environment=self.place.environment,
            on_record=on_record, grace_seconds=self.launch.grace_seconds, stall_seconds=self.launch.stall_seconds,
            command=[self.python, "-m", "digits_memplugin.jobs.child.tester", spec_file],
            divergence=trainer_spec.divergence, cancel_seconds=self.launch.cancel_seconds,
        )
        with self._lock:
            if self._cancelled:
                return None
            process.start()
            self._tester = process
        self.on_process(process.handle)
        try:
            result = process.wait()
        finally:
            with self._lock:
                self._tester = None
        if result.peak_bytes is not None:
            self.report.peak_bytes = max(self.report.peak_bytes or 0, result.peak_bytes)
        if result.outcome.status == OUTCOME_SUCCESS:
            self.report.tested.append(iteration)
            return None
        self._tester_result = (dict(snapshot), result)
        if not self.place.same_device:
            return result
        return self._tester_failed(self._results[-1], snapshot, result)

    # --- how it ended -------------------------------------------------------------------------------------------

    def _tester_failed(
        self, trainer: AttemptResult, snapshot: Mapping[str, Any], failed: AttemptResult
    ) -> AttemptResult:
        """The attempt ended by a tester: its out-of-memory (the loop plans the test nets shared next) or its
        failure, naming the snapshot; a cancel stays a cancel."""
        outcome = failed.outcome
        if outcome.status == OUTCOME_CANCELLED or self._cancelled:
            return self._cancelled_at(trainer, snapshot)
        where = f"the tester of iteration {snapshot['iteration']} ({snapshot['model']})"
        self.report.failed = f"{TESTER}: {outcome.message}"
        message = (f"{where} ran out of memory at the test nets' own batch: {outcome.message}"
                   if outcome.status == OUTCOME_OUT_OF_MEMORY else f"{where} failed: {outcome.message}")
        ended = dataclasses.replace(outcome, message=message)
        return dataclasses.replace(self._combined(trainer), outcome=ended, finished=False, error=failed.error)

    def _cancelled_at(self, trainer: AttemptResult, snapshot: Mapping[str, Any]) -> AttemptResult:
        """Cancelled between the trainer's stretches (while its tester ran): the pause's snapshot is the work kept."""
        iteration = snapshot.get("iteration")
        saved = {"iteration": iteration, "state": snapshot.get("snapshot") or snapshot.get("state")}
        message = cancel_message(None, iteration, None, self.launch.cancel_seconds, snapshot=saved)
        outcome = Outcome(OUTCOME_CANCELLED, message, exit_code=trainer.outcome.exit_code)
        return dataclasses.replace(self._combined(trainer), outcome=outcome, finished=False,
                                   stopped={"event": "stopped", **saved, "snapshot": saved["state"]})

    def _ended(self, result: AttemptResult) -> AttemptResult:
        return self._combined(result)

    def _combined(self, last: AttemptResult) -> AttemptResult:
        """The last trainer's result with the peaks of every stretch (each process starts from its own baseline)."""
        peaks = [r.peak_bytes for r in self._results if r.peak_bytes is not None]
        allocated = [r.allocated_bytes for r in self._results if r.allocated_bytes is not None]
        return dataclasses.replace(
            last, peak_bytes=max(peaks) if peaks else None, allocated_bytes=max(allocated) if allocated else None,
            records=sum(r.records for r in self._results),
        )

    # --- the trainer's processes --------------------------------------------------------------------------------

    def _start_trainer(self, spec: AttemptSpec) -> None:
        stretch = _Stretch(self.clock())
        self._stretches.append(stretch)
        launch = dataclasses.replace(self.launch, spec=spec, on_record=lambda record: self._on_trainer(stretch, record))
        process = self.backend.launch(launch)
        with self._lock:
            self._trainer = process
            cancelled, killed = self._cancelled, self._killed
        if len(self._stretches) > 1:  # the first one's is stored by the attempt loop, as any attempt's
            self.on_process(process.handle)
        if killed:
            process.kill()
        elif cancelled:
            process.cancel()

    def _on_trainer(self, stretch: _Stretch, record: dict[str, Any]) -> None:
        event = record.get("event")
        now = self.clock()
        iteration = record.get("iteration")
        if event == "constructed":
            stretch.constructed = now
            if isinstance(iteration, int):
                stretch.first = (iteration, now)
            if len(self._stretches) > 1 and self.place.same_device:
                self._on_started_again(stretch)
        elif event == "iteration" and isinstance(iteration, int):
            stretch.last = (iteration, now)
        elif event == "test_due":
            with self._lock:
                self._due.append(dict(record))
                self._wake.notify_all()
        elif event == "paused":
            stretch.paused = dict(record)
        self.launch.on_record(record)

    def _take_due(self) -> list[dict[str, Any]]:
        with self._lock:
            due, self._due = self._due, []
        return due


class SharedWatch:
    """A shared attempt of an `auto` job that left its test nets apart for what stopping cost (`StopCost`): it times
    the attempt's first test interval of training (its test passes left out: the tester runs them too) and, where
    apart, its stop included, was faster (`StopCost.keeps_apart`), stops the attempt there ("replanned"), so that
    the job goes on apart. Either way the measure is the job's (`measured`), for every plan after it."""

    def __init__(self, cost: StopCost, test_interval: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.cost = cost
        self.test_interval = test_interval
        self.clock = clock
        self.measured: float | None = None
        """An interval's training with the test nets shared, once timed."""
        self.replan = False
        self._handle: AttemptHandle | None = None
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] | None = None
        self._previous: float | None = None
        self._testing = 0.0

    def attach(self, handle: AttemptHandle) -> None:
        self._handle = handle

    def on_record(self, record: Mapping[str, Any]) -> None:
        now, event, iteration = self.clock(), record.get("event"), record.get("iteration")
        if event == "constructed" and isinstance(iteration, int):
            self._first = (iteration, now)
        elif event == "iteration" and isinstance(iteration, int) and self._first is not None:
            self._last = (iteration, now)
        elif event == "test" and self._first is not None and self._previous is not None:
            self._testing += now - self._previous  # a test pass: between the record before it and its result
        self._previous = now
        first, last = self._first, self._last
        if self.measured is not None or first is None or last is None or last[0] - first[0] < self.test_interval:
            return
        per_iteration = max(0.0, last[1] - first[1] - self._testing) / (last[0] - first[0])
        self.measured = round(per_iteration * self.test_interval, 3)
        if dataclasses.replace(self.cost, shared_interval_seconds=self.measured).keeps_apart():
            self.replan = True
            if self._handle is not None:
                self._handle.cancel()

    def ended(self, result: AttemptResult) -> AttemptResult:
        """The attempt's result; "replanned" where it stopped because apart is faster."""
        if not self.replan or result.outcome.status != OUTCOME_CANCELLED:
            return result
        cost = dataclasses.replace(self.cost, shared_interval_seconds=self.measured)
        return replanned(result, cost, "; apart is faster, its stop included: the next attempt goes on from its "
                                       "snapshot with the test nets apart")


def replanned(result: AttemptResult, cost: StopCost, then: str) -> AttemptResult:
    """An attempt stopped on purpose for what the test nets' placement was measured to cost ("replanned"): its
    message says where it stopped and what was measured, `then` why and what comes next."""
    iteration = (result.stopped or {}).get("iteration", result.last_iteration)
    message = f"replanned at iteration {iteration}: {cost.words('stopping and resuming for the tester')}{then}"
    outcome = Outcome(OUTCOME_REPLANNED, message, exit_code=result.outcome.exit_code)
    return dataclasses.replace(result, outcome=outcome, finished=False)


def tester_nets(files: Sequence[Any]) -> tuple[TestNet, ...]:
    """The tester's nets from the attempt's files (jobs.definition.attempt_files.TestNetFile)."""
    return tuple(TestNet(file.net, file.test_iter, tuple(file.stages), file.level) for file in files)


__all__ = ["ApartRun", "SharedWatch", "TesterPlace", "TesterReport", "tester_nets"]
