"""The local backend against the Ray backend on this machine: 20 short LeNet jobs on the CPU, two at a time.

For each backend the same jobs (4 iterations, a 2-batch test pass) are submitted at once to a job manager with two
CPU slots, and measured from its events:

* jobs started per minute: jobs / (the last attempt's start - the first submission), per minute;
* submission to first record: from `submit` returning to the job's first `job_progress` event, for the first job
  (a free slot: the backend's own start-up) and for all (median, p90: most wait in the queue for a slot);
* event delay: from a record's own time (the runner's clock) to its `job_progress` event (median, p90): for the
  Ray backend the Jobs API's log tail (Ray reads a job's log once a second) and ours on top of it;
* log read: the characters of the jobs' logs the server read from Ray.

The Ray backend three ways: as it is (the whole log while it is short, Ray's log-tail websocket past
TAIL_AFTER_CHARS), the tail from the start, and the whole log at every poll (without a tail). Then one longer job
(`--long-iterations`, a record per iteration) as it is and whole at every poll: reading the whole log at every
poll grows with the square of the job's length.

The Ray backend runs on a one-node Ray cluster started here (tests/test_jobs_ray.py's Cluster: `ray start --block`
with an agent), always stopped at the end.

    .venv/bin/python bench/scale.py [--jobs 20] [--long-iterations 1500] [--no-write]

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

from digits_memplugin.devices.reader import DeviceReader
from digits_memplugin.jobs.backends import ray as ray_backend
from digits_memplugin.jobs.backends.local import Backend, LocalBackend
from digits_memplugin.jobs.backends.ray import LogTail, RayBackend, RayError, RayJobsClient
from digits_memplugin.jobs.manager import JobManager, ManagerConfig

SLOTS = 2


class CountingClient(RayJobsClient):
    """The Jobs API client, counting the log characters it reads; `whole` refuses the tail (the fallback)."""

    def __init__(self, address: str, *, whole: bool) -> None:
        super().__init__(address)
        self.whole = whole
        self.read = 0

    def logs(self, submission_id: str) -> str:
        text = super().logs(submission_id)
        self.read += len(text)
        return text

    def tail(self, submission_id: str) -> LogTail:
        if self.whole:
            raise RayError("the bench reads the whole log at every poll")
        tail = super().tail(submission_id)
        client, read = self, tail.read

        def counted(timeout: float) -> str | None:
            chunk = read(timeout)
            client.read += len(chunk or "")
            return chunk

        tail.read = counted  # type: ignore[method-assign]
        return tail


def run(
    name: str, backend: Backend, data: Path, datasets: Path, jobs: int, iterations: int = 4
) -> dict[str, Any]:
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
            job = manager.submit(lenet_request(device="cpu", max_iter=iterations))
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
        "log_read": getattr(getattr(backend, "client", None), "read", None),
    }


def _p90(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.9 * len(values)) - 1)]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        (
            "| backend | jobs | started per minute | first job: submission to first record "
            "| all jobs: submission to first record (median / p90) | event delay (median / p90) | all done "
            "| log read by the server |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['backend']} | {row['jobs']} | {row['per_minute']:.1f} | {row['alone']:.2f} s "
            f"| {row['latency'][0]:.2f} s / "
            f"{row['latency'][1]:.2f} s | {row['delay'][0] * 1000:.0f} ms / {row['delay'][1] * 1000:.0f} ms "
            f"| {row['wall']:.0f} s | {_chars(row['log_read'])} |"
        )
    return "\n".join(lines)


def long_table(rows: list[dict[str, Any]], iterations: int) -> str:
    lines = [
        f"| one job of {iterations} iterations | time | log read by the server |",
        "|---|---:|---:|",
    ]
    lines += [f"| {row['backend']} | {row['wall']:.0f} s | {_chars(row['log_read'])} |" for row in rows]
    return "\n".join(lines)


def _chars(count: int | None) -> str:
    return "n/a" if count is None else f"{count / 1e6:.2f} M chars" if count >= 1e5 else f"{count / 1e3:.0f} k chars"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--long-iterations", type=int, default=1500)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mpscale", dir="/tmp"))
    datasets = base / "datasets"
    datasets.mkdir()
    write_lmdb(datasets / "mnist_train_lmdb")
    write_lmdb(datasets / "mnist_test_lmdb", records=8)
    rows = [run("local", LocalBackend(), base / "local", datasets, args.jobs)]
    long_rows: list[dict[str, Any]] = []
    shared = base / "shared"
    shared.mkdir()
    cluster = Cluster(base / "ray", shared)
    try:
        cluster.start_node("head", "1x8GiB", head=True)
        deadline = time.monotonic() + 90
        while not _answers(cluster.dashboard) and time.monotonic() < deadline:
            time.sleep(0.5)
        cluster.wait_ready(1)
        default = ray_backend.TAIL_AFTER_CHARS
        modes = {"ray": (default, False), "ray, tail from the start": (0, False),
                 "ray, whole log at every poll": (default, True)}
        try:
            for index, (name, (tail_after, whole)) in enumerate(modes.items()):
                ray_backend.TAIL_AFTER_CHARS = tail_after
                backend = RayBackend(cluster.dashboard, shared, client=CountingClient(cluster.dashboard, whole=whole))
                rows.append(run(name, backend, shared / f"short-{index}", datasets, args.jobs))
            ray_backend.TAIL_AFTER_CHARS = default
            for name in ("ray", "ray, whole log at every poll"):
                whole = modes[name][1]
                backend = RayBackend(cluster.dashboard, shared, client=CountingClient(cluster.dashboard, whole=whole))
                long_rows.append(run(name, backend, shared / f"long-{whole}", datasets, 1, args.long_iterations))
        finally:
            ray_backend.TAIL_AFTER_CHARS = default
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    text = table(rows) + "\n\n" + long_table(long_rows, args.long_iterations)
    print(text)
    if not args.no_write:
        command = "`.venv/bin/python bench/scale.py`"
        replace_section(REPO / "docs" / "benchmarks.md", "scale", f"{text}\n\n{command}, {time.strftime('%Y-%m-%d')}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
