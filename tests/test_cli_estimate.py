"""`digits-memplugin estimate`: the table, the --json document (the API's), data shapes read from the dataset,
and clear errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest
from conftest import ZOO

from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.proto import caffe_pb2

SCRIPT = Path(sys.executable).parent / "digits-memplugin"
LENET = ZOO / "caffe_lenet" / "lenet_train_test.prototxt"
LENET_SOLVER = ZOO / "caffe_lenet" / "lenet_solver.prototxt"


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, "estimate", *args], check=False, capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_json_is_the_api_document() -> None:
    result = run(LENET, "--solver", LENET_SOLVER, "--data-shape", "data=1,28,28", "--batch", "32",
                 "--free-bytes", "64MiB", "--engine", "gpu", "--json", "--no-pycaffe")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    expected = estimate(
        EstimateRequest(
            net=LENET.read_text(), solver=LENET_SOLVER.read_text(), net_source=str(LENET),
            solver_source=str(LENET_SOLVER), batch=32, engine="gpu", free_bytes=64 * 1024**2,
            data_shapes={"data": (1, 28, 28)},
        )
    )
    assert document == json.loads(json.dumps(expected))
    assert {"total_bytes", "batch_size", "engine", "categories", "layers", "max_batch_size", "plan"} <= set(document)


def test_table_names_the_total_the_largest_layers_and_the_plan() -> None:
    result = run(LENET, "--data-shape", "data=1,28,28", "--batch", "256", "--free-bytes", "40MiB")
    assert result.returncode == 0, result.stderr
    assert "total:" in result.stdout
    assert "conv1" in result.stdout
    assert "largest batch that fits:" in result.stdout
    assert "plan: batch_size" in result.stdout and "iter_size" in result.stdout


def write_lmdb(path: Path, shape: tuple[int, int, int], records: int = 3) -> None:
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for index in range(records):
            datum = caffe_pb2.Datum(channels=shape[0], height=shape[1], width=shape[2], label=0)
            datum.data = np.zeros(shape, dtype=np.uint8).tobytes()
            txn.put(f"{index:08d}".encode(), datum.SerializeToString())
    env.close()


def test_data_shape_comes_from_the_lmdb_the_net_names(tmp_path: Path) -> None:
    write_lmdb(tmp_path / "train_lmdb", (1, 28, 28))
    write_lmdb(tmp_path / "test_lmdb", (1, 28, 28))
    net = LENET.read_text().replace("examples/mnist/mnist_train_lmdb", "train_lmdb").replace(
        "examples/mnist/mnist_test_lmdb", "test_lmdb"
    )
    (tmp_path / "net.prototxt").write_text(net)
    result = run("net.prototxt", "--json", "--no-pycaffe", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    read = json.loads(result.stdout)
    given = json.loads(run(LENET, "--json", "--no-pycaffe", "--data-shape", "data=1,28,28").stdout)
    assert read["memory_required_for_data"] == given["memory_required_for_data"]
    assert read["total_bytes"] == given["total_bytes"]
    # datasets of another shape give another estimate: the shape really is read, per phase
    write_lmdb(tmp_path / "big_train_lmdb", (1, 32, 32))
    write_lmdb(tmp_path / "big_test_lmdb", (1, 32, 32))
    big = net.replace('"train_lmdb"', '"big_train_lmdb"').replace('"test_lmdb"', '"big_test_lmdb"')
    (tmp_path / "big.prototxt").write_text(big)
    bigger = json.loads(run("big.prototxt", "--json", "--no-pycaffe", cwd=tmp_path).stdout)
    given_big = json.loads(run(LENET, "--json", "--no-pycaffe", "--data-shape", "data=1,32,32").stdout)
    assert bigger["total_bytes"] == given_big["total_bytes"] > read["total_bytes"]
    # a test set of another size than the training set cannot share its weights: Caffe would abort
    (tmp_path / "mixed.prototxt").write_text(net.replace('"train_lmdb"', '"big_train_lmdb"'))
    mixed = run("mixed.prototxt", "--no-pycaffe", cwd=tmp_path)
    assert mixed.returncode == 2 and "layer 'ip1'" in mixed.stderr and "shares the train net's weights" in mixed.stderr


def test_missing_shape_is_a_clear_error() -> None:
    result = run(LENET)
    assert result.returncode == 2
    assert "layer 'mnist' (Data)" in result.stderr
    assert "--data-shape data=" in result.stderr
    assert "Traceback" not in result.stderr


def test_solver_net_path_escaping_its_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    solver = tmp_path / "jobs" / "solver.prototxt"
    solver.write_text('net: "../../etc/passwd"\ntest_iter: 1\ntest_interval: 10\nbase_lr: 0.1\n'
                      'test_net: "../outside.prototxt"\n')
    result = run(LENET, "--solver", solver, "--data-shape", "data=1,28,28")
    assert result.returncode == 2
    assert "outside.prototxt" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreadable_file_and_bad_arguments() -> None:
    missing = run("/nonexistent/net.prototxt")
    assert missing.returncode == 2 and "cannot read /nonexistent/net.prototxt" in missing.stderr
    bad_batch = run(LENET, "--batch", "0")
    assert bad_batch.returncode == 2 and "must be positive" in bad_batch.stderr
    bad_size = run(LENET, "--free-bytes", "lots")
    assert bad_size.returncode == 2 and "is not a memory size" in bad_size.stderr
    bad_shape = run(LENET, "--data-shape", "data=1,x,28")
    assert bad_shape.returncode == 2 and "is not a shape" in bad_shape.stderr


def test_a_size_without_a_unit_below_a_mib_is_refused_with_the_unit_asked_for() -> None:
    # `--free-bytes 8` is someone meaning 8 GiB: 8 bytes fit no net, and saying "does not fit" would hide the slip.
    for text in ("8", "512", "24576", "1048575"):
        refused = run(LENET, "--data-shape", "data=1,28,28", "--free-bytes", text)
        assert refused.returncode == 2 and not refused.stdout
        assert f"argument --free-bytes: {text} has no unit: write one, e.g. {text}GiB or {text}MiB" in refused.stderr
    # A unit says what is meant, however small; a byte count from 1 MiB is taken as bytes (as the REST API's
    # integers are), the same as its size with a unit.
    tiny = run(LENET, "--data-shape", "data=1,28,28", "--free-bytes", "8B", "--json", "--no-pycaffe")
    assert tiny.returncode == 0 and json.loads(tiny.stdout)["free_bytes"] == 8
    documents = [
        json.loads(run(LENET, "--data-shape", "data=1,28,28", "--free-bytes", text, "--json", "--no-pycaffe").stdout)
        for text in ("1048576", "1MiB", str(8 << 30), "8GiB")
    ]
    assert documents[0] == documents[1] and documents[2] == documents[3]
    assert documents[0]["free_bytes"] == 1 << 20 and documents[2]["free_bytes"] == 8 << 30


def test_a_digits_network_without_classes_is_told_about_classes() -> None:
    bundled = Path(__file__).resolve().parent.parent / "digits_memplugin" / "networks" / "lenet.prototxt"
    result = run(bundled, "--data-shape", "data=1,28,28", "--no-pycaffe")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"digits-memplugin estimate: error: {bundled}:100: layer 'scores' (InnerProduct): "
        "inner_product_param.num_output: must be positive, got 0; DIGITS networks leave num_output unset for the "
        "dataset's number of classes: give it with --classes N"
    )
    assert run(bundled, "--data-shape", "data=1,28,28", "--classes", "10", "--no-pycaffe").returncode == 0


def test_broken_prototxt_reports_line_and_column(tmp_path: Path) -> None:
    net = tmp_path / "broken.prototxt"
    net.write_text('name: "x"\nlayer {\n  name: "a"\n  type: "Input"\n  top: "a"\n  input_param { shape { dim: 1 }\n')
    result = run(net)
    assert result.returncode == 2
    assert f"{net}:6:32: Expected \"}}\"" in result.stderr, result.stderr  # the end of the text: a brace is missing


def test_a_batch_past_caffes_blob_limit_is_planned_and_explained() -> None:
    # LeNet's conv1 top holds 20x24x24 = 11,520 elements an item: at most 186,413 items under INT_MAX.
    result = run(LENET, "--data-shape", "data=1,28,28", "--batch", "200000", "--free-bytes", "1TiB", "--engine", "cpu",
                 "--no-pycaffe")
    assert result.returncode == 0, result.stderr
    assert "Caffe cannot build batch 200000 in one pass: layer 'conv1'" in result.stdout
    assert "at most batch 186413 per pass, so batch 200000 is reached as 100000 x iter_size 2" in result.stdout
    assert "largest batch that fits: 186413  (Caffe's INT_MAX blob limit)" in result.stdout
    assert "plan: batch_size 100000 x iter_size 2 = 200000" in result.stdout


def test_the_table_names_the_schema_flavour() -> None:
    """An NVcaffe net (DIGITS' Caffe) is estimated and the table says so; a BVLC net says bvlc."""
    nvcaffe = run(ZOO / "nvcaffe_resnet18" / "train_val.prototxt", "--data-shape", "data=3,256,256", "--batch", "2",
                  "--no-pycaffe")
    assert nvcaffe.returncode == 0, nvcaffe.stderr
    assert nvcaffe.stdout.startswith("nvcaffe caffe, engine cpu")
    bvlc = run(LENET, "--data-shape", "data=1,28,28", "--no-pycaffe")
    assert bvlc.returncode == 0 and bvlc.stdout.startswith("bvlc caffe, engine cpu"), bvlc.stderr


DETECTNET = ZOO / "detectnet_kitti" / "detectnet_network.prototxt"
DETECTNET_SOLVER = ZOO / "detectnet_kitti" / "detectnet_solver.prototxt"


@pytest.mark.skipif(not DETECTNET.is_file(), reason="DetectNet is not in the shared zoo")
def test_detectnet_estimates_from_its_image_shape_alone() -> None:
    """`digits-memplugin estimate detectnet_network.prototxt --data-shape data=3,384,1248`, as DIGITS users paste
    it: no other shape asked for; the table names NVcaffe and says what it took the label LMDB to hold."""
    table = run(DETECTNET, "--solver", DETECTNET_SOLVER, "--data-shape", "data=3,384,1248")
    assert table.returncode == 0, table.stderr
    first = table.stdout.splitlines()[0]
    assert first.startswith("nvcaffe caffe") and "batch 10, test batch 6" in first
    assert "assumes: no shape given for 'label'" in table.stdout
    document = run(DETECTNET, "--solver", DETECTNET_SOLVER, "--data-shape", "data=3,384,1248", "--json")
    assert document.returncode == 0, document.stderr
    expected = estimate(EstimateRequest(
        net=DETECTNET.read_text(), solver=DETECTNET_SOLVER.read_text(), net_source=str(DETECTNET),
        solver_source=str(DETECTNET_SOLVER), data_shapes={"data": (3, 384, 1248)},
    ))
    assert json.loads(document.stdout)["total_bytes"] == expected["total_bytes"] > 0


def test_batch_auto_is_capped_as_a_jobs_auto_and_says_why(tmp_path: Path) -> None:
    """Issue 26, 2: the CLI's estimate plans "auto" as jobs do: the largest batch that fits, within a twentieth of
    the training set (read from the net's training LMDB here, or given) and 256."""
    (tmp_path / "examples" / "mnist").mkdir(parents=True)  # where Caffe's LeNet reads its datasets from
    write_lmdb(tmp_path / "examples" / "mnist" / "mnist_train_lmdb", (1, 28, 28), records=1438)
    write_lmdb(tmp_path / "examples" / "mnist" / "mnist_test_lmdb", (1, 28, 28))
    result = run(LENET, "--batch", "auto", "--free-bytes", "8GiB", "--json", "--no-pycaffe", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["auto_cap"]["batch_size"] == 71 and document["auto_cap"]["train_items"] == 1438
    assert (document["batch_size"], document["max_batch_size"], document["plan"]["batch_size"]) == (71, 71, 71)
    table = run(LENET, "--batch", "auto", "--free-bytes", "8GiB", "--no-pycaffe", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert ("largest batch that fits: 71  (auto: capped at 71 so that an epoch of the 1438 training items has 21 "
            "iterations (at most 1/20 of the training set))") in table.stdout
    given = run(LENET, "--data-shape", "data=1,28,28", "--batch", "auto", "--train-items", "60000",
                "--free-bytes", "8GiB", "--no-pycaffe")
    assert given.returncode == 0, given.stderr
    assert "largest batch that fits: 256  (auto: capped at 256, the largest batch of Caffe's reference models" in (
        given.stdout)


def test_test_net_places_the_test_nets_in_the_table_and_the_json() -> None:
    """Issue 28: `--test-net` plans as a job's test_net (auto by default). LeNet at batch 512 in 60 MiB trains 171 x
    3 beside its test net and 256 x 2 with it apart; the table says where the test nets are and why, and what the
    tester needs; --json is the API's document for the same request."""
    common = (LENET, "--data-shape", "data=1,28,28", "--batch", "512", "--free-bytes", "60MiB", "--no-pycaffe")
    tables = {mode: run(*common, "--test-net", mode) for mode in ("shared", "apart", "auto")}
    for mode, table in tables.items():
        assert table.returncode == 0, (mode, table.stderr)
    lines = {mode: table.stdout.splitlines() for mode, table in tables.items()}
    assert "plan: batch_size 171 x iter_size 3 = 513" in lines["shared"]
    assert "test nets shared, beside the train net as Caffe keeps them (--test-net shared)" in lines["shared"]
    assert not any(line.startswith("tester:") for line in lines["shared"])
    assert "plan: batch_size 256 x iter_size 2 = 512" in lines["apart"]
    assert "test nets apart, in a tester process of their own (--test-net apart)" in lines["apart"]
    tester = [line for line in lines["apart"] if line.startswith("tester: ")]
    assert len(tester) == 1 and " for the test nets at their own batch 100, on the same device: training stops" in (
        tester[0]), tester
    # auto, the default: apart pays here, and the plan's note says why, as the job's would.
    assert "plan: batch_size 256 x iter_size 2 = 512" in lines["auto"] and tester[0] in lines["auto"]
    assert any(line.startswith("test nets apart (apart trains 256 x iter_size 2, shared 171 x iter_size 3); the cost "
                               "of stopping and resuming") for line in lines["auto"]), lines["auto"]
    assert run(*common).stdout == tables["auto"].stdout
    roomy = run(LENET, "--data-shape", "data=1,28,28", "--batch", "512", "--free-bytes", "1GiB", "--no-pycaffe")
    assert any(line.startswith("test nets shared: apart does not pay") for line in roomy.stdout.splitlines())

    document = json.loads(run(*common, "--test-net", "apart", "--json").stdout)
    expected = estimate(EstimateRequest(net=LENET.read_text(), net_source=str(LENET), batch=512, free_bytes=60 << 20,
                                        data_shapes={"data": (1, 28, 28)}, test_net="apart"))
    assert document == json.loads(json.dumps(expected))
    assert (document["test_net"], document["test_net_note"]) == ("apart", None) and document["tester_bytes"] > 0
    bad = run(*common, "--test-net", "beside")
    assert bad.returncode == 2 and "--test-net: invalid choice: 'beside'" in bad.stderr
