"""One planning path (issue 15): the same job asked for through the New model form (its preview), `POST
/api/estimate`, `digits-memplugin estimate` and a real job on the CPU gets the same batch_size, iter_size and test
batch, because all four plan with core.planning.job_plan.plan_job under the server's one policy. Under a 64 MiB CPU cap
LeNet's batch 512 does not fit in one pass, so the agreement covers iter_size too; the job trains for real. A fifth
way (issue 24): the same job on a server whose Caffe root is the bundled Caffe's binary build trains through the
`caffe` binary with the same attempts and records. That runner keeps the test nets shared (issue 28), and its plan
says why: it is compared with the pycaffe job asked to keep them shared too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import AppFactory
from flask import Flask
from test_jobs_fixtures import LENET, SHORT_SOLVER, comparable_record, datasets, wait_for  # noqa: F401 - datasets is a fixture

from digits_memplugin.jobs.child.caffe_build import BUNDLED_BINARY_ROOT

pytestmark = pytest.mark.slow

CAP = 64 * 1024 * 1024
SOLVER = "random_seed: 7\n" + SHORT_SOLVER.replace("max_iter: 10000", "max_iter: 2")
"""Seeded: the pycaffe and the binary job start from the same weights (the fifth way compares their records)."""
_FIRST, _SECOND = LENET.split('name: "mnist"', 2)[:2], LENET.split('name: "mnist"', 2)[2]
NET = 'name: "mnist"'.join(_FIRST) + 'name: "mnist_val"' + _SECOND
"""Caffe's LeNet with its TEST data layer named apart from the TRAIN one, as a form's two datasets need."""
SCRIPT = Path(sys.executable).parent / "digits-memplugin"


@pytest.fixture
def app_config(datasets: Path) -> dict[str, Any]:  # noqa: F811 - datasets is the fixture imported above
    """conftest's `app` under the 64 MiB CPU cap, reading the LeNet datasets."""
    return {"MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "MEMPLUGIN_CPU_MEMORY_CAP": CAP}


@pytest.fixture
def binary_app(make_app: AppFactory, tmp_path: Path, app_config: dict[str, Any]) -> Flask:
    """The same server with the bundled Caffe's binary build as its Caffe root: jobs train through `caffe`."""
    if not (BUNDLED_BINARY_ROOT / "build" / "tools" / "caffe").is_file():
        pytest.fail(f"the bundled Caffe's binary build is missing at {BUNDLED_BINARY_ROOT}: run `make install`")
    return make_app(**app_config, MEMPLUGIN_DATA_DIR=tmp_path / "binary-data", MEMPLUGIN_CAFFE_ROOT=str(BUNDLED_BINARY_ROOT))


def form(**fields: Any) -> dict[str, Any]:
    return {
        "model_name": "agreement", "network": "custom", "custom_network": NET, "solver": "file",
        "solver_text": SOLVER, "train_source": "mnist_train_lmdb", "val_source": "mnist_test_lmdb",
        "item_shape": "1,28,28", "classes": 10, "batch_size": 512, "device": "cpu", **fields,
    }


def triple(plan: dict[str, Any], test_plan: dict[str, Any] | None, own_test_batch: int) -> tuple[int, int, int]:
    return plan["batch_size"], plan["iter_size"], (test_plan or {}).get("batch_size", own_test_batch)


def attempts_and_records(client: Any, job_url: str, folder: Path) -> tuple[list[Any], list[Any]]:
    """A job's attempts (what planned and how each ended) and its records, without times, pids and memory figures
    (they differ between two runs, and between a Python process and `caffe`)."""
    job = client.get(job_url).get_json()
    attempts = [(a["batch_size"], a["iter_size"], a["test_batch_size"], a["test_iter"], a["status"],
                 a["end_iteration"]) for a in job["attempts"]]
    records = []
    for number in range(1, len(job["attempts"]) + 1):
        for line in (folder / "attempts" / str(number) / "progress.jsonl").read_text().splitlines():
            records.append(comparable_record(json.loads(line)))
    return attempts, records


def approx(value: Any) -> Any:
    """Caffe's log prints 6 significant digits; the pycaffe runner reads float32 values."""
    if isinstance(value, float):
        return pytest.approx(value, rel=2e-5, abs=1e-6)
    if isinstance(value, dict):
        return {key: approx(item) for key, item in value.items()}
    if isinstance(value, list):
        return [approx(item) for item in value]
    return value


def test_the_form_the_rest_estimate_the_cli_and_a_job_plan_alike(
    app: Flask, binary_app: Flask, tmp_path: Path,
) -> None:
    client = app.test_client()
    prefix = app.extensions["memplugin"].settings.url_prefix

    # 1. The form, as it would create the job (the manager's preview of the typed request).
    preview = client.post(f"{prefix}/models/preview.json", json=form())
    assert preview.status_code == 200, preview.get_json()
    shown = preview.get_json()
    assert shown["planned_by"] == "job" and shown["engine"] == "cpu"
    limit = shown["free_bytes"]  # the cap less Caffe's thread stacks: what the job's attempt may plan with
    assert limit < CAP
    form_plan = triple(shown["plan"], shown["test_plan"], 100)
    assert form_plan[1] > 1, "512 should need passes under a 64 MiB cap"

    # 2. POST /api/estimate with the same texts and memory: the same function, the same margin (the policy's).
    body = {"net": NET, "solver": SOLVER, "data_shapes": {"data": [1, 28, 28]}, "classes": 10, "batch": 512,
            "engine": "cpu", "free_bytes": limit}
    answer = client.post(f"{prefix}/api/estimate", json=body)
    assert answer.status_code == 200, answer.get_json()
    document = answer.get_json()
    assert document["safety_margin"] == 0.03
    rest_plan = triple(document["plan"], document["test_plan"], document["test_batch_size"])

    # 3. digits-memplugin estimate.
    (tmp_path / "net.prototxt").write_text(NET, encoding="utf-8")
    result = subprocess.run(
        [SCRIPT, "estimate", tmp_path / "net.prototxt", "--data-shape", "data=1,28,28", "--batch", "512",
         "--free-bytes", str(limit), "--engine", "cpu", "--json", "--no-pycaffe"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    cli_plan = triple(printed["plan"], printed["test_plan"], printed["test_batch_size"])

    # 4. The job itself, created by the form and trained on the CPU under the cap: its first attempt's plan.
    created = client.post(f"{prefix}/models.json", json=form())
    assert created.status_code == 201, created.get_json()
    job_url = f"{prefix}/api/jobs/{created.get_json()['id']}"
    job = wait_for(lambda: (doc := client.get(job_url).get_json())["attempts"] and doc, timeout=120,
                   what="the job's first attempt")
    first = job["attempts"][0]
    job_plan = (first["batch_size"], first["iter_size"], first["test_batch_size"])

    assert form_plan == rest_plan == cli_plan == job_plan, {
        "form": form_plan, "rest": rest_plan, "cli": cli_plan, "job": job_plan,
    }
    ended = wait_for(lambda: (doc := client.get(job_url).get_json())["status"] in ("done", "failed") and doc,
                     timeout=180, what="the job to end")
    assert ended["status"] == "done", ended

    # 5. The same job on the server whose Caffe is the bundled binary build: `caffe train` under the same cap. Its
    # runner cannot keep the test nets apart, so its plan keeps them shared and says why; the pycaffe job it is
    # compared with is asked to keep them shared too (step 4's planned them apart: 256 x 2 against 171 x 3).
    other = binary_app.test_client()
    plugin = binary_app.extensions["memplugin"]
    assert plugin.caffe.runner == "binary"
    planned = other.post(f"{prefix}/models/preview.json", json=form())
    assert planned.status_code == 200, planned.get_json()
    refused = plugin.jobs.config.apart_refused
    assert refused and "caffe train" in refused
    assert planned.get_json()["test_net"] == "shared"
    assert planned.get_json()["test_net_note"] == f"test nets shared: {refused}"
    asked_apart = other.post(f"{prefix}/models/preview.json", json=form(test_net="apart"))
    assert asked_apart.status_code == 400 and refused in asked_apart.get_json()["errors"]["test_net"]

    shared = client.post(f"{prefix}/models.json", json=form(test_net="shared"))
    assert shared.status_code == 201, shared.get_json()
    shared_url = f"{prefix}/api/jobs/{shared.get_json()['id']}"
    made = other.post(f"{prefix}/models.json", json=form(test_net="shared"))
    assert made.status_code == 201, made.get_json()
    binary_url = f"{prefix}/api/jobs/{made.get_json()['id']}"
    by_shared = wait_for(lambda: (doc := client.get(shared_url).get_json())["status"] in ("done", "failed") and doc,
                         timeout=180, what="the pycaffe job with its test nets shared to end")
    assert by_shared["status"] == "done", by_shared
    finished = wait_for(lambda: (doc := other.get(binary_url).get_json())["status"] in ("done", "failed") and doc,
                        timeout=180, what="the binary's job to end")
    assert finished["status"] == "done", finished
    by_pycaffe = attempts_and_records(client, shared_url, app.extensions["memplugin"].jobs.folder(by_shared["id"]))
    by_binary = attempts_and_records(other, binary_url, plugin.jobs.folder(finished["id"]))
    assert by_binary[0] == by_pycaffe[0], {"pycaffe": by_pycaffe[0], "binary": by_binary[0]}
    assert [r["event"] for r in by_binary[1]] == [r["event"] for r in by_pycaffe[1]]
    assert by_binary[1] == approx(by_pycaffe[1])
    spec = json.loads((plugin.jobs.folder(finished["id"]) / "attempts" / "1" / "attempt.json").read_text())
    assert spec["runner"] == "binary" and spec["memory_cap"] is not None
