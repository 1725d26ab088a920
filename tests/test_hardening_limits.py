"""Limits, each with a clear error when exceeded: request and upload size (JSON, multipart, and chunked bodies on the
real gevent server), prototxt size and layer count through the APIs, the number of queued jobs, and the events one
socketio client may send. Through the Flask and socketio test clients; real training children where a job must run.
"""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, wait_for
from test_jobs_restart import Server, serve

from digits_memplugin import create_app
from digits_memplugin.core.prototxt import DEFAULT_LIMITS
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.host.settings import ConfigError, Settings
from digits_memplugin.web.socket.throttle import ClientRateLimiter

pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api"
NS = "/memplugin"
LIMIT = 64 * 1024
"""MEMPLUGIN_MAX_REQUEST_BYTES of the apps below: small, so that going over it costs the test little."""


def make_app(data_dir: Path, datasets: Path, **config: Any) -> Flask:
    settings = {
        "MEMPLUGIN_DATA_DIR": data_dir,
        "MEMPLUGIN_ASYNC_MODE": "threading",
        "MEMPLUGIN_DATASET_ROOTS": [str(datasets)],
        "MEMPLUGIN_MAX_REQUEST_BYTES": LIMIT,
        "TESTING": True,
        **{f"MEMPLUGIN_{key.upper()}": value for key, value in config.items()},
    }
    return create_app(settings)


@pytest.fixture
def limited(data_dir: Path, datasets: Path) -> Iterator[Flask]:
    app = make_app(data_dir, datasets)
    yield app
    get_plugin(app).close()


def job_body(**fields: Any) -> dict[str, Any]:
    return {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4, **fields}


def no_job_folders(data_dir: Path) -> bool:
    jobs = data_dir / "jobs"
    return not jobs.exists() or not any(jobs.iterdir())


# ============================================================================ settings


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("MEMPLUGIN_MAX_QUEUED_JOBS", 0),
        ("MEMPLUGIN_MAX_QUEUED_JOBS", 2.5),
        ("MEMPLUGIN_STORE_BUSY_SECONDS", -1),
        ("MEMPLUGIN_STORE_BUSY_SECONDS", float("inf")),
        ("MEMPLUGIN_CLIENT_EVENTS_PER_SECOND", 0),
        ("MEMPLUGIN_CLIENT_EVENT_BURST", True),
        ("MEMPLUGIN_MAX_REQUEST_BYTES", 100),
    ],
)
def test_limit_settings_are_checked_at_start_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        Settings.from_config({key: value})


def test_limit_defaults() -> None:
    settings = Settings.from_config({})
    assert (settings.max_queued_jobs, settings.store_busy_seconds) == (100, 10.0)
    assert (settings.client_events_per_second, settings.client_event_burst) == (20.0, 40)
    assert settings.max_request_bytes == 4 * 1024 * 1024


# ============================================================================ request and upload size


def test_an_upload_over_the_limit_is_413_json_and_creates_nothing(limited: Flask, data_dir: Path) -> None:
    api = limited.test_client()
    big = LENET + "\n# padding\n" * (LIMIT // 10)
    response = api.post(
        f"{API}/jobs",
        data={
            "net": (io.BytesIO(big.encode()), "net.prototxt"),
            "solver": (io.BytesIO(SHORT_SOLVER.encode()), "solver.prototxt"),
            "device": "cpu",
        },
        content_type="multipart/form-data",
    )
    assert response.status_code == 413 and response.is_json
    assert f"the limit is {LIMIT}" in response.get_json()["error"]
    assert api.get(f"{API}/jobs").get_json()["jobs"] == [] and no_job_folders(data_dir)


@pytest.mark.parametrize("path", ["/jobs", "/estimate"])
def test_a_json_body_over_the_limit_is_413_json(limited: Flask, path: str) -> None:
    response = limited.test_client().post(f"{API}{path}", json=job_body(net=LENET + " " * LIMIT))
    assert response.status_code == 413 and response.is_json
    assert f"the limit is {LIMIT}" in response.get_json()["error"]


def test_an_upload_just_under_the_limit_is_taken(limited: Flask) -> None:
    """The limit is the request's size, not a smaller hidden one (Werkzeug's form parts, say)."""
    api = limited.test_client()
    padded = LENET + "#" * (LIMIT - len(LENET) - 2048)
    response = api.post(
        f"{API}/jobs",
        data={
            "net": (io.BytesIO(padded.encode()), "net.prototxt"),
            "solver": (io.BytesIO(SHORT_SOLVER.encode()), "solver.prototxt"),
            "data": '{"train": "mnist_train_lmdb", "test": "mnist_test_lmdb"}',
            "device": "cpu",
            "max_iter": "1",
        },
        content_type="multipart/form-data",
    )
    assert response.status_code == 201, response.get_json()
    doc = wait_for(lambda: (d := api.get(f"{API}/jobs/{response.get_json()['id']}").get_json())["status"] in ("done", "failed") and d, timeout=120)
    assert doc["status"] == "done", doc


def layers(count: int) -> str:
    body = "".join(f'layer {{ name: "r{i}" type: "ReLU" bottom: "data" top: "data" }}\n' for i in range(count))
    return 'name: "many"\nlayer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1 } } }\n' + body


@pytest.mark.parametrize("path", ["/jobs", "/estimate"])
def test_a_net_over_the_layer_limit_is_400_naming_the_net(data_dir: Path, datasets: Path, path: str) -> None:
    app = make_app(data_dir, datasets, max_request_bytes=8 << 20)
    try:
        response = app.test_client().post(f"{API}{path}", json={"net": layers(DEFAULT_LIMITS.max_layers), "solver": SHORT_SOLVER})
        error = response.get_json()["errors"]["net"]
        assert response.status_code == 400
        assert f"more than {DEFAULT_LIMITS.max_layers} layers (the limit)" in error["message"]
        assert no_job_folders(data_dir)
    finally:
        get_plugin(app).close()


@pytest.mark.parametrize("path", ["/jobs", "/estimate"])
def test_a_prototxt_over_the_size_limit_is_400_naming_it(data_dir: Path, datasets: Path, path: str) -> None:
    """With the request limit raised past the prototxt limit, the parser's own bound still holds."""
    app = make_app(data_dir, datasets, max_request_bytes=DEFAULT_LIMITS.max_bytes + (1 << 20))
    try:
        huge = LENET + "#" * DEFAULT_LIMITS.max_bytes
        response = app.test_client().post(f"{API}{path}", json={"net": huge, "solver": SHORT_SOLVER})
        assert response.status_code == 400
        assert f"the limit is {DEFAULT_LIMITS.max_bytes}" in response.get_json()["errors"]["net"]["message"]
        assert no_job_folders(data_dir)
    finally:
        get_plugin(app).close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_iter", 2**63), ("max_iter", 2**31), ("classes", 2**40), ("batch", 2**31),
     ("data_shapes", {"data": [1, 2**31, 28]}), ("memory_cap", 2**70)],
)
def test_numbers_beyond_what_caffe_and_sqlite_hold_are_400_naming_the_field(
    limited: Flask, data_dir: Path, field: str, value: Any
) -> None:
    """Caffe's counts are 32-bit and SQLite's integers 64-bit: 2**63 as max_iter was a 500 (OverflowError in the
    store) before the request checked the range (found by bench/fuzz_api.py)."""
    response = limited.test_client().post(f"{API}/jobs", json=job_body(**{field: value}))
    assert response.status_code == 400, response.get_json()
    errors = response.get_json()["errors"]
    assert any(key.startswith(field) for key in errors), errors
    assert no_job_folders(data_dir)


# --- chunked bodies (no Content-Length) on the real gevent server


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("live")
    server = serve(folder / "data", folder / "serve.log")
    yield server
    server.process.terminate()
    server.process.wait(timeout=30)


def chunked(server: Server, path: str, content_type: str, chunks: list[bytes], end: bool) -> bytes:
    """Send a chunked request (ended or left open, as a client that keeps sending would) and return the first
    bytes of the answer; b"" when none came within 8 seconds."""
    host, port = server.url.split("//")[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=8) as connection:
        connection.sendall(
            f"POST /memplugin/api{path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
        )
        try:
            for chunk in chunks:
                connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if end:
                connection.sendall(b"0\r\n\r\n")
            return connection.recv(400)
        except (TimeoutError, ConnectionError):
            return b""


def test_a_small_chunked_body_is_read_whole(live_server: Server) -> None:
    """The harness of the next test: a chunked body within the limit is answered as usual."""
    text = json.dumps({"net": LENET, "data_shapes": {"*": [1, 28, 28]}}).encode()
    answer = chunked(live_server, "/estimate", "application/json", [text[:100], text[100:]], end=True)
    assert answer.startswith(b"HTTP/1.1 200"), answer


@pytest.mark.parametrize(("extra", "status"), [(0, b"400"), (1, b"413")], ids=["at-the-limit", "one-byte-over"])
def test_a_chunked_body_is_taken_up_to_the_limit_and_refused_one_byte_past_it(
    live_server: Server, extra: int, status: bytes
) -> None:
    """The bound is exact: Werkzeug's bounded stream stops silently at its bound, so a body one byte over must not
    be read as a body cut at the limit. At the limit it is read whole (valid JSON, a field error: 400, not 413)."""
    limit = 4 * 1024 * 1024
    body = b'{"free_bytes": 1}'
    body += b" " * (limit + extra - len(body))
    chunks = [body[offset : offset + (1 << 16)] for offset in range(0, len(body), 1 << 16)]
    answer = chunked(live_server, "/estimate", "application/json", chunks, end=True)
    assert answer.startswith(b"HTTP/1.1 " + status), answer


BOUNDARY = b"XyZ"
MULTIPART_HEAD = b'--XyZ\r\nContent-Disposition: form-data; name="net"; filename="net.prototxt"\r\n\r\n'


@pytest.mark.parametrize(
    ("path", "content_type", "head"),
    [
        ("/estimate", "application/json", b""),
        ("/jobs", "application/json", b""),
        ("/jobs", "multipart/form-data; boundary=XyZ", MULTIPART_HEAD),
    ],
    ids=["estimate", "jobs-json", "jobs-multipart"],
)
def test_a_chunked_body_over_the_limit_is_413_before_it_ends(
    live_server: Server, path: str, content_type: str, head: bytes
) -> None:
    over = 4 * 1024 * 1024 + (1 << 20)  # the default MEMPLUGIN_MAX_REQUEST_BYTES (4 MiB), and one more MiB
    chunks = [head] * bool(head) + [b" " * (1 << 16)] * (over >> 16)
    answer = chunked(live_server, path, content_type, chunks, end=False)
    assert answer.startswith(b"HTTP/1.1 413"), answer


# ============================================================================ queued jobs


@pytest.mark.slow
def test_the_queue_limit_refuses_more_waiting_jobs_with_a_clear_400(data_dir: Path, datasets: Path) -> None:
    app = make_app(data_dir, datasets, max_queued_jobs=2)
    api = app.test_client()
    try:
        running = api.post(f"{API}/jobs", json=job_body(max_iter=100_000)).get_json()
        wait_for(lambda: api.get(f"{API}/jobs/{running['id']}").get_json()["status"] == "running", what="a running job")
        # Eight submissions at once while the one CPU slot is taken: the limit is checked again when a job is
        # stored, under the manager's lock, so exactly two of them wait; the others are refused.
        answers: list[Any] = []
        barrier = threading.Barrier(8)

        def submit() -> None:
            client = app.test_client()
            barrier.wait()
            answers.append(client.post(f"{API}/jobs", json=job_body()))

        threads = [threading.Thread(target=submit) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert sorted(a.status_code for a in answers) == [201] * 2 + [400] * 6
        refused = next(a for a in answers if a.status_code == 400).get_json()["errors"]
        assert set(refused) == {"queue"}, refused
        assert "2 jobs are already waiting" in refused["queue"] and "MEMPLUGIN_MAX_QUEUED_JOBS" in refused["queue"]
        waiting = [a.get_json() for a in answers if a.status_code == 201]
        assert [job["status"] for job in waiting] == ["queued", "queued"]
        assert len(list((data_dir / "jobs").iterdir())) == 3  # nothing left of the refused ones
        assert len(api.get(f"{API}/jobs").get_json()["jobs"]) == 3

        assert api.post(f"{API}/jobs/{waiting[0]['id']}/cancel").status_code == 200  # one place frees up
        taken = api.post(f"{API}/jobs", json=job_body())
        assert taken.status_code == 201
        # A resume is a job joining the queue too: refused while it is full, with the same reason (409).
        resume = api.post(f"{API}/jobs/{waiting[0]['id']}/resume")
        assert resume.status_code == 409 and "already waiting" in resume.get_json()["error"]
        for job in (running, waiting[1], taken.get_json()):
            api.post(f"{API}/jobs/{job['id']}/cancel")
    finally:
        get_plugin(app).close()


def test_concurrent_reads_of_one_dataset_do_not_refuse_each_other(datasets: Path) -> None:
    """LMDB refuses a second open of an environment in one process: submissions reading the same dataset at once
    failed with "already open in this process" (found by the queue test above, in threading mode)."""
    from digits_memplugin.core.errors import MemPluginError
    from digits_memplugin.estimate.datasets import lmdb_item

    failures: list[str] = []
    barrier = threading.Barrier(8)

    def read() -> None:
        barrier.wait()
        for _ in range(40):
            try:
                lmdb_item(datasets / "mnist_train_lmdb", "mnist")
            except MemPluginError as error:
                failures.append(str(error))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []


# ============================================================================ events per socketio client


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_the_client_rate_limiter_allows_a_burst_then_the_rate() -> None:
    clock = Clock()
    limiter = ClientRateLimiter(per_second=10, burst=5, clock=clock)
    assert [limiter.allow("a") for _ in range(7)] == [True] * 5 + [False] * 2
    assert limiter.allow("b")  # each client has its own bucket
    clock.now += 0.1  # one more token for "a"
    assert [limiter.allow("a") for _ in range(2)] == [True, False]
    clock.now += 10  # refills to the burst, not beyond
    assert [limiter.allow("a") for _ in range(6)] == [True] * 5 + [False]
    assert limiter.refused == 4 and limiter.clients == 2
    limiter.forget("a")
    assert limiter.clients == 1 and limiter.allow("a")
    with pytest.raises(ValueError, match="per_second must be positive"):
        ClientRateLimiter(per_second=0, burst=1)


def events(client: Any, name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in client.get_received(NS) if name is None or e["name"] == name]


@pytest.fixture
def idle_job(limited: Flask) -> dict[str, Any]:
    """A job that exists and never trains: its 1 MiB memory cap fits not even batch 1, so it fails at placement."""
    api = limited.test_client()
    job = api.post(f"{API}/jobs", json=job_body(memory_cap="1MiB")).get_json()
    wait_for(lambda: api.get(f"{API}/jobs/{job['id']}").get_json()["status"] == "failed", what="the job to fail")
    return job  # type: ignore[no-any-return]


def test_a_client_flooding_subscriptions_gets_each_event_once_and_others_are_unaffected(
    limited: Flask, idle_job: dict[str, Any]
) -> None:
    """Subscribing is idempotent: 500 subscribe_job from one client leave it in the room once, so the job's next
    event reaches it once, and a quiet client in the same room gets it too."""
    socketio = get_plugin(limited).socketio
    flooder, quiet = socketio.test_client(limited, namespace=NS), socketio.test_client(limited, namespace=NS)
    quiet.emit("subscribe_job", {"id": idle_job["id"]}, namespace=NS)
    for _ in range(500):
        flooder.emit("subscribe_job", {"id": idle_job["id"]}, namespace=NS)
        flooder.emit("subscribe_jobs", namespace=NS)
    flooder.get_received(NS)
    quiet.get_received(NS)
    assert limited.test_client().delete(f"{API}/jobs/{idle_job['id']}").status_code == 204
    assert [e["args"][0] for e in events(flooder, "job_deleted")] == [{"id": idle_job["id"]}]
    assert [e["args"][0] for e in events(quiet, "job_deleted")] == [{"id": idle_job["id"]}]


def test_a_client_over_its_event_rate_is_told_and_not_served(limited: Flask, idle_job: dict[str, Any]) -> None:
    socketio = get_plugin(limited).socketio
    flooder = socketio.test_client(limited, namespace=NS)
    flooder.get_received(NS)
    burst = get_plugin(limited).settings.client_event_burst
    for _ in range(burst * 5):  # far faster than 20 a second: at once
        flooder.emit("subscribe_jobs", namespace=NS)
    received = events(flooder)
    answered = [e for e in received if e["name"] == "jobs"]
    # each page listing the one job counts 4 (3 for the page, one per 5 jobs listed: web/socket/namespace.py's event_cost)
    assert burst // 4 <= len(answered) < burst // 2
    assert any(e["name"] == "rate_limited" for e in received)
