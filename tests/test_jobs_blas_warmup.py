"""jobs.child.blas_warmup in a real pycaffe process under each OpenBLAS kernel and thread count: after the warm-up, the
BLAS calls Caffe makes map nothing more, so a memory cap set then can never leave OpenBLAS retrying a failed map
for ever; without it (a 2x2 sgemm, the old warm-up) the SkylakeX kernels do. Every child here has a time bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_jobs_fixtures import BLAS_CORES

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]  # the blas_core fixture

# In a child: warm up (or not), cap the data segment 16 MiB above what it is, then call the BLAS at sizes larger
# than the warm-up's, the way Caffe would after the cap; print what the data segment did.
CAPPED_CALLS = textwrap.dedent(
    """
    import ctypes, json, mmap, resource, sys
    import caffe
    from digits_memplugin.jobs.child.blas_warmup import warm_up
    from digits_memplugin.measure.process_memory import data_bytes

    blas = ctypes.CDLL(caffe._caffe.__file__)
    n = 1024
    maps = [mmap.mmap(-1, n * n * 4) for _ in range(3)]
    a, b, c = ((ctypes.c_float * (n * n)).from_buffer(m) for m in maps)
    one, zero = ctypes.c_float(1), ctypes.c_float(0)
    if sys.argv[1] == "warm-up":
        found = warm_up(caffe._caffe.__file__).to_dict()
    else:  # the old warm-up: one 2x2 sgemm
        blas.cblas_sgemm(101, 111, 111, 2, 2, 2, one, a, 2, b, 2, zero, c, 2)
        found = None
    capped = data_bytes()
    resource.setrlimit(resource.RLIMIT_DATA, (capped + (16 << 20),) * 2)
    for size in (64, 256, 512, 1024):
        for trans in (111, 112):
            blas.cblas_sgemm(101, trans, 111, size, size, size, one, a, size, b, size, zero, c, size)
            blas.cblas_sgemv(101, trans, size, size, one, a, size, b, 1, zero, c, 1)
    blas.cblas_saxpy(n * n, one, a, 1, b, 1)
    print(json.dumps({"warm_up": found, "grew": data_bytes() - capped}))
    """
)


def run_capped(mode: str, timeout: float) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", CAPPED_CALLS, mode], capture_output=True, text=True, timeout=timeout, check=False,
        env=os.environ,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("blas_core", BLAS_CORES, indirect=True)
def test_after_the_warm_up_caffes_blas_calls_map_nothing_under_a_cap(
    blas_core: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", str(threads))
    found = run_capped("warm-up", timeout=120)
    assert found["grew"] == 0
    warm = found["warm_up"]
    assert isinstance(warm, dict)
    assert warm["settled"] and warm["rounds"] >= 2 and warm["threads"] == threads
    assert warm["mapped_bytes"] >= 64 << 20  # OpenBLAS's work buffer (128 MiB on x86-64)
    assert "openblas" in str(warm["library"])
    if blas_core:
        assert warm["core"] == blas_core


@pytest.mark.parametrize(
    "blas_core",
    [param for param in BLAS_CORES if param.values[0] == "SkylakeX"],
    indirect=True,
)
def test_a_tiny_warm_up_leaves_the_skylakex_buffer_for_after_the_cap(blas_core: str) -> None:
    """The hang of issue 12, kept as the witness that the test above can fail: with SkylakeX kernels a 2x2 sgemm
    takes the small-matrix path, and the first large call retries its failed map for ever."""
    with pytest.raises(subprocess.TimeoutExpired):
        run_capped("tiny", timeout=10)


def test_the_warm_up_leaves_mallocs_mmap_threshold_alone() -> None:
    """Its operands are not malloc'd: freeing a large malloc'd block would raise glibc's mmap threshold, and Caffe's
    blobs of 1-4 MiB would come from the heap instead of mappings of their own, unlike what the estimate models."""
    script = textwrap.dedent(
        """
        import ctypes
        import caffe
        from digits_memplugin.jobs.child.blas_warmup import warm_up
        from digits_memplugin.measure.process_memory import heap_bytes
        warm_up(caffe._caffe.__file__)
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype = ctypes.c_void_p
        libc.mallinfo2.restype = type("M", (ctypes.Structure,), {"_fields_": [
            (name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]})
        before = libc.mallinfo2().hblkhd
        block = libc.malloc(2 << 20)
        print(libc.mallinfo2().hblkhd - before)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert int(result.stdout.split()[-1]) >= 2 << 20  # the 2 MiB block is a mapping of its own
