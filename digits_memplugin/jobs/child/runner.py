"""The training child: one attempt of a job, driving pycaffe's solver step by step and reporting as JSON lines.

Usage: ``python -m digits_memplugin.jobs.child.runner ATTEMPT_JSON`` with the job's folder as working directory.

A Caffe without a pycaffe trains through its `caffe` binary instead (the spec's runner "binary"): this child then
runs `caffe train` and turns its log into the same records (jobs/child/binary_runner.py); all said below of the child
itself (its log, its death with the server, its priority, its records, its full disk) holds for both.

The server never runs Caffe itself: Caffe aborts the whole process on out-of-memory. Here the runner

* sends Caffe's own log (glog writes to fd 2) and any Python traceback to the attempt's ``caffe.log``;
* confines itself, before pycaffe is loaded and while it has one thread, to reading the job's folder, the dataset
  paths the spec names and the runtime's files, and to writing beneath the spec's write folders
  (jobs.child.confinement, Landlock); where the kernel has no Landlock it trains unconfined and says so in its
  "started" record;
* dies with its parent (PR_SET_PDEATHSIG), so a killed server leaves no training behind;
* lowers its own CPU priority (the attempt's "nice", 10 by default) before Caffe starts its threads, which inherit
  it: on a machine whose cores the training takes, the server's pages, API and events still come first;
* applies the attempt's memory cap to itself with RLIMIT_DATA, measured from its own footprint once pycaffe is
  loaded and the BLAS has mapped its buffers (jobs.child.blas_warmup: OpenBLAS retries a failed map for ever, so none
  may be left for after the cap), so the cap is what Caffe's buffers may take. RLIMIT_DATA (not RLIMIT_AS) because malloc then
  fails cleanly and Caffe's CHECK reports "host allocation of size N failed", while address-space reservations
  (LMDB's read-only map, glibc's arena reserves) do not count;
* disables the solver's own testing and snapshots in the generated solver and does both itself, so that every
  test result and snapshot is reported: test nets share the train net's weights, forward test_iter times, outputs
  averaged as Solver::Test does; snapshots through Solver::Snapshot with the prefix inside the job's folder;
* reports the learning rate from Caffe's formulas (core.schedule), which pycaffe does not expose.

Records on stdout (and appended to the attempt's progress.jsonl), one JSON object per line, with an "event":
started, constructed, testing (during a long test pass, at most one every ALIVE_SECONDS), test, iteration,
snapshot, test_due, paused, finished, stopped, diverged, error. Exit status 0 after "finished", "paused",
"stopped" or "diverged", 3 after "error".

With the test nets apart (the spec's test_net "apart", issue 28) the generated solver has no test net: at each test
interval the runner writes a snapshot (or names the one of that iteration) in a "test_due" record, which the
manager hands to a tester child (jobs.child.tester); on a device the two share (`pause_at_tests`) it then stops
with a "paused" record, and the manager starts it again from that snapshot once the tester has ended.

SIGINT asks the runner to stop, as `caffe train`'s default `--sigint_effect=stop` does (Solver::Step breaks out,
Solver::Solve snapshots): the handler only notes the request, and the runner honours it between two steps (or two
forward passes of a test pass), writes a snapshot of the weights it has (unless one of that iteration exists
already), a "stopped" record naming it, and exits 0. This is how the manager cancels a job (jobs.backends.attempt_process): the
work done is kept, and Resume continues from it. A runner that does not stop in time is killed.

A loss or an output that is NaN or infinite is written as "NaN", "Infinity" or "-Infinity" (core.nonfinite), never
a bare token strict JSON readers refuse. At the first such record the runner stops, unless the spec's divergence
policy is "continue" (core.divergence, the decision the server's jobs.backends.attempt_process makes from the same records): it
writes a "diverged" record with DIGITS' advice and returns before the next step or snapshot (no snapshot of NaN
weights, no signal needed).

A full disk ends the attempt with an "error" record of type "DiskFull" on stdout (a pipe to the server, which
needs no disk) rather than training on with no log, no progress file and snapshots that cannot be written.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import select
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from ...core import nonfinite
from ...core.divergence import DEFAULT_POLICY, Divergence, DivergenceWatch
from ...core.test_net_modes import TEST_NET_APART
from .attempt_spec import BINARY_RUNNER, AttemptSpec, AttemptSpecError
from .child_process import OPEN_APPEND, STOP, THREAD_STACK_BYTES, Growth, become_child, log_line, start_caffe

if TYPE_CHECKING:
    from ...core.schedule import LearningRate

SpecT = TypeVar("SpecT")
MAX_LISTED_VALUES = 16
"""Outputs with more elements are reported by their mean, not element by element."""
ALIVE_SECONDS = 10.0
"""At most one "testing" record this often during a test pass (the watchdog's sign of life)."""
DISK_FULL = "DiskFull"
"""The type of the error record of an attempt stopped by a full disk."""


class ReportDiskFull(Exception):
    """The disk holding the job's folder has no room for the attempt's records."""


class Diverged(Exception):
    """A record showed a net output that is NaN or infinite, and the attempt stops there (core.divergence)."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.stopped_message)
        self.divergence = divergence


class Reporter:
    """Writes each record to stdout (the manager reads it live) and to the attempt's progress file.

    Training never waits for a busy server: an iteration record that would block on a full stdout pipe is held
    back, and a newer one replaces it (the server keeps only the latest anyway; the progress file has them all).
    The one held back is sent before any other record, so the server sees every test, snapshot and the end, in
    order, after the latest iteration before them."""

    def __init__(
        self, stream: TextIO, progress: Path, divergence: str = DEFAULT_POLICY, seconds_before: float = 0.0
    ) -> None:
        self._stream = stream
        self.divergence = DivergenceWatch(divergence)
        self._progress = progress
        self._file: int | None = os.open(progress, OPEN_APPEND, 0o644)
        self._last = time.monotonic()
        self._started = self._last - seconds_before  # a trainer started again goes on counting its attempt's seconds
        self._held: str | None = None
        self.held_back = 0
        """Iteration records not sent live because the server was not reading (they are in the progress file)."""

    def __call__(self, event: str, **fields: Any) -> None:
        """Write one record: to stdout first (the server reads it live, with no disk in between), then to the
        progress file; a full disk there raises ReportDiskFull. Once written, a record whose outputs are not
        finite raises Diverged, unless the attempt trains on regardless."""
        self._last = time.monotonic()
        record = {"event": event, "time": time.time(), "seconds": round(self._last - self._started, 3), **fields}
        line = nonfinite.dumps(record, default=_number) + "\n"
        self._send(line, may_wait=event != "iteration")
        if self._file is None:
            return
        try:
            data = line.encode("utf-8")
            while data:
                data = data[os.write(self._file, data):]
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            os.close(self._file)
            self._file = None  # the error record that follows goes to stdout only
            raise ReportDiskFull(f"could not write {self._progress}: no space left on the device") from None
        if self.divergence.see(record) and self.divergence.first is not None:
            raise Diverged(self.divergence.first)

    def alive(self, event: str, **fields: Any) -> None:
        """A progress record for long stretches with no other (a test pass of many batches), at most one every
        ALIVE_SECONDS: it tells the server's watchdog that the attempt is still getting somewhere."""
        now = time.monotonic()
        if now - self._last >= ALIVE_SECONDS:
            self(event, **fields)

    def _send(self, line: str, may_wait: bool) -> None:
        # The line is ASCII (json.dumps escapes the rest), so its length is its size in bytes.
        if not may_wait and len(line) <= select.PIPE_BUF and not self._writable():
            if self._held is not None:
                self.held_back += 1
            self._held = line
            return
        if self._held is not None:
            self._stream.write(self._held)
            self._held = None
        self._stream.write(line)
        self._stream.flush()

    def _writable(self) -> bool:
        """Whether a line of at most PIPE_BUF bytes can be written without waiting (always, for a file)."""
        try:
            _, ready, _ = select.select([], [self._stream.fileno()], [], 0)
        except (OSError, ValueError, io.UnsupportedOperation):
            return True
        return bool(ready)


def _number(value: Any) -> Any:
    return float(value)


def output_value(values: Any) -> Any:
    """A blob's values for a record: a number, a short list, or the mean of a long one."""
    flat = values.ravel()
    if flat.size == 1:
        return float(flat[0])
    if flat.size <= MAX_LISTED_VALUES:
        return [float(v) for v in flat]
    return {"mean": float(flat.mean()), "count": int(flat.size)}


def weighted_loss(sums: Mapping[str, Any], weights: Mapping[str, float]) -> float | None:
    """Sum of loss_weight x output over the outputs that carry a loss weight (Net::Forward's loss)."""
    total, any_loss = 0.0, False
    for name, values in sums.items():
        weight = weights.get(name, 0.0)
        if weight:
            total += weight * float(values.sum())
            any_loss = True
    return total if any_loss else None


def averaged_test(
    net: Any, index: int, iterations: int, report: Reporter, source: str = "runner.py"
) -> dict[str, Any] | None:
    """Solver::Test on test net `index`: `iterations` forward passes, its outputs averaged over them. The test
    record's outputs and loss, or None when a stop was asked during the pass (Solver::Test then ends it, with no
    result)."""
    sums: dict[str, Any] = {}
    for done in range(iterations):
        if STOP.asked:
            log_line("Test interrupted.", source)
            return None
        report.alive("testing", net=index, done=done, of=iterations)
        outputs = net.forward()
        for name, values in outputs.items():
            sums[name] = values.astype("float64") if name not in sums else sums[name] + values
    means = {name: total / iterations for name, total in sums.items()}
    return {
        "outputs": {name: output_value(values) for name, values in means.items()},
        "loss": weighted_loss(means, net.blob_loss_weights),
    }


def run_tests(solver: Any, test_iters: list[int], report: Reporter) -> None:
    """Solver::TestAll: each test net shares the train net's weights, runs test_iter forward passes, and its
    outputs are averaged over them."""
    for index, net in enumerate(solver.test_nets):
        net.share_with(solver.net)
        result = averaged_test(net, index, test_iters[index], report)
        if result is None:
            return
        report("test", iteration=solver.iter, net=index, **result)


def snapshot(solver: Any, spec: AttemptSpec, report: Reporter) -> dict[str, Any]:
    """Solver::Snapshot, reported; the snapshot's iteration and files."""
    solver.snapshot()
    prefix = spec.snapshot_prefix
    h5 = ".h5" if spec.snapshot_format == "HDF5" else ""
    files = {
        "iteration": solver.iter,
        "model": f"{prefix}_iter_{solver.iter}.caffemodel{h5}",
        "state": f"{prefix}_iter_{solver.iter}.solverstate{h5}",
    }
    report("snapshot", **files)
    return files


def train(spec: AttemptSpec, report: Reporter) -> Any:
    """Confine this process to the job's files (before Caffe is loaded, while it has one thread), construct the
    solver, resume, and train to max_iter, testing and snapshotting as Solver::Solve would. The solver is
    returned: when it is freed is the caller's decision (see `_end`)."""
    from ...core.schedule import LearningRate

    schedule = LearningRate(**{**spec.schedule, "stepvalues": tuple(spec.schedule["stepvalues"])})
    started = start_caffe(spec.device, spec.memory_cap, spec.read_paths, spec.write_paths)
    memory = started.memory
    report(
        "started", pid=os.getpid(), baseline_bytes=memory.baseline, memory_cap=spec.memory_cap,
        resumed_from=spec.resume, blas=started.blas, confinement=started.confinement,
    )

    solver = started.caffe.get_solver(spec.solver)
    if spec.resume:
        solver.restore(spec.resume)
    skipped = skip_training_data(solver.net, spec.skip_forwards)
    report("constructed", iteration=solver.iter, **skipped, **memory.fields())

    try:
        _solve(solver, spec, schedule, memory, report)
    except Diverged as stop:
        report("diverged", **stop.divergence.to_dict(), message=stop.divergence.stopped_message)
    return solver


DATA_LAYERS = frozenset({"Data", "ImageData", "HDF5Data", "WindowData", "AnnotatedData", "Python"})
"""Layers that read a dataset in order and start over at its first item when a net is built."""


def skip_training_data(net: Any, forwards: int) -> dict[str, Any]:
    """`forwards` forward passes of the net's data layers alone (those with no bottom), as many as training made
    before a pause (jobs.scheduling.apart_run): each takes its next batch, so the next step reads what it would have
    read had training not stopped. What it cost, for the "constructed" record ({} when there was nothing to skip)."""
    if forwards <= 0:
        return {}
    began = time.monotonic()
    names = list(net._layer_names)
    readers = [index for index, layer in enumerate(net.layers)
               if layer.type in DATA_LAYERS and not net.bottom_names[names[index]]]
    for _ in range(forwards):
        for index in readers:
            net._forward(index, index)
    return {"skipped_forwards": forwards, "skip_seconds": round(time.monotonic() - began, 3)}


def _solve(solver: Any, spec: AttemptSpec, schedule: LearningRate, memory: Growth, report: Reporter) -> None:
    """Solver::Solve: train to max_iter, testing and snapshotting on the solver's intervals."""
    max_iter, test_interval = spec.max_iter, spec.test_interval
    test_iters = list(spec.test_iter)
    every = spec.snapshot
    weights = solver.net.blob_loss_weights
    outputs = list(solver.net.outputs)
    # The snapshot that holds the weights as they are: the state resumed from, or the latest written.
    saved = {"iteration": solver.iter, "state": spec.resume} if spec.resume else None
    apart = spec.test_net == TEST_NET_APART
    while solver.iter < max_iter:
        if STOP.asked:
            return stopped(solver, spec, memory, report, saved)
        iteration = solver.iter
        due_now = test_interval and iteration % test_interval == 0 and (iteration > 0 or spec.test_initialization)
        if due_now and iteration >= spec.tests_from:
            if not apart:
                run_tests(solver, test_iters, report)
            else:
                due = saved = test_due(solver, spec, report, saved)
                if spec.pause_at_tests:
                    return paused(solver, memory, report, due)
            if STOP.asked:
                return stopped(solver, spec, memory, report, saved)
        rate = schedule.rate(iteration)
        solver.step(1)
        values = {name: solver.net.blobs[name].data for name in outputs}
        report(
            "iteration",
            iteration=solver.iter,
            lr=rate,
            loss=weighted_loss(values, weights),
            outputs={name: output_value(v) for name, v in values.items()},
            **memory.fields(),
        )
        if every and solver.iter % every == 0:
            saved = snapshot(solver, spec, report)
    if spec.snapshot_after_train and (not every or solver.iter % every != 0):
        saved = snapshot(solver, spec, report)
    if test_interval and solver.iter % test_interval == 0 and solver.iter >= spec.tests_from:
        if not apart:
            run_tests(solver, test_iters, report)
        else:
            test_due(solver, spec, report, saved)
    report("finished", iteration=solver.iter, **memory.fields())
    log_line("Optimization Done.")


def test_due(
    solver: Any, spec: AttemptSpec, report: Reporter, saved: dict[str, Any] | None
) -> dict[str, Any]:
    """The test nets apart: the weights as they are at a test interval, in a snapshot (the one of this iteration
    when there is one already), and a "test_due" record naming it, for a tester (jobs.child.tester). The snapshot
    that holds the weights now."""
    if saved is None or saved["iteration"] != solver.iter:
        saved = snapshot(solver, spec, report)
    model = saved.get("model") or weights_of(saved["state"])
    report("test_due", iteration=solver.iter, model=model, state=saved["state"])
    return saved


def weights_of(state: str) -> str:
    """The weights Solver::Snapshot wrote beside a solver state (`<prefix>_iter_N.caffemodel[.h5]`)."""
    for suffix, weights in ((".solverstate.h5", ".caffemodel.h5"), (".solverstate", ".caffemodel")):
        if state.endswith(suffix):
            return state[: -len(suffix)] + weights
    raise ValueError(f"{state} is not a solver state Caffe names")


def paused(solver: Any, memory: Growth, report: Reporter, saved: Mapping[str, Any]) -> None:
    """The trainer's end at a test interval on a device it shares with its tester: the snapshot of this iteration
    is written (`test_due`), and the manager starts the trainer again from it once the tester has ended."""
    report("paused", iteration=solver.iter, snapshot=saved["state"], **memory.fields())
    log_line(f"Paused at iteration {solver.iter} for the tester; snapshot {saved['state']}.")


def stopped(
    solver: Any, spec: AttemptSpec, memory: Growth, report: Reporter, saved: Mapping[str, Any] | None
) -> None:
    """The end of an attempt asked to stop (SIGINT, a cancel): a snapshot of the weights as they are, unless one of
    this iteration exists already (or nothing was trained), then the "stopped" record naming it."""
    if solver.iter > 0 and (saved is None or saved["iteration"] != solver.iter):
        saved = snapshot(solver, spec, report)
    state = saved["state"] if saved is not None and saved["iteration"] == solver.iter else None
    report("stopped", iteration=solver.iter, snapshot=state, **memory.fields())
    log_line(f"Optimization stopped early at iteration {solver.iter}"
             + (f"; snapshot {state}." if state else " (nothing trained, so no snapshot)."))


def main(argv: list[str]) -> int:
    STOP.install()  # first: a cancel that comes while pycaffe loads is honoured once training can stop
    spec = read_spec(argv, "runner ATTEMPT_JSON", AttemptSpec.read, "attempt spec")
    if isinstance(spec, int):
        return spec
    become_child(spec.nice, Path(spec.log))
    report = Reporter(sys.stdout, Path(spec.progress), spec.divergence, spec.seconds_before)

    def work() -> tuple[int, Any]:
        if spec.runner == BINARY_RUNNER:
            from .binary_runner import train_with_binary

            return train_with_binary(spec, report, stack_bytes=THREAD_STACK_BYTES), None
        return 0, train(spec, report)

    return run_reported(report, work)


def read_spec(argv: list[str], usage: str, read: Callable[[Path], SpecT], what: str) -> SpecT | int:
    """The spec the child's one argument names, or the exit status of a refusal: 2 for no single argument (`usage`
    said), 3 for a file that is not a spec (`_refuse_spec`)."""
    if len(argv) != 1:
        print(f"usage: python -m digits_memplugin.jobs.child.{usage}", file=sys.stderr)
        return 2
    try:
        return read(Path(argv[0]))
    except AttemptSpecError as error:
        return _refuse_spec(argv[0], what, error)


def run_reported(report: Reporter, work: Callable[[], tuple[int, Any]]) -> int:
    """Run the child's `work` (its exit status, and what must stay referenced until the end: the solver or nets),
    every failure an error record. Every way out goes through _end while what `work` made is still referenced
    (here, or by the traceback being handled)."""
    try:
        status, held = work()
    except MemoryError as error:
        # pycaffe turns std::bad_alloc into MemoryError; the manager classifies this record as out-of-memory.
        return _end(report, _report_error(report, "MemoryError", str(error) or "out of memory"))
    except BrokenPipeError:
        return _end(report, 4)  # the server is gone; nobody reads the progress any more
    except ReportDiskFull as error:
        return _end(report, _report_error(report, DISK_FULL, str(error)))
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):  # a write of Caffe's or of ours, not the progress file
            message = f"could not write {error.filename or 'a file'}: no space left on the device"
            return _end(report, _report_error(report, DISK_FULL, message))
        with contextlib.suppress(OSError):
            traceback.print_exc()
        return _end(report, _report_error(report, type(error).__name__, str(error)))
    except Exception as error:  # noqa: BLE001 - reported to the manager, and the traceback kept in caffe.log
        with contextlib.suppress(OSError):  # caffe.log may be on a full disk
            traceback.print_exc()
        return _end(report, _report_error(report, type(error).__name__, str(error)))
    status = _end(report, status)
    del held
    return status


def _end(report: Reporter, status: int) -> int:
    """The exit status; after a net output was NaN or infinite, the process ends here instead, without freeing
    Caffe's nets. With a NaN input, Caffe's max pooling leaves its mask at -1 and its backward pass adds to the
    element before the bottom's diff buffer (pooling_layer.cpp: bottom_diff[mask[index]]), which overwrites
    malloc's header of that buffer: freeing the net then aborts ("double free or corruption (out)", SIGABRT) after
    training went well. The records, the log and the snapshots are written by now; the kernel frees the rest."""
    if report.divergence.first is None:
        return status
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(status)


def _refuse_spec(path: str, what: str, error: AttemptSpecError) -> int:
    """A spec this child cannot follow: said on stderr (the attempt's caffe.log when the manager started it) and as
    an error record on stdout, before anything is run; exit status 3, as after any error record."""
    message = f"{path} is not a valid {what}: {error}"
    print(message, file=sys.stderr)
    print(nonfinite.dumps({"event": "error", "type": type(error).__name__, "message": message}), flush=True)
    return 3


def _report_error(report: Reporter, kind: str, message: str) -> int:
    """The error record (stdout at least: the progress file may be on a full disk); exit status 3."""
    with contextlib.suppress(ReportDiskFull):
        report("error", type=kind, message=message)
    return 3


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
