"""The out-of-memory signatures: each known way a Caffe process says it ran out of memory is one small predicate that
cites the message it matches (Lightning's utilities/memory.py does the same for PyTorch) and pulls the numbers the
message carries (bytes requested, free, total, device) into an `OutOfMemory` record the fallback policy
recalibrates from. core.oom combines them into the judgement of how an attempt ended.

Only the lines a dying process writes are examined (`failure_lines`: glog ``F`` and ``E`` lines, and lines that are
not glog's own, such as a C++ terminate message or a Python traceback), so an "out of memory" in an INFO line or a
layer name cannot pass for a failure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from .sizes import format_size

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
