"""What confining a training attempt costs (jobs.child.confinement, Landlock), measured side by side in one run.

* `confine_attempt` itself, in a fresh child process, for 2, 256 and 4096 dataset read paths (each a file opened a
  component at a time without following links, then one Landlock rule): median of 7 children each.
* The same LeNet attempt (the runner and pycaffe, 200 iterations on the CPU, one BLAS thread) run by the real
  runner confined and unconfined (a seccomp filter makes the Landlock calls answer ENOSYS, as on a kernel without
  it), alternately, 5 times each: median CPU time (user + system) of the child, which a shared machine's load
  changes far less than its wall time, and their ratio.

    .venv/bin/python bench/confinement.py [--runs 5] [--no-write]

Writes the table into docs/benchmarks.md between the `confinement` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from test_jobs_confinement import WITHOUT_LANDLOCK
from test_jobs_fixtures import lenet_request, write_lmdb

from digits_memplugin.confine import landlock
from digits_memplugin.devices.reader import DeviceReader
from digits_memplugin.jobs.manager import JobManager, ManagerConfig

CONFINE = r"""
import json, sys, time
from digits_memplugin.jobs.child.confinement import confine_attempt
reads = json.load(open(sys.argv[2]))
started = time.perf_counter()
done = confine_attempt(sys.argv[1], reads, ["outputs", "snapshots", "data/lmdb", "attempts/1"])
print(json.dumps({"ms": (time.perf_counter() - started) * 1000, "rules": done.rules}))
"""


def confine_cost(tmp: Path, counts: list[int]) -> list[tuple[int, float, int]]:
    job = tmp / "job"
    for sub in ("outputs", "snapshots", "data/lmdb", "attempts/1"):
        (job / sub).mkdir(parents=True)
    files = tmp / "datasets" / "h5"
    files.mkdir(parents=True)
    for index in range(max(counts)):
        (files / f"{index}.h5").write_bytes(b"x")
    rows = []
    for count in counts:
        (tmp / "reads.json").write_text(json.dumps([str(files / f"{i}.h5") for i in range(count)]))
        runs = [
            json.loads(subprocess.run([sys.executable, "-c", CONFINE, str(job), str(tmp / "reads.json")],
                                      capture_output=True, text=True, check=True, timeout=120).stdout)
            for _ in range(7)
        ]
        rows.append((count, statistics.median(run["ms"] for run in runs), runs[0]["rules"]))
    return rows


def attempt_times(tmp: Path, runs: int) -> dict[str, list[float]]:
    """The same attempt's folder, run again by the real runner, confined and not, alternately."""
    datasets = tmp / "lenet_datasets"
    datasets.mkdir()
    write_lmdb(datasets / "mnist_train_lmdb", records=256)
    write_lmdb(datasets / "mnist_test_lmdb", records=64)
    manager = JobManager(ManagerConfig(data_dir=tmp / "data", dataset_roots=(datasets,)), DeviceReader())
    manager.start()
    try:
        job = manager.wait(manager.submit(lenet_request(max_iter=200)).id, timeout=600)
        folder = manager.folder(job.id)
    finally:
        manager.stop()
    if job.status != "done":
        raise SystemExit(f"the LeNet job did not train: {job.message}")
    commands = {
        "confined": [sys.executable, "-m", "digits_memplugin.jobs.child.runner", "attempts/1/attempt.json"],
        "unconfined": [sys.executable, "-c", WITHOUT_LANDLOCK, "digits_memplugin.jobs.child.runner", "attempts/1/attempt.json"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "GLOG_logtostderr": "1"}
    for _ in range(runs):
        for name, command in commands.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            records = [json.loads(line) for line in done.stdout.splitlines()]
            if done.returncode != 0 or records[-1]["event"] != "finished":
                raise SystemExit(f"{name} attempt failed: {done.stdout[-500:]}")
            if records[0]["confinement"]["confined"] is not (name == "confined"):
                raise SystemExit(f"{name} attempt: {records[0]['confinement']}")
            times[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return times


def table(costs: list[tuple[int, float, int]], times: dict[str, list[float]], runs: int) -> str:
    lines = ["| dataset read paths | Landlock rules | `confine_attempt` (median of 7) |", "|---:|---:|---:|"]
    lines += [f"| {count} | {rules} | {ms:.1f} ms |" for count, ms, rules in costs]
    confined, unconfined = (statistics.median(times[name]) for name in ("confined", "unconfined"))
    lines += [
        "",
        f"| LeNet attempt, 200 iterations, CPU, 1 BLAS thread ({runs} runs each, alternately) | median CPU time |",
        "|---|---:|",
        f"| confined (Landlock ABI {landlock.abi()}) | {confined:.2f} s |",
        f"| unconfined (Landlock calls answer ENOSYS) | {unconfined:.2f} s |",
        f"| ratio confined / unconfined | {confined / unconfined:.3f} |",
        "",
        f"`.venv/bin/python bench/confinement.py --runs {runs}`, {time.strftime('%Y-%m-%d')}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if landlock.abi() < 1:
        raise SystemExit(f"no Landlock here: {landlock.unavailable()}")
    with tempfile.TemporaryDirectory(prefix="memplugin-confinement-") as folder:
        text = table(confine_cost(Path(folder), [2, 256, 4096]), attempt_times(Path(folder), args.runs), args.runs)
    print(text)
    if not args.no_write:
        doc = REPO / "docs" / "benchmarks.md"
        content = doc.read_text()
        start, end = "<!-- confinement:begin -->", "<!-- confinement:end -->"
        before, _, rest = content.partition(start)
        _, _, after = rest.partition(end)
        doc.write_text(f"{before}{start}\n{text}\n{end}{after}")


if __name__ == "__main__":
    main()
