"""Estimates that cost much in worker processes, off the server's one thread, behind a bounded queue.

The server is one thread (gevent): an estimate is pure Python, so while it runs nothing else is answered. A cold
estimate costs about 2 ms per KiB of text on the development machine (3 ms for the worst texts: a thousand tiny
layers), so a few clients posting megabyte-sized nets (400,000 `dim:` entries, 2.7 MiB: 2.5 s each) stopped every
other request for tens of seconds (issue 18, item 7). A worker answers as fast as the server would, plus 0.3 to 1 ms
for the pipes (measured on every net of the zoo, cold and warm). So texts over `inline_bytes`
(MEMPLUGIN_ESTIMATE_INLINE_BYTES, 16 KiB: MobileNet 27 KiB 36 ms, ResNet-50 32 KiB 63 ms, GoogLeNet 39 KiB 78 ms,
and anything bigger) go to a worker process, and so do shorter ones that cost much (below); the others (LeNet, the
CIFAR nets, AlexNet and CaffeNet as written: 3 to 20 ms cold, under 1 ms warm) stay in the server's process, where
they are never refused for a full queue:

- `workers` processes (MEMPLUGIN_ESTIMATE_WORKERS), started at the first estimate sent there and kept; each has its own
  definition cache, and a text goes to the same worker as before when that one is free, so repeats stay warm;
- at most `queue` requests wait for a worker (MEMPLUGIN_ESTIMATE_QUEUE); one more is refused at once with
  `PoolBusy` (the API's 503 with Retry-After), so waiting requests cannot pile up without bound;
- a worker that takes longer than `timeout` is killed (`PoolTimeout`), and one that dies is replaced at the next
  call (`PoolCrashed`); workers run at nice 5, so the server's loop keeps its core first;
- waiting for a worker never blocks the server: the pipes are non-blocking and each wait for them goes through
  gevent's hub when gevent has patched the process (`serve`), or `poll` in a thread otherwise.

Text size is not the whole cost (issue 23, items 4 and 7): 8 KB of LSTM layers unrolled over 500 timesteps froze
the server for 10 s, and 3 KB with eight curve points for 30 s, while keeping hundreds of MB; a layer with no
rule starts a pycaffe child of ~100 MB, thirty estimates thirty-one children at once. So a text within
`inline_bytes` is parsed (its definition cached) and its cost predicted (`core.cost.estimate_cost`: layers set up,
recurrent layers at their largest unroll, times the builds the request asks for); it stays in the server only when
that is at most `inline_layers` (DEFAULT_INLINE_LAYERS) and no layer needs pycaffe. Even then it runs against a
deadline (`inline_seconds`): past it the estimate stops (`core.cost.TimeUp`) and is run again in a worker. So an
estimate holds the server's thread for its parse (16 KiB at most, ~30 ms) plus `inline_seconds` at worst, and
pycaffe children are at most one per worker.

Requests and answers cross the pipes pickled, between this process and its own children only. A worker exits when
its input pipe closes, so it never outlives the server.
"""

from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import importlib
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
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.cost import EstimateCost, Meter, TimeUp
from ..core.errors import MemPluginError, NetError
from ..core.estimate import EstimateRequest, estimate, estimate_cost_of

log = logging.getLogger(__name__)

DEFAULT_INLINE_BYTES = 16 * 1024
DEFAULT_INLINE_LAYERS = 1_000
"""Layer set-ups an estimate may be predicted to make and still run in the server: 50 to 120 us each here (the
memory model included), so about 0.1 s at most. Predicted (the planner's worst search, 44 builds a device): LeNet
planned for one device 465 (it makes 291) and stays; AlexNet's deploy net 1,080 (528), SqueezeNet 3,375 (1,500,
88 ms) and any net with a recurrent layer (one LSTM counts 3,500 a build) go to a worker."""
DEFAULT_INLINE_SECONDS = 0.1
"""The most an estimate may run in the server's thread (its parse aside) before it stops and goes to a worker."""
DEFAULT_QUEUE = 8
DEFAULT_TIMEOUT = 60.0
"""Seconds one estimate may take in a worker. The parse limits (4 MiB, 5000 layers) keep real work far below it."""
START_TIMEOUT = 60.0
"""Seconds a new worker may take to import the estimator and say it is ready."""
WORKER_NICE = 5
WORKER_RSS_LIMIT = 1 << 30
"""A worker whose resident memory passes this after a task forgets its cached definitions (big nets are big); one
still past it then (memory the allocator does not give back) ends after answering, and the pool starts another."""
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
    request: EstimateRequest, fallback: bool, dataset_roots: Sequence[Path] | None = None, meter: Meter | None = None
) -> dict[str, Any]:
    """The estimate document, in whatever process calls it. With `dataset_roots`, the data shapes the net's
    datasets give come first (those in the request win); their failure is `DatasetsFailed`. `meter` may stop it
    (`TimeUp`) past its deadline."""
    if dataset_roots is not None:
        try:
            found = _dataset_shapes(request.net, dataset_roots)
        except NetError as error:
            raise DatasetsFailed(error) from None
        except OSError as error:  # a source name longer than the file system takes (ENAMETOOLONG), and the like
            message = f"a dataset the net names cannot be looked up: {os.strerror(error.errno or 0)}"
            raise DatasetsFailed(NetError(message, field="read_datasets")) from None
        request = dataclasses.replace(request, data_shapes={**found, **request.data_shapes})
    return estimate(request, oracle=_oracle() if fallback else None, meter=meter)


def _dataset_shapes(net_text: str | None, roots: Sequence[Path]) -> dict[str, Any]:
    """Item shapes from the datasets the net names, opened only inside the dataset roots."""
    from ..core.prototxt import parse_net
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
"""What a worker runs by a plain name. Others name their module: "package.module:name" is `WORKER_TASKS[name]` of
that module, imported in the worker when first asked for, so that the pool serves the jobs' builds and plans
(jobs.scheduling.planning) without importing the jobs."""


def task_function(task: str) -> Callable[..., Any]:
    """The function a task names (see TASKS); KeyError for one that names nothing."""
    module, _, name = task.rpartition(":")
    if not module:
        return TASKS[task]
    tasks: Mapping[str, Callable[..., Any]] = importlib.import_module(module).WORKER_TASKS
    return tasks[name]


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

    def __init__(self, memory_limit: int = WORKER_RSS_LIMIT) -> None:
        to_child, self._to = os.pipe()
        self._from, from_child = os.pipe()
        try:
            self.process = subprocess.Popen(  # this interpreter, this module
                [sys.executable, "-m", __name__, str(memory_limit)], stdin=to_child, stdout=from_child, close_fds=True,
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
        self.retiring = False
        """The worker said it ends after its last answer (its memory stayed past its limit)."""

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def call(self, task: str, args: tuple[Any, ...], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        try:
            _write_all(self._to, _dumps((task, args)), deadline)
            kind, value, self.retiring = _read_message(self._from, deadline)
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
        inline_layers: int = DEFAULT_INLINE_LAYERS,
        inline_seconds: float = DEFAULT_INLINE_SECONDS,
        timeout: float = DEFAULT_TIMEOUT,
        fallback: bool = True,
        worker_memory: int = WORKER_RSS_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if workers < 1 or queue < 0 or inline_bytes < 0 or inline_layers < 0 or inline_seconds <= 0 or timeout <= 0:
            raise ValueError(
                f"bad pool sizes: workers {workers}, queue {queue}, inline {inline_bytes} bytes, {inline_layers} "
                f"layers, {inline_seconds} s, timeout {timeout}"
            )
        self.workers = workers
        self.queue = queue
        self.inline_bytes = inline_bytes
        self.inline_layers = inline_layers
        self.inline_seconds = inline_seconds
        self.timeout = timeout
        self.fallback = fallback
        self.worker_memory = worker_memory
        """Resident bytes past which a worker forgets its cache after a task, and ends when that is not enough."""
        self._clock = clock
        self._slots: list[_Worker | None] = [None] * workers
        # A pool dropped without close() (an app a test or a host let go) still ends its workers.
        weakref.finalize(self, _end_workers, self._slots)
        self._idle = list(range(workers))
        self._waiting = 0
        self._cond = threading.Condition()
        self._mean_seconds = 1.0
        self._closed = False
        self.offloaded = 0
        """Estimates run in a worker since the start (for tests and benchmarks)."""
        self.refused = 0
        """Requests refused because the queue was full."""
        self.stopped_inline = 0
        """Estimates stopped at their inline deadline and run again in a worker."""
        self.retired = 0
        """Workers that ended because their memory stayed past `worker_memory`."""

    # --- what the views call

    def estimate(self, request: EstimateRequest, *, dataset_roots: Sequence[Path] | None = None) -> dict[str, Any]:
        """`run_estimate`, in this process when `inline` says so (against the inline deadline), else in a worker.
        Raises NetError, DatasetsFailed, or a PoolError (PoolBusy when the queue is full)."""
        roots = None if dataset_roots is None else [Path(root) for root in dataset_roots]
        if self.inline(request):
            try:
                return run_estimate(request, self.fallback, roots, Meter.within(self.inline_seconds, self._clock))
            except TimeUp:
                self.stopped_inline += 1
                log.info("an estimate passed its %g s in the server; it goes on in a worker", self.inline_seconds)
        affinity = hash((request.net, request.solver)) % self.workers
        return self.run("estimate", (request, self.fallback, roots), affinity=affinity)  # type: ignore[no-any-return]

    def inline(self, request: EstimateRequest) -> bool:
        """Whether the estimate may run in this process: its text within `inline_bytes`, and its predicted cost
        (`cost`) within `inline_layers` with no layer that needs pycaffe (when the fallback is on). A definition
        that cannot be read stays inline, where the estimate gives its error."""
        if text_size(request) > self.inline_bytes:
            return False
        cost = self.cost(request)
        if cost is None:
            return True
        return cost.layers <= self.inline_layers and not (cost.pycaffe and self.fallback)

    @staticmethod
    def cost(request: EstimateRequest) -> EstimateCost | None:
        """The request's predicted cost (core.cost), or None when its definition cannot be read."""
        try:
            return estimate_cost_of(request)
        except NetError:
            return None

    def run(self, task: str, args: tuple[Any, ...], *, affinity: int = 0) -> Any:
        """Run the task (`task_function`) in a worker; the worker at `affinity` if it is free (its caches are warm)."""
        index = self._acquire(affinity)
        started = time.monotonic()
        worker: _Worker | None = None
        try:
            worker = self._slots[index]
            if worker is None or not worker.alive:
                worker = self._slots[index] = _Worker(self.worker_memory)
            self.offloaded += 1
            return worker.call(task, args, self.timeout)
        except PoolError:
            if worker is not None and not worker.alive:
                self._slots[index] = None
            raise
        finally:
            if worker is not None and worker.retiring:
                self._slots[index] = None
                worker.kill()
                self.retired += 1
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
                        f"the server is busy: {self.workers} costly estimate(s) are running in its workers and "
                        f"{self._waiting} wait, the most it queues (MEMPLUGIN_ESTIMATE_QUEUE); try again in {retry} s",
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
            self._slots[:] = [None] * self.workers
            self._cond.notify_all()
        for worker in workers:
            worker.kill()


def _end_workers(slots: list[_Worker | None]) -> None:
    for worker in slots:
        if worker is not None:
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


def _trim(limit: int) -> bool:
    """Forget the cached definitions when this worker holds more than `limit` bytes; True when it still does
    (then it ends after its answer)."""
    if _rss_bytes() <= limit:
        return False
    from ..core.definitions import DEFINITIONS

    DEFINITIONS.clear()
    import gc

    gc.collect()
    return _rss_bytes() > limit


def worker_main(memory_limit: int = WORKER_RSS_LIMIT) -> int:
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
            answer: tuple[str, Any] = ("ok", task_function(task)(*args))
        except (NetError, DatasetsFailed) as error:
            answer = ("raise", error)
        except Exception:  # noqa: BLE001 - sent to the server's log
            answer = ("crash", traceback.format_exc())
        retiring = _trim(memory_limit)
        data = _dumps((*answer, retiring))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
        except BrokenPipeError:
            return 0
        if retiring:
            return 0


if __name__ == "__main__":
    # The package's own copy of this module, not __main__: the classes the answers pickle must be importable by name.
    from .pool import worker_main as _worker_main

    sys.exit(_worker_main(int(sys.argv[1]) if len(sys.argv) > 1 else WORKER_RSS_LIMIT))
