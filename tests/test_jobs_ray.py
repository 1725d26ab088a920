"""The Ray backend end to end on a real local Ray cluster: a head and a second node (two `ray start --block`
processes with their own resources and fake GPUs), each with its device agent, and the web app on the Ray
backend. A LeNet job on the CPU is placed on the node asked, its progress reaches a websocket client, cancel
stops it, and an out-of-memory attempt under a memory cap is retried at a smaller batch, with the same attempts and
records as the same job on the local backend.

Every wait is bounded, and the cluster is always stopped: each `ray start --block` runs in its own session
(killed as a group), and whatever still names the cluster's temporary folder afterwards is killed by its pid.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_jobs_fixtures import LENET, LENET_DATA, MIB, SHORT_SOLVER, wait_for

from digits_memplugin.devices.cluster import host_resource
from digits_memplugin.host.app import create_app
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.jobs.backends import ray as ray_backend

pytestmark = pytest.mark.slow
pytest_plugins = ["test_jobs_fixtures"]  # the datasets fixture

REPO = Path(__file__).resolve().parent.parent
RAY = Path(sys.executable).parent / "ray"
API = "/memplugin/api/jobs"
NS = "/memplugin"
START_SECONDS = 90.0


def _node_ip() -> str:
    """This machine's address as Ray picks it for a node (the interface of the default route)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("198.51.100.1", 9))  # no packet is sent: connect only chooses the interface
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Cluster:
    """Two Ray nodes and their agents, all started here and all stopped by `stop`."""

    def __init__(self, temp: Path, shared: Path) -> None:
        self.temp = temp
        self.shared = shared
        self.processes: list[subprocess.Popen[bytes]] = []
        gcs, dashboard = _free_ports(2)
        # Two nodes on one machine talk over its network address: Ray turns a loopback --address into it for a
        # second node, and a head bound to 127.0.0.1 is then out of reach. The dashboard (the Jobs API, which runs
        # any code it is given) stays on 127.0.0.1.
        self.ip = _node_ip()
        self.gcs = f"{self.ip}:{gcs}"
        self.dashboard = f"http://127.0.0.1:{dashboard}"
        self.dashboard_port = dashboard

    def env(self, host: str, gpus: str) -> dict[str, str]:
        return {
            **os.environ, "PYTHONPATH": str(REPO), "MEMPLUGIN_NODE_NAME": host, "MEMPLUGIN_SIMULATE_GPUS": gpus,
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    def start_node(self, host: str, gpus: str, head: bool) -> None:
        env = self.env(host, gpus)
        agent = [sys.executable, "-m", "digits_memplugin.jobs.backends.node", "--agent", str(self.shared), "--interval", "1"]
        subprocess.run([*agent, "--once"], env=env, check=True, timeout=60)
        report = json.loads((self.shared / "nodes" / f"{host}.json").read_text())
        resources = {host_resource(host): 1}
        resources.update({f"memplugin_gpu:{d['uuid']}": 1 for d in report["devices"] if d["kind"] == "gpu"})
        ports = _free_ports(8)
        command = [
            str(RAY), "start", "--block", "--node-ip-address", self.ip, "--num-cpus", "2", "--num-gpus", "0",
            "--resources", json.dumps(resources), "--disable-usage-stats",
            "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
            "--runtime-env-agent-port", str(ports[2]), "--dashboard-agent-grpc-port", str(ports[3]),
            "--dashboard-agent-listen-port", str(ports[4]), "--metrics-export-port", str(ports[5]),
            "--object-store-memory", str(100 * MIB),
        ]
        if head:
            command += ["--head", "--port", self.gcs.split(":")[1], "--dashboard-host", "127.0.0.1",
                        "--dashboard-port", str(self.dashboard_port), "--ray-client-server-port", str(ports[6]),
                        "--temp-dir", str(self.temp)]
        else:
            command += ["--address", self.gcs]
        with (self.temp.parent / f"{host}.log").open("wb") as log:
            self.processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True))
        self.processes.append(subprocess.Popen(agent, env=env, start_new_session=True))

    def nodes(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.dashboard}/api/v0/nodes?detail=1", timeout=10) as reply:
            rows = json.loads(reply.read())["data"]["result"]["result"]
        return [row for row in rows if row["state"] == "ALIVE"]

    def job(self, submission_id: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.dashboard}/api/jobs/{submission_id}", timeout=10) as reply:
            return json.loads(reply.read())  # type: ignore[no-any-return]

    def wait_ready(self, count: int) -> None:
        def ready() -> bool:
            with contextlib.suppress(OSError, ValueError, KeyError):
                return len(self.nodes()) >= count
            return False

        wait_for(ready, timeout=START_SECONDS, what=f"{count} Ray nodes")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)  # `ray start --block` stops what it started
        for process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        for pid in self._leftovers():  # workers Ray started in sessions of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _leftovers(self) -> list[int]:
        """Processes of this cluster still alive: their command line or environment names its folders."""
        marks = (str(self.temp).encode(), self.gcs.encode(), str(self.shared).encode())
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            except OSError:
                continue
            if any(mark in text for mark in marks):
                found.append(int(entry.name))
        return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if not RAY.exists():
        pytest.fail(f"Ray is not installed ({RAY}): `make test` installs it with constraints/ray.txt")
    base = Path(tempfile.mkdtemp(prefix="mpray", dir="/tmp"))  # short: Ray's socket paths must stay short
    shared = base / "shared"
    shared.mkdir()
    cluster = Cluster(base / "ray", shared)
    try:
        cluster.start_node("head", "2x8GiB", head=True)
        wait_for(lambda: cluster.processes[0].poll() is None and _answers(cluster.dashboard), timeout=START_SECONDS,
                 what="the Ray head's dashboard")
        cluster.start_node("n2", "1x16GiB", head=False)
        cluster.wait_ready(2)
    except BaseException:
        for log in sorted(base.glob("*.log")):  # what Ray said, in the test's report
            print(f"--- {log.name}\n" + log.read_text(errors="replace")[-3000:])
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
        raise
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=5):
            return True
    except OSError:
        return False


@pytest.fixture
def ray_app(cluster: Cluster, tmp_path: Path, datasets: Path) -> Iterator[Any]:
    app = create_app({
        "MEMPLUGIN_DATA_DIR": tmp_path / "data", "MEMPLUGIN_ASYNC_MODE": "threading",
        "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "MEMPLUGIN_JOB_EVENTS_PER_SECOND": 50, "TESTING": True,
        "MEMPLUGIN_JOB_BACKEND": "ray", "MEMPLUGIN_RAY_ADDRESS": cluster.dashboard,
        "MEMPLUGIN_SHARED_DIR": cluster.shared,
    })
    yield app
    get_plugin(app).close()


def body(**fields: Any) -> dict[str, Any]:
    return {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "max_iter": 4, **fields}


def ended(api: Any, job_id: str, timeout: float = 180) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (doc := api.get(f"{API}/{job_id}").get_json())["status"] in ("done", "failed", "cancelled") and doc,
        timeout=timeout, what=f"job {job_id} to end",
    )


def test_every_hosts_devices_are_listed_with_the_host(ray_app: Any) -> None:
    document = ray_app.test_client().get("/memplugin/api/devices").get_json()
    rows = {(row.get("host"), row["kind"]) for row in document["devices"]}
    assert {("head", "gpu"), ("n2", "gpu"), ("head", "cpu"), ("n2", "cpu")} <= rows
    assert len([row for row in document["devices"] if row["kind"] == "gpu"]) == 3  # 2 on the head, 1 on n2


def test_a_job_runs_on_the_node_asked_and_streams_its_progress(
    cluster: Cluster, ray_app: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="digits_memplugin.jobs.backends.ray")
    monkeypatch.setattr(ray_backend, "TAIL_AFTER_CHARS", 0)  # this short job's log followed through Ray's tail
    tails: list[str] = []
    opened = ray_backend.RayJobsClient.tail

    def tail(client: ray_backend.RayJobsClient, submission_id: str) -> ray_backend.LogTail:
        stream = opened(client, submission_id)
        tails.append(submission_id)
        return stream

    monkeypatch.setattr(ray_backend.RayJobsClient, "tail", tail)
    api = ray_app.test_client()
    watcher = get_plugin(ray_app).socketio.test_client(ray_app, namespace=NS)
    job = api.post(API, json=body(device="cpu@n2")).get_json()
    assert "id" in job, job
    watcher.emit("subscribe_job", {"id": job["id"]}, namespace=NS)
    received: list[dict[str, Any]] = []

    def done() -> bool:
        received.extend(watcher.get_received(NS))
        return any(e["name"] == "job" and e["args"][0]["status"] in ("done", "failed") for e in received)

    wait_for(done, timeout=180, what="the job's end over the websocket")
    document = ended(api, job["id"])
    assert document["status"] == "done", document
    assert {"job_progress", "job_log", "job_attempt"} <= {e["name"] for e in received}
    iterations = [e["args"][0]["iteration"] for e in received
                  if e["name"] == "job_progress" and e["args"][0].get("event") == "iteration"]
    assert iterations and iterations[-1] == 4

    store = get_plugin(ray_app).jobs.store
    (attempt,) = store.attempts(job["id"])
    assert attempt.handle == f"ray:{job['id']}-1"
    ran_on = cluster.job(f"{job['id']}-1")["driver_node_id"]
    node = next(node for node in cluster.nodes() if node["node_id"] == ran_on)
    assert host_resource("n2") in node["resources_total"]  # the node asked, not the head
    assert tails == [f"{job['id']}-1"]  # followed through Ray's log tail, opened once
    assert not [r for r in caplog.records if "whole log" in r.getMessage()]


def test_cancel_stops_the_job_on_its_node(cluster: Cluster, ray_app: Any) -> None:
    api = ray_app.test_client()
    job = api.post(API, json=body(device="cpu@head", max_iter=100000)).get_json()
    wait_for(lambda: api.get(f"{API}/{job['id']}").get_json()["iteration"] >= 1, timeout=120,
             what="the job's first iteration")
    assert api.post(f"{API}/{job['id']}/cancel").status_code == 200
    document = ended(api, job["id"], timeout=60)
    assert document["status"] == "cancelled", document
    wait_for(lambda: cluster.job(f"{job['id']}-1")["status"] in ("STOPPED", "SUCCEEDED", "FAILED"), timeout=30,
             what="Ray to see the job end")


def _agreeing(document: dict[str, Any], progress: dict[str, Any]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What must be the same on both backends: each attempt's plan and end, each record's attempt, kind and
    iteration (times and memory readings vary from run to run)."""
    attempts = [(a["status"], a["batch_size"], a["iter_size"], a["test_batch_size"], a["start_iteration"],
                 a["end_iteration"], (a["out_of_memory"] or {}).get("signature")) for a in document["attempts"]]
    records = [(r.get("attempt"), r.get("event"), r.get("iteration")) for r in progress["records"]]
    return attempts, records


def test_an_out_of_memory_attempt_under_a_cap_is_retried_smaller_as_the_local_backend_does(
    ray_app: Any, tmp_path: Path, datasets: Path
) -> None:
    """The issue's REST job under a 64 MiB cap on a node of the cluster, and the same job on the local backend:
    the same attempts (an out-of-memory one, then the plan that fits) and the same records."""
    local_app = create_app({
        "MEMPLUGIN_DATA_DIR": tmp_path / "local", "MEMPLUGIN_ASYNC_MODE": "threading",
        "MEMPLUGIN_DATASET_ROOTS": [str(datasets)], "MEMPLUGIN_JOB_EVENTS_PER_SECOND": 50, "TESTING": True,
    })
    seen = {}
    try:
        for name, app, device in (("ray", ray_app, "cpu@n2"), ("local", local_app, "cpu")):
            api = app.test_client()
            job = api.post(API, json=body(device=device, batch=512, memory_cap=64 * MIB, test_net="shared",
                                          fallback={"start": "wanted"})).get_json()
            assert "id" in job, job
            document = ended(api, job["id"], timeout=240)
            assert document["status"] == "done", (name, document)
            seen[name] = _agreeing(document, api.get(f"{API}/{job['id']}/progress").get_json())
    finally:
        get_plugin(local_app).close()
    attempts, records = seen["ray"]
    first, *_, last = attempts
    assert first[:2] == ("out_of_memory", 512)
    assert first[-1] == "host_allocation_failed"  # classified on the node
    assert last[0] == "success" and last[1] < 512 and last[1] * last[2] >= 512
    assert records and records[-1][:3] == (len(attempts), "iteration", 4), records
    assert seen["ray"] == seen["local"]


def test_the_gevent_server_runs_jobs_on_the_ray_backend(cluster: Cluster, tmp_path: Path, datasets: Path) -> None:
    """`serve --backend ray` as users start it: gevent-patched, talking to Ray over HTTP only (ray.init would hang)."""
    import requests
    from test_jobs_restart import serve

    data = tmp_path / "served"
    data.mkdir()
    server = serve(data, tmp_path / "serve.log", "--backend", "ray", "--ray-address", cluster.dashboard,
                   "--shared-dir", str(cluster.shared), "--dataset-root", str(datasets))
    try:
        devices = requests.get(server.api("/devices"), timeout=10).json()["devices"]
        assert {"cpu@head", "cpu@n2"} <= {row["key"] for row in devices}
        job = requests.post(server.api("/jobs"), json=body(device="cpu@n2"), timeout=10).json()
        assert "id" in job, job
        document = wait_for(
            lambda: (doc := requests.get(server.api(f"/jobs/{job['id']}"), timeout=10).json())["status"]
            in ("done", "failed") and doc,
            timeout=180, what="the served job to end",
        )
        assert document["status"] == "done", document
    finally:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=10)
