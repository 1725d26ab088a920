"""Make the BLAS library map its buffers before a training child caps its own memory.

OpenBLAS maps a work buffer (128 MiB on x86-64) the first time a call takes its buffered path, and when that map
fails, as it does under the attempt's RLIMIT_DATA, it retries for ever (blas_memory_alloc loops over its
allocators until one succeeds): the attempt would spin at 100% CPU instead of running out of memory. Which call
first needs the buffer depends on the kernel OpenBLAS picks for the CPU (OPENBLAS_CORETYPE): a 2x2 sgemm maps it
with Haswell or Zen kernels but takes a small-matrix path with SkylakeX/Cooperlake ones; the first threaded call
maps a little more when OpenBLAS runs more than one thread.

So the child calls, before the cap, every BLAS routine Caffe's float math uses (caffe_cpu_gemm, gemv, axpy,
scal, dot, asum) at sizes that take the buffered and the threaded paths, and reads its data segment around each
round: rounds repeat until one maps nothing more, which is the check that nothing is left for later.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import mmap
import os
from collections.abc import Callable
from typing import Any

from ...measure.process_memory import data_bytes

GEMM_SIZE = 512
"""Square sgemm size: past every kernel's small-matrix path, and threaded (M*N*K far above OpenBLAS's threshold)."""
GEMV_SIZE = 1024
VECTOR_SIZE = 1 << 20
"""Level-1 routines go threaded above some tens of thousands of elements."""
MAX_ROUNDS = 4

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """What the warm-up found and did."""

    library: str | None
    """The library that defines Caffe's cblas_sgemm (None: Caffe has none, nothing was done)."""
    core: str | None
    """OpenBLAS's kernel for this CPU (openblas_get_corename), when the library says."""
    threads: int | None
    """OpenBLAS's thread count, when the library says."""
    mapped_bytes: int
    """How much the data segment grew during the warm-up: the buffers now in the baseline instead of the cap."""
    rounds: int
    settled: bool
    """The last round mapped nothing: no buffer is left to be mapped at Caffe's first call."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def warm_up(extension: str) -> WarmUp:
    """Call the BLAS routines Caffe uses until a round maps no more memory. `extension`: the shared object whose
    BLAS is to be warmed up (pycaffe's _caffe.so): its cblas_* symbols resolve, through its own dependencies, to the
    very routines Caffe calls (numpy and scipy load OpenBLAS copies of their own, which Caffe does not use)."""
    blas = ctypes.CDLL(extension)  # the loaded extension's handle: dlopen of a loaded library returns it
    library = _defining_library(blas, "cblas_sgemm")
    if library is None:
        return WarmUp(None, None, None, 0, 0, True)
    operands = _Operands()
    calls = _calls(blas, operands)
    before = data_bytes()
    rounds, settled = 0, False
    while rounds < MAX_ROUNDS and not settled:
        start = data_bytes()
        for call in calls:
            call()
        rounds += 1
        settled = rounds > 1 and data_bytes() == start
    mapped = data_bytes() - before
    del calls  # the calls hold the operands; the BLAS keeps its buffers
    operands.close()
    return WarmUp(library, _core(blas), _threads(blas), mapped, rounds, settled)


class _Operands:
    """Zeroed float arrays, each in an anonymous mapping of its own, unmapped by `close`. Not malloc'd: glibc serves
    large blocks with mmap and, when one is freed, raises its mmap threshold to that size, which would change how
    Caffe's buffers are allocated afterwards (and so the figure the estimate is held to)."""

    def __init__(self) -> None:
        self._maps: list[mmap.mmap] = []

    def floats(self, count: int) -> Any:
        mapping = mmap.mmap(-1, count * ctypes.sizeof(ctypes.c_float))
        self._maps.append(mapping)
        return (ctypes.c_float * count).from_buffer(mapping)

    def close(self) -> None:
        for mapping in self._maps:
            with contextlib.suppress(BufferError):  # an array still alive keeps its mapping: harmless
                mapping.close()
        self._maps.clear()


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p),
    ]


def _defining_library(handle: ctypes.CDLL, symbol: str) -> str | None:
    """The file that defines `symbol` as `handle` resolves it (dladdr); None when it does not resolve."""
    function = getattr(handle, symbol, None)
    if function is None:
        return None
    info = _DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return symbol  # resolved, though the C library cannot say where
    return os.path.realpath(os.fsdecode(info.dli_fname))


def _calls(blas: ctypes.CDLL, operands: _Operands) -> list[Callable[[], None]]:
    """One call of each routine Caffe's float math uses, on zeroed operands."""
    n, m = GEMM_SIZE, GEMV_SIZE
    square, result = operands.floats(n * n), operands.floats(n * n)
    matrix = operands.floats(m * m)
    vector, other = operands.floats(VECTOR_SIZE), operands.floats(VECTOR_SIZE)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    calls: list[Callable[[], None]] = []

    def add(name: str, *args: Any) -> None:
        function = getattr(blas, name, None)
        if function is not None:
            calls.append(lambda: function(*args))

    for trans_a in (_NO_TRANS, _TRANS):
        for trans_b in (_NO_TRANS, _TRANS):
            add("cblas_sgemm", _ROW_MAJOR, trans_a, trans_b, n, n, n, one, square, n, square, n, zero, result, n)
    for trans in (_NO_TRANS, _TRANS):
        add("cblas_sgemv", _ROW_MAJOR, trans, m, m, one, matrix, m, vector, 1, zero, other, 1)
    add("cblas_saxpy", VECTOR_SIZE, one, vector, 1, other, 1)
    add("cblas_sscal", VECTOR_SIZE, one, other, 1)
    blas_float = getattr(blas, "cblas_sdot", None)
    if blas_float is not None:
        blas_float.restype = ctypes.c_float
    add("cblas_sdot", VECTOR_SIZE, vector, 1, other, 1)
    asum = getattr(blas, "cblas_sasum", None)
    if asum is not None:
        asum.restype = ctypes.c_float
    add("cblas_sasum", VECTOR_SIZE, vector, 1)
    return calls


def _core(blas: ctypes.CDLL) -> str | None:
    function = getattr(blas, "openblas_get_corename", None)
    if function is None:
        return None
    function.restype = ctypes.c_char_p
    value = function()
    return value.decode("ascii", errors="replace") if value else None


def _threads(blas: ctypes.CDLL) -> int | None:
    function = getattr(blas, "openblas_get_num_threads", None)
    return None if function is None else int(function())
