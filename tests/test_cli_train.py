"""`digits-memplugin train`: one job in the foreground with the job manager, progress printed, the out-of-memory
fallback for real, Ctrl-C cancelling, and clear errors."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import LENET, SHORT_SOLVER, wait_for

from digits_memplugin.cli.train import Printer
from digits_memplugin.jobs.manager import STORE_FILE

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
                 "--json", "--divergence", "--test-net", "--tester-device"):
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


def test_caffe_root_trains_through_the_named_caffes_binary(files: list[str]) -> None:
    """`--caffe-root` names the Caffe that trains: the bundled Caffe's binary build (no pycaffe) trains the job with
    `caffe train`, out-of-memory fallback included, and says so first."""
    from digits_memplugin.jobs.child.caffe_build import BUNDLED_BINARY_ROOT

    result = train(*files, "--batch", "512", "--memory-cap", "64MiB", "--start", "wanted", "--max-iter", "3",
                   "--caffe-root", str(BUNDLED_BINARY_ROOT))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (f"training with BVLC Caffe 1.0.0 (at {BUNDLED_BINARY_ROOT}, MEMPLUGIN_CAFFE_ROOT): CPU only, "
                        "binary runner")
    assert any(line.startswith("attempt 1 on cpu: batch 512 x iter_size 1 = 512: out_of_memory: host memory ran out")
               for line in lines)
    assert lines[-1] == ("done: training finished at iteration 3; it ran out of memory at batch 512, and was retried "
                         "at batch 171 x iter_size 3 (effective batch 513)")


def test_a_caffe_root_that_cannot_train_is_one_line_without_traceback(files: list[str], tmp_path: Path) -> None:
    result = train(*files, "--caffe-root", str(tmp_path / "nowhere"))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"MEMPLUGIN_CAFFE_ROOT names {tmp_path / 'nowhere'}, which is not a folder" in result.stderr


# --- a new user's first hour: the bundled LeNet, the sample digits, and what `train` says ----------------------


@pytest.fixture
def bundled(tmp_path: Path) -> Path:
    """The folder a new user works in: the bundled LeNet and its solver as `networks --write` gives them, and the
    sample digits as `sample-dataset` writes them."""
    for command in (["networks", "--write", str(tmp_path), "lenet"], ["sample-dataset", str(tmp_path / "datasets")]):
        written = subprocess.run([SCRIPT, *command], capture_output=True, text=True, timeout=120, check=False)
        assert written.returncode == 0, written.stderr
    return tmp_path


def in_folder(folder: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`train` run from `folder` with relative paths, as a user types it."""
    return subprocess.run(
        [SCRIPT, "train", *args, "--data-dir", "var", "--device", "cpu"], capture_output=True, text=True,
        timeout=timeout, check=False, cwd=folder,
    )


def test_a_net_without_data_is_pointed_at_data_in_the_users_file(bundled: Path) -> None:
    nothing = in_folder(bundled, "lenet.prototxt", "lenet_solver.prototxt", "--classes", "10")
    assert nothing.returncode == 2 and "Traceback" not in nothing.stderr
    assert nothing.stderr.strip() == (
        "digits-memplugin train: error: lenet.prototxt:10: layer 'train-data' (Data): data_param.source: no dataset "
        "given: give it with --data train=PATH (this layer's phase) or --data train-data=PATH, PATH being an LMDB "
        f"folder in {bundled}"
    )
    half = in_folder(bundled, "lenet.prototxt", "lenet_solver.prototxt", "--classes", "10",
                     "--data", "train=datasets/digits_train_lmdb")
    assert half.returncode == 2
    assert ("lenet.prototxt:18: layer 'val-data' (Data): data_param.source: no dataset given: give it with --data "
            "test=PATH") in half.stderr
    assert not (bundled / "var" / "jobs").exists() or not any((bundled / "var" / "jobs").iterdir())


def test_errors_name_the_users_files_and_the_flags(bundled: Path, tmp_path: Path) -> None:
    data = ["--data", "train=datasets/digits_train_lmdb", "--data", "test=datasets/digits_val_lmdb"]
    classes = in_folder(bundled, "lenet.prototxt", "lenet_solver.prototxt", *data)
    assert classes.returncode == 2
    assert classes.stderr.startswith(
        "digits-memplugin train: error: lenet.prototxt:100: layer 'scores' (InnerProduct): "
        "inner_product_param.num_output: must be positive, got 0;"
    )
    assert classes.stderr.rstrip().endswith("give it with --classes N")

    (bundled / "my_solver.prototxt").write_text("base_lr: 0.01\nlr_policy: \"step\"\nmax_iter: 3\n")
    solver = in_folder(bundled, "lenet.prototxt", "my_solver.prototxt", "--classes", "10", *data)
    assert solver.returncode == 2
    assert "error: my_solver.prototxt: stepsize: the step policy needs a positive stepsize" in solver.stderr
    assert "solver.prototxt" not in solver.stderr.replace("my_solver.prototxt", "")

    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    (outside / "lmdb").mkdir(parents=True)
    absolute = in_folder(bundled, "lenet.prototxt", "lenet_solver.prototxt", "--classes", "10",
                         "--data", f"train={outside / 'lmdb'}", "--data", "test=datasets/digits_val_lmdb")
    assert absolute.returncode == 2
    assert absolute.stderr.strip() == (
        f"digits-memplugin train: error: --data: layer 'train-data' (Data): data_param.source: {outside / 'lmdb'} is "
        f"outside the dataset folders this server may read (the dataset folders here: {bundled}; --dataset-root DIR "
        "adds one)"
    )
    empty = bundled / "empty.prototxt"
    empty.write_text("\n")
    assert in_folder(bundled, "empty.prototxt", "lenet_solver.prototxt").stderr.strip() == (
        "digits-memplugin train: error: empty.prototxt is empty"
    )


def test_data_shape_gives_a_shape_the_dataset_does_not_tell(bundled: Path) -> None:
    # An ImageData layer reads a list of image files: the shape of its items is the first image's, which the
    # estimate does not open; `train` asks for it as `estimate` does, with --data-shape.
    (bundled / "datasets" / "images.txt").write_text("a.png 0\nb.png 1\n")
    for name in ("a.png", "b.png"):
        (bundled / "datasets" / name).write_bytes(b"\x89PNG\r\n\x1a\n")
    net = (bundled / "lenet.prototxt").read_text().replace(
        'type: "Data"\n  top: "data"\n  top: "label"\n  include { stage: "train" }\n  data_param { batch_size: 64 }',
        'type: "ImageData"\n  top: "data"\n  top: "label"\n  include { stage: "train" }\n'
        '  image_data_param { batch_size: 64 is_color: false }',
    )
    assert "ImageData" in net
    (bundled / "images.prototxt").write_text(net)
    data = ["--data", "train=datasets/images.txt", "--data", "test=datasets/digits_val_lmdb", "--classes", "10"]
    unknown = in_folder(bundled, "images.prototxt", "lenet_solver.prototxt", *data)
    assert unknown.returncode == 2
    assert ("images.prototxt:10: layer 'train-data' (ImageData): top: the shape of top 'data' comes from the first "
            "image of the list") in unknown.stderr
    assert unknown.stderr.rstrip().endswith("; on the command line: --data-shape data=3,256,256")
    bad = in_folder(bundled, "images.prototxt", "lenet_solver.prototxt", *data, "--data-shape", "data=0,28")
    assert bad.returncode == 2 and "--data-shape data=0,28: '0,28' is not a shape" in bad.stderr
    given = in_folder(bundled, "images.prototxt", "lenet_solver.prototxt", *data, "--data-shape", "data=1,28,28",
                      "--max-iter", "2", "--max-attempts", "1")
    # The job is made and planned with that shape, the one its row keeps (it then fails: this Caffe is built
    # without OpenCV, so without ImageData, and the files are no images anyway).
    assert "top: the shape of top" not in given.stderr, given.stderr
    job = next(line for line in given.stdout.splitlines() if line.startswith("job "))
    folder = Path(job.split(" in ", 1)[1])
    with contextlib.closing(sqlite3.connect(bundled / "var" / STORE_FILE, timeout=10)) as database:
        (spec,) = database.execute("select spec from jobs").fetchone()
    assert folder.is_dir() and json.loads(spec)["data_shapes"] == {"data": [1, 28, 28]}


def test_training_prints_regular_steps_of_n_with_speed_time_left_and_absolute_snapshots(bundled: Path) -> None:
    solver = (bundled / "lenet_solver.prototxt").read_text()
    for old, new in (("display: 50", "display: 10"), ("test_interval: 250", "test_interval: 20"),
                     ("test_iter: 12", "test_iter: 2"), ("snapshot: 500", "snapshot: 20")):
        assert old in solver
        solver = solver.replace(old, new)
    (bundled / "quick_solver.prototxt").write_text(solver)
    result = in_folder(bundled, "lenet.prototxt", "quick_solver.prototxt", "--classes", "10", "--max-iter", "40",
                       "--data", "train=datasets/digits_train_lmdb", "--data", "test=datasets/digits_val_lmdb")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    iterations = [line for line in lines if line.startswith("  iteration ")]
    assert [int(line.split()[1]) for line in iterations] == [1, 10, 20, 30, 40], result.stdout
    assert all(" of 40: loss " in line for line in iterations)
    # The speed from the second line on, the time left until the last.
    for line in iterations[1:]:
        assert re.search(r", lr 0\.0\d+, \d[\d.]* it/s", line), line
    assert all(re.search(r"it/s, \d+ s left$", line) for line in iterations[1:-1]), iterations
    assert "left" not in iterations[-1]
    # Losses and test outputs to four significant digits, not sixteen.
    numbers = re.findall(r"(?:loss|accuracy) =? ?(\d[\d.e-]*)", "\n".join(lines))
    assert numbers and all(len(re.sub(r"[^\d]", "", n.split("e")[0]).lstrip("0")) <= 4 for n in numbers), numbers
    tests = [line for line in lines if line.startswith("  test net 0 at iteration ")]
    assert [line.split()[5].rstrip(":") for line in tests] == ["0", "20", "40"]
    snapshots = [line for line in lines if line.startswith("  snapshot at iteration ")]
    assert len(snapshots) == 2
    for line in snapshots:
        model, state = re.fullmatch(r"  snapshot at iteration \d+: (\S+) \(solver state (\S+)\)", line).groups()
        assert Path(model).is_absolute() and Path(model).is_file() and model.endswith(".caffemodel")
        assert Path(state).is_absolute() and Path(state).is_file() and state.endswith(".solverstate")
        assert Path(model).is_relative_to(bundled / "var" / "jobs")
    assert lines[-1] == "done: training finished at iteration 40"


def test_epochs_and_batch_auto_train_as_long_as_the_sample_set_and_the_planned_batch_say(bundled: Path) -> None:
    """Issue 26, 2: `--epochs` counts the length as DIGITS does (ceil(1438 / 71) = 21 iterations an epoch at the
    batch "auto" plans, a twentieth of the set), validating once an epoch on one pass over the 359 validation
    images; the plan's cap is printed."""
    result = in_folder(bundled, "lenet.prototxt", "lenet_solver.prototxt", "--classes", "10", "--batch", "auto",
                       "--epochs", "2", "--data", "train=datasets/digits_train_lmdb",
                       "--data", "test=datasets/digits_val_lmdb")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert ("  batch auto: capped at 71 so that an epoch of the 1438 training items has 21 iterations (at most 1/20 "
            "of the training set)") in lines, result.stdout
    assert any(line.startswith("attempt 1 on cpu: batch 71 x iter_size 1 = 71") for line in lines)
    iterations = [line for line in lines if line.startswith("  iteration ")]
    assert iterations and all(" of 42: loss " in line for line in iterations), iterations
    tests = [line.split()[5].rstrip(":") for line in lines if line.startswith("  test net 0 at iteration ")]
    assert tests == ["0", "21", "42"]
    assert lines[-1] == "done: training finished at iteration 42"
    both = in_folder(bundled, "lenet.prototxt", "lenet_solver.prototxt", "--classes", "10", "--epochs", "2",
                     "--max-iter", "5", "--data", "train=datasets/digits_train_lmdb")
    assert both.returncode == 2 and both.stderr.strip().endswith(
        "--epochs: give the length once: epochs or max_iter, not both"), both.stderr


# --- the test nets apart (issue 28) ------------------------------------------------------------------------------


def job_folder(stdout: str) -> Path:
    return Path(next(line for line in stdout.splitlines() if line.startswith("job ")).split(" in ", 1)[1])


def progress_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_test_net_apart_prints_the_testers_results_as_the_runners_once_each(files: list[str], tmp_path: Path) -> None:
    """`--test-net apart` on the CPU: the trainer stops at each test interval for a tester child, whose results are
    printed as the runner's are (one line per net and interval, none lost, none twice), with where the tester runs
    as the attempt starts and what it did as it ends."""
    (tmp_path / "solver.prototxt").write_text(SHORT_SOLVER.replace("test_interval: 500", "test_interval: 2"))
    result = train(*files, "--max-iter", "6", "--test-net", "apart", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout[:result.stdout.index("{\n")].splitlines()
    started = lines.index(next(line for line in lines if line.startswith("attempt 1 on cpu: batch 64 x iter_size 1")))
    assert re.fullmatch(r"  test nets apart: a tester on the trainer's device, estimated \d[\d.]* [KM]iB; training "
                        r"stops at each test interval while it tests that interval's snapshot", lines[started + 1])
    tests = [line for line in lines if line.startswith("  test net ")]
    folder = job_folder(result.stdout)
    tested = [r for r in progress_records(folder / "attempts" / "1" / "tester" / "progress.jsonl") if r["event"] == "test"]
    assert [r["iteration"] for r in tested] == [0, 2, 4, 6]
    # Each of the tester's results, printed once, in the runner's words and to its four significant digits.
    assert tests == [
        f"  test net {r['net']} at iteration {r['iteration']}: "
        + ", ".join(f"{name} = {value:.4g}" for name, value in r["outputs"].items())
        for r in tested
    ]
    trainer = progress_records(folder / "attempts" / "1" / "progress.jsonl")
    assert "test" not in [r["event"] for r in trainer]  # the trainer tested nothing itself
    paused = [line for line in lines if line.startswith("  paused at iteration ")]
    assert paused == [f"  paused at iteration {i} for the tester; training resumes once it has tested" for i in (0, 2, 4)]
    ended = lines.index(next(line for line in lines if line.startswith("attempt 1 on cpu: batch 64 x iter_size 1 = 64: "
                                                                       "success: training finished")))
    assert lines[ended + 1].startswith("  tester on the trainer's device: tested 4 snapshots (iterations 0, 2, 4, 6), "
                                       "training stopped 3 times for it, each stop cost "), lines[ended + 1]
    document = json.loads(result.stdout[result.stdout.index("{\n"):])
    (attempt,) = document["attempts"]
    assert attempt["test_net"] == "apart" and attempt["tester"]["tested"] == [0, 2, 4, 6]
    assert attempt["tester"]["same_device"] and attempt["tester"]["pauses"] == 3


BIG_TEST_NET = LENET.replace("batch_size: 100", "batch_size: 1000")
"""LeNet whose test net takes 1000 items a batch: beside the train net under a 128 MiB cap it holds the train batch
of 512 back (tests/test_jobs_apart.py)."""


def test_auto_keeps_the_test_nets_apart_until_stopping_costs_too_much_and_says_so(
    files: list[str], tmp_path: Path
) -> None:
    """`--test-net auto` (the default) under a cap where the test net shared holds the batch back: the first attempt
    keeps them apart (the plan's note says why, and that the stop's cost is measured on the first interval), ends
    "replanned" once that cost is measured far over 5% (said plainly), and the next goes on from its snapshot with
    them shared, its note saying why; the tests of both are printed."""
    (tmp_path / "net.prototxt").write_text(BIG_TEST_NET)
    (tmp_path / "solver.prototxt").write_text(
        "random_seed: 7\n" + SHORT_SOLVER.replace("test_iter: 2", "test_iter: 1").replace("test_interval: 500", "test_interval: 4")
        .replace("snapshot: 2", "snapshot: 4")
    )
    result = train(*files, "--batch", "512", "--memory-cap", "128MiB", "--max-iter", "8", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("attempt 1 on cpu: batch 512 x iter_size 1 = 512,")))
    assert lines[first + 1].startswith("  test nets apart: a tester on the trainer's device, estimated ")
    assert re.fullmatch(r"  test nets apart \(apart trains 512 x iter_size 1, shared \d+ x iter_size \d+\); the cost of "
                        r"stopping and resuming at each test interval is not measured yet: it will be on the first "
                        r"interval", lines[first + 2]), lines[first + 2]
    replanned = [line for line in lines if line.startswith("attempt 1 on cpu: batch 512 x iter_size 1 = 512: ")]
    assert len(replanned) == 1 and re.match(
        r"attempt 1 on cpu: batch 512 x iter_size 1 = 512: replanned at iteration \d+: stopping and resuming for the "
        r"tester costs [\d.]+ s per test interval, [\d.]+% of its [\d.]+ s of training \(not under 5%\); the next "
        r"attempt goes on from its snapshot \(peak ", replanned[0]), replanned
    second = lines.index(next(line for line in lines if line.startswith("attempt 2 on cpu: batch ")))
    assert "resumed from " in lines[second] and " x iter_size 1 " not in lines[second]
    assert lines[second + 1].startswith("  test nets shared: stopping and resuming costs "), lines[second + 1]
    assert "not under 5%" in lines[second + 1]
    tests = [int(line.split()[5].rstrip(":")) for line in lines if line.startswith("  test net 0 at iteration ")]
    assert tests[:2] == [0, 4] and tests[-1] == 8, tests  # attempt 1's tester's, then attempt 2's own
    assert lines[-1] == "done: training finished at iteration 8"


def test_tester_flags_refused_name_the_flag_and_create_nothing(files: list[str], tmp_path: Path) -> None:
    from digits_memplugin.jobs.child.caffe_build import BUNDLED_BINARY_ROOT

    shared = train(*files, "--test-net", "shared", "--tester-device", "cpu")
    assert shared.returncode == 2 and "Traceback" not in shared.stderr
    assert shared.stderr.strip() == (
        "digits-memplugin train: error: --tester-device: names where a tester runs: give --test-net 'apart' or "
        "'auto' with it (the test nets are 'shared')"
    )
    nowhere = train(*files, "--test-net", "apart", "--tester-device", "7")
    assert nowhere.returncode == 2 and "error: --tester-device: no GPU has index 7" in nowhere.stderr
    binary = train(*files, "--test-net", "apart", "--caffe-root", str(BUNDLED_BINARY_ROOT))
    assert binary.returncode == 2 and "Traceback" not in binary.stderr
    assert "error: --test-net: cannot be 'apart' here: the Caffe that trains" in binary.stderr
    assert "has no pycaffe here" in binary.stderr
    word = train(*files, "--test-net", "beside")
    assert word.returncode == 2 and "--test-net: invalid choice: 'beside'" in word.stderr
    jobs = tmp_path / "data" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())


def test_the_printer_reads_attempts_of_every_kind() -> None:
    """Attempt rows stored before issue 28 (no test_net, no tester), a replanned end, a tester that failed, and the
    plan's notes once per attempt, each as one plain line."""
    printer = Printer()
    old = {"number": 1, "device": "cpu", "batch_size": 8, "iter_size": 2, "effective_batch": 16, "status": "running",
           "resumed_from": None, "estimated_bytes": 1 << 20, "limit_bytes": 1 << 30}
    assert printer.line("job_attempt", old) == "attempt 1 on cpu: batch 8 x iter_size 2 = 16, estimated 1.0 MiB of 1.0 GiB"
    ended = {**old, "status": "replanned", "message": "replanned at iteration 4: it costs too much", "peak_bytes": None,
             "test_net": "apart", "tester": {"device": "GPU-1", "same_device": False, "estimated_bytes": 2 << 20,
                                             "tested": [], "pauses": 0, "peak_bytes": None, "stop_cost": None,
                                             "failed": "tester: out of memory"}}
    assert printer.line("job_attempt", ended) == (
        "attempt 1 on cpu: batch 8 x iter_size 2 = 16: replanned at iteration 4: it costs too much (peak n/a)\n"
        "  tester on GPU-1: tested no snapshot, peak n/a"
    )
    beside = {**old, "test_net": "apart", "tester": {"device": "GPU-1", "same_device": False, "estimated_bytes": 3 << 20}}
    assert printer.line("job_attempt", beside).endswith(
        "\n  test nets apart: a tester on GPU-1, estimated 3.0 MiB, testing each snapshot while training goes on")
    message = "attempt 2: batch 71 fits; auto capped at 71 so that ...; test nets shared: apart does not pay (a; b)"
    job = {"id": "j", "status": "running", "message": message}
    assert printer.line("job", job) == ("  batch auto: capped at 71 so that ...\n"
                                        "  test nets shared: apart does not pay (a; b)")
    assert printer.line("job", job) is None  # once per attempt
    assert printer.line("job_progress", {"event": "test_due", "iteration": 4, "model": "m", "state": "s"}) is None
