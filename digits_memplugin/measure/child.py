"""Child process: build a solver, run one step (a test pass at start, then one training iteration), report
mallinfo2() before and after as JSON on stdout. Caffe's log goes to stderr.

Usage: python -m digits_memplugin.measure.child SOLVER_PROTOTXT
"""

from __future__ import annotations

import json
import sys
import time

from .process_memory import heap_bytes


def _in_use() -> int:
    used = heap_bytes()
    if used is None:
        raise RuntimeError("this C library has no mallinfo2(): the measurement needs glibc 2.33 or newer")
    return used


def _settled(timeout: float = 10.0) -> int:
    """Reader threads keep filling their queues for a moment after the step: wait until the count holds still."""
    deadline = time.monotonic() + timeout
    last = _in_use()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = _in_use()
        if now == last:
            return now
        last = now
    return last


def main(argv: list[str]) -> int:
    import caffe

    caffe.set_mode_cpu()
    before = _in_use()
    started = time.monotonic()
    solver = caffe.get_solver(argv[0])
    constructed = _in_use()
    solver.step(1)
    after = _settled()
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
