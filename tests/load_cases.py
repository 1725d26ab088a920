"""The loads of issue 23 (items 3, 4 and the second half of 7), shared by tests/test_hardening_load.py and
bench/flood.py: nets that are small as text and costly to estimate, a net whose layer only pycaffe shapes, a data
folder holding many stored jobs, and the readings taken during an attack (/devices latency, a process's resident
memory, the pycaffe children alive)."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, wait_for, write_lmdb

from digits_memplugin import create_app
from digits_memplugin.host.extension import get_plugin


def lstm_net(layers: int, steps: int, tag: str = "") -> str:
    """`layers` LSTM layers of 4 outputs stacked on an input of `steps` timesteps: ~110 bytes a layer, and each
    one unrolls into ~6 layers per timestep (the issue's 8.4 KB and 2.9 KB nets were of this kind). `tag`, a
    comment, makes the text new to every cache."""
    head = (
        f"# {tag}\n"
        'layer { name: "x" type: "Input" top: "x" top: "cont" '
        f"input_param {{ shape {{ dim: {steps} dim: 1 dim: 4 }} shape {{ dim: {steps} dim: 1 }} }} }}\n"
    )
    body, bottom = [], "x"
    for index in range(layers):
        body.append(
            f'layer {{ name: "l{index}" type: "LSTM" bottom: "{bottom}" bottom: "cont" top: "l{index}" '
            "recurrent_param { num_output: 4 } }\n"
        )
        bottom = f"l{index}"
    return head + "".join(body)


UNROLLED = lstm_net(6, 500)
"""~0.9 KB: six LSTM layers unrolled over 500 timesteps, ~18,000 layers to set up for one report."""
CURVED = lstm_net(3, 6)
"""~0.6 KB, cheap as written; with CURVE_NEAR_500 it is built eight times at ~500 timesteps."""
CURVE_NEAR_500 = list(range(493, 501))

EIGHT_KB_LSTM_LAYERS = 70
"""LSTM layers of the issue's ~8 KB net (7.7 KB as `lstm_net` writes them): built as written, it stops at the
50,000-layer limit, ~10 s of one core here."""


def long_hdf5_list(root: Path, lines: int = 40_000) -> None:
    """In the dataset root `root`: one.h5 (4 MNIST-shaped items and labels) under `lines` names (links in a hidden
    folder, which the datasets' scan skips), long.txt naming each once, long_out.txt the same and then
    ../../outside/secret.h5 (outside the roots when `root` is `<folder>/data/datasets`), good.txt naming one.h5,
    and the LMDB mnist_test_lmdb for a test phase."""
    import h5py
    import numpy as np

    links = root / ".l"
    links.mkdir(parents=True)
    with h5py.File(root / "one.h5", "w") as h5:
        h5["data"] = np.zeros((4, 1, 28, 28), dtype=np.float32)
        h5["label"] = np.zeros((4,), dtype=np.float32)
    for index in range(lines):
        os.symlink("../one.h5", links / f"{index}.h5")
    names = "".join(f".l/{index}.h5\n" for index in range(lines))
    (root / "long.txt").write_text(names)
    (root / "long_out.txt").write_text(names + "../../outside/secret.h5\n")
    (root / "good.txt").write_text("one.h5\n")
    write_lmdb(root / "mnist_test_lmdb", records=8)


def hdf5_lenet(source: str) -> str:
    """LeNet whose TRAIN data layer reads the HDF5 list `source` (its TEST one an LMDB, given as the job's data)."""
    start = LENET.index('name: "mnist"')
    start = LENET.rindex("layer {", 0, start)
    end = LENET.index("\n}\n", start) + 3
    layer = ('layer { name: "mnist" type: "HDF5Data" top: "data" top: "label" include { phase: TRAIN }\n'
             f'  hdf5_data_param {{ source: "{source}" batch_size: 64 }} }}\n')
    return LENET[:start] + layer + LENET[end:]


PAD_NET = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "pad" type: "Pad" bottom: "x" top: "p" pad_param { pad_u: 1 pad_d: 1 pad_l: 1 pad_r: 1 } }
layer { name: "conv" type: "Convolution" bottom: "p" top: "c" convolution_param { num_output: 4 kernel_size: 3 } }
"""
"""A net with a layer the estimator has no rule for (Pad, this Caffe's own): pycaffe shapes it in a child."""


def seed_jobs(data_dir: Path, count: int) -> None:
    """`count` stored jobs in `data_dir`: one real job (LeNet, failed at once for its 1 MiB memory cap) and copies
    of its record, as a server with that many failed jobs holds them (~760 bytes each in a page)."""
    datasets = data_dir / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    for name in ("mnist_train_lmdb", "mnist_test_lmdb"):
        if not (datasets / name).exists():
            write_lmdb(datasets / name)
    app = create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True})
    try:
        api = app.test_client()
        body = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4,
                "memory_cap": "1MiB"}
        created = api.post("/memplugin/api/jobs", json=body)
        assert created.status_code == 201, created.get_data(as_text=True)
        job_id = created.get_json()["id"]
        wait_for(lambda: api.get(f"/memplugin/api/jobs/{job_id}").get_json()["status"] == "failed",
                 what="the seed job to fail")
        store = get_plugin(app).jobs.store
        template = store.get_job(job_id)
        assert template is not None
        for index in range(count - 1):
            copy = f"20200101-000000-{index:06x}"
            store.add_job(dataclasses.replace(template, id=copy, folder=copy, name=f"job {index}"))
    finally:
        get_plugin(app).close()


@dataclasses.dataclass
class Probe:
    """GET /api/devices every `interval` seconds: each answer's latency, and the longest wait for one."""

    latencies: list[float] = dataclasses.field(default_factory=list)
    answered_at: list[float] = dataclasses.field(default_factory=list)
    """When each answer came (time.monotonic, the same clock in every process of the machine)."""
    failures: list[str] = dataclasses.field(default_factory=list)

    def slow_until(self, slower_than: float) -> float | None:
        """When the last answer slower than `slower_than` seconds came (None: none was)."""
        slow = [at for at, latency in zip(self.answered_at, self.latencies) if latency > slower_than]
        return max(slow, default=None)

    @property
    def slowest(self) -> float:
        return max(self.latencies, default=0.0)

    def summary(self) -> str:
        if not self.latencies:
            return "no answer"
        ordered = sorted(self.latencies)
        return (f"{len(ordered)} answers, median {statistics.median(ordered) * 1000:.0f} ms, "
                f"p95 {ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1000:.0f} ms, slowest {ordered[-1] * 1000:.0f} ms")


@contextmanager
def probing(api: str, interval: float = 0.05, timeout: float = 120.0) -> Iterator[Probe]:
    """A Probe of `api`/devices running while the block runs (each GET bounded by `timeout`)."""
    probe, done = Probe(), threading.Event()

    def run() -> None:
        while not done.is_set():
            started = time.monotonic()
            try:
                status = requests.get(f"{api}/devices", timeout=timeout).status_code
            except requests.RequestException as error:
                probe.failures.append(repr(error))
                continue
            now = time.monotonic()
            probe.latencies.append(now - started)
            probe.answered_at.append(now)
            if status != 200:
                probe.failures.append(f"status {status}")
            done.wait(interval)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield probe
    finally:
        done.set()
        thread.join(timeout + 5)


def rss_bytes(pid: int) -> int:
    """A process's resident memory."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, their children...), read from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def pycaffe_children(pid: int) -> int:
    """The pycaffe shape children alive below `pid` (estimate workers' and the server's own). A process a child
    forks has the child's command line until it execs (one does, briefly, while it builds the net): it is the same
    child's, not another one."""
    found: dict[int, int] = {}
    for child in descendants(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
            parent = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if b"digits_memplugin.estimate.pycaffe_shapes" in command:
            found[child] = parent
    return sum(1 for parent in found.values() if parent not in found)


@contextmanager
def counting_children(pid: int, interval: float = 0.02) -> Iterator[list[int]]:
    """The most pycaffe children alive at once below `pid` while the block runs (sampled every `interval`), as a
    one-element list filled in as it goes."""
    most, done = [0], threading.Event()

    def run() -> None:
        while not done.is_set():
            most[0] = max(most[0], pycaffe_children(pid))
            done.wait(interval)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield most
    finally:
        done.set()
        thread.join(10)


def socket_attack(url: str, clients: int = 10, events: int = 40, per_second: float | None = None, limit: int = 500,
                  quiet: float | None = 2.0, timeout: float = 120.0) -> dict[str, Any]:
    """`clients` socket.io clients (websocket) each send `events` `subscribe_jobs` {"limit": `limit`}, at once or
    `per_second`, then wait until each was told `rate_limited` (or, once answers came, nothing more came for `quiet`
    seconds, unless `quiet` is None; or `timeout`): what they received. Run it with `socket_attack_apart`, so that the clients' decoding of the pages (350 KB each)
    does not hold the probe's interpreter."""
    import socketio

    received: list[list[tuple[str, int]]] = []
    connected = []
    last = [time.monotonic()]
    try:
        for _ in range(clients):
            client, got = socketio.Client(reconnection=False), list[tuple[str, int]]()

            def on(name: str, got: list[tuple[str, int]] = got) -> object:
                def handle(data: object) -> None:
                    size = len(data["jobs"]) if name == "jobs" and isinstance(data, dict) else 0
                    got.append((name, size))
                    last[0] = time.monotonic()
                return handle

            for name in ("jobs", "rate_limited", "job_error"):
                client.on(name, on(name), namespace="/memplugin")
            client.connect(url, namespaces=["/memplugin"], transports=["websocket"], wait_timeout=60)
            connected.append(client)
            received.append(got)
        started = time.monotonic()
        for index in range(events):
            for client in connected:
                client.emit("subscribe_jobs", {"limit": limit}, namespace="/memplugin")
            if per_second:  # the attack's pace (what is measured): `per_second` rounds of events a second
                time.sleep(max(0.0, started + (index + 1) / per_second - time.monotonic()))
        sent_at = time.monotonic()
        sent_in = sent_at - started
        last[0] = sent_at
        while time.monotonic() - started < timeout:
            told = all(any(name == "rate_limited" for name, _ in got) for got in received)
            answered = any(received)
            if (told and per_second is None) or (
                quiet is not None and answered and time.monotonic() - last[0] > quiet
            ):
                break
            time.sleep(0.05)  # between two looks at the answers (the end is every client told, or a quiet spell)
        names = [name for got in received for name, _ in got]
        return {
            "sent": clients * events, "sent_in": sent_in, "sent_at": sent_at, "seconds": time.monotonic() - started,
            "pages": names.count("jobs"), "rate_limited": names.count("rate_limited"),
            "clients_told": sum(any(name == "rate_limited" for name, _ in got) for got in received),
            "page_sizes": sorted({size for got in received for name, size in got if name == "jobs"}),
        }
    finally:
        for client in connected:
            client.disconnect()


def socket_attack_apart(url: str, **options: Any) -> dict[str, Any]:
    """`socket_attack` in a process of its own (bounded by its timeout plus a minute)."""
    timeout = float(options.get("timeout", 120.0)) + 60
    done = subprocess.run(
        [sys.executable, __file__, json.dumps({"url": url, **options})],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the socket clients failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


if __name__ == "__main__":
    print(json.dumps(socket_attack(**json.loads(sys.argv[1]))))
