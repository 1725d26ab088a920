"""Datasets read in child processes, so that a file that crashes or stalls its reader costs that reader, never the
server.

LMDB maps its data file: a page past the file's end (a truncated copy, or a file cut while it is read) is a SIGBUS
that no Python code can catch, and it killed the whole server (issue 23, item 2). HDF5 follows links between files
when asked for a dataset's shape: a link to a FIFO blocked the server's one thread until someone wrote to it (item
5). datasets.py checks for both before it reads, and reads in here; what its checks cannot see (a file truncated
between the check and the read, a crafted file that sends LMDB past the end of its map, a fault in the HDF5
library) ends a reader process and comes back as an error naming the dataset.

- At most `MAX_READERS` readers, started when first needed and kept (a reader answers in about a millisecond; a
  new one takes 0.3 s to import LMDB, h5py and the Caffe schema); one that crashed is replaced at the next read.
- Every read has a deadline: the reader is killed when it passes it, and the caller gets `ReadTimedOut`. Waiting
  for a reader, and for its answer, never blocks the server: the pipes are non-blocking and every wait goes
  through gevent's hub when gevent has patched the process (`serve`), or `poll` otherwise.
- A reader cannot write, create, truncate or delete a file, open a socket or start a program (the seccomp filter
  of `sandbox.py`), has RLIMIT_DATA of 1 GiB and an RLIMIT_CPU set for each task, loads no HDF5 filter plugin,
  and ends when its parent has gone.
- Requests and answers are JSON lines, never pickles: a reader reads hostile files, so its answers are data to
  check (datasets.py checks them), not objects to rebuild. An answer over `MAX_ANSWER` bytes is refused.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from ..core.errors import NetError
from .pipes import start_child, wait, write_all

log = logging.getLogger(__name__)

MAX_READERS = 2
"""Reader processes at most (about 60 MB each): reads beyond that wait for one, within their own deadline."""
START_SECONDS = 30.0
"""A new reader's own bound for starting (its imports); not counted in a read's deadline."""
KILL_GRACE = 1.0
"""Seconds past a read's deadline before its reader is killed: the reader's own checks stop it first, with a
better message (hdf5_reads.py stops an HDF5 list at its deadline)."""
MAX_ANSWER = 1 << 20
DATA_LIMIT = 1 << 30
"""RLIMIT_DATA of a reader: what a crafted file can make it allocate (LMDB's read-only map is not counted)."""
CPU_MARGIN = 5.0
"""CPU seconds a task may use past its deadline before the reader ends itself (its parent kills it sooner)."""
_NICE = 5
_ERROR_FIELDS = ("message", "source", "line", "column", "layer", "layer_type", "field")


class ReadTimedOut(NetError):
    """A read that did not end by its deadline (its reader was stopped, or stopped itself)."""


class ReaderCrashed(NetError):
    """The reader process ended while it read: `ended` says how ("SIGBUS", "exit status 1")."""

    def __init__(self, message: str, *, ended: str = "", **where: Any) -> None:
        super().__init__(message, **where)
        self.ended = ended


# --- the server's side --------------------------------------------------------------------------------------------


def read(task: str, arguments: Mapping[str, Any], *, seconds: float) -> Any:
    """`reader_tasks.READER_TASKS[task](**arguments)` in a reader process, within `seconds` (the wait for a free reader
    included, its start not). Raises the task's NetError, ReadTimedOut, or ReaderCrashed."""
    return _pool().run(task, dict(arguments), seconds)


class _Pool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.pid = os.getpid()
        self._idle: list[_Reader] = []
        self._busy = 0
        self._cond = threading.Condition()

    def run(self, task: str, arguments: dict[str, Any], seconds: float) -> Any:
        deadline = time.monotonic() + max(0.0, seconds)
        reader = self._acquire(deadline, seconds)
        keep = False
        try:
            if reader is None:
                started = time.monotonic()
                reader = _Reader()
                deadline += time.monotonic() - started  # the start is the reader's cost, not the read's
            answer = reader.call(task, arguments, deadline, seconds)
            keep = True
            return answer
        except NetError:  # the task's own refusal (and its own timeout) leaves its reader well
            keep = reader is not None and reader.alive
            raise
        finally:
            if not keep and reader is not None:
                reader.kill()  # stopped mid-answer (a timeout, a crash, the caller's greenlet killed): not reused
            self._release(reader if keep else None)

    def _acquire(self, deadline: float, seconds: float) -> _Reader | None:
        """An idle reader, or None when the caller should start one (its slot is taken)."""
        with self._cond:
            while not self._idle and self._busy >= self.size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReadTimedOut(
                        f"not read: the {self.size} dataset readers stayed busy for {seconds:g} s; try again"
                    )
                self._cond.wait(left)
            self._busy += 1
            while self._idle:
                reader = self._idle.pop()
                if reader.alive:
                    return reader
                reader.kill()
            return None

    def close(self) -> None:
        """Stop the idle readers (a busy one is stopped by its caller's deadline)."""
        with self._cond:
            idle, self._idle = self._idle, []
        for reader in idle:
            reader.kill()

    def _release(self, reader: _Reader | None) -> None:
        with self._cond:
            self._busy -= 1
            if reader is not None:
                self._idle.append(reader)
            self._cond.notify()


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


@atexit.register
def _close_pool_at_exit() -> None:
    """The idle readers are stopped and waited for when this process exits (they would end on their own once it has
    gone, but a Popen left running is a ResourceWarning at exit)."""
    if _POOL is not None and _POOL.pid == os.getpid():
        _POOL.close()


def _pool() -> _Pool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():  # a forked process must not share its parent's pipes
            _POOL = _Pool(MAX_READERS)
        return _POOL


class _Reader:
    """One reader process and its two pipes (non-blocking on this side)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._closed = False
        # No HDF5 filter plugin is ever loaded; numpy (imported by h5py) starts no BLAS thread pool: nothing computes.
        env = {**os.environ, "HDF5_PLUGIN_PRELOAD": "::", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.process, self._to, self._from = start_child(
            [sys.executable, "-m", __name__, str(os.getpid())], stderr=subprocess.DEVNULL, cwd="/", env=env,
        )
        try:
            ready = self._answer(time.monotonic() + START_SECONDS)
        except (EOFError, TimeoutError, ValueError) as error:
            self.kill()
            raise ReaderCrashed(f"the dataset reader did not start ({type(error).__name__})") from None
        if not isinstance(ready, dict) or ready.get("ready") != self.process.pid:
            self.kill()
            raise ReaderCrashed("the dataset reader did not start: it answered something else")
        if ready.get("unconfined"):
            log.warning("a dataset reader runs unconfined: %s", ready["unconfined"])

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def call(self, task: str, arguments: dict[str, Any], deadline: float, seconds: float) -> Any:
        request = json.dumps({"task": task, "arguments": arguments, "seconds": max(0.0, deadline - time.monotonic())})
        try:
            write_all(self._to, request.encode() + b"\n", deadline + KILL_GRACE)
            answer = self._answer(deadline + KILL_GRACE)
        except TimeoutError:
            self.kill()
            raise ReadTimedOut(f"reading it took longer than {seconds:g} s; stopped") from None
        except (EOFError, BrokenPipeError):
            code = self.kill()
            name = signal.Signals(-code).name if code is not None and code < 0 and -code in signal.valid_signals() else None
            log.warning("a dataset reader (pid %d) ended while reading: %s", self.process.pid, name or code)
            ended = name or f"exit status {code}"
            raise ReaderCrashed(f"reading it ended the reader process ({ended})", ended=ended) from None
        except ValueError as error:
            self.kill()
            raise ReaderCrashed(f"the dataset reader answered what is not an answer ({error})") from None
        if not isinstance(answer, dict):
            self.kill()
            raise ReaderCrashed("the dataset reader answered what is not an answer")
        if "ok" in answer:
            return answer["ok"]
        refusal = answer.get("error")
        if isinstance(refusal, dict) and all(isinstance(refusal.get(key), (str, int, type(None))) for key in _ERROR_FIELDS):
            fields = {key: refusal.get(key) for key in _ERROR_FIELDS if key != "message"}
            kind = ReadTimedOut if refusal.get("kind") == "ReadTimedOut" else NetError
            raise kind(str(refusal.get("message")), **fields)
        log.error("a dataset reader failed:\n%s", str(answer.get("crash"))[:20000])
        raise NetError("reading it failed unexpectedly; the server log has the details")

    def _answer(self, deadline: float) -> Any:
        """The next JSON line from the reader."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_ANSWER:
                raise ValueError(f"an answer over {MAX_ANSWER} bytes")
            try:
                chunk = os.read(self._from, 1 << 16)
            except BlockingIOError:
                wait(self._from, False, deadline)
                continue
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def kill(self) -> int | None:
        """Stop the reader (if it still runs) and close its pipes, once; its exit status (-N: killed by signal N)."""
        with contextlib.suppress(ProcessLookupError):
            if self.process.poll() is None:
                self.process.kill()
        if not self._closed:  # closed once: a second close could hit a descriptor reused since
            self._closed = True
            for fd in (self._to, self._from):
                with contextlib.suppress(OSError):
                    os.close(fd)
        try:
            return self.process.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a SIGKILLed process ends
            return None


# --- the reader process -------------------------------------------------------------------------------------------


def _orphaned(parent: int) -> None:
    """End this process once its parent has gone (its pipes close then too, but a read may be under way).
    Not PR_SET_PDEATHSIG: that fires when the *thread* that started the reader ends, and a threaded host app
    starts readers from threads that come and go."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _bound_cpu(seconds: float) -> None:
    """SIGXCPU once this task has used `seconds` (and a margin) of CPU: a crafted file that sends a library into
    a loop ends this reader even when no parent is left to kill it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds + CPU_MARGIN)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.getrlimit(resource.RLIMIT_CPU)[1]))


def _prepare(parent: int) -> str | None:
    """Watch the parent, yield the CPU to it, bound what a crafted file can allocate, and confine. Returns why
    the process could not be confined (None when it is)."""
    threading.Thread(target=_orphaned, args=(parent,), name="orphaned", daemon=True).start()
    with contextlib.suppress(OSError):
        os.nice(_NICE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))
    from .sandbox import ConfinementError, confine

    try:
        confine()
    except ConfinementError as error:
        return str(error)
    return None


def _error_document(error: NetError) -> dict[str, Any]:
    document: dict[str, Any] = {key: getattr(error, key, None) for key in _ERROR_FIELDS}
    document["kind"] = "ReadTimedOut" if isinstance(error, ReadTimedOut) else "NetError"
    return document


def main(parent: int) -> int:
    """Answer requests from stdin on stdout until stdin closes. Descriptors 0 and 1 become /dev/null, so that
    nothing a library prints mixes into the answers."""
    inp, out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    from .reader_tasks import READER_IMPORTS, READER_TASKS

    READER_IMPORTS()  # everything a read needs, before the confinement (and before the reader says it is ready)
    tasks: Mapping[str, Callable[..., dict[str, Any]]] = READER_TASKS
    unconfined = _prepare(parent)
    requests = os.fdopen(inp, "rb")
    answers = os.fdopen(out, "wb")
    answers.write(json.dumps({"ready": os.getpid(), "unconfined": unconfined}).encode() + b"\n")
    answers.flush()
    for line in requests:
        answer: dict[str, Any]
        try:
            request = json.loads(line)
            seconds = float(request["seconds"])
            _bound_cpu(seconds)
            answer = {"ok": tasks[request["task"]](**request["arguments"], seconds=seconds)}
        except NetError as error:
            answer = {"error": _error_document(error)}
        except Exception:  # noqa: BLE001 - sent to the server's log
            answer = {"crash": traceback.format_exc()}
        try:
            answers.write(json.dumps(answer).encode() + b"\n")
            answers.flush()
        except BrokenPipeError:
            return 0
    return 0


if __name__ == "__main__":
    # The package's own copy of this module, not __main__: the error classes must be the ones datasets.py raises.
    from .dataset_reader import main as _main

    sys.exit(_main(int(sys.argv[1])))
