"""Capped CPU attempts under every OpenBLAS kernel, through the REST API, and the watchdog on a really stuck child.

1. For each OPENBLAS_CORETYPE (unset: OpenBLAS's pick for this CPU; Haswell, SkylakeX, Zen; kernels this CPU
   cannot run are left out) and OPENBLAS_NUM_THREADS (1, 2): a standalone server (`digits-memplugin serve`) with
   that environment, which its training children inherit, and `--repeat` times the job of issue 12: LeNet on
   MNIST-shaped LMDBs, `POST /memplugin/api/jobs` with device "cpu", memory_cap "64MiB", batch 512 and
   fallback start "wanted" (so the first attempt really runs out of memory), max_iter 4. Reported: how the job
   ended, its attempts (outcome and signature), seconds from the POST to the end (median), and what the first
   attempt's BLAS warm-up found (kernel, threads, MiB mapped before the cap). Before the warm-up mapped every
   buffer, the SkylakeX kernels and every 2-thread run never ended (issue 12).
2. The watchdog: a child that maps OpenBLAS's buffer only after capping its data segment spins in OpenBLAS's
   allocation retry for ever; under AttemptProcess with `stall_seconds` S it must be ended and classified within
   S plus the time to read its stack. Reported per S: seconds from start to outcome, the outcome and signature.

Writes the tables into docs/benchmarks.md between the `capped` markers.

    .venv/bin/python bench/capped_attempts.py [--repeat 3] [--stalls 5,15] [--no-write]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import requests
from report import replace_section
from test_jobs_fixtures import BLAS_CORES, LENET, LENET_DATA, SHORT_SOLVER, write_lmdb
from test_jobs_restart import serve
from test_jobs_watchdog import BLAS_RETRY

from digits_memplugin.jobs.backends.attempt_process import AttemptProcess

JOB = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4,
       "memory_cap": "64MiB", "batch": 512, "fallback": {"start": "wanted"}, "name": "capped"}
JOB_BOUND = 180.0
"""Seconds a job may take before it counts as hung (the watchdog's default silence is 600 s)."""


def runnable_cores() -> list[str]:
    """The kernels of the tests' BLAS_CORES that this CPU can run (the others are marked skip there)."""
    return [param.values[0] for param in BLAS_CORES if not any(mark.args and mark.args[0] for mark in param.marks)]


def serve_with_data(folder: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """A server on MNIST-shaped LMDBs in its default dataset root; its process and its API's address."""
    data = folder / "data"
    (data / "datasets").mkdir(parents=True)
    write_lmdb(data / "datasets" / "mnist_train_lmdb", records=64)
    write_lmdb(data / "datasets" / "mnist_test_lmdb", records=16)
    server = serve(data, folder / "serve.log", env=env)
    return server.process, server.api("")


def one_job(api: str, data: Path) -> dict[str, Any]:
    started = time.monotonic()
    response = requests.post(f"{api}/jobs", json=JOB, timeout=30)
    response.raise_for_status()
    job_id = response.json()["id"]
    document: dict[str, Any] = {}
    while time.monotonic() - started < JOB_BOUND:
        document = requests.get(f"{api}/jobs/{job_id}", timeout=30).json()
        if document["status"] in ("done", "failed", "cancelled"):
            break
        time.sleep(0.2)
    seconds = time.monotonic() - started
    if document.get("status") not in ("done", "failed", "cancelled"):
        requests.post(f"{api}/jobs/{job_id}/cancel", timeout=30)
    first = data / "jobs" / job_id / "attempts" / "1" / "progress.jsonl"
    blas = json.loads(first.read_text().splitlines()[0]).get("blas") if first.is_file() else None
    attempts = [
        a["status"] + (f" ({a['out_of_memory']['signature']})" if a.get("out_of_memory") else "")
        for a in document.get("attempts", [])
    ]
    return {"status": document.get("status", "?"), "attempts": attempts, "seconds": seconds, "blas": blas}


def kernels(repeat: int) -> list[dict[str, Any]]:
    rows = []
    for core in runnable_cores():
        for threads in (1, 2):
            env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads)}
            env.pop("OPENBLAS_CORETYPE", None)
            if core:
                env["OPENBLAS_CORETYPE"] = core
            with tempfile.TemporaryDirectory(prefix="memplugin-capped-") as folder:
                process, api = serve_with_data(Path(folder), env)
                try:
                    runs = [one_job(api, Path(folder) / "data") for _ in range(repeat)]
                finally:
                    process.terminate()
                    process.wait(30)
            rows.append({"core": core or "(unset)", "threads": threads, "runs": runs})
            print(rows[-1]["core"], threads, [(r["status"], r["attempts"], round(r["seconds"], 1)) for r in runs],
                  flush=True)
    return rows


def watchdog(stalls: list[float]) -> list[dict[str, Any]]:
    rows = []
    for stall in stalls:
        with tempfile.TemporaryDirectory(prefix="memplugin-stall-") as folder:
            (Path(folder) / "child.py").write_text(BLAS_RETRY)
            process = AttemptProcess(
                Path(folder), "attempt.json", "caffe.log", environment={"OPENBLAS_NUM_THREADS": "1"},
                stall_seconds=stall, command=[sys.executable, str(Path(folder) / "child.py")],
            )
            started = time.monotonic()
            process.start()
            result = process.wait()
            seconds = time.monotonic() - started
        found = result.outcome.out_of_memory
        rows.append({"stall": stall, "seconds": seconds, "status": result.outcome.status,
                     "signature": found.signature if found else None})
        print(rows[-1], flush=True)
    return rows


def table(kernel_rows: list[dict[str, Any]], watchdog_rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        f"Command: `{command}` ({os.cpu_count()} cores; gdb {'found' if shutil.which('gdb') else 'missing'}).",
        "",
        ("The job of issue 12 through REST (LeNet, CPU, memory_cap 64MiB, batch 512, start \"wanted\", max_iter 4), "
         "each kernel and thread count in a server of its own:"),
        "",
        "| OPENBLAS_CORETYPE | threads | jobs done | attempts (each run) | seconds to done, median | warm-up: kernel, MiB mapped |",
        "|---|---:|---:|---|---:|---|",
    ]
    for row in kernel_rows:
        runs = row["runs"]
        done = sum(run["status"] == "done" for run in runs)
        patterns = collections.Counter(" → ".join(run["attempts"]) for run in runs)
        attempts = "; ".join(f"{pattern} (x{count})" for pattern, count in patterns.items())
        blas = runs[0]["blas"] or {}
        mapped = f"{blas.get('core')}, {blas.get('mapped_bytes', 0) / (1 << 20):.1f}" if blas else "n/a"
        median = statistics.median(run["seconds"] for run in runs)
        lines.append(f"| {row['core']} | {row['threads']} | {done} of {len(runs)} | {attempts} | {median:.1f} | {mapped} |")
    lines += [
        "",
        "The watchdog on a child spinning in OpenBLAS's allocation retry (no warm-up, then a cap):",
        "",
        "| stall_seconds | seconds to outcome | outcome | signature |",
        "|---:|---:|---|---|",
    ]
    for row in watchdog_rows:
        lines.append(f"| {row['stall']:g} | {row['seconds']:.1f} | {row['status']} | {row['signature'] or '-'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stalls", default="5,15")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    kernel_rows = kernels(args.repeat)
    watchdog_rows = watchdog([float(s) for s in args.stalls.split(",")])
    command = ".venv/bin/python bench/capped_attempts.py" + (f" --repeat {args.repeat}" if args.repeat != 3 else "")
    text = table(kernel_rows, watchdog_rows, command)
    print(text)
    if not args.no_write:
        replace_section(REPO / "docs" / "benchmarks.md", "capped", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
