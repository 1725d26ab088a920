"""jobs.backends.watchdog with children that really get stuck: one spinning in OpenBLAS's allocation retry under a memory
cap (out of memory, found on its stack, or from /proc where no stack can be read), one spinning in Python, one
asleep (both failures); and one that keeps reporting, which the watchdog leaves alone. Every child and every wait
here is bounded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from test_jobs_fixtures import wait_for

from digits_memplugin.core import oom
from digits_memplugin.jobs.backends.attempt_process import AttemptProcess, AttemptResult
from digits_memplugin.jobs.backends.watchdog import Watchdog, data_segment, main_thread_stack
from digits_memplugin.measure.process_times import cpu_times

pytestmark = pytest.mark.slow

STALL = 3.0
"""The watchdog's silence in these tests: long enough for a child to start, short enough for a quick test."""
CPU_STALL = 1.0
"""The silence of a watchdog on the child's CPU clock (`on_cpu_time`): one second of the child's running, which a
loaded machine may spread over a minute of the wall clock."""
CPU_BOUND = 300.0
"""How long, on the wall clock, a child on the CPU clock may take to burn CPU_STALL on a loaded machine."""

# OpenBLAS maps its 128 MiB buffer at the first buffered call; under a data cap that map fails, and OpenBLAS
# retries for ever: the hang of issue 12, made on purpose (no warm-up before the cap).
BLAS_RETRY = textwrap.dedent(
    """
    import ctypes, resource, sys
    blas = ctypes.CDLL("libopenblas.so.0")
    n = 512
    a = (ctypes.c_float * (n * n))(); c = (ctypes.c_float * (n * n))()
    with open("/proc/self/status") as status:
        data = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))
    resource.setrlimit(resource.RLIMIT_DATA, (data + (16 << 20),) * 2)
    print('{"event": "started"}', flush=True)
    blas.cblas_sgemm(101, 111, 111, n, n, n, ctypes.c_float(1), a, n, a, n, ctypes.c_float(0), c, n)
    print('{"event": "finished"}', flush=True)
    """
)
PYTHON_SPIN = 'print(\'{"event": "started"}\', flush=True)\nwhile True:\n    pass\n'
# The sleeps in these children are what is tested: a child asleep, and children that report every half second.
ASLEEP = 'import time\nprint(\'{"event": "started"}\', flush=True)\ntime.sleep(600)\n'
STEADY = textwrap.dedent(
    """
    import json, time
    for i in range(12):
        print(json.dumps({"event": "iteration", "iteration": i}), flush=True)
        time.sleep(0.5)
    print(json.dumps({"event": "finished", "iteration": 12}), flush=True)
    """
)


def cpu_clock(pid: int) -> Callable[[], float]:
    """A clock that runs only while process `pid` runs: its CPU time (user and system) from /proc, the last reading
    once it is gone. On it a child that spins is busy for the whole of its silence however loaded the machine is
    (on the wall clock a niced child may get a tenth of a CPU, which the watchdog rightly calls nearly idle)."""
    last = [0.0]

    def now() -> float:
        times = cpu_times(pid)
        if times is not None:
            last[0] = times[0] + times[1]
        return last[0]

    return now


def on_cpu_time(pid: int, seconds: float) -> Watchdog:
    """The watchdog of an attempt, on the child's CPU clock: it judges what the child did, not what it was let do.
    Its gdb has the wall-clock bound of the whole test (a niced gdb on a loaded machine may need more than the 20 s
    the server gives it, and would then leave the stack unread)."""
    return Watchdog(pid, seconds, clock=cpu_clock(pid), stack=lambda traced: main_thread_stack(traced, CPU_BOUND))


def attempt(tmp_path: Path, script: str, env: dict[str, str] | None = None, on_cpu: bool = False) -> AttemptProcess:
    """The child of `script` under the watchdog: silent for STALL on the wall clock, or (`on_cpu`) for CPU_STALL
    of its own CPU time."""
    (tmp_path / "child.py").write_text(script)
    return AttemptProcess(
        tmp_path, "attempt.json", "caffe.log", environment={"OPENBLAS_NUM_THREADS": "1", **(env or {})},
        stall_seconds=CPU_STALL if on_cpu else STALL, grace_seconds=1.0,
        command=[sys.executable, str(tmp_path / "child.py")], watchdog=on_cpu_time if on_cpu else Watchdog,
    )


def run(process: AttemptProcess, bound: float = 120.0) -> oom.Outcome:
    """Start and follow the child, never longer than `bound`: past it the test fails instead of hanging."""
    process.start()
    results: list[AttemptResult] = []
    waiter = threading.Thread(target=lambda: results.append(process.wait()), daemon=True)
    waiter.start()
    waiter.join(bound)
    if waiter.is_alive():
        process.kill()
        waiter.join(30)
        pytest.fail(f"the watchdog did not end the child within {bound:g} s")
    assert process.process is not None and process.process.poll() is not None, "the child is still running"
    return results[0].outcome


def test_a_child_retrying_blas_allocation_is_out_of_memory(tmp_path: Path) -> None:
    outcome = run(attempt(tmp_path, BLAS_RETRY, on_cpu=True), bound=CPU_BOUND)
    assert outcome.status == oom.OUTCOME_OUT_OF_MEMORY and outcome.retry
    assert outcome.out_of_memory is not None
    if shutil.which("gdb"):  # scripts/system-deps.sh installs it; the stack says which loop it is
        assert outcome.out_of_memory.signature == "blas_allocation_retry"
        assert not outcome.out_of_memory.ambiguous
        assert "blas_memory_alloc" in (outcome.out_of_memory.line or "")
    else:
        assert outcome.out_of_memory.signature == "allocation_retry" and outcome.out_of_memory.ambiguous
    assert "watchdog" in outcome.message


def test_without_a_stack_the_retry_is_told_from_proc(tmp_path: Path) -> None:
    """Where gdb cannot attach, /proc alone: a capped child burning CPU mostly in the kernel is a likely retry."""
    (tmp_path / "child.py").write_text(BLAS_RETRY)
    child = subprocess.Popen(
        [sys.executable, str(tmp_path / "child.py")], stdout=subprocess.PIPE, text=True,
        env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"},
    )
    try:
        assert child.stdout is not None and "started" in child.stdout.readline()
        watchdog = Watchdog(child.pid, CPU_STALL, stack=lambda pid: None, clock=cpu_clock(child.pid))
        stall = wait_for(watchdog.stalled, timeout=CPU_BOUND, what="the watchdog to find the child stalled")
        assert stall.frames is None
        assert stall.busy and stall.system_share is not None and stall.system_share > 0.5
        assert stall.data_limit is not None and stall.data_bytes is not None and stall.data_bytes < stall.data_limit
        found = oom.stalled_out_of_memory(stall)
        assert found is not None and found.signature == "allocation_retry" and found.ambiguous
    finally:
        child.kill()
        child.wait(30)
        if child.stdout is not None:
            child.stdout.close()


def test_a_child_spinning_in_python_fails_with_no_progress(tmp_path: Path) -> None:
    outcome = run(attempt(tmp_path, PYTHON_SPIN, on_cpu=True), bound=CPU_BOUND)
    assert outcome.status == oom.OUTCOME_FAILED and not outcome.retry
    assert outcome.message.startswith(f"made no progress for {CPU_STALL:.0f} s")
    assert "of a CPU" in outcome.message and "watchdog" in outcome.message


def test_a_child_asleep_fails_with_no_progress(tmp_path: Path) -> None:
    outcome = run(attempt(tmp_path, ASLEEP))
    assert outcome.status == oom.OUTCOME_FAILED
    assert "made no progress" in outcome.message and "nearly idle" in outcome.message


def test_a_child_that_keeps_reporting_is_left_alone(tmp_path: Path) -> None:
    """Six seconds of records every half second: twice the watchdog's silence in all, never silent that long."""
    outcome = run(attempt(tmp_path, STEADY))
    assert outcome.status == oom.OUTCOME_SUCCESS, outcome


def test_log_lines_count_as_progress(tmp_path: Path) -> None:
    """Caffe's log (a net being built, a snapshot written) is a sign of life too."""
    script = textwrap.dedent(
        """
        import json, sys, time
        for i in range(12):
            print(f"I1203 building layer {i}", file=sys.stderr, flush=True)
            time.sleep(0.5)  # what is tested: a child that logs every half second
        print(json.dumps({"event": "finished"}), flush=True)
        """
    )
    assert run(attempt(tmp_path, script)).status == oom.OUTCOME_SUCCESS


def test_proc_readings_of_a_live_process() -> None:
    user, system, state = cpu_times(os.getpid()) or (None, None, None)
    assert user is not None and user > 0 and system is not None and state == "R"
    data, _ = data_segment(os.getpid())
    assert data is not None and data > 0
    assert cpu_times(2**22 + 12345) is None  # beyond pid_max: gone


def test_records_of_the_blas_child_reach_the_caller(tmp_path: Path) -> None:
    """The watchdog's stop does not lose what the child sent before."""
    records: list[dict[str, object]] = []
    process = attempt(tmp_path, BLAS_RETRY)
    process.on_record = records.append
    run(process)
    assert [record["event"] for record in records] == ["started"]
    assert json.dumps(records)
