"""What reading datasets in reader processes costs, and what the scan does with the issue's long HDF5 lists.

Side by side in one run, on the same files: an LMDB's facts and a 10-file HDF5 list's facts read in this process
(lmdb_reads.py's `_read_lmdb` / hdf5_reads.py's `_read_hdf5`, what the server did before issue 23) and through a
warm reader (`lmdb_info` / `hdf5_info`: a JSON round trip over pipes); a new reader's start; then
`dataset_scan.scan` of a root holding the issue's 200 KB list (one file named 40,000 times) and a list of 40,000
different names of one file.

Writes the table into docs/benchmarks.md between the `dataset-reads` markers.

    .venv/bin/python bench/dataset_reads.py [--rounds 30] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

import h5py
import numpy as np
from report import replace_section
from test_jobs_fixtures import write_lmdb

from digits_memplugin.estimate import dataset_reader, dataset_scan, datasets, hdf5_reads, lmdb_reads

LINES = 40_000


def median_ms(call: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def build(root: Path) -> None:
    write_lmdb(root / "mnist_lmdb", records=1000)
    (root / "h5").mkdir()
    for index in range(10):
        with h5py.File(root / "h5" / f"part{index}.h5", "w") as h5:
            h5["data"] = np.zeros((100, 1, 28, 28), dtype=np.float32)
    (root / "h5" / "list.txt").write_text("".join(f"part{index}.h5\n" for index in range(10)))
    for name in ("same", "names"):
        (root / name).mkdir()
        with h5py.File(root / name / "one.h5", "w") as h5:
            h5["data"] = np.zeros((4, 1, 28, 28), dtype=np.float32)
    (root / "same" / "list.txt").write_text("one.h5\n" * LINES)
    (root / "names" / ".l").mkdir()
    for index in range(LINES):
        os.symlink("../one.h5", root / "names" / ".l" / f"{index}.h5")
    (root / "names" / "list.txt").write_text("".join(f".l/{index}.h5\n" for index in range(LINES)))


def measure(rounds: int) -> str:
    with tempfile.TemporaryDirectory(prefix="memplugin-reads-") as folder:
        root = Path(folder)
        build(root)
        roots = [root]
        lmdb_here = median_ms(lambda: lmdb_reads._read_lmdb(root / "mnist_lmdb", "", roots, "mnist_lmdb"), rounds)
        h5_here = median_ms(
            lambda: hdf5_reads._read_hdf5(root / "h5" / "list.txt", "list", ["data"], "", roots, time.monotonic() + 60),
            rounds,
        )
        datasets.lmdb_info(root / "mnist_lmdb", "", roots)  # a warm reader
        lmdb_reader = median_ms(lambda: datasets.lmdb_info(root / "mnist_lmdb", "", roots), rounds)
        h5_reader = median_ms(lambda: datasets.hdf5_info(root / "h5" / "list.txt", ["data"], "", roots), rounds)

        def fresh() -> None:
            pool = dataset_reader._Pool(1)
            pool.run("lmdb", {"path": str(root / "mnist_lmdb"), "layer": "", "name": "m", "roots": None}, 30)
            pool.close()

        start = median_ms(fresh, max(3, rounds // 10))
        scans = []
        for name in ("same", "names"):
            began = time.perf_counter()
            scan = dataset_scan.scan([root / name])
            took = time.perf_counter() - began
            (row,) = scan.datasets
            outcome = f"{row.entries} entries, read in full" if row.error is None else f"cut short: {row.error}"
            scans.append((name, took, outcome + ("" if scan.truncated is None else "; `truncated` says so")))
    lines = [
        ("Command: `.venv/bin/python bench/dataset_reads.py` (2 cores shared; medians of "
        f"{rounds} reads, the same files side by side)."),
        "",
        "| read | in this process | through a warm reader | ratio |",
        "|---|---:|---:|---:|",
        (f"| LMDB, 1000 records: first Datum, count, size | {lmdb_here:.2f} ms | {lmdb_reader:.2f} ms | "
        f"{lmdb_reader / lmdb_here:.1f}x |"),
        f"| HDF5 list of 10 files | {h5_here:.2f} ms | {h5_reader:.2f} ms | {h5_reader / h5_here:.1f}x |",
        "",
        f"A new reader's start (imports, confinement, first read): {start:.0f} ms (median of {max(3, rounds // 10)}).",
        "",
        "| the scan of a root holding (3 s bound) | took | outcome |",
        "|---|---:|---|",
    ]
    for name, took, outcome in scans:
        what = "one file named 40,000 times (the issue's 200 KB list)" if name == "same" else (
            "40,000 different names of one file (links)")
        lines.append(f"| {what} | {took:.2f} s | {outcome} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    table = measure(args.rounds)
    print(table)
    if not args.no_write:
        replace_section(REPO / "docs" / "benchmarks.md", "dataset-reads", table)


if __name__ == "__main__":
    main()
