"""A process's CPU time, read from outside it: the watchdog judges a silent attempt by it, and the binary runner
tells by it whether `caffe` is still working while its log is quiet (both read another process, so /proc)."""

from __future__ import annotations

import os


def cpu_times(pid: int) -> tuple[float, float, str] | None:
    """(user seconds, system seconds, state letter) of a process, all its threads together; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks, fields[0]
