"""A new user's first job (issue 26, point 2): LeNet on the sample dataset with the New model form's defaults and
Auto, on the CPU, end to end through a real server; the old defaults measured beside it in the same run.

Starts `digits-memplugin serve` on 127.0.0.1 with the sample dataset (`digits-memplugin sample-dataset`: 1438
training and 359 validation digits) in its dataset folder, and posts the form's JSON twin as a new user fills it in
(names of the model and datasets, batch "auto"; everything else as the form has it: the standard LeNet, SGD at
0.01, 30 epochs, validation once an epoch on one pass). It polls the job's REST document every 0.25 s and times,
from the submission: the first document with a time left, and the end. Then `--rounds` times again. Last, the old
defaults on the same server (batch 1438, what Auto gave, 10,000 iterations validated on 32 x 100 images) train for
`--old-seconds` (150: their speed is measured over the last minute, so their first validation pass is out of it by
then), and their total is what their own measure says then (elapsed + seconds_left): they are not run for hours.

Writes the table into docs/benchmarks.md between the `first-job` markers.

    .venv/bin/python bench/first_job.py [--rounds 3] [--old-seconds 150] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

import requests
from report import replace_section
from test_jobs_restart import serve

from digits_memplugin.jobs.events.pace import format_duration

SCRIPT = Path(sys.executable).parent / "digits-memplugin"
FIRST_JOB = {"model_name": "my first LeNet", "train_source": "digits_train_lmdb", "val_source": "digits_val_lmdb",
             "batch_size": "auto"}
OLD_DEFAULTS = {"batch_size": 1438, "max_iter": 10000, "test_interval": 500, "test_iter": 100}
"""What the same form gave before: Auto filled the whole training set, the solver fields 10,000 iterations and a
validation of 100 batches of 32 every 500."""


def submit(base: str, fields: dict[str, Any]) -> tuple[str, float]:
    response = requests.post(base + "memplugin/models.json", json=fields, timeout=120)
    response.raise_for_status()
    return response.json()["id"], time.monotonic()


def follow(base: str, job_id: str, started: float, stop_after: float | None = None) -> dict[str, Any]:
    """Poll the job: when its time left first showed, what it said, and how it ended (or its measure when
    `stop_after` seconds have passed: the job is then cancelled)."""
    url = base + f"memplugin/api/jobs/{job_id}"
    first: dict[str, Any] | None = None
    while True:
        document = requests.get(url, timeout=30).json()
        now = time.monotonic() - started
        if first is None and document["seconds_left"] is not None:
            first = {"after": now, "iteration": document["iteration"], "seconds_left": document["seconds_left"]}
        if document["status"] not in ("queued", "running"):
            return {"document": document, "first": first, "wall": now}
        if stop_after is not None and now >= stop_after and document["seconds_left"] is not None:
            requests.post(url + "/cancel", timeout=30)
            return {"document": document, "first": first, "wall": now}
        time.sleep(0.25)


def measure(rounds: int, old_seconds: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="memplugin-first-job-") as folder:
        data = Path(folder) / "data"
        subprocess.run([SCRIPT, "sample-dataset", str(data / "datasets")], check=True, timeout=300,
                       capture_output=True)
        server = serve(data, Path(folder) / "serve.log")
        try:
            runs = []
            for index in range(rounds):
                job_id, started = submit(server.url, {**FIRST_JOB, "model_name": f"first LeNet {index + 1}"})
                runs.append(follow(server.url, job_id, started))
                print(summary(runs[-1]), flush=True)
            job_id, started = submit(server.url, {**FIRST_JOB, **OLD_DEFAULTS, "model_name": "old defaults"})
            old = follow(server.url, job_id, started, stop_after=old_seconds)
            wait_ended(server.url, job_id)
            return runs, old
        finally:
            server.process.terminate()
            server.process.wait(timeout=60)


def wait_ended(base: str, job_id: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if requests.get(base + f"memplugin/api/jobs/{job_id}", timeout=30).json()["status"] in ("cancelled", "done"):
            return
        time.sleep(0.5)


def accuracy(document: dict[str, Any]) -> float | None:
    tests = (document.get("progress") or {}).get("test") or []
    value = tests[0]["outputs"].get("accuracy") if tests and tests[0] else None
    return float(value) if isinstance(value, (int, float)) else None


def summary(run: dict[str, Any]) -> str:
    document = run["document"]
    return (f"{document['status']} at iteration {document['iteration']} of {document['max_iter']} in "
            f"{run['wall']:.1f} s (batch {document['batch']['batch_size']}); time left first shown after "
            f"{run['first']['after']:.1f} s at iteration {run['first']['iteration']}; accuracy {accuracy(document)}")


def table(runs: list[dict[str, Any]], old: dict[str, Any]) -> str:
    walls = [run["wall"] for run in runs]
    firsts = [run["first"]["after"] for run in runs]
    document = runs[0]["document"]
    old_doc = old["document"]
    old_total = old["wall"] + old_doc["seconds_left"]
    batch = document["batch"]
    accuracies = " / ".join(f"{accuracy(run['document']):.3f}" for run in runs)
    median = statistics.median(walls)
    new_row = (
        f"| the form's defaults and Auto, {len(runs)} runs (median) | {batch['batch_size']} | {document['max_iter']} "
        f"(30 epochs of {document['iterations_per_epoch']}) | {batch['test_iter']} x {batch['test_batch_size']} "
        f"once an epoch | {median:.0f} s ({min(walls):.0f}-{max(walls):.0f} s) | {statistics.median(firsts):.1f} s after "
        f"submitting | {accuracies} |"
    )
    old_row = (
        f"| the old defaults (measured {old['wall']:.0f} s, then cancelled) | {old_doc['batch']['batch_size']} | "
        f"{old_doc['max_iter']} | {old_doc['batch']['test_iter']} x {old_doc['batch']['test_batch_size']} every 500 | "
        f"{old_total:.0f} s ({format_duration(old_total)}) by its own measure, "
        f"{old_doc['iterations_per_second']:.2f} it/s | {old['first']['after']:.1f} s | n/a |"
    )
    rows = [
        ("Command: `.venv/bin/python bench/first_job.py` (2 cores shared with other work, the bundled CPU pycaffe, "
         "`serve` without GPUs: the job trains on the CPU)."),
        "",
        "| job | batch | iterations | validation | to the end | time left first shown | validation accuracy |",
        "|---|---:|---:|---|---:|---:|---:|",
        new_row,
        old_row,
        "",
        f"Ratio of the two times to the end: {old_total / median:.0f}x.",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--old-seconds", type=float, default=150.0,
                        help="how long the old defaults train (their speed is measured over the last minute: past "
                        "the first, their first validation pass of 3200 images is out of it)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    runs, old = measure(args.rounds, args.old_seconds)
    body = table(runs, old)
    print(body)
    if not args.no_write:
        replace_section(REPO / "docs" / "benchmarks.md", "first-job", body)


if __name__ == "__main__":
    main()
