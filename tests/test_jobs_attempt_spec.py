"""jobs.child.attempt_spec: the attempt.json the manager writes and the runner reads, round-tripped; a malformed one is
refused by the runner, naming the field, before anything is trained."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from digits_memplugin.jobs.child import runner
from digits_memplugin.jobs.child.attempt_spec import AttemptDevice, AttemptSpec, AttemptSpecError

SCHEDULE = {"policy": "step", "base_lr": 0.01, "gamma": 0.1, "power": 1.0, "stepsize": 100, "stepvalues": []}


def spec(**changes: Any) -> AttemptSpec:
    base = AttemptSpec(
        job_id="20260101-000000-abcdef", attempt=2, solver="attempts/2/solver.prototxt", log="attempts/2/caffe.log",
        progress="attempts/2/progress.jsonl", device=AttemptDevice("gpu", "GPU-aaaa", 0), batch_size=32,
        iter_size=2, resume="snapshots/x_iter_100.solverstate", memory_cap=None, max_iter=1000, test_interval=500,
        test_iter=(100, 20), test_initialization=True, snapshot=0, snapshot_after_train=True,
        snapshot_prefix="snapshots/x", snapshot_format="BINARYPROTO", schedule=SCHEDULE, nice=10,
        read_paths=("/srv/datasets/mnist_lmdb/data.mdb", "/srv/datasets/h5/train.h5"),
        write_paths=("outputs", "snapshots", "data/lmdb", "attempts/2"),
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    "original",
    [spec(), spec(device=AttemptDevice("cpu"), memory_cap=1 << 30, resume=None, test_iter=(), nice=0)],
)
def test_a_spec_round_trips_through_its_file(tmp_path: Path, original: AttemptSpec) -> None:
    path = tmp_path / "attempt.json"
    original.write(path)
    assert AttemptSpec.read(path) == original
    assert AttemptSpec.from_json(json.loads(json.dumps(original.to_json()))) == original


def test_the_file_keeps_the_layout_the_runner_has_always_read(tmp_path: Path) -> None:
    document = json.loads(json.dumps(spec().to_json()))
    assert document["device"] == {"kind": "gpu", "uuid": "GPU-aaaa", "cuda_index": 0}
    assert document["test_iter"] == [100, 20] and document["schedule"] == SCHEDULE
    assert document["write_paths"] == ["outputs", "snapshots", "data/lmdb", "attempts/2"]
    assert spec(device=AttemptDevice("cpu")).to_json()["device"] == {"kind": "cpu"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("max_iter"), "max_iter is missing"),
        (lambda d: d.update(max_iter="1000"), "max_iter must be int, not str"),
        (lambda d: d.update(batch_size=True), "batch_size must be int, not bool"),
        (lambda d: d.update(resume=3), "resume must be str or null, not int"),
        (lambda d: d.update(test_iter=[1, 0]), "test_iter must be a list of positive whole numbers"),
        (lambda d: d.update(device={"kind": "tpu"}), "device.kind must be"),
        (lambda d: d.update(device={"kind": "gpu", "uuid": "GPU-aaaa"}), "device.cuda_index is missing"),
        (lambda d: d.update(snapshot_format="LMDB"), "snapshot_format must be one of"),
        (lambda d: d.update(extra=1), "unknown field(s): 'extra'"),
        # What the child may open is never left to a default: a spec that does not say is refused.
        (lambda d: d.pop("read_paths"), "read_paths is missing"),
        (lambda d: d.pop("write_paths"), "write_paths is missing"),
        (lambda d: d.update(write_paths="outputs"), "write_paths must be list, not str"),
        (lambda d: d.update(read_paths=["/a", 3]), "read_paths must be a list of paths"),
        (lambda d: d.update(read_paths=["/a\0b"]), "read_paths must be a list of paths"),
    ],
)
def test_a_malformed_spec_names_its_field(change: Any, message: str) -> None:
    document = spec().to_json()
    change(document)
    with pytest.raises(AttemptSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AttemptSpec.from_json(document)


def test_the_runner_refuses_a_malformed_spec_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = spec().to_json()
    del document["solver"]
    path = tmp_path / "attempt.json"
    path.write_text(json.dumps(document))
    assert runner.main([str(path)]) == 3
    out, err = capsys.readouterr()
    record = json.loads(out)
    assert record["event"] == "error" and record["type"] == "AttemptSpecError"
    assert record["message"] == f"{path} is not a valid attempt spec: solver is missing"
    assert record["message"] in err


def test_the_runner_refuses_a_file_that_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "attempt.json"
    path.write_text("{not json")
    assert runner.main([str(path)]) == 3
    assert "is not a valid attempt spec: cannot read" in json.loads(capsys.readouterr().out)["message"]
