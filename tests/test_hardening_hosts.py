"""Hosts and connections (docs/security.md): a request must name this server in its Host header (DNS rebinding);
a malformed body closes its connection (request smuggling); a request's head and body must arrive in time (read
timeout); and signing in redirects only to a path on this server.

The Host check and the redirect go through the Flask test client (which names "localhost"); what happens to
connections is tested with raw sockets against `digits-memplugin serve` on gevent."""

from __future__ import annotations

import base64
import json
import os
import re
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_socketio import SocketIO
from test_jobs_fixtures import LENET, LENET_DATA, SHORT_SOLVER, wait_for, write_lmdb

import digits_memplugin
from digits_memplugin import create_app
from digits_memplugin.host.extension import get_plugin
from digits_memplugin.host.settings import ConfigError, Settings
from digits_memplugin.web.access import host_allowed, host_name, same_site_path

pytest_plugins = ["test_jobs_fixtures"]

API = "/memplugin/api"
NS = "/memplugin"
SCRIPT = Path(sys.executable).parent / "digits-memplugin"
EVIL = "attacker.example:5000"


def app_with(data_dir: Path, **config: Any) -> Flask:
    return create_app({"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "TESTING": True,
                       **config})


def as_evil(**headers: str) -> dict[str, str]:
    """What a browser sends once the attacker's name points at this server: Host and Origin agree."""
    return {"Host": EVIL, "Origin": f"http://{EVIL}", **headers}


# ============================================================================ DNS rebinding: the Host check


def assert_wrong_host(response: Any) -> None:
    assert response.status_code == 400, (response.status_code, response.get_data(as_text=True)[:300])
    document = response.get_json()
    assert document["status"] == 400
    assert "attacker.example" in document["error"] and "MEMPLUGIN_ALLOWED_HOSTS" in document["error"]
    assert "Traceback" not in document["error"]


def test_a_job_posted_under_another_host_name_is_refused_and_nothing_is_created(
    data_dir: Path, datasets: Path
) -> None:
    app = app_with(data_dir, MEMPLUGIN_DATASET_ROOTS=[str(datasets)])
    try:
        client = app.test_client()
        body = {"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 4}
        assert_wrong_host(client.post(f"{API}/jobs", json=body, headers=as_evil()))
        assert not get_plugin(app).jobs.started  # not even the job manager was started
        assert client.get(f"{API}/jobs").get_json()["jobs"] == []
        assert not (data_dir / "jobs").exists() or not any((data_dir / "jobs").iterdir())
    finally:
        get_plugin(app).close()


@pytest.mark.parametrize(
    "path", ["/", "/memplugin/", "/memplugin/jobs", f"{API}/jobs", f"{API}/devices", f"{API}/health",
             "/memplugin/login", "/memplugin/static/css/memplugin.css", "/socket.io/?EIO=4&transport=polling",
             "/no/such/page"],
)
def test_every_read_under_another_host_name_is_refused_too(data_dir: Path, path: str) -> None:
    """A rebinding page reads as well as writes: pages, the API, assets and the socketio handshake are refused."""
    assert_wrong_host(app_with(data_dir).test_client().get(path, headers=as_evil()))


def test_a_socketio_connection_under_another_host_name_is_refused(data_dir: Path) -> None:
    app = app_with(data_dir)
    socketio = get_plugin(app).socketio
    refused = socketio.test_client(app, namespace=NS, headers=as_evil())
    assert not refused.is_connected(namespace=NS)
    accepted = socketio.test_client(app, namespace=NS, headers={"Host": "127.0.0.1:5000"})
    assert accepted.is_connected(namespace=NS)


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:5000", "LocalHost.:5000", "127.0.0.1", "127.0.0.1:5000", "[::1]:5000", "[::1]",
     "192.0.2.7:8080", "[2001:db8::7]", socket.gethostname(), f"{socket.gethostname()}:5000"],
)
def test_addresses_localhost_and_the_machines_name_are_always_answered(data_dir: Path, host: str) -> None:
    """An IP address cannot be rebound (a browser sends one only for a page loaded from that address)."""
    response = app_with(data_dir).test_client().get(f"{API}/jobs", headers={"Host": host})
    assert response.status_code == 200, response.get_json()


@pytest.mark.parametrize(
    "host",
    ["attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io", "lab.example.attacker.example",
     "evil-lab.example", "[::1", "[::1]x", "[not-an-address]", "a b", "host:port", "a:1:2", "", ":5000",
     "gpu1.lab.example@attacker.example"],
)
def test_other_names_and_malformed_hosts_are_refused(data_dir: Path, host: str) -> None:
    client = app_with(data_dir, MEMPLUGIN_ALLOWED_HOSTS="gpu1.lab.example, .lab.example").test_client()
    response = client.get(f"{API}/jobs", headers={"Host": host})
    assert response.status_code == 400 and "MEMPLUGIN_ALLOWED_HOSTS" in response.get_json()["error"]


@pytest.mark.parametrize("host", ["gpu1.lab.example", "GPU1.lab.example.:443", "lab.example", "a.b.lab.example"])
def test_configured_names_and_subdomains_are_answered(data_dir: Path, host: str) -> None:
    client = app_with(data_dir, MEMPLUGIN_ALLOWED_HOSTS=["gpu1.lab.example", ".lab.example"]).test_client()
    assert client.get(f"{API}/jobs", headers={"Host": host}).status_code == 200
    # ... and the cross-site check still holds between two allowed names
    other = client.post(f"{API}/jobs", json={}, headers={"Host": host, "Origin": "http://localhost:5000"})
    assert other.status_code == 403


def test_a_star_answers_any_name(data_dir: Path) -> None:
    client = app_with(data_dir, MEMPLUGIN_ALLOWED_HOSTS="*").test_client()
    assert client.get(f"{API}/jobs", headers={"Host": EVIL}).status_code == 200


def test_the_check_holds_on_a_host_app_and_leaves_the_hosts_own_pages_alone(tmp_path: Path) -> None:
    host = Flask("host")
    host.config.update(SECRET_KEY="x", MEMPLUGIN_DATA_DIR=str(tmp_path), SERVER_NAME=None)
    socketio = SocketIO(host, async_mode="threading")
    digits_memplugin.init_app(host, socketio, allowed_hosts=["digits.lab.example"])

    @host.get("/digits-home")
    def digits_home() -> str:
        return "the host's page"

    client = host.test_client()
    assert_wrong_host(client.get(f"{API}/jobs", headers=as_evil()))
    assert_wrong_host(client.post(f"{API}/jobs", json={}, headers=as_evil()))
    assert client.get("/digits-home", headers=as_evil()).status_code == 200  # the host decides for its own pages
    assert client.get(f"{API}/jobs", headers={"Host": "digits.lab.example:5000"}).status_code == 200
    refused = socketio.test_client(host, namespace=NS, headers=as_evil())
    assert not refused.is_connected(namespace=NS)
    assert socketio.test_client(host, namespace=NS, headers={"Host": "digits.lab.example"}).is_connected(NS)


def test_host_names_are_read_without_port_case_or_final_dot() -> None:
    assert host_name("Gpu1.Lab.:80") == "gpu1.lab"
    assert host_name("[::1]:5000") == "::1"
    assert host_name("１２７.0.0.1") is None  # no look-alike digits
    assert host_allowed(None, ())  # HTTP/1.0 without Host: no browser sends that
    assert not host_allowed("localhost", ())  # only what the caller lists, and addresses
    assert host_allowed("10.0.0.1:80", ())


@pytest.mark.parametrize(
    ("value", "expected"),
    [("a.example, B.example.", ("a.example", "b.example")), (["*"], ("*",)), (None, ()), ("", ()),
     ([".lab.example", ".lab.example"], (".lab.example",))],
)
def test_allowed_hosts_setting(value: Any, expected: tuple[str, ...]) -> None:
    assert Settings.from_config({"MEMPLUGIN_ALLOWED_HOSTS": value}).allowed_hosts == expected


@pytest.mark.parametrize("value", ["http://a.example", "a.example:80", "a..example", "[::1]", 5, ["a b"], "a/b"])
def test_a_malformed_allowed_host_is_refused_at_start_naming_the_key(value: Any) -> None:
    with pytest.raises(ConfigError, match="MEMPLUGIN_ALLOWED_HOSTS"):
        Settings.from_config({"MEMPLUGIN_ALLOWED_HOSTS": value})


@pytest.mark.parametrize("value", [0, 0.5, 3601, float("nan"), float("inf"), "30", True])
def test_a_malformed_read_timeout_is_refused_at_start_naming_the_key(value: Any) -> None:
    with pytest.raises(ConfigError, match="MEMPLUGIN_READ_TIMEOUT_SECONDS"):
        Settings.from_config({"MEMPLUGIN_READ_TIMEOUT_SECONDS": value})


# ============================================================================ the redirect after signing in

TOKEN = "s3cret-token-of-some-length"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/%09/evil.example/x", "/memplugin/"),  # a tab, dropped by browsers: //evil.example/x
        ("/%0A/evil.example", "/memplugin/"),
        ("/%0D%0A/evil.example", "/memplugin/"),
        ("/%5Cevil.example", "/memplugin/"),  # a backslash, read as a slash by browsers
        ("/%5C/evil.example", "/memplugin/"),
        ("%5C%5Cevil.example", "/memplugin/"),
        ("//evil.example/x", "/memplugin/"),
        ("/%20/evil.example", "/memplugin/"),
        ("https://evil.example/x", "/memplugin/"),
        ("javascript:alert(1)", "/memplugin/"),
        ("%20//evil.example", "/memplugin/"),
        ("/%00/evil.example", "/memplugin/"),
        ("/memplugin/jobs?sort=name", "/memplugin/jobs?sort=name"),
        ("/memplugin/jobs", "/memplugin/jobs"),
    ],
)
def test_signing_in_redirects_only_to_a_path_on_this_server(data_dir: Path, target: str, expected: str) -> None:
    client = app_with(data_dir, MEMPLUGIN_API_TOKEN=TOKEN, WTF_CSRF_ENABLED=False).test_client()
    signed_in = client.post(f"/memplugin/login?next={target}", data={"token": TOKEN})
    assert signed_in.status_code == 302
    assert signed_in.headers["Location"] == expected


def test_same_site_path_refuses_what_a_browser_would_take_elsewhere() -> None:
    for target in ["/\t/evil.example", "/\\evil.example", "\\\\evil.example", "/\n/evil", "/ /evil", "http:/x",
                   "//x", "", "x/y", "/\x7f/evil"]:
        assert same_site_path(target) is None, repr(target)
    assert same_site_path("/memplugin/jobs/ab12?x=%2F%2Fy") == "/memplugin/jobs/ab12?x=%2F%2Fy"


# ============================================================================ connections on the real gevent server

READ_TIMEOUT = 2.0


class Served:
    def __init__(self, process: subprocess.Popen[bytes], host: str, port: int, log: Path) -> None:
        self.process, self.host, self.port, self.log = process, host, port, log

    def connect(self, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=timeout)

    @property
    def good_host(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`serve --read-timeout 2 --allowed-host memplugin.test` on a free port, with LeNet's datasets in its default
    dataset root (so a smuggled job submission would create a job); its output goes to a file."""
    folder = tmp_path_factory.mktemp("hosts")
    log = folder / "serve.log"
    datasets = folder / "data" / "datasets"
    datasets.mkdir(parents=True)
    write_lmdb(datasets / LENET_DATA["train"])
    write_lmdb(datasets / LENET_DATA["test"], records=8)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(folder / "data"),
             "--read-timeout", str(READ_TIMEOUT), "--allowed-host", "memplugin.test"],
            stdout=sink, stderr=subprocess.STDOUT, cwd=folder, env={**os.environ, "MEMPLUGIN_ALLOWED_HOSTS": ""},
        )

    def serving() -> re.Match[str] | bool:
        """The address serve says it serves on, or True once it has ended without."""
        return re.search(r"serving on http://(127\.0\.0\.1):(\d+)/", log.read_text()) or process.poll() is not None

    try:
        match = wait_for(serving, timeout=90, what=f"serve to start (its log: {log})")
    except BaseException:
        process.kill()
        raise
    if not isinstance(match, re.Match):
        pytest.fail("serve did not start:\n" + log.read_text())
    yield Served(process, match.group(1), int(match.group(2)), log)
    process.terminate()
    process.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()


def read_all(connection: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Everything the server sends within `timeout` seconds, and whether it closed the connection meanwhile."""
    connection.settimeout(timeout)
    received = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            data = connection.recv(65536)
            if not data:
                return received, True
            received += data
    except TimeoutError:
        return received, False
    except ConnectionResetError:
        return received, True
    return received, False


def statuses(received: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", received)]


def body_of(received: bytes) -> dict[str, Any]:
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
    return json.loads(body[:length])  # type: ignore[no-any-return]


def test_rebinding_through_the_real_server_is_refused_json(served: Served) -> None:
    with served.connect() as connection:
        body = b"{}"
        connection.sendall(
            f"POST {API}/jobs HTTP/1.1\r\nHost: attacker.example:{served.port}\r\n"
            f"Origin: http://attacker.example:{served.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
        )
        received, _ = read_all(connection, 10)
    assert statuses(received) == [400], received[:300]
    assert "MEMPLUGIN_ALLOWED_HOSTS" in body_of(received)["error"]
    # the name given with --allowed-host is answered
    with served.connect() as connection:
        connection.sendall(f"GET {API}/jobs HTTP/1.1\r\nHost: memplugin.test:{served.port}\r\nConnection: close\r\n\r\n"
                           .encode())
        received, _ = read_all(connection, 10)
    assert statuses(received) == [200] and isinstance(body_of(received)["jobs"], list)


def websocket_upgrade(served: Served, host: str) -> tuple[socket.socket, bytes]:
    connection = served.connect()
    key = base64.b64encode(os.urandom(16)).decode()
    connection.sendall(
        f"GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\n"
        f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        .encode()
    )
    connection.settimeout(10)
    head = b""
    while b"\r\n\r\n" not in head:
        data = connection.recv(1)
        if not data:
            break
        head += data
    return connection, head


def send_text_frame(connection: socket.socket, text: str) -> None:
    payload = text.encode()
    assert len(payload) < 126
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    connection.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)


def read_text_frame(connection: socket.socket) -> str:
    def exactly(count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = connection.recv(count - len(data))
            assert chunk, "the websocket was closed"
            data += chunk
        return data

    first, second = exactly(2)
    length = second & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", exactly(2))
    elif length == 127:
        (length,) = struct.unpack("!Q", exactly(8))
    payload = exactly(length)
    assert first & 0x0F in (0x1, 0x9, 0xA), first
    return payload.decode("utf-8", "replace")


def test_a_rebinding_websocket_is_refused_before_it_opens(served: Served) -> None:
    connection, head = websocket_upgrade(served, f"attacker.example:{served.port}")
    with connection:
        assert head.startswith(b"HTTP/1.1 400"), head
    connection, head = websocket_upgrade(served, served.good_host)  # the harness: the same upgrade, the right name
    with connection:
        assert head.startswith(b"HTTP/1.1 101"), head


def test_a_websocket_stays_open_past_the_read_timeout(served: Served) -> None:
    """The read timeout is for HTTP requests: an open websocket that is quiet for longer is not cut."""
    connection, head = websocket_upgrade(served, served.good_host)
    with connection:
        assert head.startswith(b"HTTP/1.1 101"), head
        assert read_text_frame(connection).startswith("0{")  # engine.io's open packet
        time.sleep(READ_TIMEOUT * 2)  # what is tested: a websocket quiet for longer than the read timeout
        send_text_frame(connection, f"40{NS},")
        frames = [read_text_frame(connection) for _ in range(2)]
        assert any(frame.startswith(f"40{NS},") for frame in frames), frames


SMUGGLED = f"DELETE {API}/jobs/NOPE HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize(
    "bad_chunk",
    ["ffffffffffffffffZ", "ffffffffffffffffff\r\n", "4\r\nabcdXX", "zz\r\n", "4\nabcd\r\n"],
    ids=["non-hex", "too-long", "no-crlf-after-data", "not-a-size", "lf-only"],
)
def test_a_malformed_chunked_body_closes_the_connection_and_runs_nothing_after_it(
    served: Served, bad_chunk: str
) -> None:
    """Issue 18 item 8: a 400 and then a 404 for the DELETE hidden in the body. Now: the 400 says Connection: close,
    and the connection is closed at once (not at the read timeout), with nothing run after it."""
    with served.connect() as connection:
        connection.sendall(
            f"POST {API}/estimate HTTP/1.1\r\nHost: {served.good_host}\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n{bad_chunk}{SMUGGLED}".encode()
        )
        started = time.monotonic()
        received, closed = read_all(connection, READ_TIMEOUT * 3)
        elapsed = time.monotonic() - started
    assert statuses(received) == [400], received
    assert closed and elapsed < READ_TIMEOUT, (closed, elapsed)
    assert b"connection: close" in received.lower()
    assert "error" in body_of(received)


def test_a_well_formed_chunked_body_keeps_the_connection_for_the_next_request(served: Served) -> None:
    """The harness of the test above: after a good body the next request on the connection is answered."""
    body = json.dumps({"net": LENET, "data_shapes": {"*": [1, 28, 28]}}).encode()
    with served.connect() as connection:
        connection.sendall(
            f"POST {API}/estimate HTTP/1.1\r\nHost: {served.good_host}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            + f"GET {API}/health HTTP/1.1\r\nHost: {served.good_host}\r\nConnection: close\r\n\r\n".encode()
        )
        received, closed = read_all(connection, 30)
    assert statuses(received) == [200, 200] and closed


# ---------------------------------------------------------------------------- framing (RFC 9112 section 6)


def job_submission(served: Served, name: str) -> bytes:
    """A whole request that creates a job named `name` (LeNet, one iteration on the CPU): hidden after a request
    head, it is the request a smuggler wants run."""
    body = json.dumps({"net": LENET, "solver": SHORT_SOLVER, "data": LENET_DATA, "device": "cpu", "max_iter": 1,
                       "name": name}).encode()
    return (f"POST {API}/jobs HTTP/1.1\r\nHost: {served.good_host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def jobs_named(served: Served, name: str) -> list[dict[str, Any]]:
    with served.connect() as connection:
        connection.sendall(f"GET {API}/jobs?limit=500 HTTP/1.1\r\nHost: {served.good_host}\r\nConnection: close\r\n\r\n"
                           .encode())
        received, _ = read_all(connection, 10)
    assert statuses(received) == [200], received[:300]
    return [job for job in body_of(received)["jobs"] if job["name"] == name]


def health_answered(served: Served) -> bool:
    with served.connect() as connection:
        connection.sendall(f"GET {API}/health HTTP/1.1\r\nHost: {served.good_host}\r\nConnection: close\r\n\r\n".encode())
        received, _ = read_all(connection, 10)
    return statuses(received) == [200]


def test_a_job_pipelined_after_a_well_framed_request_is_created(served: Served) -> None:
    """The harness of the framing tests below: the same job submission, after a request whose body is framed as
    RFC 9112 asks, runs as the second request and creates its job (the side effect they look for)."""
    name = "pipelined after a good body"
    estimate = json.dumps({"net": LENET, "data_shapes": {"*": [1, 28, 28]}}).encode()
    with served.connect() as connection:
        connection.sendall(
            f"POST {API}/estimate HTTP/1.1\r\nHost: {served.good_host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(estimate)}\r\n\r\n".encode() + estimate + job_submission(served, name)
        )
        received, _ = read_all(connection, 15)
    assert statuses(received) == [200, 201], received[:500]
    assert len(jobs_named(served, name)) == 1
    wait_for(lambda: jobs_named(served, name)[0]["status"] in ("done", "failed"), timeout=120, what="the job to end")


# Each head below is one a proxy in front may delimit otherwise than gevent did: gevent took the body as the
# comment says and read the job submission after it as a next request, which created the job.
SMUGGLING_HEADS = [
    # (fields of the head, the body gevent read before the hidden request, the status now, a word of the error)
    pytest.param("Content-Length: 0\r\nContent-Length: {hidden}\r\n", "", 400, "Content-Length headers",
                 id="two-lengths"),  # gevent: the first (0); a proxy taking the last forwards the job as the body
    pytest.param("Content-Length: {hidden}\r\nContent-Length: {hidden}\r\n", "", 400, "Content-Length headers",
                 id="two-equal-lengths"),  # refused too: one length, once
    pytest.param("Content-Length: 1_2\r\n", '{"net": "x"}', 400, "digits 0-9", id="underscore"),  # int(): 12
    pytest.param("Content-Length: +12\r\n", '{"net": "x"}', 400, "digits 0-9", id="plus"),
    pytest.param("Content-Length: 0\x0b\r\n", "", 400, "digits 0-9", id="vertical-tab"),  # int() strips it
    pytest.param("Content-Length: {hidden_after_last_chunk}\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n", 400,
                 "both Content-Length and Transfer-Encoding", id="length-and-chunked"),  # gevent: chunked
    pytest.param("Transfer-Encoding: chunked \r\nContent-Length: 5\r\n", "0\r\n\r\n", 400,
                 "both Content-Length and Transfer-Encoding", id="chunked-space-and-length"),  # gevent: the length
    pytest.param("Transfer-Encoding: gzip, chunked\r\n", "", 501, "'gzip' is not implemented",
                 id="gzip-chunked"),  # gevent: not chunked, so no body
    pytest.param("Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", "0\r\n\r\n", 400,
                 "2 Transfer-Encoding headers", id="two-codings"),
    pytest.param("Transfer-Encoding: chunked, chunked\r\n", "0\r\n\r\n", 400, "chunked more than once",
                 id="chunked-twice"),
    pytest.param("Transfer-Encoding: chunked\x00\r\n", "", 400, "NUL", id="nul"),  # gevent: not chunked
    pytest.param("Content-Length : {hidden}\r\n", "", 400, "space before its colon",
                 id="space-before-colon"),  # gevent dropped the line and every line after it: no body
    pytest.param("X-Pad: a\r\n Content-Length: {hidden}\r\n", "", 400, "line folding",
                 id="folded"),  # gevent: part of X-Pad; a proxy that takes it as a line forwards the body
    pytest.param("X-Pad: a\rContent-Length: 0\r\nContent-Length: {hidden}\r\n", "", 400, "carriage return",
                 id="bare-cr"),  # gevent: a line break, so two lengths, the first 0; a proxy: one, the job
]


@pytest.mark.parametrize(("fields", "before", "status", "word"), SMUGGLING_HEADS)
def test_a_head_whose_body_a_proxy_could_delimit_otherwise_is_refused_and_nothing_after_it_runs(
    served: Served, fields: str, before: str, status: int, word: str, request: pytest.FixtureRequest
) -> None:
    """Issue 23 item 8: two Content-Lengths (the first won and the rest ran as the next request), `1_2` and `+12`,
    Content-Length with chunked. Now the head is answered with a JSON error naming what is wrong, the connection is
    closed at once, and the job submission that followed it is never run: no job of its name exists."""
    name = f"smuggled {request.node.callspec.id}"
    hidden = job_submission(served, name)
    head = fields.format(hidden=len(hidden), hidden_after_last_chunk=len(b"0\r\n\r\n") + len(hidden))
    with served.connect() as connection:
        connection.sendall(
            f"POST {API}/estimate HTTP/1.1\r\nHost: {served.good_host}\r\nContent-Type: application/json\r\n{head}\r\n"
            .encode("latin-1") + before.encode() + hidden
        )
        started = time.monotonic()
        received, closed = read_all(connection, READ_TIMEOUT * 3)
        elapsed = time.monotonic() - started
    assert statuses(received) == [status], received[:500]
    assert closed and elapsed < READ_TIMEOUT, (closed, elapsed)
    assert b"connection: close" in received.lower()
    document = body_of(received)
    assert word in document["error"] and document["status"] == status, document
    # The server closed the connection (read_all saw its end): a request it took from what followed the head would
    # have been run, its job stored and its answer sent, before that close.
    assert jobs_named(served, name) == []
    assert health_answered(served)


def test_a_transfer_encoding_in_an_http_1_0_request_is_refused(served: Served) -> None:
    """RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing. gevent read it as
    chunked and kept the connection (keep-alive asked), running what came next."""
    name = "smuggled after HTTP/1.0 chunked"
    with served.connect() as connection:
        connection.sendall(
            f"POST {API}/estimate HTTP/1.0\r\nHost: {served.good_host}\r\nConnection: keep-alive\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".encode()
            + job_submission(served, name)
        )
        received, closed = read_all(connection, READ_TIMEOUT * 3)
    assert statuses(received) == [400] and closed, received[:500]
    assert "HTTP/1.0" in body_of(received)["error"]
    # Closed by the server: what it would have run after the refused request, it ran before the close.
    assert jobs_named(served, name) == []


@pytest.mark.parametrize(
    "coding", ["chunked", "Chunked", "chunked ", "CHUNKED\t"], ids=["plain", "capital", "space", "upper-tab"]
)
def test_chunked_in_any_case_or_with_spaces_after_it_is_read_as_chunked(served: Served, coding: str) -> None:
    """The harness of the refusals above: what the RFC allows (any case, spaces after the coding) is still taken as
    chunked, and the connection kept for the next request."""
    body = json.dumps({"net": LENET, "data_shapes": {"*": [1, 28, 28]}}).encode()
    with served.connect() as connection:
        connection.sendall(
            f"POST {API}/estimate HTTP/1.1\r\nHost: {served.good_host}\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: {coding}\r\n\r\n".encode()
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            + f"GET {API}/health HTTP/1.1\r\nHost: {served.good_host}\r\nConnection: close\r\n\r\n".encode()
        )
        received, closed = read_all(connection, 30)
    assert statuses(received) == [200, 200] and closed, received[:500]


ESTIMATE = json.dumps({"net": LENET, "data_shapes": {"*": [1, 28, 28]}}).encode()


def chunked_estimate(served: Served, body: bytes) -> bytes:
    """A chunked POST of an estimate, its chunked body as given."""
    return (f"POST {API}/estimate HTTP/1.1\r\nHost: {served.good_host}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode() + body


def proxy_smuggling_body(hidden: bytes) -> bytes:
    """Red team problem 3 (p8): a chunked body that a proxy ending lines at a bare LF (RFC 9112 section 2.2) reads
    as one request whose second chunk holds `hidden`, while gevent skipped the first chunk's extension up to the CR
    and found `hidden` after the body's end, so it ran as a next request."""
    after_lf = b"x" * 40  # gevent: the extension's rest; the proxy: the first chunk's data begins here
    first = 60
    for second in range(1, 1 << 20):
        second_line = b"%x\r\n" % second
        pad = b"p" * (len(after_lf) - len(second_line))
        if second == len(pad) + len(b"\r\n0\r\n\r\n") + len(hidden):
            break
    return (b"%x;\n" % first + after_lf + b"\r\n" + b"d" * (first - len(after_lf) - 2) + b"\r\n" + second_line + pad
            + b"\r\n0\r\n\r\n" + hidden + b"\r\n0\r\n\r\n")


# Each chunked body below breaks RFC 9112 section 7.1 in a line gevent read on: a chunk extension skipped up to the
# first CR (so a bare LF, NUL or control byte in it was taken), a trailer line read up to its CR without a colon.
# gevent answered the estimate 200 and ran the job submission after the body as the next request.
MALFORMED_CHUNK_LINES = [
    pytest.param(b"%x;a\nGET /x HTTP/1.1\r\n%s\r\n0\r\n\r\n", id="extension-bare-lf"),
    pytest.param(b"%x;\x00 \x01=\x7f\r\n%s\r\n0\r\n\r\n", id="extension-nul-ctl"),
    pytest.param(b"%x;name=va\x1blue\r\n%s\r\n0\r\n\r\n", id="extension-ctl-in-value"),
    pytest.param(b"%x;name=\"open\r\n%s\r\n0\r\n\r\n", id="extension-unclosed-quote"),
    pytest.param(b"%x\r\n%s\r\n0\r\nX-T: a\nGET /y HTTP/1.1\r\n\r\n", id="trailer-bare-lf"),
    pytest.param(b"%x\r\n%s\r\n0\r\nXNoColon\r\n\r\n", id="trailer-no-colon"),
    pytest.param(b"%x\r\n%s\r\n0\r\nX-T: a\x00b\r\n\r\n", id="trailer-nul"),
    pytest.param(None, id="proxy-smuggling-layout"),
]


@pytest.mark.parametrize("layout", MALFORMED_CHUNK_LINES)
def test_a_malformed_chunk_line_or_trailer_is_refused_and_the_request_after_it_never_runs(
    served: Served, layout: bytes | None, request: pytest.FixtureRequest
) -> None:
    """Red team problem 3: each body here was taken by gevent, which then ran the job submission after it (a proxy
    ending lines at the bare LF forwards it as part of the body). Now the body's read fails: the 400 says
    Connection: close, the connection is closed at once and the submission never creates its job."""
    name = f"smuggled chunk {request.node.callspec.id}"
    hidden = job_submission(served, name)
    body = proxy_smuggling_body(hidden) if layout is None else layout % (len(ESTIMATE), ESTIMATE) + hidden
    with served.connect() as connection:
        connection.sendall(chunked_estimate(served, body))
        started = time.monotonic()
        received, closed = read_all(connection, READ_TIMEOUT * 3)
        elapsed = time.monotonic() - started
    assert statuses(received) == [400], received[:500]
    assert closed and elapsed < READ_TIMEOUT, (closed, elapsed)
    assert b"connection: close" in received.lower()
    assert "error" in body_of(received)
    assert jobs_named(served, name) == []
    assert health_answered(served)


@pytest.mark.parametrize(
    "layout",
    [
        b"%x;name=value\r\n%s\r\n0\r\n\r\n",
        b'%x;name="quoted \\"value\\"";flag\r\n%s\r\n0;last=1\r\n\r\n',
        b'%x \t; name = "v" ;other=t\r\n%s\r\n0\r\n\r\n',
        b"%x\r\n%s\r\n0\r\nX-Checksum: abc def\r\nX-Empty:\r\nX-Tab:\tv\xe9\r\n\r\n",
    ],
    ids=["extension-token", "extension-quoted", "extension-spaces", "trailers"],
)
def test_well_formed_chunk_extensions_and_trailers_are_still_taken(served: Served, layout: bytes) -> None:
    """The harness of the refusals above: extensions and trailers RFC 9112 section 7.1 allows are read as before,
    and the connection kept for the next request."""
    with served.connect() as connection:
        connection.sendall(
            chunked_estimate(served, layout % (len(ESTIMATE), ESTIMATE))
            + f"GET {API}/health HTTP/1.1\r\nHost: {served.good_host}\r\nConnection: close\r\n\r\n".encode()
        )
        received, closed = read_all(connection, 30)
    assert statuses(received) == [200, 200] and closed, received[:500]


@pytest.mark.parametrize(
    ("head", "status", "word"),
    [
        pytest.param("".join(f"X-Header-{index}: {index}\r\n" for index in range(101)), 431, "more than 100",
                     id="101-lines"),  # gevent: http.client's HTTPException, a traceback in the log and an empty 400
        pytest.param(f"X-Long: {'a' * 70000}\r\n", 431, "over 65536 bytes", id="long-line"),
        pytest.param("Content-Length: 1\r\n" + "X" * 10, 400, "blank line", id="no-blank-line"),
    ],
)
def test_heads_too_big_or_cut_short_are_refused_in_json(served: Served, head: str, status: int, word: str) -> None:
    with served.connect() as connection:
        connection.sendall(f"GET {API}/health HTTP/1.1\r\nHost: {served.good_host}\r\n{head}".encode())
        if status == 400:
            connection.shutdown(socket.SHUT_WR)  # the head ends there
        else:
            connection.sendall(b"\r\n")
        received, closed = read_all(connection, READ_TIMEOUT * 3)
    assert statuses(received) == [status] and closed, received[:500]
    assert word in body_of(received)["error"]


def test_a_request_line_gevent_refuses_is_answered_in_json(served: Served) -> None:
    """gevent's own 400 (here for an HTTP version it does not speak) had an empty body: the error says why."""
    with served.connect() as connection:
        connection.sendall(f"GET {API}/health HTTP/7.1\r\nHost: {served.good_host}\r\n\r\n".encode())
        received, closed = read_all(connection, READ_TIMEOUT * 3)
    assert statuses(received) == [400] and closed, received[:500]
    assert "Invalid http version" in body_of(received)["error"]


def test_half_a_request_head_gets_408_and_is_closed_after_the_read_timeout(served: Served) -> None:
    with served.connect() as connection:
        connection.sendall(f"POST {API}/estimate HTTP/1.1\r\nHost: {served.good_host}\r\nContent-Ty".encode())
        started = time.monotonic()
        received, closed = read_all(connection, READ_TIMEOUT * 4)
        elapsed = time.monotonic() - started
    assert closed and READ_TIMEOUT * 0.8 < elapsed < READ_TIMEOUT * 3, (closed, elapsed, received)
    assert statuses(received) == [408], received
    assert "did not arrive in time" in body_of(received)["error"]


def test_a_head_sent_a_byte_at_a_time_is_timed_as_a_whole(served: Served) -> None:
    """Slowloris: each byte comes well within the timeout, the head as a whole does not."""
    head = f"Host: {served.good_host}\r\nX-Slow: {'a' * 200}\r\n\r\n".encode()
    started = time.monotonic()
    with served.connect() as connection:
        connection.sendall(f"GET {API}/health HTTP/1.1\r\n".encode())
        for byte in head:  # until the server answers: bytes sent after its close would reset the connection
            if select.select([connection], [], [], 0)[0] or time.monotonic() - started > READ_TIMEOUT * 3:
                break
            connection.sendall(bytes([byte]))
            time.sleep(0.05)  # what is tested: a client that sends its head slowly
        received, closed = read_all(connection, READ_TIMEOUT * 2)
    assert statuses(received) == [408] and closed, received
    assert time.monotonic() - started < READ_TIMEOUT * 4


def test_an_idle_connection_is_closed_after_the_read_timeout(served: Served) -> None:
    with served.connect() as connection:
        started = time.monotonic()
        received, closed = read_all(connection, READ_TIMEOUT * 4)
    assert closed and received == b"" and time.monotonic() - started < READ_TIMEOUT * 3


def test_a_body_that_stops_coming_is_answered_and_closed_after_the_read_timeout(served: Served) -> None:
    with served.connect() as connection:
        connection.sendall(
            f"POST {API}/estimate HTTP/1.1\r\nHost: {served.good_host}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n{\"net\": ".encode()
        )
        started = time.monotonic()
        received, closed = read_all(connection, READ_TIMEOUT * 4)
        elapsed = time.monotonic() - started
    assert closed and elapsed < READ_TIMEOUT * 3, (closed, elapsed, received)
    assert statuses(received) == [400], received
    assert "error" in body_of(received)


def test_slow_connections_do_not_hold_the_server(served: Served) -> None:
    """Issue 18 item 11: 40 slow connections were held for 70 s. They are closed after the read timeout, and the
    server answers others meanwhile."""
    slow = [served.connect() for _ in range(40)]
    try:
        for connection in slow:
            connection.sendall(f"GET {API}/health HTTP/1.1\r\nHost: {served.good_host}\r\n".encode())
        with served.connect() as other:
            other.sendall(f"GET {API}/health HTTP/1.1\r\nHost: {served.good_host}\r\nConnection: close\r\n\r\n".encode())
            assert statuses(read_all(other, 10)[0]) == [200]
        # Each is read until the server closes it (past its read timeout), all within one bound.
        deadline = time.monotonic() + READ_TIMEOUT * 3
        outcomes = [read_all(connection, max(0.1, deadline - time.monotonic())) for connection in slow]
        assert all(closed and statuses(received) == [408] for received, closed in outcomes), outcomes[:3]
    finally:
        for connection in slow:
            connection.close()


# ============================================================================ the serve command's options


def test_serve_allows_its_host_option_and_the_named_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from digits_memplugin.cli.serve import _allowed_hosts

    monkeypatch.setenv("MEMPLUGIN_ALLOWED_HOSTS", "env1.example, env2.example")
    args = argparse.Namespace(host="gpu1.lab.example", allowed_host=["a.example"])
    assert _allowed_hosts(args) == ["a.example", "env1.example", "env2.example", "gpu1.lab.example"]
    monkeypatch.delenv("MEMPLUGIN_ALLOWED_HOSTS")
    for address in ("0.0.0.0", "::", "10.1.2.3", "::1"):  # addresses are answered anyway
        assert _allowed_hosts(argparse.Namespace(host=address, allowed_host=None)) == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--allowed-host", "http://gpu1.example"], "MEMPLUGIN_ALLOWED_HOSTS"),
     (["--read-timeout", "0"], "MEMPLUGIN_READ_TIMEOUT_SECONDS")],
)
def test_serve_refuses_a_malformed_option_with_a_message(tmp_path: Path, flags: list[str], message: str) -> None:
    result = subprocess.run([SCRIPT, "serve", "--port", "0", "--data-dir", str(tmp_path), *flags],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
