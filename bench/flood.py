"""/devices latency while clients post large nets to /api/estimate (issue 18, item 7; docs/security.md, "Floods and
storage").

Starts `digits-memplugin serve --port 0` on 127.0.0.1 with a fresh data folder, then `--clients` clients each POST
the issue's net (400,000 `dim:` entries, 2.7 MiB, made unique by a comment so no cache answers it) `--posts` times,
while a probe GETs /api/devices every 50 ms. Prints the estimates' statuses and times and the probe's latencies.

    .venv/bin/python bench/flood.py [--clients 4] [--posts 2]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

NET = 'layer { name: "d" type: "Input" top: "x" input_param { shape { ' + "dim: 1 " * 400_000 + "} } }\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--posts", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "serve.log"
        script = Path(sys.executable).parent / "digits-memplugin"
        with log.open("wb") as sink:
            server = subprocess.Popen(
                [script, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(Path(folder) / "data")],
                stdout=sink, stderr=subprocess.STDOUT,
            )
        try:
            while not (match := re.search(r"serving on (http://127\.0\.0\.1:\d+/)", log.read_text())):
                if server.poll() is not None:
                    sys.exit(log.read_text())
                time.sleep(0.1)
            run(match.group(1) + "memplugin/api", args.clients, args.posts)
        finally:
            server.terminate()
            server.wait(30)
    return 0


def run(api: str, clients: int, posts: int) -> None:
    requests.get(api + "/devices", timeout=60)
    latencies: list[float] = []
    answers: list[tuple[int, float]] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            requests.get(api + "/devices", timeout=300)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.05)

    def client(index: int) -> None:
        for post in range(posts):
            started = time.perf_counter()
            answer = requests.post(api + "/estimate", json={"net": f"# {index} {post} {time.time()}\n" + NET}, timeout=600)
            answers.append((answer.status_code, round(time.perf_counter() - started, 2)))

    prober = threading.Thread(target=probe)
    prober.start()
    time.sleep(0.5)
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - started
    done.set()
    prober.join()
    latencies.sort()
    print(f"{clients} clients x {posts} posts of {len(NET) / 2**20:.1f} MiB in {took:.1f} s: (status, seconds) {answers}")
    print(f"/devices: {len(latencies)} requests, median {statistics.median(latencies) * 1000:.0f} ms, "
          f"p95 {latencies[int(len(latencies) * 0.95) - 1] * 1000:.0f} ms, slowest {latencies[-1] * 1000:.0f} ms")


if __name__ == "__main__":
    sys.exit(main())
