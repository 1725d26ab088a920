"""`digits-memplugin train`: one job in the foreground with the job manager, progress printed, the out-of-memory
fallback for real, Ctrl-C cancelling, and clear errors."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_jobs_fixtures import LENET, SHORT_SOLVER, wait_for

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]

SCRIPT = Path(sys.executable).parent / "digits-memplugin"


@pytest.fixture
def files(tmp_path: Path, datasets: Path) -> list[str]:
    (tmp_path / "net.prototxt").write_text(LENET)
    (tmp_path / "solver.prototxt").write_text(SHORT_SOLVER)
    return [
        str(tmp_path / "net.prototxt"), str(tmp_path / "solver.prototxt"),
        "--data-dir", str(tmp_path / "data"), "--dataset-root", str(datasets),
        "--data", "train=mnist_train_lmdb", "--data", "test=mnist_test_lmdb", "--device", "cpu",
    ]


def train(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, "train", *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_help_documents_the_flags() -> None:
    result = subprocess.run([SCRIPT, "train", "--help"], capture_output=True, text=True, timeout=60, check=True)
    for flag in ("--device", "--batch", "--memory-cap", "--data-dir", "--dataset-root", "--start", "--stall-seconds",
                 "--json", "--divergence"):
        assert flag in result.stdout
    overview = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, timeout=60, check=True)
    assert "train" in overview.stdout


def test_out_of_memory_then_success_printed_as_it_goes(files: list[str]) -> None:
    result = train(*files, "--batch", "512", "--memory-cap", "64MiB", "--start", "wanted", "--max-iter", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("attempt 1 on cpu: batch 512 x iter_size 1 = 512: out_of_memory: host memory ran out")
               for line in lines)
    second = [line for line in lines if line.startswith("attempt 2 on cpu") and "success" in line]
    assert second and "iter_size 1 " not in second[0]
    assert any(line.startswith("  test net 0 at iteration 0:") for line in lines)
    assert re.fullmatch(r"done: training finished at iteration 3; it ran out of memory at batch 512, and was retried "
                        r"at batch (\d+) x iter_size (\d+) \(effective batch (\d+)\)", lines[-1]), lines[-1]


def test_json_prints_the_job_document(files: list[str]) -> None:
    result = train(*files, "--max-iter", "2", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout[result.stdout.index("{\n"):])
    assert document["status"] == "done" and document["attempts"][0]["status"] == "success"


def test_a_diverging_loss_stops_with_digits_advice_or_trains_on_with_divergence_continue(
    files: list[str], tmp_path: Path
) -> None:
    (tmp_path / "solver.prototxt").write_text(SHORT_SOLVER.replace("base_lr: 0.01", "base_lr: 50"))
    stopped = train(*files, "--max-iter", "40")
    assert stopped.returncode == 1, stopped.stderr
    lines = stopped.stdout.splitlines()
    assert any(line.startswith("  iteration ") and ": loss NaN, lr 49.9" in line for line in lines), lines
    assert any(line.startswith("  Network outputted NaN") for line in lines), lines
    assert lines[-1].startswith(
        'failed: Network outputted NaN for "loss" (Train phase). Try decreasing your learning rate. Training stopped'
    )
    assert "Traceback" not in stopped.stdout + stopped.stderr
    trained = train(*files, "--max-iter", "20", "--divergence", "continue", "--json")
    assert trained.returncode == 0, trained.stderr
    document = json.loads(trained.stdout[trained.stdout.index("{\n"):], parse_constant=lambda token: 1 / 0)
    assert document["status"] == "done" and document["divergence"] == "continue" and document["iteration"] == 20
    assert document["progress"]["train"]["loss"] == "NaN"


def test_ctrl_c_cancels_the_job(files: list[str]) -> None:
    process = subprocess.Popen(
        [SCRIPT, "train", *files, "--max-iter", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    stdout = process.stdout

    def iterating() -> bool:  # a training iteration's line (a test line names iteration 0 before any update)
        return re.match(r"\s*iteration [1-9]", stdout.readline()) is not None

    wait_for(iterating, what="training output")
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert "cancelling..." in out
    # The child snapshotted before it stopped (issue 26 point 3): the job says where, and that Resume continues.
    assert re.search(r"cancelled: cancelled at iteration \d+; a snapshot of it was saved \(Resume continues from it\)$",
                     out.rstrip()), out[-500:]


def test_errors_are_one_line_without_traceback(files: list[str], tmp_path: Path) -> None:
    missing = train(str(tmp_path / "nope.prototxt"), files[1])
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    outside = train(*files, "--data", "train=/etc")
    assert outside.returncode == 2
    assert "outside the dataset folders" in outside.stderr and "Traceback" not in outside.stderr
    for bad in ("0.5", "soon", "inf"):
        stall = train(*files, "--stall-seconds", bad)
        assert stall.returncode == 2 and "--stall-seconds" in stall.stderr and "Traceback" not in stall.stderr
    failing = train(*files, "--memory-cap", "8MiB")  # not even the test net fits
    assert failing.returncode == 1 and "does not fit even when nothing else runs" in failing.stdout
