"""What every Caffe child of an attempt does with its own process, the training runner's (jobs.child.runner) and the
tester's (jobs.child.tester) alike: die with the server, let it trace, send fd 2 to the log, take SIGINT as a stop
request, and start Caffe confined, on its device, with the BLAS warmed up and the memory cap set (`start_caffe`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import resource
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...measure.process_memory import data_bytes, heap_bytes
from .attempt_spec import AttemptDevice
from .blas_warmup import warm_up
from .confinement import confine_attempt, describe

THREAD_STACK_BYTES = 512 * 1024
"""Stack of the threads Caffe starts (data prefetch, DB readers). glibc gives each one RLIMIT_STACK (8 MiB) of
address space by default, which RLIMIT_DATA counts; Caffe's threads need a few KiB."""
PR_SET_PDEATHSIG = 1
PR_SET_PTRACER = 0x59616D61
OPEN_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
"""The attempt's own files are appended to, never through a symlink (one would lead outside the job's folder)."""


class StopRequest:
    """SIGINT's request to stop at the next step with a snapshot (`caffe train --sigint_effect=stop`). The handler
    only sets a flag: Caffe's step in C++ is never interrupted, and Python runs the handler once it returns."""

    def __init__(self) -> None:
        self.asked = False

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._note)

    def _note(self, number: int, frame: Any) -> None:
        self.asked = True


STOP = StopRequest()
"""The child's one stop request (installed by its `main` before anything is loaded)."""


def log_line(text: str, source: str = "runner.py") -> None:
    """One INFO line in Caffe's log, in glog's format (the classifier reads INFO lines as nothing but progress), so
    that the log ends with how training ended, as `caffe train`'s does ("Optimization Done.")."""
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
    with contextlib.suppress(OSError, ValueError):
        print(f"I{stamp} {os.getpid():>5} {source}] {text}", file=sys.stderr, flush=True)


def die_with_parent() -> None:
    """Ask the kernel to kill this process when the server that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def let_parent_trace() -> None:
    """Where Yama restricts ptrace to ancestors, let the server (and the gdb its watchdog starts) read this
    process's stack if it ever stops making progress (jobs.backends.watchdog). Without Yama there is nothing to do."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PTRACER, os.getppid(), 0, 0, 0)


def redirect_stderr(log: Path) -> None:
    """fd 2 (glog, C++ terminate messages, Python tracebacks) appends to the attempt's caffe.log."""
    fd = os.open(log, OPEN_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = os.fdopen(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)


def become_child(nice: int, log: Path) -> None:
    """The child's process set-up once its spec is read: its priority, its death with the server, the server's
    right to trace it, its stderr to `log`."""
    if nice:
        os.nice(nice)
    die_with_parent()
    let_parent_trace()
    redirect_stderr(log)


def small_thread_stacks(size: int = THREAD_STACK_BYTES) -> None:
    """Make threads started from now on (Caffe's) reserve `size` bytes of stack instead of RLIMIT_STACK."""
    libc = ctypes.CDLL(None)
    attr = ctypes.create_string_buffer(256)  # larger than pthread_attr_t on every glibc target
    if libc.pthread_attr_init(attr) == 0 and libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(size)) == 0:
        libc.pthread_setattr_default_np(attr)
        libc.pthread_attr_destroy(attr)


class Growth:
    """The attempt's memory since the baseline (pycaffe and the BLAS loaded and warmed up, before the solver):
    `memory_bytes`, the data segment's growth, is what the cap limits (Caffe's buffers, and whatever else the
    process maps meanwhile); `allocated_bytes`, malloc's growth, is Caffe's own allocation in CPU mode, the figure
    the estimator predicts. On a GPU, Caffe's buffers are in neither: NVML's figure for the process is."""

    def __init__(self, on_cpu: bool) -> None:
        self.baseline = data_bytes()
        self.heap = heap_bytes() if on_cpu else None

    def fields(self) -> dict[str, int]:
        fields = {"memory_bytes": data_bytes() - self.baseline}
        heap = heap_bytes()
        if heap is not None and self.heap is not None:
            fields["allocated_bytes"] = heap - self.heap
        return fields


@dataclasses.dataclass(frozen=True)
class CaffeStarted:
    """pycaffe loaded, confined, on its device and capped: what the child's "started" record says of it."""

    caffe: Any
    """The pycaffe module."""
    memory: Growth
    blas: dict[str, Any]
    confinement: dict[str, Any]


def start_caffe(
    device: AttemptDevice, memory_cap: int | None, read_paths: Iterable[str], write_paths: Iterable[str]
) -> CaffeStarted:
    """Confine this process to the job's files (before Caffe is loaded, while it has one thread), load pycaffe on
    `device`, warm up its BLAS, and cap the data segment at `memory_cap` above what it then holds."""
    confinement = confine_attempt(Path.cwd(), read_paths, write_paths, gpu=device.kind == "gpu")
    print(f"memplugin: this attempt is {describe(confinement)}", file=sys.stderr, flush=True)
    import caffe

    if device.kind == "gpu":
        caffe.set_device(int(device.cuda_index or 0))
        caffe.set_mode_gpu()
    else:
        caffe.set_mode_cpu()
    blas = warm_up(caffe._caffe.__file__)
    small_thread_stacks()
    memory = Growth(on_cpu=device.kind != "gpu")
    if memory_cap:
        limit = memory.baseline + int(memory_cap)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return CaffeStarted(caffe, memory, blas.to_dict(), confinement.to_dict())


__all__ = [
    "OPEN_APPEND", "STOP", "THREAD_STACK_BYTES", "CaffeStarted", "Growth", "StopRequest", "become_child",
    "log_line", "small_thread_stacks", "start_caffe",
]
