"""`caffe train`'s log read as the training child's records: the lines BVLC Caffe and NVcaffe 0.17 write with glog,
turned into the events the pycaffe runner reports (constructed, test, iteration, snapshot, finished) and the
out-of-memory failures core.oom knows, as they come.

DIGITS reads the same log the same way (digits/model/tasks/caffe_train.py: the glog header, "Iteration N",
"(Train|Test) net output #K: name = value", "lr = ", "Snapshotting to"). What each Caffe writes, from its source:

* BVLC (solver.cpp, sgd_solver.cpp, tools/caffe.cpp), per update with `display: 1`:
  "Iteration 0 (0 iter/s, 0.01s/1 iters), loss = 2.3", then one "    Train net output #k: loss = 2.3 (* 1 = 2.3
  loss)" per output element, then "Iteration 0, lr = 0.01". "Iteration N" counts the updates done before this one.
  A test pass: "Iteration N, Testing net (#0)", then "    Test net output #k: accuracy = 0.5". A snapshot:
  "Snapshotting to binary proto file P_iter_N.caffemodel" (or "to HDF5 file"), then "Snapshotting solver state
  to ... P_iter_N.solverstate" (logged before the file is written). "Starting Optimization" once the solver is
  built (and restored); after the last update a forward pass displays "Iteration N, loss = X" with no outputs and
  no rate; "Optimization Done." at the end.
* NVcaffe 0.17: the same lines, except "Iteration 1 (0.23 s), loss = ..." for the first updates, the rate line
  "Iteration N, lr = 0.01, m = 0.9, wd = 0.0005, gs = 1" printed with the outputs, an initial test of one batch
  at iteration 0 whatever test_initialization says, and "[0] ", "[0.0] " or "[MultiGPU] " (its device, and solver
  rank) in front of many messages ("[0] Reserving 1725440 bytes of shared learnable space"); its memory manager's
  lines ("GPUMemory::Manager initialized", "Total memory: T, Free: F, dev_info[0]: ...") and "Top memory (TRAIN)
  required for data: N diff: M" are information, not records.

Records are what the pycaffe runner would send for the same training: `iteration` is the number of updates done,
`loss` the loss_weight-weighted sum of the train net's outputs (the last forward pass of the update, as Caffe's
own display shows them; not the log's smoothed loss), outputs of more than 16 values by their mean. An update's
record is sent once its rate line has come and the next line that marks a step of training (a display, a test pass,
a snapshot, the end) shows the update is over (its history is allocated then); a snapshot once such a line after
its solver state shows the file was written. Other lines (net construction, NVcaffe's per-iteration "Reserving"
lines) complete nothing. Values keep what Caffe printed:
"nan", "-nan" and "inf" become float NaN and infinity, and go through the runner's Reporter like any other number.

Pure: lines in, events out; no process, no clock.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

from ...core import oom_signatures as oom

MAX_LISTED_VALUES = 16
"""As the pycaffe runner: outputs with more elements are reported by their mean."""

_FLOAT = r"([-+]?(?:nan|inf(?:inity)?|\d+\.?\d*(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))"
_DEVICE_PREFIX = re.compile(r"^(?:\[(?:\d+(?:\.\d+)*|MultiGPU)\]\s*)+")
_DISPLAY = re.compile(rf"^Iteration (\d+)(?: \([^)]*\))?, loss = {_FLOAT}\s*$", re.IGNORECASE)
_RATE = re.compile(rf"^Iteration (\d+), lr = {_FLOAT}", re.IGNORECASE)
_OUTPUT = re.compile(rf"^(Train|Test) net output #(\d+): (.+?) = {_FLOAT}(?: \(\* {_FLOAT} = {_FLOAT} loss\))?\s*$",
                     re.IGNORECASE)
_TESTING = re.compile(r"^Iteration (\d+), Testing net \(#(\d+)\)")
_SNAPSHOT_MODEL = re.compile(r"^Snapshotting to (?:binary proto|HDF5) file (.+?)\s*$")
_SNAPSHOT_STATE = re.compile(r"^Snapshotting solver state to (?:binary proto|HDF5) file (.+?)\s*$")
_SNAPSHOT_ITERATION = re.compile(r"_iter_(\d+)\.(?:caffemodel|solverstate)(?:\.h5)?$")
_STARTING = re.compile(r"^Starting Optimization\b")
_DONE = re.compile(r"^Optimization Done\b")
_STOPPED_EARLY = re.compile(r"^Optimization stopped early\b")

Event = dict[str, Any]


def number(text: str) -> float:
    """A value as Caffe printed it: "nan" and "-nan" (glibc) are NaN, "inf" infinity."""
    lowered = text.lower().lstrip("+")
    if lowered.lstrip("-") == "nan":
        return math.nan
    return float(lowered)


def message_of(line: str) -> tuple[str | None, str]:
    """(glog's severity letter or None, the message without glog's header and NVcaffe's device prefix)."""
    match = oom.GLOG_LINE.match(line)
    if match is None:
        return None, line.strip()
    return match.group("severity"), _DEVICE_PREFIX.sub("", match.group("text").strip())


def output_value(values: list[float]) -> Any:
    """An output's values for a record, as the pycaffe runner reports them."""
    if len(values) == 1:
        return values[0]
    if len(values) <= MAX_LISTED_VALUES:
        return list(values)
    return {"mean": math.fsum(values) / len(values), "count": len(values)}


@dataclasses.dataclass
class _Outputs:
    """Output lines of one display or one test pass: values by name, in order, and the weighted loss."""

    values: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    loss: float | None = None

    def add(self, name: str, value: str, weighted: str | None) -> None:
        self.values.setdefault(name, []).append(number(value))
        if weighted is not None:
            self.loss = (self.loss or 0.0) + number(weighted)

    def fields(self) -> dict[str, Any]:
        return {"outputs": {name: output_value(values) for name, values in self.values.items()}, "loss": self.loss}


@dataclasses.dataclass
class _Update:
    done_before: int
    outputs: _Outputs = dataclasses.field(default_factory=_Outputs)
    lr: float | None = None


@dataclasses.dataclass
class _Test:
    iteration: int
    net: int
    outputs: _Outputs = dataclasses.field(default_factory=_Outputs)


class TrainingLog:
    """Feed `caffe train`'s lines one by one (`feed`); each call returns the events they complete. `close` at the
    end (with whether caffe exited with status 0) returns the rest. `rate(iteration)` gives the learning rate of
    an update whose log shows none (a Caffe that does not print it)."""

    def __init__(self, start_iteration: int = 0, rate: Callable[[int], float] | None = None) -> None:
        self.iteration = start_iteration
        """Updates done, as far as the log has shown."""
        self.done = False
        """"Optimization Done" was logged."""
        self.stopped_early = False
        """"Optimization stopped early" was logged: a SIGINT (a cancel) ended Solve, after its snapshot_after_train."""
        self._last_state: str | None = None
        self.out_of_memory: oom.OutOfMemory | None = None
        """The first out-of-memory failure the log showed (a line of the kind a dying process writes)."""
        self._rate = rate
        self._update: _Update | None = None
        self._update_complete = False
        self._test: _Test | None = None
        self._model: str | None = None
        self._snapshot: Event | None = None
        self._in_stack = False

    @property
    def testing(self) -> int | None:
        """The test net whose pass is under way (its outputs not all logged yet), None between passes."""
        return None if self._test is None or self._test.outputs.values else self._test.net

    def feed(self, line: str) -> list[Event]:
        line = line.rstrip("\r\n")
        events: list[Event] = []
        severity, text = message_of(line)
        found = self._failure(line, severity)
        if found is not None:
            events.append({"event": "out_of_memory", "out_of_memory": found})
        if severity is None:
            return events  # not glog's: a terminate message, OpenBLAS, a stack frame
        output = _OUTPUT.match(text)
        if output is not None and output.group(1).lower() == "train" and self._update is not None:
            self._update.outputs.add(output.group(3), output.group(4), output.group(6))
            return events
        if output is not None and output.group(1).lower() == "test" and self._test is not None:
            self._test.outputs.add(output.group(3), output.group(4), output.group(6))
            return events
        rate = _RATE.match(text)
        if rate is not None and self._update is not None and int(rate.group(1)) == self._update.done_before:
            self._update.lr = number(rate.group(2))
            self._update_complete = True
            return events
        display = _DISPLAY.match(text)
        testing = _TESTING.match(text)
        model = _SNAPSHOT_MODEL.match(text)
        state = _SNAPSHOT_STATE.match(text)
        starting, done = _STARTING.match(text), _DONE.match(text)
        if _STOPPED_EARLY.match(text):
            self.stopped_early = True
            return events
        if not (display or testing or model or state or starting or done):
            return events  # information (net construction, NVcaffe's memory manager, "Test loss:"): no record
        events.extend(self._flush(next_display=display is not None))
        if display is not None:
            self._update = _Update(int(display.group(1)))
        elif testing is not None:
            self._test = _Test(int(testing.group(1)), int(testing.group(2)))
        elif model is not None:
            self._model = model.group(1)
        elif state is not None:
            found_iteration = _SNAPSHOT_ITERATION.search(state.group(1))
            self._snapshot = {
                "event": "snapshot", "iteration": int(found_iteration.group(1)) if found_iteration else self.iteration,
                "model": self._model, "state": state.group(1),
            }
            self._model = None
            self._last_state = state.group(1)
        elif starting is not None:
            events.append({"event": "constructed", "iteration": self.iteration})
        else:
            self.done = True
        return events

    def close(self, exited_cleanly: bool) -> list[Event]:
        """The events the end completes: the last update and snapshot once caffe exited with status 0, then
        `finished` when it also logged "Optimization Done", or `stopped` (with the state of the snapshot made at the
        iteration it stopped at, else None) when Solve stopped early: a cancel's SIGINT."""
        if not exited_cleanly:
            self._snapshot = None  # its file may be half written
            if not self._update_complete:
                self._update = None
            self._test = None
        events = self._flush(next_display=False)
        if exited_cleanly and self.done and self.stopped_early:  # as the pycaffe runner ends after a cancel
            state = self._last_state if self._last_state_iteration() == self.iteration else None
            events.append({"event": "stopped", "iteration": self.iteration, "snapshot": state})
        elif exited_cleanly and self.done:
            events.append({"event": "finished", "iteration": self.iteration})
        return events

    def _last_state_iteration(self) -> int | None:
        found = _SNAPSHOT_ITERATION.search(self._last_state or "")
        return int(found.group(1)) if found else None

    def _flush(self, next_display: bool) -> list[Event]:
        """What the line that just came completes: the pending update (when its rate came, or when the next
        display shows it was an update), the test pass, the snapshot."""
        events: list[Event] = []
        update = self._update
        if update is not None and (self._update_complete or next_display):
            lr = update.lr if update.lr is not None else (self._rate(update.done_before) if self._rate else None)
            self.iteration = update.done_before + 1
            events.append({"event": "iteration", "iteration": self.iteration, "lr": lr, **update.outputs.fields()})
        # Without its rate and not followed by another update: the forward pass Solve displays after the last one.
        self._update, self._update_complete = None, False
        if self._test is not None:
            test = self._test
            events.append({"event": "test", "iteration": test.iteration, "net": test.net, **test.outputs.fields()})
            self._test = None
        if self._snapshot is not None:
            events.append(self._snapshot)
            self._snapshot = None
        return events

    def _failure(self, line: str, severity: str | None) -> oom.OutOfMemory | None:
        """An out-of-memory signature in a line of the kind a dying process writes (glog's E and F lines, and
        lines that are not glog's, less its "Check failure stack trace" frames), as core.oom classifies the end."""
        if severity is None:
            if line.startswith("*** Check failure stack trace"):
                self._in_stack = True
                return None
            if (self._in_stack and line.startswith("    @ ")) or not line.strip():
                return None
        else:
            self._in_stack = False
            if severity not in "EF":
                return None
        found = oom.out_of_memory_in(line)
        if found is not None and self.out_of_memory is None:
            self.out_of_memory = found
            return found
        return None


__all__ = ["MAX_LISTED_VALUES", "TrainingLog", "message_of", "number", "output_value"]
