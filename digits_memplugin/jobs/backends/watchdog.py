"""The stuck-attempt watchdog: notices an attempt that sends no record and writes no log line for a set time, and
looks at what the process is doing before it is ended.

A training child always gets somewhere: a record every iteration, a "testing" record during long test passes,
Caffe's log while it builds nets or writes snapshots. One that stays silent is stuck, and no wait of the server's
may last for ever. The classic case: OpenBLAS under the attempt's memory cap, retrying a buffer map that fails,
for ever, at 100% CPU (core.oom's ALLOCATION_RETRY_FRAMES).

What is read, all from outside the child:
* /proc/PID/stat (CPU time, user and system, and the state letter) when the stall starts and when it is judged,
  so the CPU share is over the stall itself; /proc/PID/status (VmData) and /proc/PID/limits (the data cap);
* the main thread's stack, sampled with gdb in batch mode where gdb is installed and the system lets this
  process attach (root, or Yama's ptrace_scope allowing it); the runner names the server its tracer
  (PR_SET_PTRACER) so that where Yama restricts ptrace to ancestors, a gdb started by the server may attach.
Where no stack can be read, core.oom judges from /proc alone and says that the cause is only likely.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable

from ...core.oom import Stall
from ...measure.process_memory import data_bytes
from ...measure.process_times import cpu_times

STACK_TIMEOUT_SECONDS = 20.0
"""gdb attaching to a process and printing one thread's stack takes about a second; a bound on a slow one."""
MAX_FRAMES = 32
_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-fA-F]+ in )?(?P<function>[^\s(]+)")


def data_segment(pid: int) -> tuple[int | None, int | None]:
    """(VmData, RLIMIT_DATA) of a process in bytes; None where /proc does not say or there is no limit."""
    data = limit = None
    try:
        data = data_bytes(pid)
        with open(f"/proc/{pid}/limits", encoding="ascii", errors="replace") as limits:
            for line in limits:
                if line.startswith("Max data size"):
                    soft = line[len("Max data size") :].split()[0]
                    limit = None if soft == "unlimited" else int(soft)
    except (OSError, ValueError, IndexError, RuntimeError):
        pass
    return data, limit


def main_thread_stack(pid: int, timeout: float = STACK_TIMEOUT_SECONDS) -> tuple[str, ...] | None:
    """The function names on the process's main thread's stack, innermost first; None where gdb is missing or
    cannot attach. gdb stops the process while it reads, so this is for a process about to be ended."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return None
    try:
        result = subprocess.run(
            [gdb, "--batch", "--nx", "-p", str(pid), "-ex", f"thread apply 1 backtrace {MAX_FRAMES}"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=timeout, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    frames = tuple(match.group("function") for line in result.stdout.splitlines() if (match := _FRAME.match(line)))
    return frames or None


class Watchdog:
    """Follows one child: `activity` on every sign of life, `stalled` in the waiting loop. Cheap between stalls:
    /proc is read once after each sign of life, not on every poll."""

    def __init__(
        self,
        pid: int,
        seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        stack: Callable[[int], tuple[str, ...] | None] = main_thread_stack,
    ) -> None:
        self.pid = pid
        self.seconds = seconds
        self._clock = clock
        self._stack = stack
        self._since = clock()
        self._cpu_at_start: tuple[float, float, str] | None = None
        self._fresh = True

    def follow(self, pid: int) -> None:
        """Look at another process from now on: the one that really trains (the `caffe` a binary runner runs)."""
        self.pid = pid
        self._fresh = True

    def activity(self) -> None:
        """The child sent a record or wrote to its log."""
        self._since = self._clock()
        self._fresh = True

    def stalled(self) -> Stall | None:
        """None while the child makes progress; once it has been silent for `seconds`, what it is doing."""
        now = self._clock()
        if self._fresh:  # the CPU clock at the start of this silence, read at the first poll after it began
            self._fresh = False
            self._cpu_at_start = cpu_times(self.pid)
        silent = now - self._since
        if silent < self.seconds:
            return None
        end = cpu_times(self.pid)
        cpu_share = system_share = None
        state = end[2] if end is not None else None
        if end is not None and self._cpu_at_start is not None and silent > 0:
            user = end[0] - self._cpu_at_start[0]
            system = end[1] - self._cpu_at_start[1]
            cpu_share = (user + system) / silent
            system_share = system / (user + system) if user + system > 0 else 0.0
        data, limit = data_segment(self.pid)
        frames = self._stack(self.pid)
        return Stall(
            seconds=silent, cpu_share=cpu_share, system_share=system_share, frames=frames,
            data_bytes=data, data_limit=limit, state=state,
        )
