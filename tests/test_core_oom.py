"""core.oom: every out-of-memory signature in DESIGN.md recognised from real-looking logs, with its numbers; any
other failure reported by its glog F line; only out-of-memory retried. The real CPU failures are in test_jobs_*."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys

import pytest

from digits_memplugin.core import oom

# What Caffe writes before the F line: the real noise of a training log, including misleading words.
PREAMBLE = """\
I20261202 09:26:01.100000 20235 solver.cpp:45] Initializing solver from parameters:
I20261202 09:26:01.200000 20235 net.cpp:84] Creating Layer out_of_memory_probe
I20261202 09:26:01.300000 20235 net.cpp:127] Top shape: 64 20 24 24 (737280) out of memory budget? no
W20261202 09:26:02.000000 20235 blocking_queue.cpp:50] Data layer prefetch queue empty
"""
STACK = """\
*** Check failure stack trace: ***
    @     0x7f2ab2c1e1dd  google::LogMessage::Fail()
    @     0x7f2ab2c23a4f  google::LogMessage::SendToLog()
    @     0x7f2ab3a1c3f0  caffe::SyncedMemory::mutable_gpu_data()
"""


def log_with(fatal: str) -> str:
    return PREAMBLE + fatal + "\n" + STACK


# (log text, signature, device, ambiguous, requested, free, total, device index)
SIGNATURES = [
    (
        log_with("F20261202 09:26:08.945708 20235 syncedmem.cpp:71] Check failed: error == cudaSuccess (2 vs. 0)  "
                 "out of memory"),
        "cuda_out_of_memory", "gpu", False, None, None, None, None,
    ),
    (
        # Old glog (before 0.7) writes MMDD without the year.
        log_with("F1202 09:26:08.945708 20235 common.cpp:152] Check failed: error == cudaSuccess (2 vs. 0)  "
                 "out of memory"),
        "cuda_out_of_memory", "gpu", False, None, None, None, None,
    ),
    (
        log_with("F20261202 09:26:08.945708 20235 cudnn_conv_layer.cpp:52] Check failed: status == "
                 "CUDNN_STATUS_SUCCESS (2 vs. 0)  CUDNN_STATUS_ALLOC_FAILED"),
        "cudnn_alloc_failed", "gpu", False, None, None, None, None,
    ),
    (
        log_with("F20261202 09:26:08.945708 20235 cudnn_conv_layer.cu:28] Check failed: status == "
                 "CUDNN_STATUS_SUCCESS (4 vs. 0)  CUDNN_STATUS_INTERNAL_ERROR"),
        "cudnn_internal_error", "gpu", True, None, None, None, None,
    ),
    (
        log_with("F20261202 09:26:08.945708 20235 cudnn_conv_layer.cu:43] Check failed: status == "
                 "CUDNN_STATUS_SUCCESS (8 vs. 0)  CUDNN_STATUS_EXECUTION_FAILED"),
        "cudnn_execution_failed", "gpu", True, None, None, None, None,
    ),
    (
        log_with("F20261202 09:26:08.945708 20235 gpu_memory.cpp:171] Out of memory: failed to allocate "
                 "1073741824 bytes on device 1"),
        "nvcaffe_out_of_memory", "gpu", False, 1073741824, None, None, 1,
    ),
    (
        log_with("F20261202 09:26:08.945708 20235 gpu_memory.hpp:37] Failed to allocate 536870912 bytes on device 0. "
                 "Total memory: 12788498432, Free: 318767104, dev_info[0]: total=12788498432 free=318767104"),
        "nvcaffe_failed_to_allocate", "gpu", False, 536870912, 318767104, 12788498432, 0,
    ),
    (
        log_with("F20261202 09:26:08.945708 20235 gpu_memory.cpp:120] Out of memory in safe_reserve: 402653184 > "
                 "134217728 + 104857600 on device 2"),
        "nvcaffe_safe_reserve", "gpu", False, 268435456, 104857600, None, 2,
    ),
    (
        # A real line of this pycaffe under RLIMIT_DATA (see test_jobs_runner.py for the real failure).
        log_with("F20261202 09:49:10.893952   927 syncedmem.hpp:25] Check failed: *ptr host allocation of size "
                 "11796480 failed"),
        "host_allocation_failed", "cpu", False, 11796480, None, None, None,
    ),
    (
        # A real log of this pycaffe under RLIMIT_DATA with two OpenBLAS threads (exit status 1, no F line).
        PREAMBLE + "I20261203 06:35:21.950387 11199 solver.cpp:63] Solver scaffolding done.\n"
        "OpenBLAS: malloc failed in gemm_driver\n",
        "openblas_malloc_failed", "cpu", False, None, None, None, None,
    ),
    (
        PREAMBLE + "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n",
        "cpp_bad_alloc", "cpu", False, None, None, None, None,
    ),
    (
        PREAMBLE + "Traceback (most recent call last):\n  File \"runner.py\", line 10, in <module>\n"
        "    outputs = numpy.zeros(big)\nnumpy.core._exceptions._ArrayMemoryError: Unable to allocate\nMemoryError\n",
        "python_memory_error", "cpu", False, None, None, None, None,
    ),
    (
        # CaffeMallocHost's cudaMallocHost: the device's words at syncedmem.hpp, the host's memory (seen under the
        # stand-in CUDA runtime, bench/standin/).
        log_with("F20261202 09:26:08.945708 20235 syncedmem.hpp:18] Check failed: error == cudaSuccess (2 vs. 0)  "
                 "out of memory"),
        "pinned_host_out_of_memory", "cpu", False, None, None, None, None,
    ),
]


@pytest.mark.parametrize(
    ("log", "signature", "device", "ambiguous", "requested", "free", "total", "index"),
    SIGNATURES,
    ids=[case[1] + (f"-{i}" if i == 1 else "") for i, case in enumerate(SIGNATURES)],
)
def test_each_signature_is_out_of_memory_with_its_numbers(
    log: str, signature: str, device: str, ambiguous: bool, requested: int | None, free: int | None,
    total: int | None, index: int | None,
) -> None:
    outcome = oom.classify(-signal.SIGABRT, log)
    assert outcome.status == oom.OUTCOME_OUT_OF_MEMORY and outcome.retry
    assert oom.classify(1, log).status == oom.OUTCOME_OUT_OF_MEMORY  # what the process exits with does not matter
    found = outcome.out_of_memory
    assert found is not None
    assert (found.signature, found.device, found.ambiguous) == (signature, device, ambiguous)
    assert (found.requested_bytes, found.free_bytes, found.total_bytes, found.device_index) == (
        requested, free, total, index,
    )
    assert outcome.signal == "SIGABRT" and outcome.exit_code is None
    if ambiguous:
        assert "likely" in found.message


BLAS_STACK = ("syscall", "??", "blas_memory_alloc", "cblas_sgemm", "caffe::caffe_cpu_gemm<float>")


def test_a_stall_in_a_known_allocation_retry_is_out_of_memory() -> None:
    stall = oom.Stall(seconds=600, cpu_share=1.0, system_share=0.87, frames=BLAS_STACK, data_limit=50 << 20)
    outcome = oom.classify(-signal.SIGKILL, "", stall=stall)
    assert outcome.status == oom.OUTCOME_OUT_OF_MEMORY and outcome.retry and outcome.out_of_memory is not None
    assert outcome.out_of_memory.signature == "blas_allocation_retry" and not outcome.out_of_memory.ambiguous
    assert "600 s" in outcome.message and "blas_memory_alloc" in outcome.message


def test_a_stall_without_a_stack_is_judged_from_proc() -> None:
    """Only a capped process burning CPU mostly in the kernel is a likely retry; each condition matters."""
    retry = oom.Stall(seconds=60, cpu_share=0.98, system_share=0.87, frames=None, data_limit=50 << 20)
    found = oom.stalled_out_of_memory(retry)
    assert found is not None and found.signature == "allocation_retry" and found.ambiguous
    assert "likely" in found.message and "87%" in found.message
    for other in (
        dataclasses.replace(retry, data_limit=None),  # no cap: an allocation would not fail like this
        dataclasses.replace(retry, system_share=0.05),  # computing, not calling the kernel
        dataclasses.replace(retry, cpu_share=0.01),  # idle
        dataclasses.replace(retry, frames=("PyEval_EvalFrameDefault",)),  # a stack that is no retry
    ):
        assert oom.stalled_out_of_memory(other) is None
        outcome = oom.classify(-signal.SIGKILL, "", stall=other)
        assert outcome.status == oom.OUTCOME_FAILED and not outcome.retry
        assert outcome.message.startswith("made no progress for 60 s") and "watchdog" in outcome.message


def test_a_stall_message_says_what_the_process_was_doing() -> None:
    busy = oom.Stall(seconds=30, cpu_share=1.0, system_share=0.0, frames=("spin", "main"))
    assert "using 100% of a CPU" in oom.stall_message(busy) and "spin <- main" in oom.stall_message(busy)
    idle = oom.Stall(seconds=30, cpu_share=0.0, system_share=0.0, state="S")
    assert "nearly idle (state S)" in oom.stall_message(idle)
    assert "could not be read" in oom.stall_message(oom.Stall(seconds=30))


def test_a_stall_we_cancelled_is_cancelled() -> None:
    stall = oom.Stall(seconds=60, cpu_share=1.0, system_share=0.9, frames=BLAS_STACK, data_limit=1 << 20)
    assert oom.classify(-signal.SIGKILL, "", cancelled=True, stall=stall).status == oom.OUTCOME_CANCELLED


def test_exit_status_134_reads_as_sigabrt() -> None:
    """A shell in between reports SIGABRT as 134 (DIGITS showed the same death as "error code -6")."""
    outcome = oom.classify(134, SIGNATURES[0][0])
    assert outcome.status == oom.OUTCOME_OUT_OF_MEMORY
    assert outcome.signal == "SIGABRT"


def test_the_runner_memory_error_record_is_out_of_memory() -> None:
    outcome = oom.classify(3, PREAMBLE, runner_error={"type": "MemoryError", "message": "std::bad_alloc"})
    assert outcome.status == oom.OUTCOME_OUT_OF_MEMORY
    assert outcome.out_of_memory is not None and outcome.out_of_memory.signature == "python_memory_error"


def test_a_sigkill_we_did_not_send_is_likely_the_oom_killer() -> None:
    outcome = oom.classify(-signal.SIGKILL, PREAMBLE)
    assert outcome.status == oom.OUTCOME_OUT_OF_MEMORY
    assert outcome.out_of_memory is not None
    assert outcome.out_of_memory.ambiguous and "likely" in outcome.out_of_memory.message
    assert outcome.signal == "SIGKILL"


def test_our_cancel_is_cancelled_whatever_the_signal() -> None:
    for code in (-signal.SIGTERM, -signal.SIGKILL):
        outcome = oom.classify(code, PREAMBLE, cancelled=True)
        assert outcome.status == oom.OUTCOME_CANCELLED and not outcome.retry


def test_success_needs_exit_zero_and_the_runner_saying_it_finished() -> None:
    assert oom.classify(0, PREAMBLE, finished=True).status == oom.OUTCOME_SUCCESS
    early = oom.classify(0, PREAMBLE, finished=False)
    assert early.status == oom.OUTCOME_FAILED and "before training finished" in early.message


OTHER_FAILURE = (
    PREAMBLE
    + "F20261202 09:26:08.945708 20235 sgd_solvers.hpp:95] Check failed: "
    "history_[param_id]->shape() == net_params[param_id]->shape()\n" + STACK
)


def test_another_failure_is_reported_by_its_f_line_and_not_retried() -> None:
    outcome = oom.classify(-signal.SIGABRT, OTHER_FAILURE)
    assert outcome.status == oom.OUTCOME_FAILED and not outcome.retry
    assert outcome.out_of_memory is None
    assert outcome.fatal_line is not None and outcome.fatal_line.startswith("F20261202 09:26:08.945708 20235")
    assert outcome.message == (
        "Check failed: history_[param_id]->shape() == net_params[param_id]->shape() (sgd_solvers.hpp:95)"
    )


def test_words_in_info_lines_and_layer_names_are_not_failures() -> None:
    """PREAMBLE says "out_of_memory" and "out of memory" in INFO lines: no signature may match them."""
    assert oom.find_out_of_memory(oom.failure_lines(PREAMBLE)) is None
    outcome = oom.classify(-signal.SIGSEGV, PREAMBLE)
    assert outcome.status == oom.OUTCOME_FAILED
    assert outcome.message == "the training process was killed by SIGSEGV"


def test_an_unknown_exit_without_f_line_says_only_what_is_known() -> None:
    outcome = oom.classify(7, PREAMBLE)
    assert (outcome.status, outcome.exit_code, outcome.message) == (
        oom.OUTCOME_FAILED, 7, "the training process exited with status 7",
    )


def test_glog_stack_frames_are_not_examined() -> None:
    frames = "*** Check failure stack trace: ***\n    @     0x1  caffe::std::bad_alloc_handler()\n"
    assert oom.failure_lines(frames) == []


def test_outcomes_serialise_to_json_shapes() -> None:
    document = oom.classify(-signal.SIGABRT, SIGNATURES[6][0]).to_dict()
    assert document["status"] == "out_of_memory"
    assert document["out_of_memory"]["free_bytes"] == 318767104
    assert set(document) == {"status", "message", "out_of_memory", "exit_code", "signal", "fatal_line", "divergence"}


def test_the_core_imports_no_server_modules() -> None:
    """core.oom, core.planning.fallback and core.schedule load without Flask, gevent, pynvml, sqlite3 or subprocess."""
    code = (
        "import sys\n"
        "import digits_memplugin.core.oom, digits_memplugin.core.planning.fallback, digits_memplugin.core.schedule\n"
        "bad = {'flask', 'gevent', 'pynvml', 'sqlite3', 'subprocess'} & set(sys.modules)\n"
        "print(sorted(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
