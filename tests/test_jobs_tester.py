"""jobs.child.tester, the tester child: on a snapshot's weights it reports the very test records the pycaffe runner
reported at that iteration (same weights, same data, the runner's own averaging), confined as the runner is; a spec
that is not one is refused naming the field, a missing snapshot is an error record, and a stop leaves no result."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import SHORT_SOLVER, ManagerFactory, lenet_request, wait_for

from digits_memplugin.confine import landlock
from digits_memplugin.core.prototxt import parse_solver
from digits_memplugin.jobs.child import tester_spec as specs
from digits_memplugin.jobs.child.attempt_spec import AttemptDevice
from digits_memplugin.jobs.definition.job_folder import LMDB_FOLDER

pytest_plugins = ["test_jobs_fixtures"]

K = 4
"""test_interval and snapshot of the training: the runner tests at 0, 4 and 8 and snapshots at 4 and 8. Each test
pass reads 2 batches of 100 items from an 8-item LMDB (25 times over), so each of the runner's passes begins at
the first item, as a new tester's does: the two see the same data."""
SOLVER = "random_seed: 7\n" + SHORT_SOLVER.replace("test_interval: 500", f"test_interval: {K}").replace(
    "snapshot: 2", f"snapshot: {K}"
)
ENV = {**os.environ, "GLOG_logtostderr": "1", "GLOG_minloglevel": "0"}
"""The environment the manager gives its children (jobs.backends.attempt_process)."""


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_child(
    folder: Path, spec: specs.TesterSpec | None, name: str = "tester.json", timeout: float = 120
) -> tuple[int, str]:
    """The tester started as the manager will start it, the job's folder as working directory, on `spec` (None:
    the file `name` as it is)."""
    if spec is not None:
        spec.write(folder / name)
    result = subprocess.run(
        [sys.executable, "-m", "digits_memplugin.jobs.child.tester", name],
        cwd=folder, env=ENV, capture_output=True, text=True, timeout=timeout, check=False,
    )
    return result.returncode, result.stdout


def trained(make_manager: ManagerFactory, snapshot_format: str = "BINARYPROTO") -> tuple[Path, list[dict[str, Any]]]:
    """LeNet trained by the pycaffe runner for 2 K iterations: the job's folder and the attempt's records."""
    manager = make_manager()
    solver = SOLVER if snapshot_format == "BINARYPROTO" else SOLVER + "snapshot_format: HDF5\n"
    request = dataclasses.replace(lenet_request(max_iter=2 * K), solver=solver)
    job = manager.wait(manager.submit(request).id, timeout=180)
    assert job.status == "done"
    folder = manager.folder(job.id)
    return folder, read_records(folder / "attempts" / "1" / "progress.jsonl")


def spec_for(folder: Path, weights: str, iteration: int, own: str, **changes: Any) -> specs.TesterSpec:
    """A spec for the attempt's test nets as its generated solver names them, writing only in `own` (and the LMDB
    lock folders); what it may read is what the attempt could."""
    attempt = json.loads((folder / "attempts" / "1" / "attempt.json").read_text())
    solver = parse_solver((folder / attempt["solver"]).read_text())
    (folder / own).mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {
        "weights": weights, "iteration": iteration,
        "nets": tuple(map(specs.TestNet, solver.test_net, solver.test_iter)),
        "device": AttemptDevice("cpu"), "memory_cap": 512 << 20, "log": f"{own}/caffe.log",
        "progress": f"{own}/progress.jsonl", "read_paths": tuple(attempt["read_paths"]),
        "write_paths": (LMDB_FOLDER, own), **changes,
    }
    return specs.TesterSpec(**fields)


def files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(folder)): (path.stat().st_mtime_ns, path.stat().st_size)
            for path in folder.rglob("*") if path.is_file()}


def changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> set[str]:
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


@pytest.mark.slow
@pytest.mark.parametrize("snapshot_format", ["BINARYPROTO", "HDF5"])
def test_the_testers_records_are_the_runners_at_the_same_snapshot(
    make_manager: ManagerFactory, snapshot_format: str
) -> None:
    folder, runner = trained(make_manager, snapshot_format)
    snapshots = {r["iteration"]: r["model"] for r in runner if r["event"] == "snapshot"}
    assert sorted(snapshots) == [K, 2 * K]
    for iteration, weights in snapshots.items():
        own = f"attempts/1/tester/{iteration}"
        spec = spec_for(folder, weights, iteration, own)
        before = files(folder)
        status, stdout = run_child(folder, spec)
        got = read_records(folder / own / "progress.jsonl")
        assert status == 0, (folder / own / "caffe.log").read_text()[-2000:]
        assert [json.loads(line) for line in stdout.splitlines()] == got  # stdout has every record too
        assert [r["event"] for r in got] == ["started", "constructed", "test", "tested"]
        expected = [r for r in runner if r["event"] == "test" and r["iteration"] == iteration]
        tests = [r for r in got if r["event"] == "test"]
        assert len(expected) == 1 and len(tests) == 1
        field = ("iteration", "net", "outputs", "loss")
        assert {k: tests[0][k] for k in field} == {k: expected[0][k] for k in field}  # to the last bit
        assert set(tests[0]) == set(expected[0])  # and no other field than the runner's
        started = got[0]
        assert started["weights"] == weights and started["iteration"] == iteration
        assert started["memory_cap"] == 512 << 20 and started["blas"]["settled"]
        assert started["confinement"]["confined"] == (landlock.abi() >= 1)
        if started["confinement"]["confined"]:
            assert own in started["confinement"]["writes"]
            assert set(started["confinement"]["writes"]) <= {own, LMDB_FOLDER}
        # It wrote its spec's own folder and the LMDB lock files only (tester.json is the test's).
        assert all(name.startswith((own + "/", LMDB_FOLDER + "/")) or name == "tester.json"
                   for name in changed(before, files(folder))), changed(before, files(folder))
        assert "Tested " in (folder / own / "caffe.log").read_text()


@pytest.mark.slow
def test_a_stop_ends_the_tester_with_no_result(make_manager: ManagerFactory) -> None:
    folder, runner = trained(make_manager)
    weights = next(r["model"] for r in runner if r["event"] == "snapshot")
    own = "attempts/1/tester/stopped"
    spec = spec_for(folder, weights, K, own)
    # One pass far longer than the test waits. (Not the same net twice: that opens one LMDB twice in one process,
    # which LMDB forbids; it hangs, as a solver with two test nets on one LMDB would.)
    spec = dataclasses.replace(spec, nets=(dataclasses.replace(spec.nets[0], test_iter=100_000),))
    spec.write(folder / "tester.json")
    child = subprocess.Popen(
        [sys.executable, "-m", "digits_memplugin.jobs.child.tester", "tester.json"],
        cwd=folder, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        progress = folder / own / "progress.jsonl"
        wait_for(lambda: progress.is_file() and '"constructed"' in progress.read_text(), 120, "the nets")
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    events = [r["event"] for r in read_records(progress)]
    assert events[-1] == "stopped" and "test" not in events
    assert "Test interrupted." in (folder / own / "caffe.log").read_text()


A_SPEC = specs.TesterSpec(
    weights="snapshots/s_iter_4.caffemodel.h5", iteration=4, nets=(specs.TestNet("attempts/1/test0.prototxt", 2),),
    device=AttemptDevice("cpu"), memory_cap=None, log="caffe.log", progress="progress.jsonl",
    read_paths=(), write_paths=("attempts/1",),
)
"""A spec that needs no job: for what the tester refuses before it loads Caffe."""


def test_a_missing_snapshot_is_an_error_record(tmp_path: Path) -> None:
    spec = dataclasses.replace(A_SPEC, weights="snapshots/none_iter_4.caffemodel")
    status, stdout = run_child(tmp_path, spec, timeout=60)
    assert status == 3
    (error,) = [json.loads(line) for line in stdout.splitlines()]
    assert error["event"] == "error" and error["type"] == "FileNotFoundError"
    assert "snapshots/none_iter_4.caffemodel" in error["message"]
    assert read_records(tmp_path / "progress.jsonl") == [error]


def test_a_spec_that_is_not_one_is_refused_naming_the_field(tmp_path: Path) -> None:
    good = A_SPEC.to_json()
    assert specs.TesterSpec.from_json(good).to_json() == good
    wrong: list[tuple[dict[str, Any], str]] = [
        ({k: v for k, v in good.items() if k != "weights"}, "weights is missing"),
        ({**good, "weights": "snapshots/s_iter_4.solverstate"}, "weights must name a .caffemodel"),
        ({**good, "iteration": "4"}, "iteration must be int"),
        ({**good, "nets": []}, "nets must name at least one"),
        ({**good, "nets": [{"net": "t.prototxt", "test_iter": 0}]}, "nets[0].test_iter must be a positive"),
        ({**good, "nets": [{"test_iter": 2}]}, "nets[0].net is missing"),
        ({**good, "nets": [{"net": "t.prototxt", "test_iter": 2, "phase": 1}]}, "nets[0]: unknown field(s): 'phase'"),
        ({**good, "device": {"kind": "tpu"}}, "device.kind must be"),
        ({**good, "read_paths": None}, "read_paths must be list"),
        ({**good, "extra": 1}, "unknown field(s): 'extra'"),
    ]
    for data, message in wrong:
        with pytest.raises(specs.TesterSpecError) as refused:
            specs.TesterSpec.from_json(data)
        assert message in str(refused.value)
    (tmp_path / "tester.json").write_text(json.dumps({**good, "iteration": True}))
    status, stdout = run_child(tmp_path, None, timeout=60)
    assert status == 3
    (record,) = [json.loads(line) for line in stdout.splitlines()]
    assert record["event"] == "error" and record["type"] == "TesterSpecError"
    assert "is not a valid tester spec: iteration must be int" in record["message"]
