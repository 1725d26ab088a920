"""The `caffe` binary runner: one attempt trained by `caffe train --solver=S [--gpu=N] [--snapshot=STATE]`, as DIGITS
runs it, followed by the training child (jobs/child/runner.py, which calls `train_with_binary` for a Caffe without a
pycaffe) and turned into the records the pycaffe runner sends.

The child stays what the manager supervises, and caffe runs inside it:

* in the child's process group (a cancel's SIGTERM and SIGKILL reach both), with PR_SET_PDEATHSIG set between fork
  and exec, so the chain dies together: the server's death kills the child, the child's kills caffe;
* preloaded with the capped-start library (capped_start.c, built by jobs/child/preload.py), which, inside caffe, once its
  libraries are initialised and before its main runs, warms its BLAS up as blas_warmup does for pycaffe (a map
  left for after the cap would make OpenBLAS retry for ever), makes Caffe's threads reserve small stacks, takes
  the baseline and sets RLIMIT_DATA to it plus the attempt's cap, names the server its ptracer, and reports all
  that on a pipe before caffe's first line. A caffe that does not load it (a static binary, another C library) is
  not run under a cap: the attempt ends with an error saying so;
* its `started` record names caffe's pid, so the manager's watchdog, which ends and classifies a silent attempt,
  looks at the process that trains (its CPU time, its stack, its data segment), and GPU memory is read for it;
* its output (glog on stderr, anything on stdout) is appended to the attempt's caffe.log as it comes, and read as
  it comes (jobs/child/caffe_log.py): records for the tests, updates, snapshots and the end, with `memory_bytes` (caffe's
  data segment growth, read from /proc) and, on the CPU, `allocated_bytes` (malloc's growth, which only caffe can
  read: the library answers on a pipe);
* out of memory is recognised from the live log with the classifier's signatures (core.oom): caffe normally
  aborts at once after such a line; one that neither ends nor gets further within OOM_GRACE_SECONDS is killed and
  the attempt ends as out of memory, so the fallback goes on instead of waiting for the watchdog;
* a caffe killed by a signal (SIGABRT after glog's F line) ends the child with the same signal, an exit status is
  passed on: the manager classifies the attempt as it would a pycaffe one.

The generated solver has Caffe's own testing, snapshots and `display: 1` on (jobs/definition/attempt_files.py), so that the log
says everything the records need.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ...core.oom import SYSTEM_SHARE_OF_A_RETRY
from ...core.oom_signatures import GLOG_LINE
from ...core.schedule import LearningRate
from ...measure.process_memory import data_bytes
from ...measure.process_times import cpu_times
from .attempt_spec import AttemptSpec
from .caffe_build import linked_libraries
from .caffe_log import TrainingLog
from .confinement import Confinement, ConfinementError, confine_attempt, describe
from .preload import PreloadError, ensure_library

PR_SET_PDEATHSIG = 1
REPORT_SECONDS = 300.0
"""How long caffe may take to load its libraries before the capped-start library reports (CUDA's take seconds)."""
ANSWER_SECONDS = 5.0
"""How long the library may take to say malloc's heap."""
OOM_GRACE_SECONDS = 10.0
"""After an out-of-memory line, how long caffe may take to end (it prints its stack first) or to get further."""
EXIT_SECONDS = 30.0
"""After caffe closed its output, how long it may take to exit."""
ALIVE_SECONDS = 10.0
"""During a test pass caffe logs nothing: a "testing" record this often while it uses the CPU as a computation does."""
POLL_SECONDS = 1.0
MAX_TOLD_BYTES = 64 * 1024
"""What caffe's process may say of its confinement (a JSON object of a few fields)."""
BUSY_SHARE = 0.25
"""A test pass using at least this share of a CPU, mostly outside the kernel, is making progress (a failed
allocation retried for ever spends most of its time in the kernel: core.oom's SYSTEM_SHARE_OF_A_RETRY)."""
_SNAPSHOT_ITERATION = re.compile(r"_iter_(\d+)\.solverstate(?:\.h5)?$")


class BinaryRunnerError(Exception):
    """The attempt cannot be run with this binary as asked (its cap cannot be applied); the message says why."""


def command_line(spec: AttemptSpec) -> list[str]:
    """`caffe train` as DIGITS starts it: the solver, the GPU (CUDA's number inside the child), the state to resume."""
    if spec.caffe is None:
        raise BinaryRunnerError("the attempt names no caffe binary")
    command = [spec.caffe, "train", f"--solver={spec.solver}"]
    if spec.device.kind == "gpu":
        command.append(f"--gpu={spec.device.cuda_index or 0}")
    if spec.resume:
        command.append(f"--snapshot={spec.resume}")
    return command


def start_iteration(spec: AttemptSpec) -> int:
    """Updates done before this attempt: the resumed state's, from its name (`<prefix>_iter_N.solverstate`)."""
    found = _SNAPSHOT_ITERATION.search(spec.resume or "")
    return int(found.group(1)) if found else 0


def _child_setup(parent: int, confine: Any, told: int) -> Any:  # pragma: no cover - in the child, fork to exec
    def setup() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the runner died before the request took effect
            os._exit(1)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a core of a large caffe would fill the job's folder
        # The confinement is made here, in caffe's own process (one thread, before exec): its /proc/<pid> is
        # caffe's, which the capped-start library reads. What was done goes to the runner on its own pipe.
        try:
            said: dict[str, Any] = confine().to_dict()
        except ConfinementError as error:
            said = {"error": error.strerror or str(error)}
        os.write(told, (json.dumps(said) + "\n").encode())
        os.close(told)
        if "error" in said:
            os._exit(126)

    return setup


class _Caffe:
    """The running caffe and the three pipes of its capped-start library."""

    def __init__(self, spec: AttemptSpec, library: Path, stack_bytes: int, confine: Any) -> None:
        told_read, told_write = os.pipe()
        report_read, report_write = os.pipe()
        query_read, query_write = os.pipe()
        answer_read, answer_write = os.pipe()
        preloaded = " ".join(filter(None, [str(library), os.environ.get("LD_PRELOAD", "")]))
        environment = {
            **os.environ,
            "GLOG_logtostderr": "1",
            "LD_PRELOAD": preloaded,
            "MEMPLUGIN_REPORT_FD": str(report_write),
            "MEMPLUGIN_QUERY_FD": str(query_read),
            "MEMPLUGIN_ANSWER_FD": str(answer_write),
            "MEMPLUGIN_DATA_CAP": str(spec.memory_cap or 0),
            "MEMPLUGIN_THREAD_STACK": str(stack_bytes),
            "MEMPLUGIN_PTRACER": str(os.getppid()),
        }
        self.process = subprocess.Popen(
            command_line(spec), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=environment, pass_fds=(report_write, query_read, answer_write),
            preexec_fn=_child_setup(os.getpid(), confine, told_write),  # noqa: PLW1509 - this process starts no thread before it
        )
        for fd in (told_write, report_write, query_read, answer_write):
            os.close(fd)
        with os.fdopen(told_read, "rb") as told:
            line = told.readline(MAX_TOLD_BYTES)
        try:
            said = json.loads(line) if line else {"error": "caffe's process ended before it was confined"}
        except ValueError:
            said = {"error": f"caffe's process said {line[:200]!r} of its confinement"}
        if "error" in said:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=EXIT_SECONDS)
            raise BinaryRunnerError(f"the attempt could not be confined: {said['error']}")
        self.confinement: dict[str, Any] = said
        self.report_fd, self.query_fd, self.answer_fd = report_read, query_write, answer_read
        assert self.process.stdout is not None
        self.output = self.process.stdout.fileno()
        os.set_blocking(self.output, False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def heap(self) -> int | None:
        """malloc's heap inside caffe (the library's answer), None when it does not answer."""
        if self.query_fd < 0:
            return None
        try:
            os.write(self.query_fd, b"?")
            ready, _, _ = select.select([self.answer_fd], [], [], ANSWER_SECONDS)
            line = os.read(self.answer_fd, 64) if ready else b""
            return int(line.split(b"\n")[0])
        except (OSError, ValueError):
            self._stop_answers()
            return None

    def _stop_answers(self) -> None:
        for fd in (self.query_fd, self.answer_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.query_fd = self.answer_fd = -1

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def close(self) -> None:
        self._stop_answers()
        with contextlib.suppress(OSError):
            os.close(self.report_fd)
        if self.process.stdout is not None:
            self.process.stdout.close()


class _Follower:
    """Reads caffe's output into caffe.log and the parser, and reports the records with their memory figures."""

    def __init__(self, spec: AttemptSpec, caffe: _Caffe, report: Any, baseline: int | None, heap: int | None) -> None:
        self.spec, self.caffe, self.report = spec, caffe, report
        self.baseline, self.heap_baseline = baseline, heap
        self.on_cpu = spec.device.kind != "gpu"
        schedule = LearningRate(**{**spec.schedule, "stepvalues": tuple(spec.schedule["stepvalues"])})
        self.log = TrainingLog(start_iteration(spec), rate=schedule.rate)
        self.partial = b""
        self.finished = False
        self.oom_line: str | None = None
        self.oom_at: float | None = None
        self.oom_iteration = 0
        self.last_line = time.monotonic()
        self.test_cpu: tuple[float, float, float] | None = None
        self.last_memory: dict[str, int] = {}
        self.last_memory_taken: set[str] = set()

    def memory(self) -> dict[str, int]:
        """What the pycaffe runner's records carry: the data segment's growth and, on the CPU, malloc's. A figure
        that cannot be read any more (caffe exits right after "Optimization Done") is its last reading."""
        fields: dict[str, int] = {}
        if self.baseline is not None:
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                fields["memory_bytes"] = data_bytes(self.caffe.pid) - self.baseline
        if self.on_cpu and self.heap_baseline is not None:
            heap = self.caffe.heap()
            if heap is not None:
                fields["allocated_bytes"] = heap - self.heap_baseline
        self.last_memory.update(fields)
        return {**self.last_memory, **fields}

    def take(self, chunk: bytes) -> None:
        os.write(2, chunk)  # the attempt's caffe.log (the runner's stderr): the whole output, as it came
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            self.line(line.decode("utf-8", errors="replace"))

    def line(self, text: str) -> None:
        self.last_line = time.monotonic()
        for event in self.log.feed(text):
            self.send(event)
        if self.log.done and "finished" not in self.last_memory_taken:
            self.last_memory_taken.add("finished")
            self.memory()  # while caffe is still there: the figures of the "finished" record

    def send(self, event: dict[str, Any]) -> None:
        name = event.pop("event")
        if name == "out_of_memory":
            found = event["out_of_memory"]
            if self.oom_line is None:
                self.oom_line, self.oom_at, self.oom_iteration = found.line or "", time.monotonic(), self.log.iteration
            return
        if name == "test":
            self.test_cpu = None
        if name == "finished":
            self.finished = True
        if name in ("constructed", "iteration", "finished"):
            event.update(self.memory())
        self.report(name, **event)

    def end(self, exited_cleanly: bool) -> None:
        if self.partial:
            self.line(self.partial.decode("utf-8", errors="replace"))
            self.partial = b""
        for event in self.log.close(exited_cleanly):
            self.send(event)

    def overdue_after_oom(self) -> bool:
        """An out-of-memory line came, and since then caffe neither ended nor completed an update."""
        if self.oom_at is None:
            return False
        if self.log.iteration > self.oom_iteration:  # it got further: whatever it was, it recovered
            self.oom_line = self.oom_at = None
            return False
        return time.monotonic() - self.oom_at > OOM_GRACE_SECONDS

    def alive_while_testing(self) -> None:
        """A "testing" record, at most every ALIVE_SECONDS of a test pass with no line, while caffe computes."""
        net = self.log.testing
        if net is None or time.monotonic() - self.last_line < ALIVE_SECONDS:
            self.test_cpu = None
            return
        now = cpu_times(self.caffe.pid)
        if now is None:
            return
        if self.test_cpu is None:
            self.test_cpu = (time.monotonic(), now[0], now[1])
            return
        since, user, system = self.test_cpu
        elapsed = time.monotonic() - since
        if elapsed < ALIVE_SECONDS:
            return
        used = (now[0] - user) + (now[1] - system)
        kernel = (now[1] - system) / used if used > 0 else 1.0
        self.test_cpu = (time.monotonic(), now[0], now[1])
        if used / elapsed >= BUSY_SHARE and kernel < SYSTEM_SHARE_OF_A_RETRY:
            of = self.spec.test_iter[net] if net < len(self.spec.test_iter) else None
            self.report("testing", net=net, done=None, of=of, cpu_seconds=round(used, 3))


def _read_report(caffe: _Caffe, early: list[bytes]) -> dict[str, Any] | None:
    """The capped-start library's report, which it writes before caffe's main runs; None when caffe's main speaks
    first (a glog line), or caffe ends, without one: the library was not loaded. Output read meanwhile (the
    loader's complaint, an OpenBLAS warning from its constructor) is kept in `early` for the follower."""
    deadline = time.monotonic() + REPORT_SECONDS
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([caffe.report_fd, caffe.output], [], [], POLL_SECONDS)
        if caffe.report_fd in ready:
            chunk = os.read(caffe.report_fd, 65536)
            data += chunk
            if b"\n" in data or not chunk:
                break
            continue
        if caffe.output in ready:
            output = _read_some(caffe.output)
            if output:
                early.append(output)
            lines = b"".join(early).decode("utf-8", errors="replace").splitlines()
            if output == b"" or any(GLOG_LINE.match(line) for line in lines):
                break
        elif caffe.process.poll() is not None:
            break
    line = data.split(b"\n")[0]
    if not line:
        return None
    try:
        report = json.loads(line)
    except json.JSONDecodeError:
        return None
    return report if isinstance(report, dict) else None


def _read_some(fd: int) -> bytes | None:
    """What the non-blocking pipe holds; b"" at its end, None when nothing is there yet."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None


def _blas(report: dict[str, Any] | None) -> dict[str, Any]:
    """The `started` record's "blas", as the pycaffe runner's (jobs.child.blas_warmup.WarmUp)."""
    if report is None:
        return {"library": None, "core": None, "threads": None, "mapped_bytes": 0, "rounds": 0, "settled": False}
    threads = report.get("threads")
    return {
        "library": report.get("library"), "core": report.get("core"),
        "threads": threads if isinstance(threads, int) and threads >= 0 else None,
        "mapped_bytes": report.get("mapped_bytes", 0), "rounds": report.get("rounds", 0),
        "settled": bool(report.get("settled")),
    }


def train_with_binary(spec: AttemptSpec, report: Any, *, stack_bytes: int) -> int:
    """Run the attempt with `caffe train`; the child's exit status (or the signal that killed caffe, raised on this
    process). Raises BinaryRunnerError or PreloadError before caffe trains when it cannot be run as asked."""
    library = Path(spec.preload) if spec.preload and Path(spec.preload).is_file() else None
    if library is None:
        try:
            library = ensure_library()
        except PreloadError as error:
            raise BinaryRunnerError(f"the capped-start library cannot be built: {error}") from None
    caffe = _Caffe(spec, library, stack_bytes, _confinement(spec, library))
    said = Confinement(**{**caffe.confinement, "writes": tuple(caffe.confinement.get("writes", ()))})
    print(f"memplugin: caffe (pid {caffe.pid}) is {describe(said)}", file=sys.stderr, flush=True)
    try:
        return _follow(spec, caffe, report)
    finally:
        if caffe.process.poll() is None:
            caffe.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                caffe.process.wait(timeout=EXIT_SECONDS)
        caffe.close()


def _confinement(spec: AttemptSpec, library: Path) -> Any:
    """The attempt's confinement (jobs.child.confinement) as a call made in caffe's process between fork and exec: besides
    what the pycaffe runner is granted, caffe's own Caffe root (its binary and libcaffe), the folders of the libraries
    it links (as ldd resolves them, here, before any confinement) and the capped-start library are read and
    executed."""
    if spec.caffe is None:
        raise BinaryRunnerError("the attempt names no caffe binary")
    binary = Path(spec.caffe).resolve()
    root = binary.parents[2] if binary.parent.parts[-2:] == ("build", "tools") else binary.parent
    linked, _ = linked_libraries(binary)
    folders = {str(Path(path).parent) for path in linked.values() if path.startswith("/")}
    executables = [str(root), str(library), *sorted(folders)]
    folder = Path.cwd()

    def confine() -> Confinement:
        return confine_attempt(
            folder, spec.read_paths, spec.write_paths, gpu=spec.device.kind == "gpu", executables=executables
        )

    return confine


def _follow(spec: AttemptSpec, caffe: _Caffe, report: Any) -> int:
    early: list[bytes] = []
    found = _read_report(caffe, early)
    if found is not None and found.get("error"):
        caffe.process.wait(timeout=EXIT_SECONDS)
        raise BinaryRunnerError(f"the memory cap could not be set inside {spec.caffe}: {found['error']}")
    if found is None and spec.memory_cap:
        caffe.kill()
        first = b"".join(early).decode("utf-8", errors="replace").strip().splitlines()
        said = f" (it said: {first[0][:300]})" if first else ""
        raise BinaryRunnerError(
            f"{spec.caffe} did not load the capped-start library{said}, so its memory cap cannot be applied: a "
            "statically linked caffe, or a BLAS it does not export, cannot train under a cap (train it on a GPU, or "
            "without MEMPLUGIN_CPU_MEMORY_CAP)"
        )
    baseline = found.get("baseline_bytes") if found else None
    heap = found.get("heap_bytes") if found else None
    report(
        "started", pid=caffe.pid, runner_pid=os.getpid(), baseline_bytes=baseline, memory_cap=spec.memory_cap,
        resumed_from=spec.resume, blas=_blas(found), caffe=spec.caffe, confinement=caffe.confinement,
    )
    follower = _Follower(spec, caffe, report, baseline if isinstance(baseline, int) else None,
                         heap if isinstance(heap, int) else None)
    for chunk in early:
        follower.take(chunk)
    killed_for_oom = False
    while True:
        ready, _, _ = select.select([caffe.output], [], [], POLL_SECONDS)
        if ready:
            output = _read_some(caffe.output)
            if output == b"":
                break
            if output:
                follower.take(output)
                continue
        if follower.overdue_after_oom():
            caffe.kill()
            killed_for_oom = True
            break
        follower.alive_while_testing()
    try:
        returncode = caffe.process.wait(timeout=EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        caffe.kill()
        returncode = caffe.process.wait(timeout=EXIT_SECONDS)
    follower.end(exited_cleanly=returncode == 0 and not killed_for_oom)
    if killed_for_oom:
        report("error", type="OutOfMemory", message=(
            f"{follower.oom_line} (caffe neither ended nor got further within {OOM_GRACE_SECONDS:g} s: stopped)"
        ))
        return 3
    if returncode < 0:
        _end_like(-returncode)
    return returncode


def _end_like(number: int) -> None:
    """End this process with the signal that ended caffe, so the manager sees what it would of a pycaffe child."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    time.sleep(1)  # pragma: no cover - the signal arrives first
    os._exit(128 + number)  # pragma: no cover - a signal that does not end the process


__all__ = ["BinaryRunnerError", "command_line", "start_iteration", "train_with_binary"]
