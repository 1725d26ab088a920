"""How a training attempt ended: success, cancelled, out of memory (retried), diverged or another failure (neither
retried).

Caffe does not raise on out-of-memory: a glog CHECK fails, glog prints an ``F`` line and the process aborts
(SIGABRT, exit status 134; DIGITS showed "error code -6"). Each known way of running out of memory is one small
predicate of core.oom_signatures, which reads the lines a dying process writes; `classify` combines them with how
the process ended (its exit status or signal, the runner's own error, a cancel, the kernel's OOM killer, the
watchdog's stall) into an `Outcome`. Anything unrecognised is "another failure" whose message is glog's ``F`` line,
never a guess.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Mapping
from typing import Any, Final, Literal

from .divergence import Divergence
from .oom_signatures import (
    GLOG_LINE,
    OutOfMemory,
    failure_lines,
    fatal_line,
    find_out_of_memory,
    killed_by_oom_killer,
)

OUTCOME_SUCCESS: Final = "success"
OUTCOME_CANCELLED: Final = "cancelled"
OUTCOME_OUT_OF_MEMORY: Final = "out_of_memory"
OUTCOME_FAILED: Final = "failed"
OUTCOME_INTERRUPTED: Final = "interrupted"
"""An attempt whose supervisor went away (the server was killed): neither retried nor failed, resumable."""
OUTCOME_DIVERGED: Final = "diverged"
"""An attempt stopped because a net output became NaN or infinite (core.divergence): not retried, and not a crash."""

OUTCOME_REPLANNED: Final = "replanned"
"""An attempt stopped after a snapshot so that the next one trains with another plan (the test nets apart, under
`auto`, shared from there when stopping for the tester costs too much: jobs.scheduling.apart_run): neither a
failure nor the job's end."""

OutcomeStatus = Literal["success", "cancelled", "out_of_memory", "failed", "interrupted", "diverged", "replanned"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The classification of one ended attempt."""

    status: OutcomeStatus
    message: str
    out_of_memory: OutOfMemory | None = None
    exit_code: int | None = None
    """The process's exit status; None when a signal ended it."""
    signal: str | None = None
    """The name of the signal that ended it (SIGABRT, SIGKILL, ...)."""
    fatal_line: str | None = None
    """glog's F line, when the process wrote one."""
    divergence: Divergence | None = None
    """The first non-finite net output the attempt's records showed: why it is DIVERGED, or, for an attempt of a
    job that trains on regardless, what its message notes."""

    @property
    def retry(self) -> bool:
        """Only out-of-memory is worth another attempt with a smaller batch."""
        return self.status == OUTCOME_OUT_OF_MEMORY

    def to_dict(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["out_of_memory"] = None if self.out_of_memory is None else self.out_of_memory.to_dict()
        document["divergence"] = None if self.divergence is None else self.divergence.to_dict()
        return document

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> Outcome:
        """The outcome `to_dict` wrote (a node's result: jobs.backends.node); KeyError/TypeError/ValueError when it is
        not one."""
        fields = dict(document)
        memory, divergence = fields.get("out_of_memory"), fields.get("divergence")
        fields["out_of_memory"] = None if memory is None else OutOfMemory(**memory)
        fields["divergence"] = None if divergence is None else Divergence.from_dict(divergence)
        return cls(**fields)


# --- an attempt that made no progress ---------------------------------------------------------------------------

ALLOCATION_RETRY_FRAMES: Final = {"blas_memory_alloc": "blas_allocation_retry"}
"""Functions that retry a failed allocation for ever, by the signature a stack through them is: OpenBLAS's
memory.c loops over its allocators until a buffer maps (seen under RLIMIT_DATA, gdb on the stuck child)."""
SYSTEM_SHARE_OF_A_RETRY: Final = 0.5
"""Without a stack: a capped process spending at least this share of its CPU time in the kernel is taken to be
retrying a failing mmap (the OpenBLAS loop measured 87% system time; compute loops measure near 0%)."""
BUSY_SHARE: Final = 0.5
"""At least this share of one CPU over the stall counts as burning CPU."""


@dataclasses.dataclass(frozen=True)
class Stall:
    """What the watchdog saw of an attempt that wrote no record and no log line for `seconds`."""

    seconds: float
    cpu_share: float | None = None
    """CPU time over wall time during the stall (1.0: one core busy); None when /proc did not say."""
    system_share: float | None = None
    """The kernel's share of that CPU time."""
    frames: tuple[str, ...] | None = None
    """The main thread's stack, innermost first (function names), where it could be sampled."""
    data_bytes: int | None = None
    data_limit: int | None = None
    """RLIMIT_DATA of the process (None: unlimited or unknown)."""
    state: str | None = None
    """The process's state letter in /proc (R running, S sleeping, D in uninterruptible I/O, T stopped...)."""

    @property
    def busy(self) -> bool:
        return self.cpu_share is not None and self.cpu_share >= BUSY_SHARE


def stalled_out_of_memory(stall: Stall) -> OutOfMemory | None:
    """A stall that is an allocation retried for ever: a known retry loop on the main thread's stack (certain), or,
    where the stack could not be read, a capped process burning CPU mostly in the kernel (likely)."""
    for frame in stall.frames or ():
        signature = ALLOCATION_RETRY_FRAMES.get(frame)
        if signature is not None:
            return OutOfMemory(
                signature, "cpu",
                f"host memory ran out: the process retried a failed allocation for {stall.seconds:.0f} s "
                f"({frame} on its stack) under its memory cap, and the watchdog stopped it",
                line=" <- ".join(stall.frames or ()),
            )
    if (
        stall.frames is None and stall.busy and stall.data_limit is not None
        and stall.system_share is not None and stall.system_share >= SYSTEM_SHARE_OF_A_RETRY
    ):
        return OutOfMemory(
            "allocation_retry", "cpu",
            f"host memory likely ran out: for {stall.seconds:.0f} s the process burned CPU mostly in the kernel "
            f"({stall.system_share:.0%} system time) under its memory cap, as a failed allocation retried for ever "
            "does (its stack could not be read to be sure), and the watchdog stopped it",
            ambiguous=True,
        )
    return None


def stall_message(stall: Stall) -> str:
    """Why the watchdog ended an attempt that is not out of memory, for people."""
    if stall.busy and stall.cpu_share is not None:
        doing = f"while using {stall.cpu_share:.0%} of a CPU"
    elif stall.cpu_share is not None:
        doing = f"while nearly idle (state {stall.state or '?'})"
    else:
        doing = "(its CPU use could not be read)"
    where = f"; its main thread was in {' <- '.join(stall.frames[:6])}" if stall.frames else ""
    return (
        f"made no progress for {stall.seconds:.0f} s (no record, no log line) {doing}{where}: stopped by the "
        "watchdog; resume the job to try again"
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


SIGNAL_WORDS: Final = {
    "SIGABRT": "the training process aborted",
    "SIGKILL": "the training process was killed",
    "SIGTERM": "the training process was stopped",
    "SIGINT": "the training process was interrupted",
    "SIGSEGV": "the training process crashed (invalid memory access)",
    "SIGBUS": "the training process crashed (bus error: a file it had mapped went away)",
    "SIGFPE": "the training process crashed (arithmetic error)",
    "SIGILL": "the training process crashed (an instruction this CPU lacks)",
}
"""What the signal that ended an attempt means, in words for the pages (the name stays beside them, as a title):
Caffe's failed CHECK aborts (SIGABRT), a kill is SIGKILL."""


def signal_words(name: str) -> str:
    """The words for a signal's name (`Outcome.signal`): "the training process aborted" for "SIGABRT"."""
    return SIGNAL_WORDS.get(name, f"the training process ended on {name}")


def classify(
    returncode: int | None,
    log: str,
    *,
    cancelled: bool = False,
    finished: bool = False,
    runner_error: Mapping[str, Any] | None = None,
    oom_killer: bool | None = None,
    stall: Stall | None = None,
    divergence: Divergence | None = None,
    train_on: bool = False,
) -> Outcome:
    """Classify an ended attempt.

    `returncode` is Popen's (negative: killed by that signal; 128+N from a shell means the same), `log` the tail
    of Caffe's log, `cancelled` whether we asked it to stop, `finished` whether the runner reported the end of
    training, `runner_error` the runner's own error record ({"type": "MemoryError", "message": ...}),
    `oom_killer` whether the kernel's OOM killer killed a process while the attempt ran (None: unknown). A SIGKILL
    we did not send is out-of-memory unless the kernel says it killed nothing: then it is a failure, not retried.
    `stall`: the watchdog ended the attempt because it made no progress; what it saw decides between
    out-of-memory (an allocation retried for ever) and a failure.
    `divergence`: the first non-finite net output the records showed (before any cancel). Unless `train_on` (the
    job asked to train on regardless), the attempt was stopped for it: DIVERGED with DIGITS' advice, whatever the
    stop left in the log; with `train_on` it is classified as usual and the outcome carries the divergence, except
    that a runner that said it finished has succeeded whatever its exit: once an input is NaN, Caffe's max pooling
    writes before its buffers (its mask stays -1) and freeing the net at exit aborts ("double free or corruption").
    """
    code, killed_by = _exit(returncode)
    signal_name = None if killed_by is None else _signal_name(killed_by)
    if divergence is not None and not train_on:
        return Outcome(OUTCOME_DIVERGED, divergence.stopped_message, exit_code=code, signal=signal_name, divergence=divergence)
    if divergence is not None and finished and runner_error is None and not cancelled and returncode != 0:
        ended = f"signal {signal_name}" if signal_name else f"exit status {code}"
        return Outcome(
            OUTCOME_SUCCESS, f"training finished (the process then ended with {ended} freeing a net whose outputs were not "
            "finite)", exit_code=code, signal=signal_name, divergence=divergence,
        )
    outcome = _classify(returncode, log, cancelled=cancelled, finished=finished, runner_error=runner_error,
                        oom_killer=oom_killer, stall=stall)
    return outcome if divergence is None else dataclasses.replace(outcome, divergence=divergence)


def _exit(returncode: int | None) -> tuple[int | None, int | None]:
    """(exit status, signal number) of Popen's returncode: negative, killed by that signal; 128+N from a shell
    means the same for SIGABRT and SIGKILL."""
    if returncode is not None and returncode < 0:
        return None, -returncode
    if returncode is not None and returncode > 128 and returncode - 128 in (signal.SIGABRT, signal.SIGKILL):
        return None, returncode - 128
    return returncode, None


def _classify(
    returncode: int | None,
    log: str,
    *,
    cancelled: bool,
    finished: bool,
    runner_error: Mapping[str, Any] | None,
    oom_killer: bool | None,
    stall: Stall | None,
) -> Outcome:
    code, killed_by = _exit(returncode)
    signal_name = None if killed_by is None else _signal_name(killed_by)
    lines = failure_lines(log)
    if runner_error is not None:
        lines.append(f"{runner_error.get('type', 'Error')}: {runner_error.get('message', '')}".rstrip(": "))
    fatal = fatal_line(lines)

    if returncode == 0 and finished and runner_error is None:
        return Outcome(OUTCOME_SUCCESS, "training finished", exit_code=0)
    if cancelled:
        return Outcome(OUTCOME_CANCELLED, "cancelled", exit_code=code, signal=signal_name, fatal_line=fatal)

    if stall is not None:
        found = stalled_out_of_memory(stall)
        if found is not None:
            return Outcome(OUTCOME_OUT_OF_MEMORY, found.message, found, exit_code=code, signal=signal_name, fatal_line=fatal)
        return Outcome(OUTCOME_FAILED, stall_message(stall), exit_code=code, signal=signal_name, fatal_line=fatal)

    found = find_out_of_memory(lines)
    if found is None and killed_by == signal.SIGKILL:
        if oom_killer is False:
            return Outcome(
                OUTCOME_FAILED,
                "the training process was killed with SIGKILL by someone else: not by this server, and not by the "
                "kernel's out-of-memory killer (it counted no kill meanwhile); resume the job to continue",
                exit_code=code, signal=signal_name, fatal_line=fatal,
            )
        found = killed_by_oom_killer(counted=oom_killer is True)
    if found is not None:
        return Outcome(OUTCOME_OUT_OF_MEMORY, found.message, found, exit_code=code, signal=signal_name, fatal_line=fatal)

    if fatal is not None:
        message = GLOG_LINE.match(fatal)
        text = message.group("text") if message else fatal
        where = message.group("where") if message else None
        return Outcome(
            OUTCOME_FAILED, f"{text} ({where})" if where else text, exit_code=code, signal=signal_name, fatal_line=fatal
        )
    if runner_error is not None:
        return Outcome(OUTCOME_FAILED, lines[-1], exit_code=code, signal=signal_name)
    if returncode == 0:
        return Outcome(OUTCOME_FAILED, "the training process exited before training finished", exit_code=0)
    if signal_name is not None:
        return Outcome(OUTCOME_FAILED, f"the training process was killed by {signal_name}", signal=signal_name)
    return Outcome(OUTCOME_FAILED, f"the training process exited with status {returncode}", exit_code=code)
