"""jobs.definition (loading, confiner, recheck, attempt_files): nothing a job reads is outside the dataset folders,
nothing it writes is outside its folder, and the generated prototxts carry the attempt's batch, iter_size and test plan."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from google.protobuf import text_format
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER

from digits_memplugin.core.errors import NetError
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.prototxt import parse_net, parse_solver
from digits_memplugin.estimate.pycaffe_shapes import pycaffe_oracle
from digits_memplugin.jobs.definition import recheck
from digits_memplugin.jobs.definition.attempt_files import set_batch, write_attempt
from digits_memplugin.jobs.definition.definition import JobDefinition
from digits_memplugin.jobs.definition.job_folder import check_job_folder
from digits_memplugin.jobs.definition.loading import load_definition
from digits_memplugin.networks import standard_network

pytest_plugins = ["test_jobs_fixtures"]  # the datasets fixture

HDF5_NET = """
name: "h5"
layer { name: "data" type: "HDF5Data" top: "data" top: "label" include { phase: TRAIN }
  hdf5_data_param { source: "train_h5.txt" batch_size: 10 } }
layer { name: "data" type: "HDF5Data" top: "data" top: "label" include { phase: TEST }
  hdf5_data_param { source: "test_h5.txt" batch_size: 5 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
HDF5_SOLVER = 'test_iter: 3 test_interval: 10 base_lr: 0.01 lr_policy: "fixed" max_iter: 20'


def load(folder: Path, roots: list[Path], net: str = LENET, solver: str = SHORT_SOLVER, **kwargs: Any) -> JobDefinition:
    folder.mkdir(exist_ok=True)
    return load_definition(net, solver, folder=folder, roots=roots, **kwargs)


def error_of(folder: Path, roots: list[Path], net: str, **kwargs: Any) -> NetError:
    with pytest.raises(NetError) as raised:
        load(folder, roots, net, **kwargs)
    return raised.value


def test_sources_resolve_inside_the_roots_and_phases_take_their_data(tmp_path: Path, datasets: Path) -> None:
    definition = load(tmp_path / "job", [datasets], data=LENET_DATA)
    train, test = definition.training.train.param.layer[0], definition.training.train.param.layer[1]
    assert train.data_param.source == str(datasets / "mnist_train_lmdb")
    assert test.data_param.source == str(datasets / "mnist_test_lmdb")
    assert definition.net_batch == 64 and definition.test_batch == 100
    assert {spec.shape for spec in definition.data_shapes.values()} == {(1, 28, 28)}  # read from the LMDBs
    assert definition.threads == 4  # a prefetch thread and a reader per Data layer, train and test


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("/etc", "outside the dataset folders"),
        ("../../etc", "outside the dataset folders"),
        ("no_such_lmdb", "does not exist"),
    ],
)
def test_sources_outside_the_roots_or_missing_are_refused(
    tmp_path: Path, datasets: Path, source: str, expected: str
) -> None:
    error = error_of(tmp_path / "job", [datasets], LENET, data={"train": source, "test": "mnist_test_lmdb"})
    assert expected in error.message
    assert (error.layer, error.field) == ("mnist", "data_param.source")


def test_a_symlink_out_of_the_roots_is_refused(tmp_path: Path, datasets: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink(outside, datasets / "link_lmdb")
    error = error_of(tmp_path / "job", [datasets], LENET, data={"train": "link_lmdb", "test": "mnist_test_lmdb"})
    assert "outside the dataset folders" in error.message


def test_the_same_reader_in_both_nets_is_refused_before_it_deadlocks(tmp_path: Path, datasets: Path) -> None:
    error = error_of(tmp_path / "job", [datasets], LENET, data={"train": "mnist_train_lmdb", "test": "mnist_train_lmdb"})
    assert "deadlocks" in error.message


@pytest.mark.parametrize(
    ("extra", "field", "expected"),
    [
        ('layer { name: "py" type: "Python" bottom: "ip2" top: "py" python_param { module: "os" layer: "x" } }',
         "type", "Python layers"),
        ('layer { name: "w" type: "WindowData" top: "w" window_data_param { source: "x" } }', "type", "WindowData"),
        (('layer { name: "ig" type: "InfogainLoss" bottom: "ip2" bottom: "label" top: "ig" '
          'infogain_loss_param { source: "/etc/passwd" } }'), "infogain_loss_param.source", "outside"),
    ],
)
def test_layers_that_run_code_or_read_elsewhere_are_refused(
    tmp_path: Path, datasets: Path, extra: str, field: str, expected: str
) -> None:
    error = error_of(tmp_path / "job", [datasets], LENET + extra, data=LENET_DATA)
    assert error.field == field and expected in error.message


WRITER = 'layer { name: "out" type: "HDF5Output" bottom: "ip2" bottom: "label" hdf5_output_param { file_name: "%s" } }'


def test_outputs_are_kept_in_the_job_folders_outputs(tmp_path: Path, datasets: Path) -> None:
    folder = tmp_path / "job"
    # HDF5Output has no estimator rule: pycaffe gives its shapes, as in the server (MEMPLUGIN_PYCAFFE_FALLBACK).
    definition = load(folder, [datasets], LENET + WRITER % "preds.h5", data=LENET_DATA, oracle=pycaffe_oracle)
    out = next(layer for layer in definition.training.train.param.layer if layer.type == "HDF5Output")
    assert out.hdf5_output_param.file_name == str((folder / "outputs" / "preds.h5").resolve())
    # outputs/../.. is the job folder's parent; ../data/lmdb/ is where each attempt links its datasets' data files
    # (issue 23: it did not exist yet when the path was resolved, so the old check let it through); snapshots/ is
    # the job's too, but not a layer's to write.
    for escaping in ("../../escape.h5", "/tmp/escape.h5", "../data/lmdb/0-mnist_train_lmdb/data.mdb",
                     "x/../../snapshots/lenet_iter_2.caffemodel", ".", str(folder / "net.prototxt")):
        error = error_of(folder, [datasets], LENET + WRITER % escaping, data=LENET_DATA)
        assert "outside the job's outputs folder" in error.message, (escaping, error.message)
        assert (error.layer, error.field) == ("out", "hdf5_output_param.file_name")
    error = error_of(folder, [datasets], LENET + WRITER % "a\\000b.h5", data=LENET_DATA)
    assert "NUL byte" in error.message and error.field == "hdf5_output_param.file_name"


@pytest.mark.parametrize("planted", ["outputs/sub", "outputs/sub/preds.h5", "outputs"])
def test_outputs_are_checked_again_at_each_attempt(tmp_path: Path, datasets: Path, planted: str) -> None:
    """A link planted on an output's way while the job waited (by someone with access to the data folder) is
    refused when the attempt's files are written, naming it, and nothing is written through it."""
    folder = tmp_path / "job"
    definition = load(folder, [datasets], LENET + WRITER % "sub/preds.h5", data=LENET_DATA, oracle=pycaffe_oracle)
    write_attempt(definition, folder, "attempts/1", batch_size=8, iter_size=1, test_batch=None, gpu=None)
    target = tmp_path / "elsewhere"
    target.mkdir()
    path = folder / planted
    if path.is_dir():
        path.rename(path.with_name(path.name + ".old"))
    path.symlink_to(target if planted != "outputs/sub/preds.h5" else target / "preds.h5")
    with pytest.raises(NetError) as raised:
        write_attempt(definition, folder, "attempts/2", batch_size=8, iter_size=1, test_batch=None, gpu=None)
    assert f"{planted} in the job's folder is a link" in raised.value.message, raised.value.message
    assert (raised.value.layer, raised.value.field) == ("out", "hdf5_output_param.file_name")
    assert not (folder / "attempts" / "2" / "solver.prototxt").exists()
    assert list(target.iterdir()) == []


def test_hdf5_list_files_are_rewritten_with_each_file_checked(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "h5").mkdir(parents=True)
    for name, rows in (("train", 40), ("test", 15)):
        with h5py.File(root / "h5" / f"{name}.h5", "w") as h5:
            h5["data"] = np.zeros((rows, 4), dtype=np.float32)
            h5["label"] = np.zeros((rows,), dtype=np.float32)
        (root / f"{name}_h5.txt").write_text(f"h5/{name}.h5\n")  # relative to the list file's folder
    folder = tmp_path / "job"
    definition = load(folder, [root], HDF5_NET, HDF5_SOLVER)
    source = definition.training.train.param.layer[0].hdf5_data_param.source
    assert Path(source).parent == folder / "data"
    assert Path(source).read_text() == f"{(root / 'h5' / 'train.h5').resolve()}\n"
    (root / "test_h5.txt").write_text("../../../etc/passwd\n")
    error = error_of(tmp_path / "job2", [root], HDF5_NET, solver=HDF5_SOLVER)
    assert "outside the dataset folders" in error.message


def test_data_overrides_must_name_something(tmp_path: Path, datasets: Path) -> None:
    error = error_of(tmp_path / "job", [datasets], LENET, data={**LENET_DATA, "nosuchlayer": "x"})
    assert error.field == "data" and "nosuchlayer" in error.message


def test_no_dataset_roots_means_no_data(tmp_path: Path) -> None:
    error = error_of(tmp_path / "job", [], LENET, data=LENET_DATA)
    assert "no dataset folders are configured" in error.message


def test_the_attempt_files_carry_the_plan(tmp_path: Path, datasets: Path) -> None:
    folder = tmp_path / "job"
    definition = load(folder, [datasets], data=LENET_DATA, max_iter=30)
    files = write_attempt(definition, folder, "attempts/2", batch_size=21, iter_size=3, test_batch=50, gpu=None)
    solver = parse_solver((folder / files.solver).read_text())
    assert (solver.iter_size, solver.max_iter, list(solver.test_iter)) == (3, 30, [4])  # 2 x 100 items / 50
    assert solver.train_net == "attempts/2/train.prototxt" and list(solver.test_net) == ["attempts/2/test0.prototxt"]
    assert solver.snapshot_prefix == "snapshots/lenet" and solver.snapshot == 0
    assert solver.solver_mode == 0  # CPU
    train = parse_net((folder / "attempts/2/train.prototxt").read_text())
    test = parse_net((folder / "attempts/2/test0.prototxt").read_text())
    batches = {(layer.include[0].phase, layer.data_param.batch_size) for layer in train.layer[:2]}
    assert batches == {(0, 21), (1, 100)}  # only the TRAIN layer changed in the train net
    assert {(layer.include[0].phase, layer.data_param.batch_size) for layer in test.layer[:2]} == {(0, 64), (1, 50)}


def test_set_batch_follows_the_state(tmp_path: Path) -> None:
    net = parse_net(HDF5_NET)
    from digits_memplugin.core.net import net_state

    set_batch(net, net_state(net, "TEST"), "net.prototxt", 7)
    assert [layer.hdf5_data_param.batch_size for layer in net.layer[:2]] == [10, 7]
    assert text_format.MessageToString(net)


def test_digits_stage_rules_take_the_phases_data(tmp_path: Path, datasets: Path) -> None:
    """DIGITS' standard networks pick their data layers by stage ("train", "val"), not by phase: the request's
    "train" and "test" sources go to them as they do to phase rules."""
    solver = SHORT_SOLVER + 'train_state { stage: "train" }\ntest_state { stage: "val" }\n'  # as DIGITS writes it
    definition = load(tmp_path / "job", [datasets], standard_network("lenet").text, solver, data=LENET_DATA, classes=10)
    sources = {
        tuple(rule.stage[0] for rule in layer.include): layer.data_param.source
        for layer in definition.training.train.param.layer
        if layer.type == "Data"
    }
    assert sources == {("train",): str(datasets / "mnist_train_lmdb"), ("val",): str(datasets / "mnist_test_lmdb")}
    # Unset, the backend is LevelDB, which this Caffe lacks: the request's sources are LMDB, as DIGITS sets them.
    data_layers = [layer for layer in definition.training.train.param.layer if layer.type == "Data"]
    assert {layer.data_param.backend for layer in data_layers} == {caffe_pb2.DataParameter.LMDB}
    assert definition.data_shapes["train-data/data"].shape == (1, 28, 28)


# --- the data checked again when each attempt starts (issue 18, items 4-6) -------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Real data outside the roots, for links to point at."""
    from test_jobs_fixtures import write_lmdb

    folder = tmp_path / "outside"
    folder.mkdir()
    write_lmdb(folder / "secret_lmdb")
    (folder / "secret.binaryproto").write_bytes(MEAN.SerializeToString())
    write_h5(folder / "secret.h5", 40)
    return folder


MEAN = caffe_pb2.BlobProto(num=1, channels=1, height=28, width=28, data=[0.5] * 28 * 28)


def write_h5(path: Path, rows: int) -> None:
    with h5py.File(path, "w") as h5:
        h5["data"] = np.zeros((rows, 4), dtype=np.float32)
        h5["label"] = np.zeros((rows,), dtype=np.float32)


def lenet_reading(source: str, mean: str = "") -> str:
    """LeNet whose TRAIN Data layer reads `source` (and subtracts `mean`)."""
    transform = f'transform_param {{ scale: 0.00390625 mean_file: "{mean}" }}' if mean else ""
    train = (
        'layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TRAIN }\n'
        f'  {transform} data_param {{ source: "{source}" batch_size: 64 backend: LMDB }} }}\n'
    )
    start = LENET.index("layer {")
    end = LENET.index("\n}\n", start) + 3
    return LENET[:start] + train + LENET[end:]


def link_out(path: Path, target: Path) -> None:
    """`path` (a file or a folder) replaced by a link to `target`."""
    if path.is_dir() and not path.is_symlink():
        path.rename(path.with_name(path.name + ".old"))
    else:
        path.unlink()
    path.symlink_to(target)


def replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


SWAPS: dict[str, tuple[str, str, Any, str, str]] = {
    # case: (net kind, path swapped (under the root), how, what the message names, what it says)
    "lmdb-folder-linked-out": ("lmdb", "swap_lmdb", lambda p, o: link_out(p, o / "secret_lmdb"), "swap_lmdb",
                               "changed since the job was submitted"),
    "lmdb-data-file-linked-out": ("lmdb", "swap_lmdb/data.mdb", lambda p, o: link_out(p, o / "secret_lmdb" / "data.mdb"),
                                  "swap_lmdb/data.mdb", "outside the dataset folders"),
    "lmdb-data-file-a-fifo": ("lmdb", "swap_lmdb/data.mdb", lambda p, o: replace_with_fifo(p), "swap_lmdb/data.mdb",
                              "FIFO"),
    "lmdb-folder-removed": ("lmdb", "swap_lmdb", lambda p, o: p.rename(p.with_name("gone")), "swap_lmdb",
                            "no longer exists"),
    "mean-file-linked-out": ("mean", "mean.binaryproto", lambda p, o: link_out(p, o / "secret.binaryproto"),
                             "mean.binaryproto", "changed since the job was submitted"),
    "hdf5-file-linked-out": ("hdf5", "h5/train.h5", lambda p, o: link_out(p, o / "secret.h5"), "h5/train.h5",
                             "changed since the job was submitted"),
    "hdf5-folder-linked-out": ("hdf5", "h5", link_out, "h5/train.h5",
                               "changed since the job was submitted"),
}


def swappable(kind: str, folder: Path, root: Path) -> JobDefinition:
    """A definition reading data of `kind` under `root`, loaded (checked) as a submission is."""
    import shutil

    if kind == "hdf5":
        (root / "h5").mkdir()
        for name, rows in (("train", 40), ("test", 15)):
            write_h5(root / "h5" / f"{name}.h5", rows)
            (root / f"{name}_h5.txt").write_text(f"h5/{name}.h5\n")
        return load(folder, [root], HDF5_NET, HDF5_SOLVER)
    shutil.copytree(root / "mnist_train_lmdb", root / "swap_lmdb")
    (root / "mean.binaryproto").write_bytes(MEAN.SerializeToString())
    net = lenet_reading("swap_lmdb", "mean.binaryproto" if kind == "mean" else "")
    return load(folder, [root], net, data={"test": "mnist_test_lmdb"})


@pytest.mark.parametrize("case", sorted(SWAPS))
def test_each_attempt_checks_the_data_again_and_names_what_changed(
    tmp_path: Path, datasets: Path, outside: Path, case: str
) -> None:
    """A queued job's data swapped after the submission's checks (a folder or file replaced by a link out of the
    roots, a FIFO, a removal) is refused when the attempt's files are written, naming the path, not its target."""
    kind, swapped, swap, named, says = SWAPS[case]
    folder = tmp_path / "job"
    definition = swappable(kind, folder, datasets)
    write_attempt(definition, folder, "attempts/1", batch_size=8, iter_size=1, test_batch=None, gpu=None)  # as checked
    swap(datasets / swapped, outside)
    with pytest.raises(NetError) as raised:
        write_attempt(definition, folder, "attempts/2", batch_size=8, iter_size=1, test_batch=None, gpu=None)
    error = raised.value
    assert named in error.message and says in error.message, error
    assert str(outside) not in str(error)
    assert error.layer in ("mnist", "data") and error.field is not None
    assert not (folder / "attempts" / "2" / "solver.prototxt").exists()  # nothing for a child to start on


def test_the_child_is_handed_the_real_paths_and_its_own_lmdb_lock(tmp_path: Path, datasets: Path) -> None:
    """Caffe opens an LMDB folder's lock.mdb for writing even read-only: the attempt's nets name a folder of the
    job's own whose data.mdb links to the dataset's real data file; every other path is the checked real path."""
    (datasets / "nested").mkdir()
    (datasets / "nested" / "real_lmdb").symlink_to(datasets / "mnist_train_lmdb")  # a link inside the root
    (datasets / "mean.binaryproto").write_bytes(MEAN.SerializeToString())
    (datasets / "mean_link.binaryproto").symlink_to(datasets / "mean.binaryproto")
    folder = tmp_path / "job"
    net = lenet_reading("nested/real_lmdb", "mean_link.binaryproto")
    definition = load(folder, [datasets], net, data={"test": "mnist_test_lmdb"})
    files = write_attempt(definition, folder, "attempts/1", batch_size=8, iter_size=1, test_batch=None, gpu=None)
    train = parse_net((folder / files.nets[0]).read_text())
    data = {layer.include[0].phase: layer for layer in train.layer if layer.type == "Data"}
    for phase, dataset in ((0, "mnist_train_lmdb"), (1, "mnist_test_lmdb")):
        handed = Path(data[phase].data_param.source)
        assert handed.parent == (folder / "data" / "lmdb").resolve(), handed
        assert sorted(os.listdir(handed)) == ["data.mdb"]  # the child's lock.mdb will be made here
        assert os.readlink(handed / "data.mdb") == str((datasets / dataset / "data.mdb").resolve())
    assert data[0].transform_param.mean_file == str((datasets / "mean.binaryproto").resolve())
    # What the child's confinement grants: the data files it was checked to read, and its write folders.
    assert sorted(files.reads) == sorted([
        str((datasets / "mean.binaryproto").resolve()), str((datasets / "mnist_train_lmdb" / "data.mdb").resolve()),
        str((datasets / "mnist_test_lmdb" / "data.mdb").resolve()),
    ])
    assert files.writes == ("outputs", "snapshots", "data/lmdb", "attempts/1")
    # The same dataset in the test net's file is handed the same folder (Caffe keys its readers by source).
    test = parse_net((folder / files.nets[1]).read_text())
    assert {layer.data_param.source for layer in test.layer if layer.type == "Data"} == {
        layer.data_param.source for layer in train.layer if layer.type == "Data"
    }


def test_a_hard_link_in_a_written_folder_is_refused(tmp_path: Path, datasets: Path) -> None:
    """A hard link is the dataset's own file under a name in the job's folder: Caffe would truncate and rewrite it
    as a snapshot or an output (and the child's confinement allows that name). Refused before the attempt."""
    folder = tmp_path / "jobs" / "job"
    folder.parent.mkdir()
    definition = load(folder, [datasets], LENET + WRITER % "preds.h5", data=LENET_DATA, oracle=pycaffe_oracle)
    write_attempt(definition, folder, "attempts/1", batch_size=8, iter_size=1, test_batch=None, gpu=None)
    victim = datasets / "mnist_test_lmdb" / "data.mdb"
    os.link(victim, folder / "outputs" / "preds.h5")
    with pytest.raises(NetError, match=r"outputs/preds.h5 in the job's folder has other names \(a hard link\)"):
        write_attempt(definition, folder, "attempts/2", batch_size=8, iter_size=1, test_batch=None, gpu=None)
    (folder / "outputs" / "preds.h5").unlink()
    os.link(victim, folder / "snapshots" / "lenet_iter_2.caffemodel")
    with pytest.raises(NetError, match=r"snapshots/lenet_iter_2.caffemodel in the job's folder has other names"):
        check_job_folder(folder.parent, folder)
    assert victim.stat().st_nlink == 2  # left alone: only refused


def test_past_the_rule_limit_the_child_reads_the_roots_holding_its_files(
    tmp_path: Path, datasets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Landlock rule per file pins each inode in the kernel: past MAX_READ_RULES files (a list of a million
    images), the child is granted the dataset roots that hold them instead."""
    folder = tmp_path / "job"
    definition = load(folder, [datasets], data=LENET_DATA)
    assert len(write_attempt(definition, folder, "attempts/1", batch_size=8, iter_size=1, test_batch=None,
                             gpu=None).reads) == 2
    monkeypatch.setattr(recheck, "MAX_READ_RULES", 1)
    files = write_attempt(definition, folder, "attempts/2", batch_size=8, iter_size=1, test_batch=None, gpu=None)
    assert files.reads == (str(datasets.resolve()),)
