"""Floods and storage (docs/security.md, "Floods and storage"; issue 18, items 7 and 9): many clients each within
their own limits must not stall the one server thread, and failed jobs must not fill the disk.

- Estimates of large texts run in worker processes (estimate_pool.py): on the real gevent server, /devices keeps
  answering while several clients post 2.7 MiB nets, a full queue is a 503 with Retry-After, small estimates are
  still answered meanwhile.
- Socket.IO: a cap on connections (refused beyond it, on the real server) and on events from all clients together.
- Jobs: a cap on the jobs stored (400) and on their folders' bytes (507), each naming jobs to delete; the list is
  paged (REST, the jobs page, subscribe_jobs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import socketio
from flask import Flask
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, wait_for
from zoo_cases import ZOO

from digits_memplugin import create_app
from digits_memplugin.core.errors import NetError, PrototxtSyntaxError
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.estimate.pool import EstimatePool, PoolBusy, PoolCrashed, PoolTimeout
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.host.settings import ConfigError, Settings

pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api"
NS = "/memplugin"
SCRIPT = Path(sys.executable).parent / "digits-memplugin"
RESNET50 = (ZOO / "resnet50_kaiminghe" / "ResNet-50-deploy.prototxt").read_text()
BIG_NET = 'layer { name: "d" type: "Input" top: "x" input_param { shape { ' + "dim: 1 " * 400_000 + "} } }\n"
"""The issue's net: 2.7 MiB, 400,000 `dim:` entries (a 400 in the end: a blob has at most 32 axes), 2.5 s to read."""


def big_net(tag: str) -> str:
    """BIG_NET made unique by a comment, as the probe did, so that no cache answers it."""
    return f"# {tag} {time.time_ns()}\n" + BIG_NET


def make_app(data_dir: Path, datasets: Path | None = None, **config: Any) -> Flask:
    settings = {
        "MEMPLUGIN_DATA_DIR": data_dir,
        "MEMPLUGIN_ASYNC_MODE": "threading",
        "TESTING": True,
        **({"MEMPLUGIN_DATASET_ROOTS": [str(datasets)]} if datasets else {}),
        **{f"MEMPLUGIN_{key.upper()}": value for key, value in config.items()},
    }
    return create_app(settings)


# ============================================================================ settings


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("MEMPLUGIN_ESTIMATE_INLINE_BYTES", -1),
        ("MEMPLUGIN_ESTIMATE_WORKERS", 0),
        ("MEMPLUGIN_ESTIMATE_WORKERS", "2"),
        ("MEMPLUGIN_ESTIMATE_QUEUE", 1.5),
        ("MEMPLUGIN_MAX_SOCKET_CONNECTIONS", 0),
        ("MEMPLUGIN_SOCKET_EVENTS_PER_SECOND", 0.5),
        ("MEMPLUGIN_SOCKET_EVENTS_PER_SECOND", float("nan")),
        ("MEMPLUGIN_MAX_STORED_JOBS", 0),
        ("MEMPLUGIN_MAX_STORED_BYTES", 1000),
        ("MEMPLUGIN_MAX_STORED_BYTES", "lots"),
    ],
)
def test_flood_and_storage_settings_are_checked_at_start_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        Settings.from_config({key: value})


def test_flood_and_storage_defaults() -> None:
    settings = Settings.from_config({})
    assert settings.estimate_inline_bytes == 16 * 1024
    assert (settings.estimate_workers, settings.estimate_queue) == (None, 8)
    assert (settings.max_socket_connections, settings.socket_events_per_second) == (500, 200.0)
    assert (settings.max_stored_jobs, settings.max_stored_bytes) == (1000, 20 * 1024**3)
    assert Settings.from_config({"MEMPLUGIN_MAX_STORED_BYTES": "50GiB"}).max_stored_bytes == 50 * 1024**3


# ============================================================================ the estimate pool itself


@pytest.fixture
def pool() -> Iterator[EstimatePool]:
    pool = EstimatePool(1, 0, inline_bytes=0)
    yield pool
    pool.close()


def test_a_worker_answers_what_the_server_would(pool: EstimatePool) -> None:
    request = EstimateRequest(net=RESNET50, free_bytes=16 << 30)
    assert pool.estimate(request) == estimate(request)
    assert pool.offloaded == 1 and pool.started_workers == 1


def test_a_definition_error_crosses_the_pipe_with_its_place(pool: EstimatePool) -> None:
    with pytest.raises(PrototxtSyntaxError) as raised:
        pool.estimate(EstimateRequest(net="layer {\n  nonsense: 1\n}\n"))
    with pytest.raises(NetError) as inline:
        estimate(EstimateRequest(net="layer {\n  nonsense: 1\n}\n"))
    assert raised.value.to_dict() == inline.value.to_dict() and raised.value.line == 2


def test_small_texts_stay_in_the_server_and_large_ones_go_to_a_worker() -> None:
    pool = EstimatePool(1, 0, inline_bytes=len(RESNET50))
    try:
        pool.estimate(EstimateRequest(net=RESNET50))
        assert pool.offloaded == 0 and pool.started_workers == 0
        pool.estimate(EstimateRequest(net=RESNET50 + " "))
        assert pool.offloaded == 1 and pool.started_workers == 1
    finally:
        pool.close()


def test_a_full_queue_is_refused_at_once_with_when_to_try_again(pool: EstimatePool) -> None:
    done: list[Any] = []

    def slow_estimate() -> None:
        try:
            pool.estimate(EstimateRequest(net=big_net("slow")))
        except NetError as error:
            done.append(error)

    slow = threading.Thread(target=slow_estimate)
    slow.start()
    wait_for(lambda: pool._idle == [], timeout=30, what="the worker to be busy")
    started = time.monotonic()
    with pytest.raises(PoolBusy, match="MEMPLUGIN_ESTIMATE_QUEUE") as busy:
        pool.estimate(EstimateRequest(net=RESNET50))
    assert time.monotonic() - started < 0.5 and busy.value.retry_after >= 1
    slow.join(60)
    assert done and "axes" in str(done[0])
    assert pool.estimate(EstimateRequest(net=RESNET50))["total_bytes"] > 0  # the worker is free again


def test_a_worker_past_its_time_is_killed_and_the_next_call_gets_a_new_one() -> None:
    pool = EstimatePool(1, 0, inline_bytes=0, timeout=0.3)
    try:
        pool.estimate(EstimateRequest(net=RESNET50))
        first = pool._slots[0].process.pid  # type: ignore[union-attr]
        with pytest.raises(PoolTimeout, match=r"longer than 0\.3 s"):
            pool.estimate(EstimateRequest(net=big_net("timeout")))
        wait_for(lambda: not os.path.exists(f"/proc/{first}") or "Z" in Path(f"/proc/{first}/stat").read_text().split()[2],
                 timeout=10, what="the worker to be gone")
        pool.timeout = 60
        assert pool.estimate(EstimateRequest(net=RESNET50))["total_bytes"] > 0
        assert pool._slots[0].process.pid != first  # type: ignore[union-attr]
    finally:
        pool.close()


def test_a_worker_that_dies_is_replaced(pool: EstimatePool) -> None:
    pool.estimate(EstimateRequest(net=RESNET50))
    worker = pool._slots[0]
    assert worker is not None
    threading.Timer(0.5, worker.process.kill).start()
    with pytest.raises(PoolCrashed, match="ended before answering"):
        pool.estimate(EstimateRequest(net=big_net("killed")))
    assert pool.estimate(EstimateRequest(net=RESNET50))["total_bytes"] > 0


# ============================================================================ through the API (test client)


def test_a_large_estimate_through_the_api_matches_the_in_process_one(data_dir: Path, datasets: Path) -> None:
    inline, pooled = make_app(data_dir / "a", datasets), make_app(data_dir / "b", datasets, estimate_inline_bytes=0)
    # The in-process path without its 0.1 s deadline: on a loaded machine the dataset reads alone pass it, and the
    # estimate would go on in a worker (a CI run saw exactly that); the deadline has its own tests above.
    get_plugin(inline).estimates.inline_seconds = 60.0  # type: ignore[union-attr]
    try:
        net = LENET.replace("examples/mnist/", "")  # the dataset root's own LMDBs
        body = {"net": net, "read_datasets": True, "free_bytes": 8 << 30, "curve_batches": [1, 8]}
        answers = [app.test_client().post(f"{API}/estimate", json=body) for app in (inline, pooled)]
        assert [a.status_code for a in answers] == [200, 200]
        assert answers[0].get_json() == answers[1].get_json()
        assert get_plugin(inline).estimates.offloaded == 0 and get_plugin(pooled).estimates.offloaded == 1  # type: ignore[union-attr]
        # a dataset that cannot be read is still the 400 on read_datasets, from the worker too
        broken = {"net": net.replace("mnist_train_lmdb", "/etc"), "read_datasets": True}  # outside the roots
        refused = [app.test_client().post(f"{API}/estimate", json=broken) for app in (inline, pooled)]
        assert [r.status_code for r in refused] == [400, 400]
        assert refused[0].get_json() == refused[1].get_json() and "read_datasets" in refused[1].get_json()["errors"]
    finally:
        get_plugin(inline).close()
        get_plugin(pooled).close()


def test_the_new_model_forms_json_twin_estimates_in_the_pool_too(data_dir: Path, datasets: Path) -> None:
    app = make_app(data_dir, datasets, estimate_inline_bytes=0)
    try:
        body = {"model_name": "lenet", "train_source": "mnist_train_lmdb", "val_source": "mnist_test_lmdb",
                "device": "cpu", "batch_size": "auto", "max_iter": 2}  # the standard LeNet
        answer = app.test_client().post("/memplugin/models.json", json=body)
        assert answer.status_code == 201, answer.get_data(as_text=True)
        assert get_plugin(app).estimates.offloaded >= 1  # type: ignore[union-attr]
        app.test_client().post(f"{API}/jobs/{answer.get_json()['id']}/cancel")
    finally:
        get_plugin(app).close()


# ============================================================================ the real gevent server


class Served:
    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    def api(self, path: str) -> str:
        return f"{self.url}memplugin/api{path}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        assert "Traceback" not in self.log.read_text(), self.log.read_text()[-3000:]


LAUNCHER = """
import json, sys
from gevent import monkey
monkey.patch_all()
from digits_memplugin.host.app import create_app
from digits_memplugin.host.server import serve
serve(create_app(json.loads(sys.argv[1])), "127.0.0.1", 0)
"""
"""`digits-memplugin serve` with settings it has no option for: the same app, server and monkey-patching."""


def start(folder: Path, config: dict[str, Any] | None = None) -> Served:
    log = folder / "serve.log"
    if config is None:
        command = [str(SCRIPT), "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(folder / "data")]
    else:
        settings = {"MEMPLUGIN_DATA_DIR": str(folder / "data"), "MEMPLUGIN_ASYNC_MODE": "gevent", **config}
        command = [sys.executable, "-c", LAUNCHER, json.dumps(settings)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=folder)
    url = wait_for(lambda: (m := re.search(r"serving on (http://127\.0\.0\.1:\d+/)", log.read_text())) and m.group(1),
                   timeout=90, what="the server's address")
    return Served(process, url, log)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`digits-memplugin serve` as it is shipped (default settings)."""
    server = start(tmp_path_factory.mktemp("floods"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The same server with one estimate worker, one waiting place, and three socket connections."""
    server = start(tmp_path_factory.mktemp("tight"), {
        "MEMPLUGIN_ESTIMATE_WORKERS": 1, "MEMPLUGIN_ESTIMATE_QUEUE": 1, "MEMPLUGIN_MAX_SOCKET_CONNECTIONS": 3,
    })
    yield server
    server.stop()


def post_all(server: Served, nets: list[str]) -> list[requests.Response]:
    """POST each net to /api/estimate at once, each from its own client."""
    answers: list[requests.Response] = []
    threads = [threading.Thread(target=lambda net=net: answers.append(
        requests.post(server.api("/estimate"), json={"net": net}, timeout=300))) for net in nets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


DEVICES_BOUND = 3.0
"""Seconds /devices may take while the large estimates run: generous, as the machine is shared. Before the pool,
each estimate held the server's only thread for 2.5 s (10 s on a loaded machine) and /devices waited for them
(18.5 s with 4 clients posting twice). With the pool the server still reads each body, checks its text and hands it
over (about 0.2 s for 2.7 MiB, of which most is the check for lone surrogates); figures in docs/security.md."""


@pytest.mark.slow
def test_devices_keep_answering_while_clients_post_large_nets(served: Served) -> None:
    requests.get(served.api("/devices"), timeout=30)
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            started = time.monotonic()
            assert requests.get(served.api("/devices"), timeout=120).status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)  # the probe's pace: /devices asked all through the posts, a sample, not a wait

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        answers = post_all(served, [big_net(f"client {i}") for i in range(4)])
    finally:
        done.set()
        prober.join()
    assert [a.status_code for a in answers] == [400] * 4, [a.text[:200] for a in answers]
    assert all("axes" in json.dumps(a.json()["errors"]) for a in answers)
    assert len(latencies) >= 10 and max(latencies) < DEVICES_BOUND, sorted(latencies)[-5:]


@pytest.mark.slow
def test_a_full_estimate_queue_is_a_503_with_retry_after_and_small_estimates_go_on(tight: Served) -> None:
    small: list[requests.Response] = []
    done = threading.Event()

    def lenet() -> None:
        while not done.is_set():
            small.append(requests.post(tight.api("/estimate"), json={"net": LENET, "data_shapes": {"*": [1, 28, 28]}},
                                       timeout=60))
            time.sleep(0.2)  # the pace of a client asking small estimates all through the large ones

    asker = threading.Thread(target=lenet)
    asker.start()
    try:
        answers = post_all(tight, [big_net(f"queue {i}") for i in range(5)])
    finally:
        done.set()
        asker.join()
    statuses = sorted(a.status_code for a in answers)
    assert 503 in statuses and statuses.count(400) >= 2, statuses  # one running, one waiting, the rest refused
    for refused in (a for a in answers if a.status_code == 503):
        assert refused.headers["Content-Type"] == "application/json"
        assert int(refused.headers["Retry-After"]) >= 1
        document = refused.json()
        assert document["status"] == 503 and "MEMPLUGIN_ESTIMATE_QUEUE" in document["error"]
    assert small and all(a.status_code == 200 for a in small)  # small texts stay in the server, never queued


def socket_client(server: Served) -> tuple[socketio.Client, list[Any]]:
    client = socketio.Client(reconnection=False)
    refusals: list[Any] = []
    client.on("connect_error", refusals.append, namespace=NS)
    return client, refusals


@pytest.mark.slow
def test_socket_connections_beyond_the_cap_are_refused(tight: Served) -> None:
    clients = []
    try:
        for _ in range(3):
            client, _refusals = socket_client(tight)
            client.connect(tight.url, namespaces=[NS], transports=["websocket"], wait_timeout=30)
            clients.append(client)
        extra, refusals = socket_client(tight)
        with pytest.raises(socketio.exceptions.ConnectionError):
            extra.connect(tight.url, namespaces=[NS], transports=["websocket"], wait_timeout=30)
        assert "MEMPLUGIN_MAX_SOCKET_CONNECTIONS" in json.dumps(refusals), refusals
        extra.disconnect()
        clients.pop().disconnect()  # a place frees up
        later, _ = socket_client(tight)
        wait_for(lambda: _connects(later, tight), timeout=30, what="a connection once one left")
        clients.append(later)
    finally:
        for client in clients:
            client.disconnect()


def _connects(client: socketio.Client, server: Served) -> bool:
    try:
        client.connect(server.url, namespaces=[NS], transports=["websocket"], wait_timeout=30)
    except socketio.exceptions.ConnectionError:
        client.disconnect()
        return False
    return True


# ============================================================================ events from all clients together


def test_events_from_all_clients_together_are_capped(data_dir: Path) -> None:
    """Five clients each send 10 subscriptions, each within its own burst of 40 (a page listing no job counts 3:
    web/socket/namespace.py's event_cost); together they pass the server's 20 at once (10 a second), so about 7 are
    handled, and the others are refused with a message saying so."""
    app = make_app(data_dir, socket_events_per_second=10)
    try:
        socketio_ = get_plugin(app).socketio
        clients = [socketio_.test_client(app, namespace=NS) for _ in range(5)]
        for client in clients:
            client.get_received(NS)
        for client in clients:
            for _ in range(10):
                client.emit("subscribe_jobs", namespace=NS)
        received = [event for client in clients for event in client.get_received(NS)]
        handled = [e for e in received if e["name"] == "jobs"]
        told = [e["args"][0] for e in received if e["name"] == "rate_limited"]
        assert 7 <= len(handled) < 12, len(handled)
        # a page is charged before it is handled, so the bucket may be in debt: at least one token's wait, 0.1 s
        assert told and all("all its clients together" in t["error"] and 0.1 <= t["retry_after"] <= 1.3 for t in told)
        for client in clients:
            client.disconnect(namespace=NS)
    finally:
        get_plugin(app).close()


def test_socket_connections_are_counted_and_released(data_dir: Path) -> None:
    app = make_app(data_dir, max_socket_connections=2)
    try:
        socketio_ = get_plugin(app).socketio
        first, second = socketio_.test_client(app, namespace=NS), socketio_.test_client(app, namespace=NS)
        assert first.is_connected(NS) and second.is_connected(NS)
        third = socketio_.test_client(app, namespace=NS)
        assert not third.is_connected(NS)
        first.disconnect(namespace=NS)
        fourth = socketio_.test_client(app, namespace=NS)
        assert fourth.is_connected(NS)
    finally:
        get_plugin(app).close()


# ============================================================================ stored jobs and bytes


def job_body(**fields: Any) -> dict[str, Any]:
    """A job that fails at once and stays stored: its 1 MiB memory cap fits not even batch 1."""
    return {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4,
            "memory_cap": "1MiB", **fields}


def folders(data_dir: Path) -> set[str]:
    return {path.name for path in (data_dir / "jobs").iterdir()}


def test_stored_jobs_are_capped_with_a_400_naming_jobs_to_delete(data_dir: Path, datasets: Path) -> None:
    app = make_app(data_dir, datasets, max_stored_jobs=3)
    api = app.test_client()
    try:
        jobs = [api.post(f"{API}/jobs", json=job_body(name=f"job{i}")).get_json() for i in range(3)]
        wait_for(lambda: all(api.get(f"{API}/jobs/{j['id']}").get_json()["status"] == "failed" for j in jobs),
                 what="the jobs to fail")
        before = folders(data_dir)
        refused = api.post(f"{API}/jobs", json=job_body())
        assert refused.status_code == 400
        message = refused.get_json()["errors"]["stored_jobs"]
        assert "3 jobs are stored" in message and "MEMPLUGIN_MAX_STORED_JOBS" in message and "delete" in message
        assert jobs[0]["id"] in message  # the oldest, named
        assert folders(data_dir) == before  # nothing written
        assert api.delete(f"{API}/jobs/{jobs[0]['id']}").status_code == 204
        assert api.post(f"{API}/jobs", json=job_body()).status_code == 201
    finally:
        get_plugin(app).close()


def test_stored_bytes_are_capped_with_a_507_naming_the_largest_jobs(data_dir: Path, datasets: Path) -> None:
    app = make_app(data_dir, datasets, max_stored_bytes="1MiB")
    api = app.test_client()
    padded = LENET + "# " + "x" * 300_000 + "\n"
    try:
        answers = []
        for _ in range(6):
            answers.append(api.post(f"{API}/jobs", json=job_body(net=padded)))
            if answers[-1].status_code != 201:
                break
        created = [a.get_json()["id"] for a in answers if a.status_code == 201]
        refused = answers[-1]
        assert len(created) >= 2 and refused.status_code == 507, [a.status_code for a in answers]
        document = refused.get_json()
        assert document["status"] == 507 and "MEMPLUGIN_MAX_STORED_BYTES" in document["error"]
        assert "delete" in document["error"] and any(job_id in document["error"] for job_id in created)
        assert folders(data_dir) == set(created)  # nothing left of the refused one
        wait_for(lambda: all(api.get(f"{API}/jobs/{i}").get_json()["status"] == "failed" for i in created),
                 what="the jobs to fail")
        assert api.delete(f"{API}/jobs/{created[0]}").status_code == 204
        assert api.post(f"{API}/jobs", json=job_body(net=padded)).status_code == 201  # room again
    finally:
        get_plugin(app).close()


# ============================================================================ paging


@pytest.fixture
def five_jobs(data_dir: Path, datasets: Path) -> Iterator[tuple[Flask, list[str]]]:
    app = make_app(data_dir, datasets)
    api = app.test_client()
    ids = [api.post(f"{API}/jobs", json=job_body(name=f"job{i}")).get_json()["id"] for i in range(5)]
    wait_for(lambda: all(api.get(f"{API}/jobs/{i}").get_json()["status"] == "failed" for i in ids), what="failures")
    yield app, ids
    get_plugin(app).close()


def test_the_jobs_list_is_paged_newest_first(five_jobs: tuple[Flask, list[str]]) -> None:
    app, ids = five_jobs
    api = app.test_client()
    whole = api.get(f"{API}/jobs").get_json()
    assert [j["id"] for j in whole["jobs"]] == ids and (whole["total"], whole["limit"], whole["older"]) == (5, 50, None)
    first = api.get(f"{API}/jobs?limit=2").get_json()
    assert [j["id"] for j in first["jobs"]] == ids[3:] and first["older"] == ids[3] and first["total"] == 5
    second = api.get(f"{API}/jobs?limit=2&before={first['older']}").get_json()
    assert [j["id"] for j in second["jobs"]] == ids[1:3] and second["older"] == ids[1]
    last = api.get(f"{API}/jobs?limit=2&before={second['older']}").get_json()
    assert [j["id"] for j in last["jobs"]] == ids[:1] and last["older"] is None


@pytest.mark.parametrize("query", ["limit=0", "limit=501", "limit=x", "limit=%C2%B2", "limit=" + "9" * 5000,
                                   "before=20990101-000000-abcdef", "before=%ED%A0%80"])
def test_a_bad_page_is_a_400_saying_why(five_jobs: tuple[Flask, list[str]], query: str) -> None:
    answer = five_jobs[0].test_client().get(f"{API}/jobs?{query}")
    assert answer.status_code == 400, answer.get_data(as_text=True)[:300]
    assert "limit" in answer.get_json()["error"] or "before" in answer.get_json()["error"]


def test_subscribe_jobs_and_the_jobs_page_are_paged_too(five_jobs: tuple[Flask, list[str]]) -> None:
    app, ids = five_jobs
    client = get_plugin(app).socketio.test_client(app, namespace=NS)
    client.get_received(NS)
    client.emit("subscribe_jobs", {"limit": 2}, namespace=NS)
    client.emit("subscribe_jobs", {"limit": 2, "before": ids[3]}, namespace=NS)
    client.emit("subscribe_jobs", {"limit": 0}, namespace=NS)
    received = client.get_received(NS)
    pages = [e["args"][0] for e in received if e["name"] == "jobs"]
    assert [[j["id"] for j in page["jobs"]] for page in pages] == [ids[3:], ids[1:3]]
    assert [e["args"][0]["error"] for e in received if e["name"] == "job_error"] == ["limit must be a whole number from 1 to 500"]
    client.emit("subscribe_jobs", namespace=NS)  # as jobs.js sent it before: the newest page
    assert [j["id"] for j in client.get_received(NS)[0]["args"][0]["jobs"]] == ids

    page = app.test_client().get("/memplugin/jobs?limit=2").get_data(as_text=True)
    assert "job4" in page and "job3" in page and "job2" not in page
    assert f'href="/memplugin/jobs?before={ids[3]}&amp;limit=2" id="older-jobs"' in page and "5 jobs stored" in page
    older = app.test_client().get(f"/memplugin/jobs?limit=2&before={ids[1]}").get_data(as_text=True)
    assert "job0" in older and "job1" not in older and 'id="newest-jobs"' in older
    assert app.test_client().get("/memplugin/jobs?before=nope").status_code == 404
