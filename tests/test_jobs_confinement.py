"""jobs.child.confinement: a training attempt confined by the kernel (Landlock) to reading its job's folder, the dataset
files it was checked to read and the runtime's files, and to writing beneath its write folders only.

Each test confines a real child process (the confinement is for good: never the test's own) laid out as an attempt
is: a job folder whose data/lmdb/<n>/data.mdb links to a dataset's real data file, as the manager hands LMDBs to
Caffe. What the kernel allowed is the evidence: errno of each try, the files' checksums, an inotify watch. The
last tests run the real runner and pycaffe: the issue's HDF5Output onto a dataset's data.mdb (its finding 1)
with the server's own check taken away, so that the confinement is the only wall, and the runner on a kernel
without Landlock (simulated with a seccomp filter that answers ENOSYS), which trains and says it is not confined.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from test_hardening_paths import Watch
from test_jobs_fixtures import ManagerFactory, lenet_request, wait_for, write_lmdb

from digits_memplugin.confine import landlock
from digits_memplugin.jobs.child.caffe_build import BUNDLED_BINARY_ROOT, find_caffe
from digits_memplugin.jobs.child.preload import ensure_library
from digits_memplugin.jobs.definition import attempt_files, confiner
from digits_memplugin.networks import standard_network

pytest_plugins = ["test_jobs_fixtures"]

needs_landlock = pytest.mark.skipif(landlock.abi() < 1, reason=f"no Landlock here: {landlock.unavailable()}")

CHILD = r"""
import errno, json, os, subprocess, sys, threading, time
from digits_memplugin.jobs.child.confinement import ConfinementError, confine_attempt
spec = json.loads(sys.argv[1])
if spec.get("thread"):
    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()  # a second thread: what is tested
result = {}
try:
    result["confinement"] = confine_attempt(
        spec["folder"], spec["reads"], spec["writes"], executables=spec.get("executables", ())
    ).to_dict()
except ConfinementError as error:
    result["refused"] = str(error)
    print(json.dumps(result))
    sys.exit(0)

def read(path):
    with open(path, "rb") as file:
        file.read(1)

def write(path):  # an existing file, opened for writing without truncating it
    with open(path, "r+b") as file:
        file.write(b"x")

def create(path):
    with open(path, "xb") as file:
        file.write(b"x")

def truncate(path):
    open(path, "wb").close()

def run(command):
    done = subprocess.run(command, capture_output=True, timeout=30)
    if done.returncode:
        raise OSError(errno.EACCES, done.stderr.decode(errors="replace"))
    return done.stdout

actions = {"read": read, "write": write, "create": create, "truncate": truncate, "list": os.listdir,
           "mkdir": os.mkdir, "symlink": lambda path: os.symlink("/etc", path), "remove": os.unlink,
           "exec_cat": lambda path: run(["cat", path]), "exec_path": lambda path: run([path, "/dev/null"]),
           "import": __import__}
for name, action, path in spec["tries"]:
    try:
        actions[action](path)
        result[name] = "ok"
    except OSError as error:
        result[name] = errno.errorcode.get(error.errno, str(error.errno))
print(json.dumps(result))
"""

WITHOUT_LANDLOCK = r"""
import ctypes, errno, platform, runpy, struct, sys
# A kernel without Landlock: its three calls answer ENOSYS, everything else runs (linux/filter.h, seccomp.h).
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[platform.machine()]
program = [(0x20, 0, 0, 4), (0x15, 1, 0, ARCH), (0x06, 0, 0, 0x7FFF0000), (0x20, 0, 0, 0),
           (0x35, 0, 3, 444), (0x35, 2, 0, 447), (0x06, 0, 0, 0x00050000 | errno.ENOSYS), (0x06, 0, 0, 0x7FFF0000),
           (0x06, 0, 0, 0x7FFF0000)]
code = b"".join(struct.pack("HBBI", *op) for op in program)
buffer = ctypes.create_string_buffer(code, len(code))
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
prog = Prog(len(program), ctypes.addressof(buffer))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.addressof(prog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
if sys.argv[1] == "-c":  # python -c WITHOUT_LANDLOCK -c CODE ARGS...
    code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
    exec(compile(code, "<child>", "exec"), {"__name__": "__main__"})
else:  # python -c WITHOUT_LANDLOCK MODULE ARGS...
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """An attempt's folders, a dataset root beside them, and a folder outside everything."""
    root = tmp_path / "datasets"
    root.mkdir()
    write_lmdb(root / "victim_lmdb")
    for name in ("granted.h5", "other.h5"):
        with h5py.File(root / name, "w") as h5:
            h5["data"] = np.arange(8, dtype=np.float32)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    job = tmp_path / "jobs" / "20260101-000000-abcdef"
    for sub in ("outputs", "snapshots", "attempts/1", "data/lmdb/0-victim_lmdb"):
        (job / sub).mkdir(parents=True)
    (job / "data/lmdb/0-victim_lmdb/data.mdb").symlink_to(root / "victim_lmdb" / "data.mdb")
    (job / "data/list.txt").write_text(f"{root / 'granted.h5'}\n")
    return {"root": root, "outside": outside, "job": job}


WRITES = ["outputs", "snapshots", "data/lmdb", "attempts/1"]


def confined(layout: dict[str, Path], tries: list[tuple[str, str, str]], *, reads: list[str] | None = None,
             writes: list[str] | None = None, thread: bool = False, wrapper: str | None = None,
             executables: list[str] | None = None) -> dict[str, Any]:
    """Run CHILD (confined as asked, then trying each action) and return what it reported."""
    root = layout["root"]
    spec = {
        "folder": str(layout["job"]), "thread": thread, "tries": tries,
        "reads": reads if reads is not None else [str(root / "victim_lmdb" / "data.mdb"), str(root / "granted.h5")],
        "writes": writes if writes is not None else WRITES, "executables": executables or [],
    }
    command = [sys.executable, "-c", CHILD, json.dumps(spec)]
    if wrapper:
        command = [sys.executable, "-c", wrapper, "-c", CHILD, json.dumps(spec)]
    done = subprocess.run(command, cwd=layout["job"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def watch(layout: dict[str, Path]) -> Iterator[Watch]:
    watcher = Watch(layout["root"])
    yield watcher
    watcher.close()


def writes_seen(watch: Watch) -> list[str]:
    return [event for event in watch.events() if event.split()[0] in ("write", "create", "moved", "delete", "attrib")]


@needs_landlock
def test_an_attempt_writes_only_beneath_its_write_folders(layout: dict[str, Path], watch: Watch) -> None:
    """Caffe's own writes land (outputs, snapshots, an LMDB lock table beside the link); nothing reaches the dataset
    through the link in data/lmdb (the issue's finding 1), nor data/, the job's other files, the jobs folder, the
    datasets or anywhere else; no link can be made."""
    root, job = layout["root"], layout["job"]
    victim = root / "victim_lmdb" / "data.mdb"
    before = sha256(victim)
    link = "data/lmdb/0-victim_lmdb/data.mdb"
    result = confined(layout, [
        ("output", "create", "outputs/dump.h5"),
        ("output folder", "mkdir", "outputs/sub"),
        ("snapshot", "create", "snapshots/lenet_iter_2.caffemodel"),
        ("lock table", "create", "data/lmdb/0-victim_lmdb/lock.mdb"),
        ("log", "create", "attempts/1/caffe.log"),
        ("write through the link", "write", link),
        ("truncate through the link", "truncate", link),
        ("remove the link", "remove", link),
        ("a list file", "truncate", "data/list.txt"),
        ("the job's folder", "create", "net.prototxt"),
        ("the jobs folder", "create", "../planted"),
        ("the dataset's folder", "create", str(root / "victim_lmdb" / "new.mdb")),
        ("the dataset itself", "write", str(victim)),
        ("outside", "create", str(layout["outside"] / "new.txt")),
        ("tmp", "create", f"/tmp/memplugin-confined-{os.getpid()}"),
        ("a link in outputs", "symlink", "outputs/link"),
    ])
    assert result["confinement"]["confined"] and result["confinement"]["writes"] == WRITES
    assert result["confinement"]["landlock_abi"] == landlock.abi()
    for allowed in ("output", "output folder", "snapshot", "lock table", "log"):
        assert result[allowed] == "ok", (allowed, result)
    denied = {name: code for name, code in result.items() if name != "confinement" and code != "ok"}
    assert set(denied) == set(result) - {"confinement", "output", "output folder", "snapshot", "lock table", "log"}
    assert set(denied.values()) == {"EACCES"}, denied
    assert sha256(victim) == before and writes_seen(watch) == []
    assert not (job / "outputs" / "link").exists() and not (job.parent / "planted").exists()
    assert not Path(f"/tmp/memplugin-confined-{os.getpid()}").exists()


@needs_landlock
def test_an_attempt_reads_only_its_folder_its_checked_dataset_files_and_the_runtime(
    layout: dict[str, Path]
) -> None:
    """A dataset file is readable through the job's link to it, and the files the job was checked to read; another
    file of the same dataset root, anything outside, /etc/passwd, the process's own environment (it holds the
    server's) are not; Python can still import what it has not loaded yet."""
    root = layout["root"]
    result = confined(layout, [
        ("through the link", "read", "data/lmdb/0-victim_lmdb/data.mdb"),
        ("a granted file", "read", str(root / "granted.h5")),
        ("a list file", "read", "data/list.txt"),
        ("own status", "read", "/proc/self/status"),
        ("a module not loaded yet", "import", "wave"),
        ("another file of the root", "read", str(root / "other.h5")),
        ("the root's listing", "list", str(root)),
        ("outside", "read", str(layout["outside"] / "secret.txt")),
        ("passwd", "read", "/etc/passwd"),
        ("own environment", "read", "/proc/self/environ"),
        ("the jobs folder", "list", ".."),
    ])
    allowed = {"through the link", "a granted file", "a list file", "own status", "a module not loaded yet"}
    assert {name for name, code in result.items() if code == "ok"} == allowed, result
    assert {code for name, code in result.items() if name not in allowed | {"confinement"}} == {"EACCES"}, result
    assert result["confinement"]["reads"] == 2


@needs_landlock
def test_what_an_attempt_execs_is_confined_as_well(layout: dict[str, Path]) -> None:
    """A runner that execs the `caffe` binary confines itself first: the program it starts is held to the same
    rules (cat reads the granted file, not the outside one)."""
    root = layout["root"]
    result = confined(layout, [
        ("cat a granted file", "exec_cat", str(root / "granted.h5")),
        ("cat outside", "exec_cat", str(layout["outside"] / "secret.txt")),
        ("cat passwd", "exec_cat", "/etc/passwd"),
    ])
    assert result["cat a granted file"] == "ok", result
    assert result["cat outside"] == result["cat passwd"] == "EACCES", result


@needs_landlock
def test_a_program_outside_the_system_folders_runs_only_when_granted(layout: dict[str, Path], tmp_path: Path) -> None:
    """A `caffe` binary in a build folder: denied unless the runner names it in `executables`."""
    program = tmp_path / "build" / "tools" / "cat"
    program.parent.mkdir(parents=True)
    shutil.copy2(shutil.which("cat") or "/bin/cat", program)
    tries = [("run it", "exec_path", str(program))]
    assert confined(layout, tries)["run it"] == "EACCES"
    assert confined(layout, tries, executables=[str(program.parent)])["run it"] == "ok"


@needs_landlock
@pytest.mark.parametrize("planted", ["outputs", "data/lmdb"])
def test_a_write_folder_that_is_a_link_is_refused_not_granted(
    layout: dict[str, Path], watch: Watch, planted: str
) -> None:
    """A link planted where a write folder should be would grant writing wherever it points (the dataset root):
    the child refuses to confine itself, and so trains nothing."""
    job, root = layout["job"], layout["root"]
    target = job / planted
    os.rename(target, job / "moved")
    target.symlink_to(root)
    result = confined(layout, [])
    assert "refused" in result and f"{planted} is a link" in result["refused"], result
    assert writes_seen(watch) == []


@needs_landlock
def test_a_dataset_path_that_became_a_link_is_refused(layout: dict[str, Path]) -> None:
    root = layout["root"]
    (root / "granted.h5").unlink()
    (root / "granted.h5").symlink_to(layout["outside"] / "secret.txt")
    result = confined(layout, [])
    assert "refused" in result and "granted.h5 is a link" in result["refused"], result


@needs_landlock
def test_a_thread_already_running_is_refused(layout: dict[str, Path]) -> None:
    """Landlock confines the calling thread and what it starts, not threads already running: refused."""
    result = confined(layout, [], thread=True)
    assert "refused" in result and "threads already run" in result["refused"], result


def test_without_landlock_nothing_is_confined_and_it_says_why(layout: dict[str, Path]) -> None:
    result = confined(layout, [("outside", "read", str(layout["outside"] / "secret.txt"))], wrapper=WITHOUT_LANDLOCK)
    assert result["confinement"] == {
        "confined": False, "landlock_abi": 0,
        "reason": "this kernel has no Landlock (Linux 5.13 or later, built with CONFIG_SECURITY_LANDLOCK)",
    }
    assert result["outside"] == "ok"  # nothing was confined: the server's own checks are what holds then


# ============================================================================ the real runner


DIGITS_LENET = standard_network("lenet").text
DIGITS_SOLVER = (
    'test_iter: 1\ntest_interval: 1000\nbase_lr: 0.01\nlr_policy: "fixed"\nsnapshot: 0\n'
    'train_state { stage: "train" }\ntest_state { stage: "val" }\n'
)
DUMP = ('layer{name:"dump" type:"HDF5Output" bottom:"data" bottom:"label" include{stage:"train"} '
        'hdf5_output_param{file_name:"../data/lmdb/1-victim_lmdb/data.mdb"}}\n')
"""The issue's finding 1: DIGITS' LeNet with an HDF5Output onto the path where each attempt links the test
dataset's data file."""


def permissive_output(self: Any, value: str, where: Any, *, folder: bool) -> Path:
    """The server's output check as it was before the fix: the path resolved now (when data/lmdb/ does not exist
    yet), inside the job's folder."""
    target = (self.folder / "outputs" / value).resolve()
    assert target.is_relative_to(self.folder.resolve())
    (target if folder else target.parent).mkdir(parents=True, exist_ok=True)
    return target


@pytest.mark.slow
@needs_landlock
@pytest.mark.parametrize("runner", ["pycaffe", "binary"])
def test_the_issues_hdf5output_onto_a_datasets_data_mdb_is_stopped_by_the_kernel(
    make_manager: ManagerFactory, datasets: Path, monkeypatch: pytest.MonkeyPatch, runner: str
) -> None:
    """With the server's output checks taken away (as if they missed a path), the attempt's child still cannot
    write the dataset: Landlock resolves the link in data/lmdb/ and finds the dataset's file, which is not
    writable. The dataset's checksum is the evidence, with an inotify watch on the dataset root. The same through
    the `caffe` binary runner, whose caffe is confined in its own process before exec."""
    write_lmdb(datasets / "victim_lmdb", records=8)
    victim = datasets / "victim_lmdb" / "data.mdb"
    before = sha256(victim)
    monkeypatch.setattr(confiner.Confiner, "output", permissive_output)
    monkeypatch.setattr(attempt_files, "confirm_outputs", lambda definition, folder: None, raising=False)
    if runner == "binary":
        if not (BUNDLED_BINARY_ROOT / "build" / "tools" / "caffe").is_file():
            pytest.fail(f"the bundled Caffe's binary build is missing at {BUNDLED_BINARY_ROOT}: run `make install`")
        manager = make_manager(caffe=find_caffe(BUNDLED_BINARY_ROOT), preload=str(ensure_library()))
    else:
        manager = make_manager()
    request = lenet_request(net=DIGITS_LENET + DUMP, solver=DIGITS_SOLVER, classes=10, max_iter=2,
                            data={"train": "mnist_train_lmdb", "test": "victim_lmdb"}, fallback={"max_attempts": 1})
    watch = Watch(datasets)
    try:
        job = manager.wait(manager.submit(request).id, timeout=120)
        events = writes_seen(watch)
    finally:
        watch.close()
    assert sha256(victim) == before and events == []
    assert job.status == "failed", job
    (attempt,) = manager.attempts(job.id)
    log = (manager.folder(job.id) / attempt.log).read_text()
    assert "HDF5" in (job.message or "") and "Permission denied" in log, (job.message, log[-3000:])
    started = json.loads((manager.folder(job.id) / "attempts/1/progress.jsonl").read_text().splitlines()[0])
    assert started["confinement"]["confined"] is True and "data" not in started["confinement"]["writes"]


@pytest.mark.slow
def test_on_a_kernel_without_landlock_the_runner_trains_and_says_it_is_not_confined(
    make_manager: ManagerFactory
) -> None:
    manager = make_manager()
    job = manager.wait(manager.submit(lenet_request(max_iter=2)).id, timeout=120)
    assert job.status == "done", job
    folder = manager.folder(job.id)
    first = json.loads((folder / "attempts/1/progress.jsonl").read_text().splitlines()[0])
    assert first["confinement"]["confined"] is (landlock.abi() >= 1)
    # The same attempt again, on a kernel that has no Landlock.
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_LANDLOCK, "digits_memplugin.jobs.child.runner", "attempts/1/attempt.json"],
        cwd=folder, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, (folder / "attempts/1/caffe.log").read_text()[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    started = next(record for record in records if record["event"] == "started")
    assert started["confinement"] == {
        "confined": False, "landlock_abi": 0,
        "reason": "this kernel has no Landlock (Linux 5.13 or later, built with CONFIG_SECURITY_LANDLOCK)",
    }
    assert records[-1]["event"] == "finished"
    log = (folder / "attempts/1/caffe.log").read_text()
    assert "this attempt is not confined: this kernel has no Landlock" in log


H5_NET = """name: "h5"
layer { name: "data" type: "HDF5Data" top: "data" top: "label" hdf5_data_param { source: "h5/list.txt" batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
DUMP_OUTPUT = ('layer { name: "dump" type: "HDF5Output" bottom: "data" bottom: "label" '
               'hdf5_output_param { file_name: "sub/dump.h5" } }\n')
H5_SOLVER = 'base_lr: 0.01\nlr_policy: "fixed"\nsnapshot: 20\nsnapshot_prefix: "h5"\nsnapshot_format: HDF5\n'


def confinement_of(manager: Any, job_id: str, attempt: int = 1) -> dict[str, Any]:
    path = manager.folder(job_id) / "attempts" / str(attempt) / "progress.jsonl"
    return dict(json.loads(path.read_text().splitlines()[0])["confinement"])


@pytest.mark.slow
@needs_landlock
def test_what_training_opens_later_is_within_the_confinement(make_manager: ManagerFactory, datasets: Path) -> None:
    """Confined, training still does everything it opens files for after the start: HDF5Data opening each file of
    its list again as it cycles through them, HDF5 snapshots, resuming from an HDF5 solver state, an HDF5Output
    writing into outputs/ (one forward: this Caffe's HDF5Output cannot write a second batch to its file)."""
    (datasets / "h5").mkdir()
    for name in ("a", "b"):
        with h5py.File(datasets / "h5" / f"{name}.h5", "w") as h5:
            h5["data"] = np.random.default_rng(0).random((8, 4), dtype=np.float32)
            h5["label"] = np.zeros((8,), dtype=np.float32)
    (datasets / "h5" / "list.txt").write_text("a.h5\nb.h5\n")
    manager = make_manager()
    dumped = manager.wait(manager.submit(lenet_request(
        net=H5_NET + DUMP_OUTPUT, solver=H5_SOLVER, data={}, max_iter=1, fallback={"max_attempts": 1})).id, timeout=120)
    assert dumped.status == "done", dumped
    assert (manager.folder(dumped.id) / "outputs" / "sub" / "dump.h5").is_file()
    assert confinement_of(manager, dumped.id)["writes"] == ["outputs", "snapshots", "data/lmdb", "attempts/1"]

    job = manager.submit(lenet_request(net=H5_NET, solver=H5_SOLVER, data={}, max_iter=1_000_000))
    snapshot = wait_for(lambda: manager.get(job.id).snapshot, timeout=120, what="an HDF5 snapshot")
    assert snapshot["state"].endswith(".solverstate.h5") and snapshot["iteration"] >= 20  # 10 passes over a.h5, b.h5
    manager.wait(manager.cancel(job.id).id, timeout=60)
    manager.resume(job.id)
    resumed = manager.folder(job.id) / "attempts" / "2" / "progress.jsonl"

    def trained_past_two_files() -> bool:
        attempts = manager.attempts(job.id)
        if len(attempts) < 2 or not resumed.is_file():
            return False
        records = [json.loads(line) for line in resumed.read_text().splitlines()]
        start = attempts[1].start_iteration
        return any(r["event"] == "iteration" and r["iteration"] > start + 8 for r in records)

    wait_for(trained_past_two_files, timeout=120, what="the resumed attempt to train past two files")
    manager.wait(manager.cancel(job.id).id, timeout=60)
    second = manager.attempts(job.id)[1]
    assert second.resumed_from is not None and second.resumed_from.endswith(".solverstate.h5")
    assert confinement_of(manager, job.id, 2)["confined"] is True
    assert confinement_of(manager, job.id, 2)["reads"] == 2  # a.h5 and b.h5
