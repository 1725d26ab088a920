"""Two readings of a process's own memory, each counting something different, read cheaply and often.

* `data_bytes`: the data segment (VmData in /proc/self/status), which RLIMIT_DATA limits: every private writable
  mapping, so malloc's heap, the BLAS library's buffers and the Python interpreter's arenas alike.
* `heap_bytes`: what malloc has handed out and not had back (glibc's mallinfo2: uordblks + hblkhd, all arenas). In
  CPU mode Caffe's blobs, layer buffers and solver history are malloc'd, so its growth is Caffe's own allocation,
  the quantity the estimator predicts; it leaves out OpenBLAS's buffers (mmap'd by OpenBLAS itself) and Python's
  object arenas (mmap'd by pymalloc).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


@functools.cache
def _mallinfo2() -> Any:
    try:
        function = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc, or a glibc older than 2.33
        return None
    function.restype = _Mallinfo2
    return function


def heap_bytes() -> int | None:
    """Bytes malloc has handed out and not had back (None where the C library has no mallinfo2)."""
    function = _mallinfo2()
    if function is None:
        return None
    info = function()
    return int(info.uordblks + info.hblkhd)


def data_bytes(pid: int | None = None) -> int:
    """The data segment (VmData), what RLIMIT_DATA limits, of this process or of `pid`. Raises OSError when the
    process is gone, RuntimeError where /proc does not say."""
    path = f"/proc/{'self' if pid is None else pid}/status"
    with open(path, encoding="ascii", errors="replace") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{path} has no VmData line")
