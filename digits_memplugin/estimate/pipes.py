"""The non-blocking pipes to this process's own children (estimate workers, dataset readers): the children started
with them, and waits on them that never block the server's one thread.

Under gevent's monkey-patching (`serve`) a wait goes through gevent's hub, so other greenlets run meanwhile; in a
threaded server or the CLI it is `poll` in the calling thread. Each wait has a deadline (TimeoutError past it).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Any

CHUNK = 1 << 20
"""The most bytes one read or write of a pipe moves."""


def cooperative() -> bool:
    """Whether gevent has patched this process: then waits go through its hub, never blocking the thread."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("select"))


def wait(fd: int, write: bool, deadline: float) -> None:
    """Until `fd` can be written (`write`) or read, or TimeoutError at `deadline` (time.monotonic)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    if cooperative():
        from gevent.socket import wait_read, wait_write

        (wait_write if write else wait_read)(fd, timeout=left, timeout_exc=TimeoutError())
        return
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    if not poller.poll(left * 1000):
        raise TimeoutError


def write_all(fd: int, data: bytes, deadline: float) -> None:
    """All of `data` into the non-blocking pipe `fd`, waiting (`wait`) whenever it is full."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view[:CHUNK])
        except BlockingIOError:
            wait(fd, True, deadline)
            continue
        view = view[written:]


def start_child(command: list[str], **options: Any) -> tuple[subprocess.Popen[bytes], int, int]:
    """`command` started with a pipe to its stdin and one from its stdout (`options` go to Popen): the process and
    this side's end of each pipe, non-blocking. Nothing is left open when the process cannot be started."""
    to_child, to = os.pipe()
    answers, from_child = os.pipe()
    try:
        process = subprocess.Popen(command, stdin=to_child, stdout=from_child, close_fds=True, **options)
    except BaseException:
        for fd in (to, answers):
            os.close(fd)
        raise
    finally:
        os.close(to_child)
        os.close(from_child)
    for fd in (to, answers):
        os.set_blocking(fd, False)
    return process, to, answers
