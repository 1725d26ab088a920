"""Load on the standalone server: websocket clients following a training job, and REST clients asking for estimates.

Starts `digits-memplugin serve --port 0 --data-dir <tmp> --simulate-gpus 2x24GiB` (gevent, websockets through
simple-websocket) on 127.0.0.1 and measures, `--seconds` each:

- REST warm, no job: `--rest-clients` clients (a process each, one kept-alive http.client connection) POST LeNet to
  /api/estimate back to back, the same text every time (the server keeps parsed definitions and their last reports:
  what a form asking again and again costs), while nothing trains;
- REST cold, no job: the same with a text new to the server each time (parsed, built and planned from scratch);

then creates a real CPU training job (LeNet on synthetic MNIST-shaped LMDBs, long enough to train through the
whole run) and measures the same two phases while it trains, then:

- websockets: `--clients` python-socketio clients (websocket transport, through websocket-client), each subscribed
  to the job's room, counting the `job_progress` iteration events they receive;
- websockets + REST warm: both at once.

Every client is in a process of its own or shared only with other websocket clients, so that no Python GIL queue
adds to the latency measured, and runs at nice `--client-nice` (5): on two cores, twenty client processes woken by
their answers otherwise take the one-threaded server's core from it (wake-up preemption), a cost that browsers on
other machines do not put on a server. At nice 0 the median stayed at 2 ms but the p99 rose to about 200 ms, the
server blocked inside send() while a client ran (gevent's monitor thread showed it). The events the server emitted are counted in the server itself: the server
process is the `serve` command with the job event throttle's emit wrapped to append each job_progress iteration
event it hands to socketio to a file (the throttle decides how many are emitted: MEMPLUGIN_JOB_EVENTS_PER_SECOND, 4
a second by default). A drop is an event the server emitted while a client was subscribed that the client did not
receive. Also reported: request latency percentiles and throughput, event delivery delay (from the runner writing
the record to a client receiving it, the throttle's hold of up to 1/4 s included), and the CPU time of the server and
of the training child. The run with a job is made once per `--nice` value of the training child (0 and the default
10); the no-job phases once.

Writes the tables into docs/benchmarks.md between the `load` markers.

    .venv/bin/python bench/load.py [--clients 200] [--rest-clients 20] [--seconds 20] [--nice 0,10] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import logging
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import requests
from report import replace_section
from test_jobs_fixtures import LENET, LENET_DATA, LENET_SOLVER, write_lmdb

NS = "/memplugin"
# The serve command, with the throttle's emit counted (what the server handed to socketio for the job rooms) and
# the training child's nice value taken from LOAD_JOB_NICE.
SERVE = """
import dataclasses, json, os, sys, time
from digits_memplugin.jobs import manager
from digits_memplugin.web.socket import throttle
log = open(sys.argv[1], "a", buffering=1)
original = throttle.EventThrottle.__init__
def counted(self, emit, *args, **kwargs):
    def emit_counted(name, payload):
        if name == "job_progress" and payload.get("event") == "iteration":
            log.write(json.dumps([time.time(), payload["job_id"], payload["attempt"], payload["iteration"]]) + "\\n")
        emit(name, payload)
    original(self, emit_counted, *args, **kwargs)
throttle.EventThrottle.__init__ = counted
from_settings = manager.ManagerConfig.from_settings.__func__
manager.ManagerConfig.from_settings = classmethod(
    lambda cls, settings: dataclasses.replace(from_settings(cls, settings), job_nice=int(os.environ["LOAD_JOB_NICE"]))
)
from digits_memplugin.cli import main
sys.exit(main(sys.argv[2:]))
"""
SOLVER = (
    LENET_SOLVER.replace("test_interval: 500", "test_interval: 1000000")
    .replace("snapshot: 5000", "snapshot: 0")
    .replace("test_iter: 100", "test_iter: 1")
)
ESTIMATE = {"net": LENET, "data_shapes": {"*": [1, 28, 28]}, "free_bytes": 8 << 30}


# ============================================================================ the server


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    emitted: Path
    data: Path

    def api(self, path: str) -> str:
        return f"{self.url}memplugin/api{path}"


def start_server(folder: Path, nice: int = 10) -> Server:
    data = folder / "data"
    (data / "datasets").mkdir(parents=True)
    write_lmdb(data / "datasets" / "mnist_train_lmdb", records=256)
    write_lmdb(data / "datasets" / "mnist_test_lmdb", records=64)
    emitted, output = folder / "emitted.jsonl", folder / "serve.log"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(emitted), "serve", "--host", "127.0.0.1", "--port", "0",
             "--data-dir", str(data), "--simulate-gpus", "2x24GiB"],
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "LOAD_JOB_NICE": str(nice)},
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.findall(r"serving on (http://127\.0\.0\.1:\d+/)", output.read_text())
        if found:
            return Server(process, found[-1], emitted, data)
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"the server did not start: {output.read_text()[-2000:]}")


def create_job(server: Server) -> tuple[str, int]:
    """A CPU training job long enough to outlast the run; its id and the training child's pid."""
    body = {"net": LENET, "solver": SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 10_000_000,
            "name": "load"}
    response = requests.post(server.api("/jobs"), json=body, timeout=30)
    response.raise_for_status()
    job_id = response.json()["id"]
    progress = server.data / "jobs" / job_id / "attempts" / "1" / "progress.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lines = progress.read_text().splitlines() if progress.is_file() else []
        if any('"iteration"' in line for line in lines[1:]):
            return job_id, int(json.loads(lines[0])["pid"])
        time.sleep(0.2)
    raise RuntimeError("the job did not start training")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def emitted_between(server: Server, job_id: str, start: float, end: float) -> set[tuple[int, int]]:
    events = set()
    for line in server.emitted.read_text().splitlines():
        when, job, attempt, iteration = json.loads(line)
        if job == job_id and start <= when <= end:
            events.add((attempt, iteration))
    return events


# ============================================================================ websocket clients (their own process)


def followers_process(url: str, job_id: str, count: int, nice: int, commands: Connection) -> None:
    """Connect `count` clients to the job's room, then answer the parent's commands: "clear" forgets what was
    received, "collect" sends it back, "quit" disconnects them all."""
    import socketio

    os.nice(nice)

    for name in ("engineio.client", "socketio.client", "websocket"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # "packet queue is empty, aborting" at disconnect
    lock = threading.Lock()
    received: list[dict[tuple[int, int], float]] = [{} for _ in range(count)]
    delays: list[list[float]] = [[] for _ in range(count)]
    subscribed = [threading.Event() for _ in range(count)]
    clients: list[Any] = [None] * count
    errors: list[str | None] = [None] * count

    def start(index: int) -> None:
        client = socketio.Client(reconnection=False)

        def on_job(document: dict[str, Any]) -> None:
            if document.get("id") == job_id:
                subscribed[index].set()

        def on_progress(payload: dict[str, Any]) -> None:
            if payload.get("event") == "iteration" and payload.get("job_id") == job_id:
                now = time.time()
                with lock:
                    received[index][(payload["attempt"], payload["iteration"])] = now
                    delays[index].append(now - float(payload["time"]))

        client.on("job", on_job, namespace=NS)
        client.on("job_progress", on_progress, namespace=NS)
        try:
            client.connect(url, namespaces=[NS], transports=["websocket"], wait_timeout=30)
            client.emit("subscribe_job", {"id": job_id}, namespace=NS)
            clients[index] = client
        except Exception as error:  # noqa: BLE001 - a client that cannot connect is counted, not fatal
            errors[index] = f"{type(error).__name__}: {error}"

    pending = list(range(count))

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                index = pending.pop()
            start(index)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    deadline = time.monotonic() + 60
    for index in range(count):
        if errors[index] is None and not subscribed[index].wait(max(0.0, deadline - time.monotonic())):
            errors[index] = "not subscribed within 60 s"
    commands.send({"errors": [e for e in errors if e]})
    while True:
        command = commands.recv()
        if command == "clear":
            with lock:
                for index in range(count):
                    received[index].clear()
                    delays[index].clear()
            commands.send("cleared")
        elif command == "collect":
            with lock:
                live = [i for i in range(count) if errors[i] is None]
                commands.send({"received": [sorted(received[i]) for i in live], "delays": [d for i in live for d in delays[i]]})
        else:

            def disconnect(client: Any) -> None:
                with contextlib.suppress(Exception):  # a client already gone has nothing to close
                    client.disconnect()

            closing = [threading.Thread(target=disconnect, args=(c,)) for c in clients if c is not None]
            for thread in closing:
                thread.start()
            for thread in closing:
                thread.join(timeout=30)
            commands.send("done")
            return


@dataclass
class Followers:
    process: multiprocessing.process.BaseProcess
    commands: Connection
    count: int
    failed: list[str]

    @classmethod
    def start(cls, server: Server, job_id: str, count: int, nice: int) -> Followers:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(
            target=followers_process, args=(server.url, job_id, count, nice, child), daemon=True
        )
        process.start()
        if not parent.poll(300):
            raise RuntimeError("the websocket clients did not connect within 300 s")
        return cls(process, parent, count, parent.recv()["errors"])

    def ask(self, command: str) -> Any:
        self.commands.send(command)
        return self.commands.recv()

    def stop(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self.ask("quit")
        self.process.join(timeout=60)
        if self.process.is_alive():
            self.process.kill()


# ============================================================================ REST clients


@dataclass
class RestResult:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0


def rest_client_process(url: str, index: int, nice: int, commands: Connection) -> None:
    """One REST client in a process of its own (as a user's browser is): on ("go", cold, seconds) it POSTs
    estimates back to back on one kept-alive connection for that long and sends back its latencies; "quit" ends it.

    Processes, not threads: twenty Python threads in one process queue for its GIL, and that queue, not the
    server, made the latency tail. http.client rather than requests: on two cores the clients' CPU time is taken
    from the server, so the lighter client measures the server better."""
    os.nice(nice)
    host, port = url.split("//")[1].rstrip("/").split(":")
    path = "/memplugin/api/estimate"
    warm = json.dumps(ESTIMATE).encode()
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    commands.send("ready")
    counter = 0
    while True:
        command = commands.recv()
        if command == "quit":
            connection.close()
            return
        _, cold, seconds = command
        result = RestResult()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            counter += 1
            body = warm
            if cold:  # a text never seen before: no cached parse, nets built and planned from scratch
                body = json.dumps({**ESTIMATE, "net": f"{LENET}\n# client {index} request {counter}\n"}).encode()
            started = time.perf_counter()
            try:
                connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
                connection = http.client.HTTPConnection(host, int(port), timeout=60)
            if ok:
                result.latencies.append(time.perf_counter() - started)
            else:
                result.errors += 1
        commands.send((result.latencies, result.errors))


@dataclass
class RestClients:
    processes: list[multiprocessing.process.BaseProcess]
    pipes: list[Connection]

    @classmethod
    def start(cls, server: Server, count: int, nice: int) -> RestClients:
        context = multiprocessing.get_context("spawn")
        processes, pipes = [], []
        for index in range(count):
            parent, child = context.Pipe()
            process = context.Process(target=rest_client_process, args=(server.url, index, nice, child), daemon=True)
            process.start()
            processes.append(process)
            pipes.append(parent)
        for pipe in pipes:
            if not pipe.poll(120) or pipe.recv() != "ready":
                raise RuntimeError("a REST client did not start")
        return cls(processes, pipes)

    def go(self, cold: bool, seconds: float) -> None:
        for pipe in self.pipes:
            pipe.send(("go", cold, seconds))

    def collect(self) -> RestResult:
        result = RestResult()
        for pipe in self.pipes:
            latencies, errors = pipe.recv()
            result.latencies += latencies
            result.errors += errors
        return result

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send("quit")
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


# ============================================================================ phases


@dataclass
class Phase:
    name: str
    nice: int | None
    seconds: float
    server_cpu: float
    child_cpu: float
    rest: RestResult | None = None
    clients: int = 0
    failed_clients: int = 0
    emitted: int = 0
    drops: list[int] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def measure(
    name: str, nice: int | None, server: Server, job_id: str | None, child: int | None, seconds: float,
    rest: RestClients | None, cold: bool, followers: Followers | None,
) -> Phase:
    """One phase: the REST clients (if any) and the followers (if any, already subscribed) for `seconds`."""
    if followers is not None:
        followers.ask("clear")
    cpu0, child0 = cpu_seconds(server.process.pid), cpu_seconds(child) if child else 0.0
    start = time.time()
    if rest is not None:
        rest.go(cold, seconds)
    time.sleep(seconds)
    end = time.time()
    cpu1, child1 = cpu_seconds(server.process.pid), cpu_seconds(child) if child else 0.0
    phase = Phase(name, nice, end - start, cpu1 - cpu0, child1 - child0, rest.collect() if rest else None)
    if followers is not None and job_id is not None:
        time.sleep(2.0)  # events emitted just before the end are still on their way
        emitted = emitted_between(server, job_id, start + 0.5, end)
        collected = followers.ask("collect")
        phase.clients, phase.failed_clients = followers.count, len(followers.failed)
        phase.emitted = len(emitted)
        phase.drops = [len(emitted - {tuple(event) for event in events}) for events in collected["received"]]
        phase.delays = collected["delays"]
    return phase


def run(args: argparse.Namespace, nice: int) -> list[Phase]:
    with tempfile.TemporaryDirectory(prefix="memplugin-load-") as folder:
        server = start_server(Path(folder), nice)
        followers: Followers | None = None
        rest: RestClients | None = None
        job_id: str | None = None
        try:
            rest = RestClients.start(server, args.rest_clients, args.client_nice)
            phases = []
            if nice == args.idle_with:  # the server alone first: what the clients get when no job trains
                phases += [
                    measure("REST warm, no job", None, server, None, None, args.seconds, rest, False, None),
                    measure("REST cold, no job", None, server, None, None, args.seconds, rest, True, None),
                ]
            job_id, child = create_job(server)
            phases += [
                measure("REST warm", nice, server, job_id, child, args.seconds, rest, False, None),
                measure("REST cold", nice, server, job_id, child, args.seconds, rest, True, None),
            ]
            followers = Followers.start(server, job_id, args.clients, args.client_nice)
            phases.append(measure("websockets", nice, server, job_id, child, args.seconds, None, False, followers))
            phases.append(
                measure("websockets + REST warm", nice, server, job_id, child, args.seconds, rest, False, followers)
            )
            return phases
        finally:
            if rest is not None:
                rest.stop()
            if followers is not None:
                followers.stop()
            if job_id is not None:
                with contextlib.suppress(requests.RequestException):
                    requests.post(server.api(f"/jobs/{job_id}/cancel"), timeout=30)
            server.process.terminate()
            try:
                server.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.process.kill()


def report(phases: list[Phase], args: argparse.Namespace, started: float) -> str:
    command = (f"`.venv/bin/python bench/load.py --clients {args.clients} --rest-clients {args.rest_clients} "
               f"--seconds {args.seconds:g} --nice {args.nice} --client-nice {args.client_nice}`")
    lines = [
        (f"Command: {command} (the `serve` command on 127.0.0.1, gevent, `--simulate-gpus 2x24GiB`; a LeNet CPU "
         "training job running except in the \"no job\" phases, its child at the nice value shown; every client on "
         f"the same 2-core machine at nice {args.client_nice}, each REST client a process of its own, the websocket "
         "clients in one more; "
         f"{time.time() - started:.0f} s this run)."),
        "",
        (f"`POST /api/estimate` with LeNet from {args.rest_clients} concurrent clients (warm: the same text each "
         "time; cold: a text new to the server each time):"),
        "",
        "| phase | child nice | requests/s | p50 ms | p90 ms | p99 ms | max ms | errors | server CPU | child CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in phases:
        if phase.rest is not None and phase.rest.latencies:
            ms = [1000 * value for value in phase.rest.latencies]
            lines.append(
                f"| {phase.name} | {'-' if phase.nice is None else phase.nice} | {len(ms) / phase.seconds:.0f} | {percentile(ms, 50):.1f} | "
                f"{percentile(ms, 90):.1f} | {percentile(ms, 99):.1f} | {max(ms):.0f} | {phase.rest.errors} | "
                f"{phase.server_cpu / phase.seconds:.2f} | {phase.child_cpu / phase.seconds:.2f} |"
            )
    lines += [
        "",
        (f"{args.clients} websocket clients following the job (`subscribe_job`), `job_progress` iteration events "
         "(the throttle emits at most 4 a second):"),
        "",
        ("| phase | child nice | clients connected | events emitted | received by each (min) | dropped, all "
         "clients | delivery p50 ms | p99 ms | server CPU | child CPU |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in phases:
        if phase.clients:
            received = min((phase.emitted - d for d in phase.drops), default=0)
            lines.append(
                f"| {phase.name} | {phase.nice} | {phase.clients - phase.failed_clients} of {phase.clients} | "
                f"{phase.emitted} | {received} | {sum(phase.drops)} | {1000 * percentile(phase.delays, 50):.0f} | "
                f"{1000 * percentile(phase.delays, 99):.0f} | {phase.server_cpu / phase.seconds:.2f} | "
                f"{phase.child_cpu / phase.seconds:.2f} |"
            )
    lines += ["", "CPU columns: CPU seconds per second of the phase (1.00 = one core busy)."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200, help="websocket clients (default: %(default)s)")
    parser.add_argument("--rest-clients", type=int, default=20, help="concurrent REST clients (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase (default: %(default)s)")
    parser.add_argument("--nice", default="0,10", help="the training child's nice values to run with (default: 0,10)")
    parser.add_argument(
        "--client-nice", type=int, default=5,
        help="the clients' nice value (default: %(default)s): below the server, which is what remote clients are",
    )
    parser.add_argument("--no-write", action="store_true", help="print the tables, leave docs/benchmarks.md alone")
    args = parser.parse_args()
    args.idle_with = int(args.nice.split(",")[-1])  # the no-job phases run once, on the server of the last run
    started = time.time()
    phases = [phase for nice in (int(n) for n in args.nice.split(",")) for phase in run(args, nice)]
    table = report(phases, args, started)
    print(table)
    if not args.no_write:
        replace_section(REPO / "docs" / "benchmarks.md", "load", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
