"""The local backend against the Ray backend on this machine: 20 short LeNet jobs on the CPU, two at a time.

For each backend the same jobs (4 iterations, a 2-batch test pass) are submitted at once to a job manager with two
CPU slots, and measured from its events:

* jobs started per minute: jobs / (the last attempt's start - the first submission), per minute;
* submission to first record: from `submit` returning to the job's first `job_progress` event, for the first job
  (a free slot: the backend's own start-up) and for all (median, p90: most wait in the queue for a slot);
* event delay: from a record's own time (the runner's clock) to its `job_progress` event (median, p90): for the
  Ray backend the Jobs API's log polling (Ray reads a job's log once a second) and ours on top of it.

The Ray backend runs on a one-node Ray cluster started here (tests/test_jobs_ray.py's Cluster: `ray start --block`
with an agent), always stopped at the end.

    .venv/bin/python bench/scale.py [--jobs 20] [--no-write]

Writes the table into docs/benchmarks.md between the `scale` markers.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from report import replace_section
from test_jobs_fixtures import lenet_request, write_lmdb
from test_jobs_ray import Cluster, _answers

from digits_memplugin.devices import DeviceReader
from digits_memplugin.jobs.backend import Backend, LocalBackend
from digits_memplugin.jobs.manager import JobManager, ManagerConfig
from digits_memplugin.jobs.ray_backend import RayBackend

SLOTS = 2


def run(name: str, backend: Backend, data: Path, datasets: Path, jobs: int) -> dict[str, Any]:
    lock = threading.Lock()
    first_record: dict[str, float] = {}
    started: dict[str, float] = {}
    delays: list[float] = []

    def on_event(event: str, payload: dict[str, Any]) -> None:
        now = time.time()
        with lock:
            if event == "job_progress":
                first_record.setdefault(payload["job_id"], now)
                if isinstance(payload.get("time"), (int, float)):
                    delays.append(now - payload["time"])
            elif event == "job_attempt" and payload.get("status") == "running":
                started.setdefault(payload["job_id"], now)

    manager = JobManager(
        ManagerConfig(data_dir=data, dataset_roots=(datasets,), jobs_per_cpu=SLOTS, poll_seconds=0.2,
                      stall_seconds=None),
        DeviceReader(), on_event=on_event, backend=backend,
    )
    manager.start()
    try:
        submitted: dict[str, float] = {}
        for _ in range(jobs):
            job = manager.submit(lenet_request(device="cpu", max_iter=4))
            submitted[job.id] = time.time()
        ends = [manager.wait(job_id, timeout=900) for job_id in submitted]
    finally:
        manager.stop()
    failed = [job.message for job in ends if job.status != "done"]
    if failed:
        raise SystemExit(f"{name}: {len(failed)} job(s) did not finish: {failed[:3]}")
    latencies = [first_record[job_id] - at for job_id, at in submitted.items()]
    span = max(started.values()) - min(submitted.values())
    return {
        "backend": name, "jobs": jobs, "per_minute": jobs / span * 60,
        "latency": (statistics.median(latencies), _p90(latencies)), "alone": latencies[0],
        "delay": (statistics.median(delays), _p90(delays)),
        "wall": max(job.finished_at or 0 for job in ends) - min(submitted.values()),
    }


def _p90(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.9 * len(values)) - 1)]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        (
            "| backend | jobs | started per minute | first job: submission to first record "
            "| all jobs: submission to first record (median / p90) | event delay (median / p90) | all done |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['backend']} | {row['jobs']} | {row['per_minute']:.1f} | {row['alone']:.2f} s "
            f"| {row['latency'][0]:.2f} s / "
            f"{row['latency'][1]:.2f} s | {row['delay'][0] * 1000:.0f} ms / {row['delay'][1] * 1000:.0f} ms "
            f"| {row['wall']:.0f} s |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mpscale", dir="/tmp"))
    datasets = base / "datasets"
    datasets.mkdir()
    write_lmdb(datasets / "mnist_train_lmdb")
    write_lmdb(datasets / "mnist_test_lmdb", records=8)
    rows = [run("local", LocalBackend(), base / "local", datasets, args.jobs)]
    shared = base / "shared"
    shared.mkdir()
    cluster = Cluster(base / "ray", shared)
    try:
        cluster.start_node("head", "1x8GiB", head=True)
        deadline = time.monotonic() + 90
        while not _answers(cluster.dashboard) and time.monotonic() < deadline:
            time.sleep(0.5)
        cluster.wait_ready(1)
        rows.append(run("ray", RayBackend(cluster.dashboard, shared), shared, datasets, args.jobs))
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    text = table(rows)
    print(text)
    if not args.no_write:
        command = "`.venv/bin/python bench/scale.py`"
        replace_section(REPO / "docs" / "benchmarks.md", "scale", f"{text}\n\n{command}, {time.strftime('%Y-%m-%d')}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
