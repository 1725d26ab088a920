"""`digits-memplugin sample-dataset`: real handwritten digits (scikit-learn's bundled set) written as train and
validation LMDBs that the New model page lists and that LeNet really trains on, on the CPU."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_jobs_fixtures import LENET, SHORT_SOLVER

from digits_memplugin.cli.sample_dataset import TRAIN_NAME, VAL_NAME
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.estimate import dataset_scan

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]

SCRIPT = Path(sys.executable).parent / "digits-memplugin"


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_it_writes_real_digits_that_lenet_trains_on(tmp_path: Path) -> None:
    folder = tmp_path / "datasets"
    written = run("sample-dataset", str(folder))
    assert written.returncode == 0, written.stderr
    assert f"wrote {folder / TRAIN_NAME} (1438 images of 1x28x28) and {folder / VAL_NAME} (359 images)" in written.stdout
    found = {d.name: d for d in dataset_scan.scan([folder]).datasets}
    assert {name: (d.shape, d.entries) for name, d in found.items()} == {
        TRAIN_NAME: ((1, 28, 28), 1438), VAL_NAME: ((1, 28, 28), 359),
    }
    # Real digits, not noise: every label, ink in the 20 x 20 box MNIST uses and a blank border around it.
    import lmdb

    env = lmdb.open(str(folder / TRAIN_NAME), readonly=True, lock=False)
    labels, images = [], []
    with env.begin() as txn:
        for _, value in txn.cursor():
            datum = caffe_pb2.Datum.FromString(value)
            labels.append(datum.label)
            images.append(np.frombuffer(datum.data, dtype=np.uint8).reshape(28, 28))
    env.close()
    assert sorted(set(labels)) == list(range(10))
    stack = np.stack(images)
    assert stack[:, :4, :].max() == 0 and stack[:, 24:, :].max() == 0 and stack.max() == 255
    assert 0.1 < (stack[:, 4:24, 4:24] > 64).mean() < 0.6

    (tmp_path / "net.prototxt").write_text(LENET)
    (tmp_path / "solver.prototxt").write_text(SHORT_SOLVER)
    trained = run(
        "train", str(tmp_path / "net.prototxt"), str(tmp_path / "solver.prototxt"), "--data-dir", str(tmp_path / "d"),
        "--dataset-root", str(folder), "--data", f"train={TRAIN_NAME}", "--data", f"test={VAL_NAME}",
        "--device", "cpu", "--max-iter", "30",
    )
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert trained.stdout.splitlines()[-1] == "done: training finished at iteration 30"
    losses = [float(line.split("loss ")[1].split(",")[0]) for line in trained.stdout.splitlines()
              if line.startswith("  iteration ") and "loss " in line]
    assert losses and losses[-1] < losses[0], trained.stdout


def test_the_command_line_it_prints_trains_the_bundled_lenet(tmp_path: Path) -> None:
    """What a new user without the web page does: run the two commands `sample-dataset` prints, as printed."""
    written = subprocess.run([SCRIPT, "sample-dataset", "digits"], capture_output=True, text=True, timeout=300,
                             check=False, cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    (line,) = [line for line in written.stdout.splitlines() if line.startswith("on the command line: ")]
    commands = [shlex.split(part) for part in line.removeprefix("on the command line: ").split(" && ")]
    assert [command[:2] for command in commands] == [["digits-memplugin", "networks"], ["digits-memplugin", "train"]]
    for command in commands:
        extra = ["--max-iter", "20", "--device", "cpu", "--data-dir", "var"] if command[1] == "train" else []
        result = subprocess.run([SCRIPT, *command[1:], *extra], capture_output=True, text=True, timeout=300,
                                check=False, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "done: training finished at iteration 20"
    assert "  iteration 20 of 20: loss " in result.stdout


def test_it_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    (tmp_path / TRAIN_NAME).mkdir()
    refused = run("sample-dataset", str(tmp_path))
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"digits-memplugin sample-dataset: error: {tmp_path / TRAIN_NAME} exists; give --force to replace it"
    )
    assert run("sample-dataset", str(tmp_path), "--force").returncode == 0
    assert (tmp_path / TRAIN_NAME / "data.mdb").is_file()


def test_it_is_listed_in_the_help() -> None:
    overview = run("--help", timeout=60)
    assert "sample-dataset" in overview.stdout
