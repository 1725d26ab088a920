"""/devices latency, the server's memory and its pycaffe children during loads within the documented limits, the
code before a change and after it side by side (issue 18, item 7; issue 23, items 3, 4 and 7; docs/security.md,
"Floods and storage").

Each run starts `digits-memplugin serve --port 0` on 127.0.0.1 with a fresh data folder, probes GET /api/devices
every 50 ms, and makes one attack:

- `big-net`: `--clients` clients each POST the issue 18 net (400,000 `dim:` entries, 2.7 MiB, new to every cache)
  `--posts` times;
- `subscribe`: 1000 jobs stored; ten socket.io clients (websocket, in a process of their own) each send 40
  `subscribe_jobs` {"limit": 500} at once (the 400-event burst the limits allow), then wait until each is told
  `rate_limited` or, once pages came, nothing comes for 5 s (the pages counted are those the clients received by
  then);
- `subscribe-rate`: the same clients each send 20 `subscribe_jobs` {"limit": 500} a second for 5 s (each within its
  20 a second), then wait until nothing comes for 5 s: the backlog is how long after the last event was sent a
  /devices answer still took more than 0.5 s;
- `unrolled`: one POST of twelve LSTM layers over 500 timesteps (1.5 KB, 36,000 layers to set up), then one of four
  LSTM layers asked for eight curve points near 500 timesteps (0.8 KB, 96,000 layers): the server's resident
  memory before and after both;
- `pycaffe`: 30 clients at once POST a net with a Pad layer (no rule: pycaffe shapes it in a child process); the
  most pycaffe children alive at once below the server is sampled every 20 ms;
- `hdf5-list-job`: three POST /api/jobs, one after the other, of LeNet reading an HDF5 list of 40,000 lines (one
  file under 40,000 names), then the form's preview and Create (models/preview.json, models.json) with the same
  list ending in a file outside the roots (a 400); the jobs made are cancelled;
- `lstm-jobs`: ten clients at once POST /api/jobs with the issue's 8 KB LSTM net (70 layers over 500 timesteps:
  its build stops at the 50,000-layer limit, a 400), then one small LSTM job (six layers) with batch "auto" is
  submitted and waited for until the scheduler has placed it;
- `issue-sizes` (not in `all`): the issue's own nets, 55 LSTM layers over 500 timesteps (6 KB), then 18 LSTM layers
  with eight curve points near 500 timesteps (2 KB), and the server's memory before and after.

`--before REV` runs every attack on that revision too (its package extracted with `git archive` and put first on
the server's PYTHONPATH), alternating with the working tree's, `--runs` times each; the tables give each figure's
median over the runs and the ratio before / after. Writes them into docs/benchmarks.md between the `flood` markers
(`flood-ATTACK` for one attack) unless `--no-write`.

    .venv/bin/python bench/flood.py [--attack all|big-net|subscribe|subscribe-rate|unrolled|pycaffe|hdf5-list-job|
        lstm-jobs|issue-sizes]
        [--runs 3] [--before REV] [--clients 4] [--posts 2] [--no-write]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import requests
from load_cases import (
    EIGHT_KB_LSTM_LAYERS,
    PAD_NET,
    Probe,
    counting_children,
    descendants,
    hdf5_lenet,
    long_hdf5_list,
    lstm_net,
    probing,
    rss_bytes,
    seed_jobs,
    socket_attack_apart,
)
from report import replace_section
from test_jobs_fixtures import SHORT_SOLVER

BIG_NET = 'layer { name: "d" type: "Input" top: "x" input_param { shape { ' + "dim: 1 " * 400_000 + "} } }\n"
UNROLLED_NET = lstm_net(12, 500)
CURVED_NET = lstm_net(4, 6)
CURVE = list(range(493, 501))
STORED_JOBS = 1000

Figures = dict[str, float]


class Server:
    """`digits-memplugin serve` on a data folder, importing the package from `code` when given."""

    def __init__(self, data: Path, code: Path | None) -> None:
        log = data.parent / f"serve-{time.time_ns()}.log"
        env = {**os.environ, **({"PYTHONPATH": str(code)} if code else {})}
        script = Path(sys.executable).parent / "digits-memplugin"
        with log.open("wb") as sink:
            # Not in the repository: its children run `python -m digits_memplugin...`, which puts the current folder
            # first on their path, before PYTHONPATH.
            self.process = subprocess.Popen(
                [script, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data)],
                stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=data.parent,
            )
        deadline = time.monotonic() + 120
        while not (match := re.search(r"serving on (http://127\.0\.0\.1:\d+/)", log.read_text())):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        self.url = match.group(1)
        self.api = self.url + "memplugin/api"
        requests.get(self.api + "/devices", timeout=60)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def post_all(url: str, bodies: list[dict[str, Any]]) -> list[requests.Response]:
    answers: list[requests.Response] = []
    threads = [threading.Thread(target=lambda body=body: answers.append(requests.post(url, json=body, timeout=900)))
               for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(900)
    return answers


def statuses(answers: list[requests.Response]) -> dict[str, float]:
    return {f"answers {code}": float(sum(a.status_code == code for a in answers))
            for code in sorted({a.status_code for a in answers})}


# ============================================================================ the attacks


def big_net(server: Server, args: argparse.Namespace, probe: Probe) -> Figures:
    bodies = [{"net": f"# {index} {post} {time.time_ns()}\n" + BIG_NET}
              for index in range(args.clients) for post in range(args.posts)]
    started = time.monotonic()
    answers = post_all(server.api + "/estimate", bodies)
    return {"attack s": time.monotonic() - started, **statuses(answers)}


def socket_figures(got: dict[str, Any]) -> Figures:
    return {"attack s": float(got["seconds"]), "events sent": float(got["sent"]),
            "pages answered": float(got["pages"]), "rate_limited": float(got["rate_limited"])}


def subscribe(server: Server, args: argparse.Namespace, probe: Probe) -> Figures:
    return socket_figures(socket_attack_apart(server.url, clients=10, events=40, limit=500, quiet=5, timeout=300))


def subscribe_rate(server: Server, args: argparse.Namespace, probe: Probe) -> Figures:
    got = socket_attack_apart(server.url, clients=10, events=100, per_second=20, limit=500, quiet=5, timeout=300)
    slow_until = probe.slow_until(0.5)
    backlog = max(0.0, slow_until - got["sent_at"]) if slow_until is not None else 0.0
    return {**socket_figures(got), "backlog s": backlog}


def unrolled(server: Server, args: argparse.Namespace, probe: Probe) -> Figures:
    before = rss_bytes(server.process.pid)
    started = time.monotonic()
    first = requests.post(server.api + "/estimate", json={"net": UNROLLED_NET}, timeout=900)
    second = requests.post(server.api + "/estimate", json={"net": CURVED_NET, "curve_batches": CURVE}, timeout=900)
    took = time.monotonic() - started
    workers = [pid for pid in descendants(server.process.pid) if _is_worker(pid)]
    return {
        "attack s": took, **statuses([first, second]),
        "server RSS before MB": before / 2**20, "server RSS after MB": rss_bytes(server.process.pid) / 2**20,
        "workers' RSS after MB": sum(_rss_or_zero(pid) for pid in workers) / 2**20,
    }


def issue_sizes(server: Server, args: argparse.Namespace, probe: Probe) -> Figures:
    """The issue's own sizes: 55 LSTM layers over 500 timesteps (6 KB; after the fix a 400 from a worker, the build
    being past 50,000 layers), then 18 LSTM layers asked for eight curve points near 500 timesteps (2 KB)."""
    before = rss_bytes(server.process.pid)
    started = time.monotonic()
    first = requests.post(server.api + "/estimate", json={"net": lstm_net(55, 500, "six")}, timeout=900)
    second = requests.post(server.api + "/estimate", json={"net": lstm_net(18, 6, "two"), "curve_batches": CURVE},
                           timeout=900)
    return {
        "attack s": time.monotonic() - started, **statuses([first, second]),
        "server RSS before MB": before / 2**20, "server RSS after MB": rss_bytes(server.process.pid) / 2**20,
    }


def _is_worker(pid: int) -> bool:
    try:
        return b"digits_memplugin.estimate.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _rss_or_zero(pid: int) -> int:
    try:
        return rss_bytes(pid)
    except OSError:
        return 0


def pycaffe(server: Server, args: argparse.Namespace, probe: Probe) -> Figures:
    with counting_children(server.process.pid) as most:
        started = time.monotonic()
        answers = post_all(server.api + "/estimate", [{"net": PAD_NET}] * 30)
        took = time.monotonic() - started
    return {"attack s": took, **statuses(answers), "pycaffe children at once": float(most[0])}


def hdf5_list_job(server: Server, args: argparse.Namespace, probe: Probe) -> Figures:
    body = {"net": hdf5_lenet("long.txt"), "solver": SHORT_SOLVER, "data": {"test": "mnist_test_lmdb"},
            "device": "cpu", "max_iter": 2}
    form = {"model_name": "long", "data_backend": "hdf5", "train_source": "long_out.txt", "val_source": "good.txt",
            "device": "cpu", "batch_size": "4", "max_iter": 2}
    started = time.monotonic()
    answers = [requests.post(server.api + "/jobs", json=body, timeout=900) for _ in range(3)]
    took = time.monotonic() - started
    answers += [requests.post(server.url + f"memplugin/models{path}", json=form, timeout=900)
                for path in ("/preview.json", ".json")]
    for answer in answers:
        if answer.status_code == 201:
            requests.post(server.api + f"/jobs/{answer.json()['id']}/cancel", timeout=60)
    return {"3 submissions s": took, "attack s": time.monotonic() - started, **statuses(answers)}


def lstm_jobs(server: Server, args: argparse.Namespace, probe: Probe) -> Figures:
    started = time.monotonic()
    body = {"solver": SHORT_SOLVER, "device": "cpu", "max_iter": 2}
    answers = post_all(server.api + "/jobs", [{**body, "net": lstm_net(EIGHT_KB_LSTM_LAYERS, 500, f"try {n}")}
                                              for n in range(10)])
    took = time.monotonic() - started
    made = requests.post(server.api + "/jobs", json={**body, "net": lstm_net(6, 500), "batch": "auto"}, timeout=900)
    placed = float("nan")
    if made.status_code == 201:
        job = made.json()["id"]
        while time.monotonic() - started < 900:
            if requests.get(server.api + f"/jobs/{job}", timeout=60).json()["status"] != "queued":
                placed = time.monotonic() - started - took
                break
            time.sleep(0.2)
        requests.post(server.api + f"/jobs/{job}/cancel", timeout=60)
    return {"10 submissions s": took, "small job placed after s": placed, **statuses(answers)}


ATTACKS: dict[str, Callable[[Server, argparse.Namespace, Probe], Figures]] = {
    "big-net": big_net, "subscribe": subscribe, "subscribe-rate": subscribe_rate, "unrolled": unrolled,
    "pycaffe": pycaffe, "hdf5-list-job": hdf5_list_job, "lstm-jobs": lstm_jobs, "issue-sizes": issue_sizes,
}
IN_ALL = ("big-net", "subscribe", "subscribe-rate", "unrolled", "pycaffe", "hdf5-list-job", "lstm-jobs")
"""What `--attack all` runs (issue-sizes takes a minute a run before the fix: asked for by name)."""


# ============================================================================ runs


def run_once(attack: str, args: argparse.Namespace, code: Path | None, seeded: Path, work: Path) -> Figures:
    data = work / f"data-{time.time_ns()}"
    if attack.startswith("subscribe"):
        shutil.copytree(seeded, data)
    elif attack == "hdf5-list-job":
        shutil.copytree(work / "lists", data, symlinks=True)  # 40,000 links, not 40,000 copies
    server = Server(data, code)
    try:
        with probing(server.api, timeout=600) as probe:
            time.sleep(0.5)
            figures = ATTACKS[attack](server, args, probe)
        ordered = sorted(probe.latencies)
        return {
            **figures,
            "/devices answers": float(len(ordered)),
            "/devices median ms": statistics.median(ordered) * 1000 if ordered else float("nan"),
            "/devices slowest ms": ordered[-1] * 1000 if ordered else float("nan"),
        }
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def extract(revision: str, into: Path) -> Path:
    """The package, templates and static files of `revision`, from `git archive`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "digits_memplugin", "templates", "static"],
                             check=True, capture_output=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def table(attack: str, runs: dict[str, list[Figures]]) -> str:
    versions = list(runs)
    keys = list(dict.fromkeys(key for figures in runs.values() for run in figures for key in run))
    head = "| figure | " + " | ".join(f"{version} (median of {len(runs[version])})" for version in versions)
    lines = [head + (" | before / after |" if len(versions) == 2 else " |"),
             "|---|" + "---:|" * (len(versions) + (len(versions) == 2))]
    for key in keys:
        medians = [statistics.median(run.get(key, 0.0) for run in runs[version]) for version in versions]
        cells = [f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.2f}" for value in medians]
        ratio = ""
        if len(versions) == 2:
            ratio = f" {medians[0] / medians[1]:.1f} |" if medians[1] else " - |"
        lines.append(f"| {key} | " + " | ".join(cells) + " |" + ratio)
    return f"`{attack}`:\n\n" + "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attack", default="all", choices=["all", *ATTACKS])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", help="a git revision to run side by side with the working tree")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--posts", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    attacks = list(IN_ALL) if args.attack == "all" else [args.attack]
    started = time.monotonic()
    sections = []
    with tempfile.TemporaryDirectory(prefix="memplugin-flood-") as folder:
        work = Path(folder)
        versions: dict[str, Path | None] = {"after": None}
        if args.before:
            versions = {f"before ({args.before})": extract(args.before, work / "before"), "after": None}
        seeded = work / "seeded"
        if any(attack.startswith("subscribe") for attack in attacks):
            seed_jobs(seeded, STORED_JOBS)
        if "hdf5-list-job" in attacks:
            long_hdf5_list(work / "lists" / "datasets")
        for attack in attacks:
            runs: dict[str, list[Figures]] = {version: [] for version in versions}
            for number in range(args.runs):
                for version, code in versions.items():  # alternating: both see the machine as it is
                    figures = run_once(attack, args, code, seeded, work)
                    runs[version].append(figures)
                    print(f"{attack} run {number + 1} {version}: "
                          + ", ".join(f"{key} {value:.0f}" for key, value in figures.items()), flush=True)
            sections.append(table(attack, runs))
            print(sections[-1], flush=True)
    took = time.monotonic() - started
    command = "`.venv/bin/python bench/flood.py " + " ".join(sys.argv[1:]) + "`"
    body = (f"Command: {command} (the `serve` command on 127.0.0.1, default settings, this 2-core machine shared "
            f"with other work; {took:.0f} s this run). Each run is a fresh server; the versions alternate run by "
            "run.\n\n" + "\n\n".join(sections))
    if not args.no_write:
        section = "flood" if args.attack == "all" else f"flood-{args.attack}"
        replace_section(REPO / "docs" / "benchmarks.md", section, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
