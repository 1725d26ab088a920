"""Child process: build a solver, run one step (a test pass at start, then one training iteration), report
mallinfo2() before and after as JSON on stdout. Caffe's log goes to stderr.

Usage: python -m digits_memplugin.measure.child SOLVER_PROTOTXT
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _in_use(libc: ctypes.CDLL) -> int:
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def _settled(libc: ctypes.CDLL, timeout: float = 10.0) -> int:
    """Reader threads keep filling their queues for a moment after the step: wait until the count holds still."""
    deadline = time.monotonic() + timeout
    last = _in_use(libc)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = _in_use(libc)
        if now == last:
            return now
        last = now
    return last


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    import caffe

    caffe.set_mode_cpu()
    before = _in_use(libc)
    started = time.monotonic()
    solver = caffe.get_solver(argv[0])
    constructed = _in_use(libc)
    solver.step(1)
    after = _settled(libc)
    print(
        json.dumps(
            {
                "before": before,
                "constructed": constructed,
                "after": after,
                "allocated": after - before,
                "seconds": time.monotonic() - started,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
