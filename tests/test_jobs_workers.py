"""Several web workers, end to end: a real redis-server and two `digits-memplugin serve` processes (gevent) on one
data folder with `--message-queue redis://...`. The first to start its job manager leads (runs the jobs); the
second follows. Through the follower's API a job is submitted and cancelled, a socketio client connected to the
follower gets the progress and the end of the job the leader runs, and both workers list the same jobs.

Every wait is bounded; redis-server and the servers are always stopped (redis-server runs in a temporary folder
with persistence off, on a free port: the system's Redis service, if any, is never used).
"""

from __future__ import annotations

import json
import queue
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, pid_alive, wait_for, write_lmdb
from test_jobs_restart import Server, job_doc, serve

pytestmark = pytest.mark.slow

NS = "/memplugin"
REDIS = shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes], timeout: float = 30) -> int | None:
    """SIGTERM, then SIGKILL after `timeout`; the exit status (None when it had to be killed)."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
        return None


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of its own: a free port, loopback only, no persistence, in a temporary folder."""
    if REDIS is None:
        pytest.skip("redis-server is not installed (scripts/system-deps.sh installs it)")
    port = _free_port()
    folder = tmp_path / "redis"
    folder.mkdir()
    with (tmp_path / "redis.log").open("wb") as log:
        process = subprocess.Popen(
            [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(folder)],
            stdout=log, stderr=subprocess.STDOUT, cwd=folder,
        )
    try:
        wait_for(lambda: process.poll() is not None or _pong(port), timeout=20, what="redis-server")
        assert process.poll() is None, (tmp_path / "redis.log").read_text()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(process, timeout=10)


@pytest.fixture
def workers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        _stop(server.process)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _leader_and_follower(tmp_path: Path, redis_url: str, workers: list[Server]) -> tuple[Path, Server, Server]:
    """The data folder (with LeNet's datasets) and two workers on it: the first started leads, the second follows."""
    data = tmp_path / "data"
    (data / "datasets").mkdir(parents=True)
    write_lmdb(data / "datasets" / "mnist_train_lmdb")
    write_lmdb(data / "datasets" / "mnist_test_lmdb", records=8)
    leader = serve(data, tmp_path / "leader.log", "--message-queue", redis_url)
    workers.append(leader)
    assert requests.get(leader.api("/jobs"), timeout=30).status_code == 200  # its job manager starts: it leads
    follower = serve(data, tmp_path / "follower.log", "--message-queue", redis_url)
    workers.append(follower)
    listed = requests.get(follower.api("/jobs"), timeout=30)
    assert listed.status_code == 200, listed.text  # a follower, not "another server is using the data folder"
    return data, leader, follower


def test_two_workers_share_a_data_folder_through_redis(tmp_path: Path, redis_url: str, workers: list[Server]) -> None:
    data, leader, follower = _leader_and_follower(tmp_path, redis_url, workers)

    import socketio

    received: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    client = socketio.Client()
    for name in ("job", "job_attempt", "job_progress", "job_iteration", "job_error"):
        client.on(name, lambda payload, name=name: received.put((name, payload)), namespace=NS)
    client.connect(follower.url, namespaces=[NS], transports=["polling"], wait_timeout=10)
    try:
        client.emit("subscribe_jobs", {}, namespace=NS)
        body: dict[str, Any] = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu",
                                "max_iter": 200}
        created = requests.post(follower.api("/jobs"), json=body, timeout=30)
        assert created.status_code == 201, created.text
        short = created.json()["id"]
        client.emit("subscribe_job", {"id": short}, namespace=NS)

        # What the follower's client gets of the job the leader runs: its attempt, progress records, its end.
        seen: dict[str, list[dict[str, Any]]] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                name, payload = received.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            assert name != "job_error", payload
            seen.setdefault(name, []).append(payload)
            if name == "job" and payload.get("id") == short and payload["status"] in ("done", "failed", "cancelled"):
                break
        ends = [p for p in seen.get("job", []) if p.get("id") == short and p["status"] == "done"]
        assert ends and ends[-1]["iteration"] == 200, seen.get("job")
        iterations = [p for p in seen.get("job_progress", []) if p["job_id"] == short and p["event"] == "iteration"]
        assert iterations and all(p["attempt"] == 1 for p in iterations)
        assert any(p["id"] == short for p in seen.get("job_iteration", []))  # the list's room, from the leader
        assert any(p["job_id"] == short for p in seen.get("job_attempt", []))

        # A long job submitted and cancelled on the follower: the leader runs it and stops it.
        body["max_iter"] = 100_000
        created = requests.post(follower.api("/jobs"), json=body, timeout=30)
        assert created.status_code == 201, created.text
        long = created.json()["id"]
        client.emit("subscribe_job", {"id": long}, namespace=NS)
        wait_for(lambda: job_doc(follower, long)["iteration"] > 0, timeout=120, what="the long job to train")
        progress = data / "jobs" / long / "attempts" / "1" / "progress.jsonl"
        child = json.loads(progress.read_text().splitlines()[0])["pid"]
        assert _parent(child) == leader.process.pid  # the leader trains it, not the follower
        cancel = requests.post(follower.api(f"/jobs/{long}/cancel"), timeout=30)
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["message"] == "cancelling"
        ended = wait_for(lambda: (d := job_doc(leader, long))["status"] != "running" and d, timeout=60,
                         what="the leader to cancel the job")
        assert ended["status"] == "cancelled" and ended["attempts"][-1]["status"] == "cancelled"
        wait_for(lambda: not pid_alive(child), timeout=30, what="the training child to stop")
        deadline = time.monotonic() + 30
        cancelled = False
        while time.monotonic() < deadline and not cancelled:
            name, payload = received.get(timeout=max(0.1, deadline - time.monotonic()))
            cancelled = name == "job" and payload.get("id") == long and payload["status"] == "cancelled"
        assert cancelled  # the follower's client saw the end the leader recorded
    finally:
        client.disconnect()

    # Both workers tell the same story, once the leader's last writes of the cancelled job are in the database
    # (the leader shows what its task knows at once; the follower reads the database).
    def same() -> bool:
        lists = [requests.get(server.api("/jobs"), timeout=30).json() for server in (follower, leader)]
        return lists[0] == lists[1] and all(job_doc(follower, i) == job_doc(leader, i) for i in (short, long))

    wait_for(same, timeout=30, what="the follower and the leader to agree")
    log = requests.get(follower.api(f"/jobs/{short}/log"), timeout=30)
    assert log.status_code == 200 and "Solver scaffolding done" in log.text

    assert _stop(follower.process) == 0 and _stop(leader.process) == 0
    for server in workers:
        assert "Traceback" not in server.output.read_text(), server.output.read_text()[-3000:]


def test_a_follower_leads_when_the_leader_dies(tmp_path: Path, redis_url: str, workers: list[Server]) -> None:
    """The leader is killed (SIGKILL: no stop of its own) while it trains a job: its child dies with it (death
    signal), the follower takes the folder's lock, marks the job interrupted as a restarted server would, and runs
    the job again when it is resumed there."""
    data, leader, follower = _leader_and_follower(tmp_path, redis_url, workers)
    body = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 100_000}
    created = requests.post(follower.api("/jobs"), json=body, timeout=30)
    assert created.status_code == 201, created.text
    job = created.json()["id"]
    wait_for(lambda: job_doc(follower, job)["iteration"] > 0, timeout=120, what="the leader to train the job")
    child = json.loads((data / "jobs" / job / "attempts" / "1" / "progress.jsonl").read_text().splitlines()[0])["pid"]
    assert _parent(child) == leader.process.pid

    leader.process.kill()
    leader.process.wait(timeout=30)
    wait_for(lambda: not pid_alive(child), timeout=30, what="the leader's training child to die with it")
    interrupted = wait_for(lambda: (d := job_doc(follower, job))["status"] == "interrupted" and d, timeout=60,
                           what="the follower to lead and mark the job interrupted")
    assert interrupted["attempts"][-1]["status"] == "interrupted"

    resumed = requests.post(follower.api(f"/jobs/{job}/resume"), timeout=30)
    assert resumed.status_code == 200, resumed.text
    wait_for(lambda: len((d := job_doc(follower, job))["attempts"]) == 2 and d["status"] == "running"
             and d["iteration"] > d["attempts"][1]["start_iteration"], timeout=120, what="the new leader to train")
    progress = data / "jobs" / job / "attempts" / "2" / "progress.jsonl"
    assert _parent(json.loads(progress.read_text().splitlines()[0])["pid"]) == follower.process.pid
    assert requests.post(follower.api(f"/jobs/{job}/cancel"), timeout=30).status_code == 200
    ended = wait_for(lambda: (d := job_doc(follower, job))["status"] != "running" and d, timeout=60,
                     what="the cancel")
    assert ended["status"] == "cancelled"
    assert _stop(follower.process) == 0
    assert "Traceback" not in follower.output.read_text(), follower.output.read_text()[-3000:]
