"""Estimates of large prototxt texts in worker processes, off the server's one thread, behind a bounded queue.

The server is one thread (gevent): an estimate is pure Python, so while it runs nothing else is answered. A cold
estimate costs about 2 ms per KiB of text on the development machine (3 ms for the worst texts: a thousand tiny
layers), so a few clients posting megabyte-sized nets (400,000 `dim:` entries, 2.7 MiB: 2.5 s each) stopped every
other request for tens of seconds (issue 18, item 7). A worker answers as fast as the server would, plus 0.3 to 1 ms
for the pipes (measured on every net of the zoo, cold and warm). So texts up to `inline_bytes`
(MEMPLUGIN_ESTIMATE_INLINE_BYTES, 16 KiB: LeNet, the CIFAR nets, AlexNet, CaffeNet, SqueezeNet; 3 to 20 ms cold,
under 1 ms warm) stay in the server's process, never refused for a full queue and holding the loop 50 ms at worst;
larger ones (MobileNet 27 KiB 36 ms, ResNet-50 32 KiB 63 ms, GoogLeNet 39 KiB 78 ms, and anything bigger) go to a
worker process:

- `workers` processes (MEMPLUGIN_ESTIMATE_WORKERS), started at the first large estimate and kept; each has its own
  definition cache, and a text goes to the same worker as before when that one is free, so repeats stay warm;
- at most `queue` requests wait for a worker (MEMPLUGIN_ESTIMATE_QUEUE); one more is refused at once with
  `PoolBusy` (the API's 503 with Retry-After), so waiting requests cannot pile up without bound;
- a worker that takes longer than `timeout` is killed (`PoolTimeout`), and one that dies is replaced at the next
  call (`PoolCrashed`); workers run at nice 5, so the server's loop keeps its core first;
- waiting for a worker never blocks the server: the pipes are non-blocking and each wait for them goes through
  gevent's hub when gevent has patched the process (`serve`), or `poll` in a thread otherwise.

Requests and answers cross the pipes pickled, between this process and its own children only. A worker exits when
its input pipe closes, so it never outlives the server.
"""

from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import io
import logging
import math
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .core.errors import NetError
from .core.estimate import EstimateRequest, estimate
from .errors import MemPluginError

log = logging.getLogger(__name__)

DEFAULT_INLINE_BYTES = 16 * 1024
DEFAULT_QUEUE = 8
DEFAULT_TIMEOUT = 60.0
"""Seconds one estimate may take in a worker. The parse limits (4 MiB, 5000 layers) keep real work far below it."""
START_TIMEOUT = 60.0
"""Seconds a new worker may take to import the estimator and say it is ready."""
WORKER_NICE = 5
WORKER_RSS_LIMIT = 1 << 30
"""A worker whose resident memory passes this after a task forgets its cached definitions (big nets are big)."""
MAX_RETRY_AFTER = 60
_HEADER = struct.Struct("!Q")
_CHUNK = 1 << 20


def default_workers() -> int:
    """Half the machine's cores (the server's loop keeps one), at least 1 and at most 4."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class PoolError(MemPluginError):
    """An estimate that could not be run in a worker; the message says why."""


class PoolBusy(PoolError):
    """Every worker is busy and `queue` requests already wait: try again after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PoolTimeout(PoolError):
    """The estimate ran past the pool's timeout; its worker was killed."""


class PoolCrashed(PoolError):
    """The worker died or answered what it should not (its log line says more)."""


class DatasetsFailed(MemPluginError):
    """Reading data shapes from the datasets a net names failed (`read_datasets`): `error` says where."""

    def __init__(self, error: NetError) -> None:
        super().__init__(error)
        self.error = error


# --- what a worker does -------------------------------------------------------------------------------------------


def text_size(request: EstimateRequest) -> int:
    """Characters of prototxt an estimate reads: what its cost grows with."""
    return len(request.net or "") + len(request.solver or "")


def run_estimate(
    request: EstimateRequest, fallback: bool, dataset_roots: Sequence[Path] | None = None
) -> dict[str, Any]:
    """The estimate document, in whatever process calls it. With `dataset_roots`, the data shapes the net's
    datasets give come first (those in the request win); their failure is `DatasetsFailed`."""
    if dataset_roots is not None:
        try:
            found = _dataset_shapes(request.net, dataset_roots)
        except NetError as error:
            raise DatasetsFailed(error) from None
        except OSError as error:  # a source name longer than the file system takes (ENAMETOOLONG), and the like
            message = f"a dataset the net names cannot be looked up: {os.strerror(error.errno or 0)}"
            raise DatasetsFailed(NetError(message, field="read_datasets")) from None
        request = dataclasses.replace(request, data_shapes={**found, **request.data_shapes})
    return estimate(request, oracle=_oracle() if fallback else None)


def _dataset_shapes(net_text: str | None, roots: Sequence[Path]) -> dict[str, Any]:
    """Item shapes from the datasets the net names, opened only inside the dataset roots."""
    from .core.prototxt import parse_net
    from .datasets import shapes_from_sources

    if net_text is None:
        return {}
    roots = list(roots)
    return shapes_from_sources([parse_net(net_text)], Path(roots[0]), allowed=roots)  # type: ignore[no-any-return]


def _oracle() -> Any:
    try:
        from .pycaffe_shapes import pycaffe_oracle
    except ImportError:  # pragma: no cover - the fallback module is optional
        return None
    return pycaffe_oracle


TASKS: Mapping[str, Callable[..., Any]] = {"estimate": run_estimate}
"""What a worker may be asked to run, by name."""


# --- messages -----------------------------------------------------------------------------------------------------


def _rebuild_error(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    error = cls.__new__(cls)
    BaseException.__init__(error, *args)
    error.__dict__.update(state)
    return error


class _Pickler(pickle.Pickler):
    """Pickles NetError and its subclasses (keyword-only constructors, which pickle's default cannot call)."""

    dispatch_table = copyreg.dispatch_table

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, NetError):
            return _rebuild_error, (type(obj), obj.args, dict(obj.__dict__))
        return NotImplemented


def _dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    data = buffer.getvalue()
    return _HEADER.pack(len(data)) + data


def _cooperative() -> bool:
    """Whether gevent has patched this process: then waits go through its hub, never blocking the thread."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("select"))


def _wait(fd: int, write: bool, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    if _cooperative():
        from gevent.socket import wait_read, wait_write

        (wait_write if write else wait_read)(fd, timeout=left, timeout_exc=TimeoutError())
        return
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    if not poller.poll(left * 1000):
        raise TimeoutError


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view[:_CHUNK])
        except BlockingIOError:
            _wait(fd, True, deadline)
            continue
        view = view[written:]


def _read_exactly(fd: int, count: int, deadline: float) -> bytes:
    parts: list[bytes] = []
    while count:
        try:
            data = os.read(fd, min(count, _CHUNK))
        except BlockingIOError:
            _wait(fd, False, deadline)
            continue
        if not data:
            raise EOFError
        parts.append(data)
        count -= len(data)
    return b"".join(parts)


def _read_message(fd: int, deadline: float) -> Any:
    (length,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exactly(fd, length, deadline))  # our own child's answer


# --- the pool -----------------------------------------------------------------------------------------------------


class _Worker:
    """One worker process and the two pipes to it (non-blocking on this side)."""

    def __init__(self) -> None:
        to_child, self._to = os.pipe()
        self._from, from_child = os.pipe()
        try:
            self.process = subprocess.Popen(  # this interpreter, this module
                [sys.executable, "-m", __name__], stdin=to_child, stdout=from_child, close_fds=True,
            )
        except BaseException:
            for fd in (self._to, self._from):
                os.close(fd)
            raise
        finally:
            os.close(to_child)
            os.close(from_child)
        for fd in (self._to, self._from):
            os.set_blocking(fd, False)
        try:
            ready = _read_message(self._from, time.monotonic() + START_TIMEOUT)
        except (EOFError, TimeoutError, pickle.UnpicklingError) as error:
            self.kill()
            raise PoolCrashed(f"an estimate worker did not start ({type(error).__name__}); see the server log") from None
        if ready != ("ready", self.process.pid):
            self.kill()
            raise PoolCrashed("an estimate worker did not start: it answered something else")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def call(self, task: str, args: tuple[Any, ...], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        try:
            _write_all(self._to, _dumps((task, args)), deadline)
            kind, value = _read_message(self._from, deadline)
        except TimeoutError:
            self.kill()
            raise PoolTimeout(f"the estimate took longer than {timeout:g} s and was stopped") from None
        except (EOFError, BrokenPipeError, pickle.UnpicklingError):
            self.kill()
            log.warning("an estimate worker (pid %d) ended: %s", self.process.pid, self.process.returncode)
            raise PoolCrashed("the estimate's worker process ended before answering; try again") from None
        if kind == "ok":
            return value
        if kind == "raise":
            raise value
        log.error("an estimate worker failed:\n%s", value)
        raise PoolCrashed("the estimate failed unexpectedly; the server log has the details")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(OSError):
            os.close(self._to)
        with contextlib.suppress(OSError):
            os.close(self._from)
        with contextlib.suppress(Exception):
            self.process.wait(5)


class EstimatePool:
    """Estimates large texts in `workers` worker processes, with at most `queue` requests waiting for one."""

    def __init__(
        self,
        workers: int,
        queue: int,
        *,
        inline_bytes: int = DEFAULT_INLINE_BYTES,
        timeout: float = DEFAULT_TIMEOUT,
        fallback: bool = True,
    ) -> None:
        if workers < 1 or queue < 0 or inline_bytes < 0 or timeout <= 0:
            raise ValueError(f"bad pool sizes: workers {workers}, queue {queue}, inline {inline_bytes}, timeout {timeout}")
        self.workers = workers
        self.queue = queue
        self.inline_bytes = inline_bytes
        self.timeout = timeout
        self.fallback = fallback
        self._slots: list[_Worker | None] = [None] * workers
        self._idle = list(range(workers))
        self._waiting = 0
        self._cond = threading.Condition()
        self._mean_seconds = 1.0
        self._closed = False
        self.offloaded = 0
        """Estimates run in a worker since the start (for tests and benchmarks)."""
        self.refused = 0
        """Requests refused because the queue was full."""

    # --- what the views call

    def estimate(self, request: EstimateRequest, *, dataset_roots: Sequence[Path] | None = None) -> dict[str, Any]:
        """`run_estimate`, in this process for texts up to `inline_bytes`, else in a worker. Raises NetError,
        DatasetsFailed, or a PoolError (PoolBusy when the queue is full)."""
        roots = None if dataset_roots is None else [Path(root) for root in dataset_roots]
        if text_size(request) <= self.inline_bytes:
            return run_estimate(request, self.fallback, roots)
        affinity = hash((request.net, request.solver)) % self.workers
        return self.run("estimate", (request, self.fallback, roots), affinity=affinity)  # type: ignore[no-any-return]

    def run(self, task: str, args: tuple[Any, ...], *, affinity: int = 0) -> Any:
        """Run `TASKS[task](*args)` in a worker; the worker at `affinity` if it is free (its caches are warm)."""
        index = self._acquire(affinity)
        started = time.monotonic()
        worker: _Worker | None = None
        try:
            worker = self._slots[index]
            if worker is None or not worker.alive:
                worker = self._slots[index] = _Worker()
            self.offloaded += 1
            return worker.call(task, args, self.timeout)
        except PoolError:
            if worker is not None and not worker.alive:
                self._slots[index] = None
            raise
        finally:
            self._release(index, time.monotonic() - started)

    def _acquire(self, affinity: int) -> int:
        with self._cond:
            if self._closed:
                raise PoolBusy("the server is stopping", MAX_RETRY_AFTER)
            if not self._idle:
                if self._waiting >= self.queue:
                    self.refused += 1
                    retry = self.retry_after()
                    raise PoolBusy(
                        f"the server is busy: {self.workers} large estimate(s) are running and {self._waiting} "
                        f"wait, the most it queues (MEMPLUGIN_ESTIMATE_QUEUE); try again in {retry} s",
                        retry,
                    )
                self._waiting += 1
                deadline = time.monotonic() + self.timeout
                try:
                    while not self._idle:
                        left = deadline - time.monotonic()
                        if left <= 0 or self._closed:
                            raise PoolBusy(
                                f"no estimate worker was free within {self.timeout:g} s; try again later",
                                self.retry_after(),
                            )
                        self._cond.wait(left)
                finally:
                    self._waiting -= 1
            index = affinity if affinity in self._idle else self._idle[0]
            self._idle.remove(index)
            return index

    def _release(self, index: int, seconds: float) -> None:
        with self._cond:
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * seconds
            self._idle.append(index)
            self._cond.notify()

    def retry_after(self) -> int:
        """Seconds until a refused request may find room: the recent mean estimate time, times the queue's turns."""
        turns = (self._waiting + self.workers) / self.workers
        return max(1, min(MAX_RETRY_AFTER, math.ceil(self._mean_seconds * turns)))

    @property
    def started_workers(self) -> int:
        return sum(1 for worker in self._slots if worker is not None and worker.alive)

    def close(self) -> None:
        """Kill the workers (an estimate running in one ends with PoolCrashed)."""
        with self._cond:
            self._closed = True
            workers = [worker for worker in self._slots if worker is not None]
            self._slots = [None] * self.workers
            self._cond.notify_all()
        for worker in workers:
            worker.kill()


# --- the worker process -------------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _blocking_read(fd: int, count: int) -> bytes:
    parts: list[bytes] = []
    while count:
        data = os.read(fd, min(count, _CHUNK))
        if not data:
            raise EOFError
        parts.append(data)
        count -= len(data)
    return b"".join(parts)


def _trim() -> None:
    if _rss_bytes() > WORKER_RSS_LIMIT:
        from .core.estimate import _cached_definition

        _cached_definition.cache_clear()
        import gc

        gc.collect()


def worker_main() -> int:
    """Answer tasks from stdin on stdout until stdin closes. stdin and stdout are kept for the pipes; the fds 0
    and 1 become /dev/null and stderr, so that nothing this process or its children (the pycaffe fallback) print
    can mix into the answers, and no child holds the pipes."""
    inp, out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICE)
    _oracle()  # import what the first task needs before saying so
    os.write(out, _dumps(("ready", os.getpid())))
    while True:
        try:
            (length,) = _HEADER.unpack(_blocking_read(inp, _HEADER.size))
            task, args = pickle.loads(_blocking_read(inp, length))  # our own parent's request
        except EOFError:
            return 0
        try:
            answer: tuple[str, Any] = ("ok", TASKS[task](*args))
        except (NetError, DatasetsFailed) as error:
            answer = ("raise", error)
        except Exception:  # noqa: BLE001 - sent to the server's log
            answer = ("crash", traceback.format_exc())
        data = _dumps(answer)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
        except BrokenPipeError:
            return 0
        _trim()


if __name__ == "__main__":
    # The package's own copy of this module, not __main__: the classes the answers pickle must be importable by name.
    from digits_memplugin.estimate_pool import worker_main as _worker_main

    sys.exit(_worker_main())
