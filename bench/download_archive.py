"""What sending the trained model costs the server's one thread: jobs/model_files.tar_gz over an AlexNet-sized
weights file (60 M float32 values, 229 MiB, random like trained weights) with the small text members an archive
has, the weights stored (as it is written) and deflated at zlib level 1 (as it was first written), alternately in
one run. The longest stretch between two chunks is how long the server's other requests wait at worst (the
generator yields to gevent's hub between chunks); the total is the thread's time for the whole download.

Writes the table into docs/benchmarks.md between the `download-archive` markers.

    .venv/bin/python bench/download_archive.py [--runs 5] [--no-write]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import numpy as np
from report import replace_section

from digits_memplugin.jobs.definition import model_files
from digits_memplugin.jobs.definition.model_files import Member, OpenFile, tar_gz

VALUES = 60_000_000
"""float32 values in the weights: AlexNet has about 61 M parameters."""


def one(weights: Path, level: int) -> tuple[float, float, int]:
    """(seconds in all, longest seconds between two chunks, bytes out) for one archive with the weights at `level`."""
    model_files.STORED = level
    fd = os.open(weights, os.O_RDONLY)
    members = [Member("train_val.prototxt", b'layer { name: "x" }\n' * 200),
               Member(weights.name, file=OpenFile(fd, os.fstat(fd).st_size, weights.name, 0)),
               Member("info.json", b"{}\n")]
    start = last = time.perf_counter()
    longest = 0.0
    out = 0
    for chunk in tar_gz(members):
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
        out += len(chunk)
    return time.perf_counter() - start, longest, out


def check(weights: Path) -> None:
    """The archive reads back: the weights as they are."""
    model_files.STORED = 0
    fd = os.open(weights, os.O_RDONLY)
    data = b"".join(tar_gz([Member(weights.name, file=OpenFile(fd, os.fstat(fd).st_size, weights.name, 0))]))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        member = archive.extractfile(weights.name)
        assert member is not None and member.read() == weights.read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / "alexnet_iter_1000.caffemodel"
        np.random.default_rng(0).standard_normal(VALUES, dtype=np.float32).tofile(weights)
        check(weights)
        results: dict[int, list[tuple[float, float, int]]] = {0: [], 1: []}
        for _ in range(args.runs):
            for level in (0, 1):
                results[level].append(one(weights, level))
        size = weights.stat().st_size
    model_files.STORED = 0
    rows = []
    for level, label in ((0, "weights stored (as written)"), (1, "weights deflated, zlib level 1 (before)")):
        total = statistics.median(run[0] for run in results[level])
        longest = statistics.median(run[1] for run in results[level])
        out = results[level][0][2]
        rows.append((label, total, longest, out))
    ratio_total = rows[1][1] / rows[0][1]
    ratio_longest = rows[1][2] / rows[0][2]
    load = os.getloadavg()[0]
    body = "\n".join([
        f"| {size / 2**20:.0f} MiB of weights, medians of {args.runs} runs each, alternately | in all | longest between two chunks | archive |",
        "|---|---:|---:|---:|",
        *(f"| {label} | {total:.2f} s | {longest * 1000:.0f} ms | {out / 2**20:.0f} MiB |" for label, total, longest, out in rows),
        f"| ratio before / now | {ratio_total:.1f} | {ratio_longest:.1f} | |",
        "",
        (f"`.venv/bin/python bench/download_archive.py --runs {args.runs}`, {time.strftime('%Y-%m-%d')}, load "
         f"average {load:.1f} on this shared 2-core machine."),
    ])
    print(body)
    if not args.no_write:
        replace_section(REPO / "docs" / "benchmarks.md", "download-archive", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
