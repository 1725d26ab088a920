"""An estimate worker process: started by the pool as `python -m`, it answers the tasks its pipe brings until the
pipe closes, so it never outlives the server.

A task is run by name (`pool.task_function`); its answer is ("ok", value), ("raise", error) for the errors a caller
is told (NetError, DatasetsFailed), or ("crash", traceback) for the server's log, with whether the worker retires:
one whose memory stays past its limit after forgetting its cached definitions ends after answering.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from ..core.errors import NetError
from .pool import WORKER_NICE, WORKER_RSS_LIMIT, DatasetsFailed, _oracle, task_function
from .worker_messages import dumps, read_request


def _rss_bytes() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


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
    os.write(out, dumps(("ready", os.getpid())))
    while True:
        try:
            task, args = read_request(inp)
        except EOFError:
            return 0
        try:
            answer: tuple[str, Any] = ("ok", task_function(task)(*args))
        except (NetError, DatasetsFailed) as error:
            answer = ("raise", error)
        except Exception:  # noqa: BLE001 - sent to the server's log
            answer = ("crash", traceback.format_exc())
        retiring = _trim(memory_limit)
        data = dumps((*answer, retiring))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
        except BrokenPipeError:
            return 0
        if retiring:
            return 0


if __name__ == "__main__":
    sys.exit(worker_main(int(sys.argv[1]) if len(sys.argv) > 1 else WORKER_RSS_LIMIT))
