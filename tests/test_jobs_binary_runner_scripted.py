"""jobs.child.binary_runner with a scripted `caffe` (tests/scripted_caffe.py) standing in for the builds this machine cannot
have: NVcaffe 0.17 and BVLC Caffe on a GPU. The stand-in trains nothing: it prints recorded log lines of those builds
(tests/caffe_logs/) and ends as they end, so what is tested is the real runner, parser, classifier and fallback on
those lines. Everything BVLC on the CPU is tested with the real binary (test_jobs_binary_runner.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scripted_caffe import caffe_root
from test_jobs_fixtures import LENET_DATA, MIB, SHORT_SOLVER, ManagerFactory, lenet_request

from digits_memplugin.core import oom
from digits_memplugin.core.schedule import LearningRate
from digits_memplugin.jobs.backends.attempt_process import AttemptProcess
from digits_memplugin.jobs.child.attempt_spec import AttemptDevice, AttemptSpec
from digits_memplugin.jobs.child.caffe_build import BINARY, NVCAFFE, find_caffe
from digits_memplugin.jobs.child.caffe_log import TrainingLog
from digits_memplugin.jobs.definition.request import parse_job_request

pytest_plugins = ["test_jobs_fixtures"]

LOGS = Path(__file__).with_name("caffe_logs")
BVLC_LOG, NVCAFFE_LOG = LOGS / "bvlc-lenet-gpu.log", LOGS / "nvcaffe-lenet-gpu.log"
STACK = """\
*** Check failure stack trace: ***
    @     0x7f2ab2c1e1dd  google::LogMessage::Fail()
    @     0x7f2ab2c23a4f  google::LogMessage::SendToLog()
    @     0x7f2ab3a1c3f0  caffe::SyncedMemory::mutable_gpu_data()
"""
# The failure lines: each as its Caffe writes it (glog F line: the CHECK or LOG(FATAL) of syncedmem.cpp,
# cudnn_conv_layer.cpp, NVcaffe's gpu_memory.hpp/.cpp), the numbers those the classifier must pull out.
FAILURES = [
    ("bvlc", "F1203 10:00:01.600000  4242 syncedmem.cpp:71] Check failed: error == cudaSuccess (2 vs. 0)  out of memory",
     "cuda_out_of_memory", {}),
    ("bvlc", ("F1203 10:00:01.600000  4242 cudnn_conv_layer.cpp:52] Check failed: status == CUDNN_STATUS_SUCCESS (2 vs. 0)"
     "  CUDNN_STATUS_ALLOC_FAILED"), "cudnn_alloc_failed", {}),
    ("bvlc", ("F1203 10:00:01.600000  4242 cudnn_conv_layer.cu:28] Check failed: status == CUDNN_STATUS_SUCCESS (4 vs. 0)"
     "  CUDNN_STATUS_INTERNAL_ERROR"), "cudnn_internal_error", {"ambiguous": True}),
    ("nvcaffe", ("F1203 10:00:01.600000  4242 gpu_memory.hpp:40] Failed to allocate 536870912 bytes on device 0. "
     "Total memory: 25447170048, Free: 318767104, dev_info[0]: total=25447170048 free=318767104"),
     "nvcaffe_failed_to_allocate", {"requested_bytes": 536870912, "free_bytes": 318767104, "total_bytes": 25447170048}),
    ("nvcaffe", ("F1203 10:00:01.600000  4242 gpu_memory.cpp:151] Out of memory in safe_reserve: 402653184 > 134217728 "
     "+ 104857600 on device 0"), "nvcaffe_safe_reserve", {"requested_bytes": 268435456, "free_bytes": 104857600}),
    ("nvcaffe", ("F1203 10:00:01.600000  4242 gpu_memory.hpp:110] Out of memory: failed to allocate 1073741824 bytes on "
     "device 0"), "nvcaffe_out_of_memory", {"requested_bytes": 1073741824, "device_index": 0}),
    ("nvcaffe", ("F1203 10:00:01.600000  4242 cudnn_conv_layer.cpp:311] Check failed: status == CUDNN_STATUS_SUCCESS "
     "(4 vs. 0)  CUDNN_STATUS_INTERNAL_ERROR"), "cudnn_internal_error", {"ambiguous": True}),
    ("nvcaffe", ("F1203 10:00:01.600000  4242 cudnn_conv_layer.cpp:311] Check failed: status == CUDNN_STATUS_SUCCESS "
     "(2 vs. 0)  CUDNN_STATUS_ALLOC_FAILED"), "cudnn_alloc_failed", {}),
]
VERSIONS = {"bvlc": "1.0.0", "nvcaffe": "0.17.4"}


def records_of(log: Path, schedule: LearningRate | None = None) -> list[dict[str, Any]]:
    parser = TrainingLog(rate=schedule.rate if schedule else None)
    events = []
    for line in log.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            events += parser.feed(line)
    return events + parser.close(exited_cleanly=True)


def head(log: Path) -> str:
    """A recorded log up to its first update: what came before the failure."""
    lines = log.read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[: next(i for i, line in enumerate(lines) if "Train net output" in line) + 1]) + "\n"


def spec_for(folder: Path, binary: Path, *, device: AttemptDevice) -> str:
    (folder / "attempts" / "1").mkdir(parents=True)
    (folder / "snapshots").mkdir()
    schedule = LearningRate(policy="inv", base_lr=0.01, gamma=0.0001, power=0.75)
    spec = AttemptSpec(
        job_id="scripted", attempt=1, solver="attempts/1/solver.prototxt", log="attempts/1/caffe.log",
        progress="attempts/1/progress.jsonl", device=device, batch_size=64, iter_size=1, resume=None, memory_cap=None,
        max_iter=2, test_interval=500, test_iter=(2,), test_initialization=True, snapshot=2, snapshot_after_train=True,
        snapshot_prefix="snapshots/lenet", snapshot_format="BINARYPROTO", schedule=schedule.to_dict(),
        runner="binary", caffe=str(binary), write_paths=("snapshots", "attempts/1"),
    )
    spec.write(folder / "attempts" / "1" / "attempt.json")
    return "attempts/1/attempt.json"


def run_scripted(tmp_path: Path, flavour: str, log: Path, end: int | str, **extra: Any) -> tuple[Any, list[Any]]:
    root = caffe_root(tmp_path / "root", version=VERSIONS[flavour], cuda=True, log=log, end=end, **extra)
    job = tmp_path / "job"
    records: list[dict[str, Any]] = []
    gpu = AttemptDevice("gpu", "GPU-aaaaaaaa-1111-2222-3333-444444444444", 0)
    spec_file = spec_for(job, root / "build" / "tools" / "caffe", device=gpu)
    process = AttemptProcess(job, spec_file, "attempts/1/caffe.log", on_record=records.append,
                             environment={"CUDA_VISIBLE_DEVICES": "0"}, stall_seconds=120)
    process.start()
    return process.wait(), records


def test_scripted_nvcaffe_progress_lines_parse_to_the_same_records_as_bvlcs() -> None:
    """The same training as NVcaffe 0.17 and BVLC log it (recorded lines): the same records, value for value."""
    bvlc, nvcaffe = records_of(BVLC_LOG), records_of(NVCAFFE_LOG)
    assert [event["event"] for event in bvlc] == [
        "constructed", "test", "iteration", "iteration", "snapshot", "finished",
    ]
    assert nvcaffe == bvlc
    updates = [event for event in bvlc if event["event"] == "iteration"]
    assert updates == [
        {"event": "iteration", "iteration": 1, "lr": 0.01, "outputs": {"loss": 2.30359}, "loss": 2.30359},
        {"event": "iteration", "iteration": 2, "lr": 0.00999925, "outputs": {"loss": 2.27711}, "loss": 2.27711},
    ]
    assert bvlc[1] == {"event": "test", "iteration": 0, "net": 0, "outputs": {"accuracy": 0.085, "loss": 2.31064},
                       "loss": 2.31064}
    assert bvlc[4] == {"event": "snapshot", "iteration": 2, "model": "snapshots/lenet_iter_2.caffemodel",
                       "state": "snapshots/lenet_iter_2.solverstate"}


@pytest.mark.parametrize(("line", "same"), [
    ("I1203 10:00:01.450000  4242 solver.cpp:347] [0.0] Iteration 0 (0.22 s), loss = 2.30359",
     "I1203 10:00:01.450000  4242 solver.cpp:347] Iteration 0 (0.22 s), loss = 2.30359"),
    ("I1203 10:00:01.450000  4242 solver.cpp:368] [MultiGPU] [0]     Train net output #0: loss = nan (* 1 = -nan loss)",
     "I1203 10:00:01.450000  4242 solver.cpp:368]     Train net output #0: loss = nan (* 1 = -nan loss)"),
])
def test_a_device_before_an_nvcaffe_message_changes_nothing(line: str, same: str) -> None:
    from digits_memplugin.jobs.child.caffe_log import message_of

    assert message_of(line) == message_of(same)


def test_nan_and_inf_in_the_log_become_float_values_for_the_reporter() -> None:
    parser = TrainingLog()
    for line in [
        "I1203 10:00:01.450000  4242 solver.cpp:239] Iteration 0 (0 iter/s, 0.2s/1 iters), loss = -nan",
        "I1203 10:00:01.450000  4242 solver.cpp:258]     Train net output #0: loss = -nan (* 1 = -nan loss)",
        "I1203 10:00:01.450000  4242 solver.cpp:258]     Train net output #1: score = inf",
        "I1203 10:00:01.450000  4242 sgd_solver.cpp:112] Iteration 0, lr = 0.01",
    ]:
        assert parser.feed(line) == []
    (update,) = parser.close(exited_cleanly=True)
    assert update["loss"] != update["loss"] and update["outputs"]["loss"] != update["outputs"]["loss"]  # NaN
    assert update["outputs"]["score"] == float("inf") and update["lr"] == 0.01


def test_the_forward_pass_solve_displays_after_training_is_no_update() -> None:
    """BVLC's Solve displays "Iteration N, loss = X" after the last update (no outputs, no rate): not a record."""
    events = records_of(BVLC_LOG)
    assert [event["iteration"] for event in events if event["event"] == "iteration"] == [1, 2]
    assert events[-1] == {"event": "finished", "iteration": 2}


def test_a_snapshot_is_reported_only_once_its_state_file_is_written() -> None:
    """Caffe logs "Snapshotting solver state to P" before writing P: a caffe that dies then leaves no snapshot."""
    parser = TrainingLog()
    lines = [*head(BVLC_LOG).splitlines(), "I1203 10:00:01.450000  4242 sgd_solver.cpp:112] Iteration 0, lr = 0.01", "I1203 10:00:01.500000  4242 solver.cpp:468] Snapshotting to binary proto file snapshots/lenet_iter_1.caffemodel", "I1203 10:00:01.510000  4242 sgd_solver.cpp:280] Snapshotting solver state to binary proto file snapshots/lenet_iter_1.solverstate"]
    events = [event for line in lines if not line.startswith("#") for event in parser.feed(line)]
    events += parser.close(exited_cleanly=False)
    assert [event["event"] for event in events] == ["constructed", "test", "iteration"]


@pytest.mark.slow
@pytest.mark.parametrize(("flavour", "line", "signature", "numbers"), FAILURES,
                         ids=[f"scripted-{flavour}-{signature}" for flavour, _, signature, _ in FAILURES])
def test_recorded_gpu_failures_through_the_binary_runner_and_a_scripted_caffe_end_as_out_of_memory(
    tmp_path: Path, flavour: str, line: str, signature: str, numbers: dict[str, Any]
) -> None:
    """Each GPU out-of-memory line, as BVLC or NVcaffe writes it, from a scripted caffe that then aborts as glog does:
    the attempt ends out of memory with the signature and its numbers, after the records of what came before."""
    log = tmp_path / "failing.log"
    source = BVLC_LOG if flavour == "bvlc" else NVCAFFE_LOG
    log.write_text(head(source) + line + "\n" + STACK, encoding="utf-8")
    result, records = run_scripted(tmp_path, flavour, log, end="abort")
    assert result.outcome.status == oom.OUTCOME_OUT_OF_MEMORY, result.outcome
    found = result.outcome.out_of_memory
    assert found is not None and found.signature == signature and found.device == "gpu"
    for name, value in numbers.items():
        assert getattr(found, name) == value, (name, found)
    assert result.outcome.signal == "SIGABRT"  # the runner ends as caffe ended: the manager sees what pycaffe shows
    events = [record["event"] for record in records]
    assert events[:3] == ["started", "constructed", "test"]
    started = records[0]
    assert started["pid"] != started["runner_pid"] and started["caffe"].endswith("build/tools/caffe")


@pytest.mark.slow
def test_an_out_of_memory_line_then_silence_is_ended_by_the_runner_at_once(tmp_path: Path) -> None:
    """A scripted caffe that prints glog's F line for a failed allocation and then hangs (instead of aborting) is
    killed by the runner within its grace, not left to the watchdog, and the attempt is out of memory."""
    log = tmp_path / "failing.log"
    log.write_text(head(NVCAFFE_LOG) + FAILURES[3][1] + "\n", encoding="utf-8")
    result, records = run_scripted(tmp_path, "nvcaffe", log, end="hang")
    assert result.outcome.status == oom.OUTCOME_OUT_OF_MEMORY
    assert result.outcome.out_of_memory is not None
    assert result.outcome.out_of_memory.signature == "nvcaffe_failed_to_allocate"
    assert records[-1]["event"] == "error" and records[-1]["type"] == "OutOfMemory"
    assert result.returncode == 3


@pytest.mark.slow
def test_a_scripted_nvcaffe_log_through_the_binary_runner_ends_in_success_with_its_records(tmp_path: Path) -> None:
    result, records = run_scripted(tmp_path, "nvcaffe", NVCAFFE_LOG, end=0)
    assert result.outcome.status == oom.OUTCOME_SUCCESS and result.finished and result.last_iteration == 2
    assert [record["event"] for record in records] == [
        "started", "constructed", "test", "iteration", "iteration", "snapshot", "finished",
    ]
    assert (tmp_path / "job" / "snapshots" / "lenet_iter_2.solverstate").is_file()
    log = (tmp_path / "job" / "attempts" / "1" / "caffe.log").read_text(encoding="utf-8")
    assert "Top memory (TRAIN) required for data" in log  # the whole output is kept, as it came
    progress = (tmp_path / "job" / "attempts" / "1" / "progress.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["event"] for line in progress] == [record["event"] for record in records]


# --- NVcaffe jobs, accepted when NVcaffe trains -------------------------------------------------------------------

def nvcaffe_lenet() -> str:
    """LeNet with one field only NVcaffe's schema has (a net-level default storage type): an NVcaffe net."""
    from test_jobs_fixtures import LENET

    return 'default_forward_type: FLOAT\ndefault_backward_type: FLOAT\n' + LENET


@pytest.mark.slow
def test_an_nvcaffe_job_is_accepted_and_trains_when_a_scripted_nvcaffe_root_trains(
    tmp_path: Path, make_manager: ManagerFactory
) -> None:
    """With the Caffe root set to a scripted NVcaffe 0.17 (stand-in: it prints recorded lines), a job for an NVcaffe
    net is accepted, trains through the binary runner and ends done with the records of its log."""
    root = caffe_root(tmp_path / "nvcaffe", version="0.17.4", cuda=True, log=NVCAFFE_LOG)
    caffe = find_caffe(root)
    assert caffe.flavour == NVCAFFE and caffe.runner == BINARY and caffe.cuda
    manager = make_manager(caffe=caffe)
    request, errors = parse_job_request(
        {"net": nvcaffe_lenet(), "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2},
        default_attempts=5,
    )
    assert request is not None, errors
    job = manager.wait(manager.submit(request).id, timeout=120)
    assert job.status == "done", job.message
    (attempt,) = manager.attempts(job.id)
    solver = (manager.folder(job.id) / "attempts" / "1" / "solver.prototxt").read_text()
    assert "display: 1" in solver and "test_interval: 500" in solver  # caffe's own testing and display, on
    assert "default_forward_type: FLOAT" in (manager.folder(job.id) / "attempts" / "1" / "train.prototxt").read_text()
    assert job.snapshot is not None and job.snapshot["iteration"] == 2
    assert attempt.status == "success" and attempt.end_iteration == 2


def test_an_nvcaffe_job_is_refused_without_an_nvcaffe_root_naming_the_caffe_and_the_setting(
    make_manager: ManagerFactory,
) -> None:
    from digits_memplugin.jobs.errors import JobValidationError

    manager = make_manager()
    request, errors = parse_job_request(
        {"net": nvcaffe_lenet(), "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 2},
        default_attempts=5,
    )
    assert request is not None, errors
    with pytest.raises(JobValidationError) as refused:
        manager.submit(request)
    message = json.dumps(refused.value.errors)
    assert "this server trains with BVLC Caffe 1.0.0 (the bundled pycaffe)" in message
    assert "this net needs NVcaffe" in message and "MEMPLUGIN_CAFFE_ROOT" in message
    jobs = manager.config.data_dir / "jobs"
    assert not [path for path in jobs.iterdir() if not path.name.startswith(".")]  # nothing of it is left


def test_the_memory_cap_is_not_applied_to_a_caffe_that_cannot_take_it(tmp_path: Path) -> None:
    """A capped CPU attempt with a caffe that does not load the capped-start library (the scripted stand-in is a
    Python script: it has no BLAS to warm up) does not train uncapped: it ends with an error that says so."""
    root = caffe_root(tmp_path / "root", version="1.0.0", cuda=False, log=BVLC_LOG)
    job = tmp_path / "job"
    spec_file = spec_for(job, root / "build" / "tools" / "caffe", device=AttemptDevice("cpu"))
    spec = AttemptSpec.read(job / spec_file)
    import dataclasses

    dataclasses.replace(spec, memory_cap=64 * MIB).write(job / spec_file)
    records: list[dict[str, Any]] = []
    process = AttemptProcess(job, spec_file, "attempts/1/caffe.log", on_record=records.append, stall_seconds=60)
    process.start()
    result = process.wait()
    assert result.outcome.status == oom.OUTCOME_FAILED
    assert "memory cap cannot be applied" in result.outcome.message
    assert [record["event"] for record in records] == ["error"]


__all__ = ["lenet_request"]


@pytest.mark.slow
def test_caffe_dies_with_the_child_that_runs_it(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG through the chain: the child killed alone (not its group), the caffe it runs dies too."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    from test_jobs_fixtures import pid_alive, wait_for

    root = caffe_root(tmp_path / "root", version="1.0.0", cuda=True, log=BVLC_LOG, end="hang")
    job = tmp_path / "job"
    spec_file = spec_for(job, root / "build" / "tools" / "caffe",
                         device=AttemptDevice("gpu", "GPU-aaaaaaaa-1111-2222-3333-444444444444", 0))
    child = subprocess.Popen([sys.executable, "-m", "digits_memplugin.jobs.child.runner", spec_file], cwd=job,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout is not None
        started = json.loads(child.stdout.readline())
        assert started["event"] == "started" and started["runner_pid"] == child.pid
        caffe = started["pid"]
        log = job / "attempts" / "1" / "caffe.log"
        # Once it has printed everything it sleeps: no write of its own can end it.
        wait_for(lambda: "Optimization Done." in log.read_text() and
                 Path(f"/proc/{caffe}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S",
                 timeout=30, what="the scripted caffe to sleep")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        wait_for(lambda: not pid_alive(caffe), timeout=10, what="caffe to die with the child")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()
