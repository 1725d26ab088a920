"""How a training attempt ended: success, cancelled, out of memory (retried), diverged or another failure (neither
retried).

Caffe does not raise on out-of-memory: a glog CHECK fails, glog prints an ``F`` line and the process aborts
(SIGABRT, exit status 134; DIGITS showed "error code -6"). Each known way of running out of memory is one small
predicate below that cites the message it matches (Lightning's utilities/memory.py does the same for PyTorch);
`classify` combines them and pulls the numbers a message carries (bytes requested, free, total, device) into an
`OutOfMemory` record the fallback policy recalibrates from. Anything unrecognised is "another failure" whose
message is glog's ``F`` line, never a guess.

Only the lines a dying process writes are examined (glog ``F`` and ``E`` lines, and lines that are not glog's
own, such as a C++ terminate message or a Python traceback), so an "out of memory" in an INFO line or a layer
name cannot pass for a failure.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal

from .divergence import Divergence
from .sizes import format_size

SUCCESS: Final = "success"
CANCELLED: Final = "cancelled"
OUT_OF_MEMORY: Final = "out_of_memory"
FAILED: Final = "failed"
INTERRUPTED: Final = "interrupted"
"""An attempt whose supervisor went away (the server was killed): neither retried nor failed, resumable."""
DIVERGED: Final = "diverged"
"""An attempt stopped because a net output became NaN or infinite (core.divergence): not retried, and not a crash."""

Status = Literal["success", "cancelled", "out_of_memory", "failed", "interrupted", "diverged"]

# A glog line: severity letter, date (MMDD, or YYYYMMDD since glog 0.7), time, thread id, file:line] message.
GLOG_LINE = re.compile(r"^(?P<severity>[IWEF])(?:\d{8}|\d{4}) \d\d:\d\d:\d\d\.\d+\s+\d+ (?P<where>[^\]\s]+)\] ?(?P<text>.*)$")


@dataclasses.dataclass(frozen=True)
class OutOfMemory:
    """What an out-of-memory failure tells: which signature matched and the numbers its message carries."""

    signature: str
    """Name of the predicate that matched (`cuda_out_of_memory`, `host_allocation_failed`, ...)."""
    device: Literal["gpu", "cpu"]
    message: str
    """A sentence for people, saying when the cause is only likely."""
    ambiguous: bool = False
    """The signature also has other causes (a cuDNN internal error, a SIGKILL): classified OOM, said so."""
    requested_bytes: int | None = None
    """The allocation that failed, when the message gives it."""
    free_bytes: int | None = None
    """Free memory on the device when it failed, when the message gives it."""
    total_bytes: int | None = None
    device_index: int | None = None
    """The device number in the message (CUDA's numbering inside the child)."""
    line: str | None = None
    """The log line that matched."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The classification of one ended attempt."""

    status: Status
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
        return self.status == OUT_OF_MEMORY

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


# --- the signatures: each takes one failure line, returns a record or None -------------------------------------

Predicate = Callable[[str], OutOfMemory | None]
PREDICATES: list[Predicate] = []


def _predicate(function: Predicate) -> Predicate:
    PREDICATES.append(function)
    return function


_CUDA_OOM = re.compile(r"Check failed: error == cudaSuccess \((\d+) vs\. 0\)\s+out of memory")
_PINNED_HOST = re.compile(r"\bsyncedmem\.hpp:\d+\]")
"""Where CaffeMallocHost CHECKs cudaMallocHost: the same words as a device allocation's, at its own place."""


@_predicate
def pinned_host_out_of_memory(line: str) -> OutOfMemory | None:
    """A GPU job's host side: CaffeMallocHost (syncedmem.hpp) could not pin host memory for a blob's host copy
    (cudaMallocHost fails with the device's words, ``syncedmem.hpp:18] Check failed: error == cudaSuccess (2 vs. 0)
    out of memory``, seen under the stand-in runtime, bench/standin/). The host ran out, not the GPU."""
    if _CUDA_OOM.search(line) is None or _PINNED_HOST.search(line) is None:
        return None
    return OutOfMemory(
        "pinned_host_out_of_memory", "cpu",
        "host memory ran out pinning a buffer for the GPU (cudaMallocHost: out of memory)", line=line,
    )


@_predicate
def cuda_out_of_memory(line: str) -> OutOfMemory | None:
    """BVLC Caffe, syncedmem.cpp / common.cpp on cudaMalloc:
    ``Check failed: error == cudaSuccess (2 vs. 0)  out of memory``."""
    if _CUDA_OOM.search(line) is None:
        return None
    return OutOfMemory("cuda_out_of_memory", "gpu", "the GPU ran out of memory (cudaMalloc: out of memory)", line=line)


@_predicate
def cudnn_alloc_failed(line: str) -> OutOfMemory | None:
    """cuDNN could not allocate its own memory: ``Check failed: status == CUDNN_STATUS_SUCCESS (2 vs. 0)
    CUDNN_STATUS_ALLOC_FAILED``."""
    if "CUDNN_STATUS_ALLOC_FAILED" not in line:
        return None
    return OutOfMemory(
        "cudnn_alloc_failed", "gpu", "the GPU ran out of memory (cuDNN: CUDNN_STATUS_ALLOC_FAILED)", line=line
    )


@_predicate
def cudnn_internal_error(line: str) -> OutOfMemory | None:
    """cuDNN near the memory limit: ``Check failed: status == CUDNN_STATUS_SUCCESS (4 vs. 0)
    CUDNN_STATUS_INTERNAL_ERROR``. Also a driver or library fault, hence ambiguous."""
    if "CUDNN_STATUS_INTERNAL_ERROR" not in line:
        return None
    return OutOfMemory(
        "cudnn_internal_error",
        "gpu",
        "cuDNN failed with CUDNN_STATUS_INTERNAL_ERROR: likely out of GPU memory (cuDNN reports this when it "
        "cannot allocate near the limit), though a driver or library fault gives the same message",
        ambiguous=True,
        line=line,
    )


@_predicate
def cudnn_execution_failed(line: str) -> OutOfMemory | None:
    """cuDNN near the memory limit: ``... CUDNN_STATUS_EXECUTION_FAILED``. Also a kernel fault, hence ambiguous."""
    if "CUDNN_STATUS_EXECUTION_FAILED" not in line:
        return None
    return OutOfMemory(
        "cudnn_execution_failed",
        "gpu",
        "cuDNN failed with CUDNN_STATUS_EXECUTION_FAILED: likely out of GPU memory, though a failing kernel gives "
        "the same message",
        ambiguous=True,
        line=line,
    )


_NV_FAILED = re.compile(r"Out of memory: failed to allocate (\d+) bytes on device (\d+)")


@_predicate
def nvcaffe_out_of_memory(line: str) -> OutOfMemory | None:
    """NVcaffe's pooled allocator: ``Out of memory: failed to allocate N bytes on device D``."""
    match = _NV_FAILED.search(line)
    if match is None:
        return None
    requested, device = int(match.group(1)), int(match.group(2))
    return OutOfMemory(
        "nvcaffe_out_of_memory", "gpu", f"GPU {device} ran out of memory allocating {format_size(requested)}",
        requested_bytes=requested, device_index=device, line=line,
    )


_NV_TOTAL = re.compile(r"Failed to allocate (\d+) bytes on device (\d+)\. Total memory: (\d+), Free: (\d+)")


@_predicate
def nvcaffe_failed_to_allocate(line: str) -> OutOfMemory | None:
    """NVcaffe's GPUMemory::allocate: ``Failed to allocate N bytes on device D. Total memory: T, Free: F``."""
    match = _NV_TOTAL.search(line)
    if match is None:
        return None
    requested, device, total, free = (int(group) for group in match.groups())
    return OutOfMemory(
        "nvcaffe_failed_to_allocate", "gpu",
        f"GPU {device} ran out of memory allocating {format_size(requested)} with {format_size(free)} of "
        f"{format_size(total)} free",
        requested_bytes=requested, free_bytes=free, total_bytes=total, device_index=device, line=line,
    )


_NV_RESERVE = re.compile(r"Out of memory in safe_reserve: (\d+) > (\d+) \+ (\d+) on device (\d+)")


@_predicate
def nvcaffe_safe_reserve(line: str) -> OutOfMemory | None:
    """NVcaffe's workspace: ``Out of memory in safe_reserve: A > B + C on device D`` (A wanted, B held, C free)."""
    match = _NV_RESERVE.search(line)
    if match is None:
        return None
    wanted, held, free, device = (int(group) for group in match.groups())
    return OutOfMemory(
        "nvcaffe_safe_reserve", "gpu",
        f"GPU {device} ran out of memory growing a workspace to {format_size(wanted)} (held {format_size(held)}, "
        f"free {format_size(free)})",
        requested_bytes=wanted - held, free_bytes=free, device_index=device, line=line,
    )


_HOST_ALLOCATION = re.compile(r"Check failed: \*ptr host allocation of size (\d+) failed")


@_predicate
def host_allocation_failed(line: str) -> OutOfMemory | None:
    """CPU mode, syncedmem.hpp CaffeMallocHost: ``Check failed: *ptr host allocation of size N failed``."""
    match = _HOST_ALLOCATION.search(line)
    if match is None:
        return None
    requested = int(match.group(1))
    return OutOfMemory(
        "host_allocation_failed", "cpu", f"host memory ran out allocating {format_size(requested)} (malloc failed)",
        requested_bytes=requested, line=line,
    )


_OPENBLAS_MALLOC = re.compile(r"OpenBLAS: malloc failed in (\w+)")


@_predicate
def openblas_malloc_failed(line: str) -> OutOfMemory | None:
    """CPU mode with more than one BLAS thread: OpenBLAS mallocs its threads' job table at every threaded call
    (driver/level3/level3_thread.c) and, when that fails, prints ``OpenBLAS: malloc failed in gemm_driver`` and
    exits with status 1 (seen under the attempt's memory cap, after Caffe's buffers had taken it)."""
    match = _OPENBLAS_MALLOC.search(line)
    if match is None:
        return None
    return OutOfMemory(
        "openblas_malloc_failed", "cpu", f"host memory ran out (OpenBLAS could not allocate in {match.group(1)})",
        line=line,
    )


_PYTHON_MEMORY_ERROR = re.compile(r"^(?:\w+\.)*MemoryError\b")


@_predicate
def python_memory_error(line: str) -> OutOfMemory | None:
    """The runner's Python code, or pycaffe translating std::bad_alloc: ``MemoryError`` (a traceback's last line,
    or the runner's own error record)."""
    if _PYTHON_MEMORY_ERROR.match(line.strip()) is None:
        return None
    return OutOfMemory("python_memory_error", "cpu", "host memory ran out (Python MemoryError)", line=line.strip())


@_predicate
def cpp_bad_alloc(line: str) -> OutOfMemory | None:
    """C++ ``new`` failing: ``terminate called after throwing an instance of 'std::bad_alloc'`` (or its
    ``what():  std::bad_alloc`` line)."""
    if "std::bad_alloc" not in line:
        return None
    return OutOfMemory("cpp_bad_alloc", "cpu", "host memory ran out (std::bad_alloc)", line=line)


def killed_by_oom_killer(counted: bool = False) -> OutOfMemory:
    """A SIGKILL we did not send: on Linux most often the kernel's out-of-memory killer. `counted`: the kernel
    counted an OOM kill while the attempt ran (still "likely": the count is the machine's, not the process's)."""
    evidence = " (the kernel counted an out-of-memory kill meanwhile)" if counted else ""
    return OutOfMemory(
        "sigkill",
        "cpu",
        "the process was killed with SIGKILL, which this server did not send: likely the kernel's out-of-memory "
        f"killer{evidence} (the machine's or the container's memory ran out)",
        ambiguous=True,
    )


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


# --- reading a log ---------------------------------------------------------------------------------------------


def failure_lines(log: str | Iterable[str]) -> list[str]:
    """The lines worth examining: glog's F and E lines and lines that are not glog's (terminate messages,
    Python tracebacks), without glog's "Check failure stack trace" frames."""
    lines = log.splitlines() if isinstance(log, str) else list(log)
    kept = []
    in_stack = False
    for line in lines:
        match = GLOG_LINE.match(line)
        if match is not None:
            in_stack = False
            if match.group("severity") in "EF":
                kept.append(line)
            continue
        if line.startswith("*** Check failure stack trace"):
            in_stack = True
            continue
        if in_stack and line.startswith("    @ "):
            continue
        if line.strip():
            kept.append(line)
    return kept


def fatal_line(log: str | Iterable[str]) -> str | None:
    """The last glog F line (``F20261202 09:26:08.945708 20235 sgd_solvers.hpp:95] Check failed: ...``)."""
    lines = log.splitlines() if isinstance(log, str) else list(log)
    for line in reversed(lines):
        match = GLOG_LINE.match(line)
        if match is not None and match.group("severity") == "F":
            return line
    return None


def find_out_of_memory(lines: Sequence[str]) -> OutOfMemory | None:
    """The first signature found, the F line first (the cause), then the other lines from the end."""
    fatal = fatal_line(lines)
    ordered = ([fatal] if fatal is not None else []) + [line for line in reversed(lines) if line != fatal]
    for line in ordered:
        found = out_of_memory_in(line)
        if found is not None:
            return found
    return None


def out_of_memory_in(line: str) -> OutOfMemory | None:
    """The signature one failure line carries, for a log followed as it is written (jobs/child/caffe_log.py): every
    predicate, in the classifier's order; None for a line that shows none."""
    for predicate in PREDICATES:
        found = predicate(line)
        if found is not None:
            return found
    return None


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
        return Outcome(DIVERGED, divergence.stopped_message, exit_code=code, signal=signal_name, divergence=divergence)
    if divergence is not None and finished and runner_error is None and not cancelled and returncode != 0:
        ended = f"signal {signal_name}" if signal_name else f"exit status {code}"
        return Outcome(
            SUCCESS, f"training finished (the process then ended with {ended} freeing a net whose outputs were not "
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
        return Outcome(SUCCESS, "training finished", exit_code=0)
    if cancelled:
        return Outcome(CANCELLED, "cancelled", exit_code=code, signal=signal_name, fatal_line=fatal)

    if stall is not None:
        found = stalled_out_of_memory(stall)
        if found is not None:
            return Outcome(OUT_OF_MEMORY, found.message, found, exit_code=code, signal=signal_name, fatal_line=fatal)
        return Outcome(FAILED, stall_message(stall), exit_code=code, signal=signal_name, fatal_line=fatal)

    found = find_out_of_memory(lines)
    if found is None and killed_by == signal.SIGKILL:
        if oom_killer is False:
            return Outcome(
                FAILED,
                "the training process was killed with SIGKILL by someone else: not by this server, and not by the "
                "kernel's out-of-memory killer (it counted no kill meanwhile); resume the job to continue",
                exit_code=code, signal=signal_name, fatal_line=fatal,
            )
        found = killed_by_oom_killer(counted=oom_killer is True)
    if found is not None:
        return Outcome(OUT_OF_MEMORY, found.message, found, exit_code=code, signal=signal_name, fatal_line=fatal)

    if fatal is not None:
        message = GLOG_LINE.match(fatal)
        text = message.group("text") if message else fatal
        where = message.group("where") if message else None
        return Outcome(
            FAILED, f"{text} ({where})" if where else text, exit_code=code, signal=signal_name, fatal_line=fatal
        )
    if runner_error is not None:
        return Outcome(FAILED, lines[-1], exit_code=code, signal=signal_name)
    if returncode == 0:
        return Outcome(FAILED, "the training process exited before training finished", exit_code=0)
    if signal_name is not None:
        return Outcome(FAILED, f"the training process was killed by {signal_name}", signal=signal_name)
    return Outcome(FAILED, f"the training process exited with status {returncode}", exit_code=code)
