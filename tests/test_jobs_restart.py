"""Restart safety, end to end on the real gevent server: `digits-memplugin serve` killed with SIGKILL mid-job takes
its training child along; started again on the same data folder it shows the job interrupted with its attempts,
log and snapshot intact, and resumes it from the snapshot, with live events on socketio."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import requests
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, pid_alive, wait_for, write_lmdb

pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "digits-memplugin"


class Server:
    def __init__(self, process: subprocess.Popen[bytes], url: str, output: Path) -> None:
        self.process, self.url, self.output = process, url, output

    def api(self, path: str) -> str:
        return f"{self.url}memplugin/api{path}"


def serve(data_dir: Path, output: Path, *options: str, env: Mapping[str, str] | None = None) -> Server:
    """`serve --port 0` (with `options`, in `env`) with its output in a file (a pipe nobody drains could stall it);
    the address from it. The benchmarks start their servers with it too."""
    with output.open("ab") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir), *options],
            stdout=sink, stderr=subprocess.STDOUT, cwd=data_dir.parent, env=env,
        )
    url = wait_for(
        lambda: (m := re.findall(r"serving on (http://127\.0\.0\.1:\d+/)", output.read_text())) and m[-1],
        timeout=60, what="the server's address",
    )
    return Server(process, url, output)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def job_doc(server: Server, job_id: str) -> dict[str, Any]:
    return requests.get(server.api(f"/jobs/{job_id}"), timeout=10).json()  # type: ignore[no-any-return]


def test_a_server_killed_mid_job_finds_it_interrupted_and_resumes_it(tmp_path: Path, servers: list[Server]) -> None:
    data = tmp_path / "data"
    (data / "datasets").mkdir(parents=True)  # the default dataset root: <data dir>/datasets
    write_lmdb(data / "datasets" / "mnist_train_lmdb")
    write_lmdb(data / "datasets" / "mnist_test_lmdb", records=8)
    first = serve(data, tmp_path / "first.log")
    servers.append(first)
    body: dict[str, Any] = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 100_000}
    created = requests.post(first.api("/jobs"), json=body, timeout=30)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    snapshot = wait_for(lambda: job_doc(first, job_id)["snapshot"], timeout=120, what="a snapshot")
    progress = data / "jobs" / job_id / "attempts" / "1" / "progress.jsonl"
    child = json.loads(progress.read_text().splitlines()[0])["pid"]
    assert pid_alive(child)

    os.kill(first.process.pid, signal.SIGKILL)  # the server only: its child must not outlive it
    first.process.wait(timeout=20)
    wait_for(lambda: not pid_alive(child), timeout=20, what="the training child to die with the server")
    log_before = (data / "jobs" / job_id / "attempts" / "1" / "caffe.log").read_text()

    second = serve(data, tmp_path / "second.log")
    servers.append(second)
    doc = job_doc(second, job_id)
    assert doc["status"] == "interrupted" and doc["resumable"] is True
    assert doc["snapshot"]["iteration"] >= snapshot["iteration"]
    (attempt,) = doc["attempts"]
    assert attempt["status"] == "interrupted" and "server stopped" in attempt["message"]
    log = requests.get(second.api(f"/jobs/{job_id}/log"), timeout=10)
    assert log.status_code == 200 and log.text.startswith(log_before[:1000]) and "Solver scaffolding done" in log.text
    assert (data / "jobs" / job_id / doc["snapshot"]["state"]).is_file()

    import socketio

    received: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    client = socketio.Client()
    for name in ("job", "job_attempt", "job_progress"):
        client.on(name, lambda payload, name=name: received.put((name, payload)), namespace="/memplugin")
    client.connect(second.url, namespaces=["/memplugin"], transports=["polling"], wait_timeout=10)
    try:
        client.emit("subscribe_job", {"id": job_id}, namespace="/memplugin")
        resumed = requests.post(second.api(f"/jobs/{job_id}/resume"), timeout=10)
        assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
        attempt2 = wait_for(
            lambda: (a := job_doc(second, job_id)["attempts"]) and len(a) == 2 and a[1], timeout=60, what="attempt 2"
        )
        assert attempt2["resumed_from"] == doc["snapshot"]["state"]
        assert attempt2["start_iteration"] == doc["snapshot"]["iteration"]
        deadline = time.monotonic() + 60
        iterations: list[int] = []
        while time.monotonic() < deadline and not iterations:
            name, payload = received.get(timeout=30)
            if name == "job_progress" and payload["event"] == "iteration" and payload["attempt"] == 2:
                iterations.append(payload["iteration"])
        assert iterations and iterations[0] > doc["snapshot"]["iteration"]  # went on from the snapshot
    finally:
        client.disconnect()
    child = json.loads((data / "jobs" / job_id / "attempts" / "2" / "progress.jsonl").read_text().splitlines()[0])["pid"]

    # A clean stop (SIGTERM) stops the job too, as interrupted, rather than leaving it "running" in the store.
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(timeout=60) == 0
    assert not pid_alive(child)
    third = serve(data, tmp_path / "third.log")
    servers.append(third)
    doc = job_doc(third, job_id)
    assert doc["status"] == "interrupted" and [a["status"] for a in doc["attempts"]] == ["interrupted"] * 2
    assert requests.delete(third.api(f"/jobs/{job_id}"), timeout=10).status_code == 204
    assert not (data / "jobs" / job_id).exists()
    third.process.send_signal(signal.SIGTERM)
    assert third.process.wait(timeout=30) == 0
    for server in servers:
        assert "Traceback" not in server.output.read_text()
